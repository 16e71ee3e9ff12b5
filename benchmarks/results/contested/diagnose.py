"""Are the acceptance estimates right for a node that another source contests? Per tried node (its parent accepted,
or a root child) of every step: its origin, whether another source drafted a different sibling beside it
(*contested*), its estimated conditional acceptance ``c`` and whether it was accepted; summed per origin.

    PYTHONPATH=. python benchmarks/results/contested/diagnose.py --curve flat --workloads code-editing --prompts 8

SmolLM2-135M (bundled), fp32, greedy, 128 new tokens, the bundled feature heads (their cost pinned as in
``context-head/variants.py`` on the flat curve), a fresh decoder per prompt. ``--curve cpu``: the kept CPU curve.
"""

import argparse
from collections import defaultdict

import numpy as np
import torch

from benchmarks.replay import FLAT_CURVE
from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead import acceptance as acceptance_module
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.draft import ORIGINS
from lookahead.heads import DraftHeads
from lookahead.models import load_smollm2

HEADS_COST = (0.0003, 0.0001)
rows: list[tuple[int, bool, float, bool]] = []  # origin, contested, c, accepted


def contested_of(parents: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """bool[n]: whether a node has a sibling (the same parent) of another origin."""
    out = np.zeros(len(parents), bool)
    by_parent = defaultdict(list)
    for i, p in enumerate(parents.tolist()):
        by_parent[p].append(i)
    for kids in by_parent.values():
        if len(kids) > 1:
            origins = origin[kids]
            for k in kids:
                out[k] = bool((origins != origin[k]).any())
    return out


def spy() -> None:
    update = acceptance_module.AcceptanceStats.update

    def recording(self, draft, accepted_nodes):
        c, hit = update(self, draft, accepted_nodes)
        if len(draft.tokens):
            ok = np.zeros(len(draft.tokens), bool)
            ok[np.asarray(accepted_nodes, dtype=np.int64)] = True
            tried = np.array([p < 0 or ok[p] for p in draft.parents.tolist()], bool)
            contested = contested_of(draft.parents, draft.origin)
            for o, k, ci, h in zip(draft.origin[tried].tolist(), contested[tried].tolist(), c.tolist(), hit.tolist()):
                rows.append((o, k, ci, h))
        return c, hit

    acceptance_module.AcceptanceStats.update = recording


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--curve", choices=("flat", "cpu"), default="flat")
    ap.add_argument("--workloads", default="code-editing,code-completion,chat")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--heads", choices=("yes", "no"), default="yes")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_smollm2(dtype=torch.float32)
    spy()
    for wl, prompts in build_workloads(args.workloads.split(","), args.prompts).items():
        rows.clear()
        tokens = calls = 0
        for p in prompts:
            if args.curve == "flat":
                heads = DraftHeads.bundled(cost=HEADS_COST) if args.heads == "yes" else None
                decoder = LookaheadDecoder(LookaheadConfig(cost_curve=FLAT_CURVE), heads=heads)
            else:
                decoder = LookaheadDecoder(heads=DraftHeads.bundled() if args.heads == "yes" else None)
            inputs = encode(p, tok, model.device)
            out = model.generate(**inputs, max_new_tokens=128, do_sample=False, custom_generate=decoder)
            tokens += out.shape[1] - inputs["input_ids"].shape[1]
            calls += decoder.stats.target_calls
        print(f"{wl} ({args.curve} curve, heads {args.heads}): tokens/call {tokens / calls:.3f}")
        arr = np.array(rows, dtype=float)
        for o in sorted(set(arr[:, 0].astype(int))):
            for k in (0, 1):
                sel = arr[(arr[:, 0] == o) & (arr[:, 1] == k)]
                if len(sel):
                    print(f"  {ORIGINS[o]:8s} {'contested' if k else 'alone    '} tried {len(sel):6d} "
                          f"estimated c {sel[:, 2].mean():.3f} accepted {sel[:, 3].mean():.3f} "
                          f"(accepted {int(sel[:, 3].sum())})", flush=True)


if __name__ == "__main__":
    main()
