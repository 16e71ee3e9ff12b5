"""How often a step's accepted path is its first rows, by node order, on a replayed recording.

Run from the repository root: ``PYTHONPATH=. python benchmarks/results/draft-order/prefix_rate.py``. Each step
of every recorded prompt is replayed with the default config on three cost curves; for the steps that
accepted a node it checks whether the accepted nodes are rows ``0 .. a-1`` as drafted (``as drafted``), and
as they would be in depth-first order with siblings first-drafted first (``dfs``) or by the budget's
estimates (``dfs-best``).
"""

from __future__ import annotations

import json

from benchmarks.replay import FLAT_CURVE, replay
from benchmarks.replay_tuning import STEP_BF16, STEP_FP32
from lookahead.config import LookaheadConfig
from lookahead.cost import CostModel
from lookahead.policy import DraftPolicy

RECORDING = "benchmarks/results/replay-smollm2-16.json"


def preorder(parents, key=None) -> list[int]:
    """Depth-first preorder of a parent-first tree; siblings in index order, or by ``key`` descending."""
    children = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        children[p + 1].append(i)
    out: list[int] = []

    def visit(v: int) -> None:
        kids = children[v] if key is None else sorted(children[v], key=lambda c: -key[c])
        for c in kids:
            out.append(c)
            visit(c + 1)

    visit(0)
    return out


def main() -> None:
    records = json.load(open(RECORDING))
    log = []
    learn = DraftPolicy.learn

    def logged(self, draft, accepted, *args, **kwargs):
        probs = self.budget.node_probabilities(draft, scaled=False) if self.budget is not None and len(draft) else None
        log.append((draft.parents.tolist(), list(accepted), probs))
        return learn(self, draft, accepted, *args, **kwargs)

    DraftPolicy.learn = logged
    try:
        for name, curve in (("flat", FLAT_CURVE), ("bf16", STEP_BF16), ("fp32", STEP_FP32)):
            log.clear()
            for r in records["prompts"].values():
                replay(r["prompt"], r["output"], r["max_new_tokens"], LookaheadConfig(), CostModel(curve))
            hits, steps = {"as drafted": 0, "dfs": 0, "dfs-best": 0}, 0
            for parents, accepted, probs in log:
                if not accepted:
                    continue
                steps += 1
                first = list(range(len(accepted)))
                hits["as drafted"] += accepted == first
                for label, key in (("dfs", None), ("dfs-best", probs)):
                    where = {v: i for i, v in enumerate(preorder(parents, key))}
                    hits[label] += [where[x] for x in accepted] == first
            print(name, "steps that accepted a node:", steps, {k: round(v / steps, 3) for k, v in hits.items()})
    finally:
        DraftPolicy.learn = learn


if __name__ == "__main__":
    main()
