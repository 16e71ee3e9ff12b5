"""Where a step's draft loses tokens: per step, the longest prefix of the true continuation that each source's
own tree held, that the merged tree held, and that the verified (kept) tree held.

    PYTHONPATH=. python benchmarks/results/agreement/losses.py [WORKLOAD] [HEADS_KIND|none] [--json OUT]

SmolLM2-135M (bundled), fp32, one torch thread, the flat cost curve of ``benchmarks.heads`` (tokens per call is
then the speed-up), the bundled heads with their cost pinned at 0.3 ms + 0.1 ms per level, 4 prompts, 128 new
tokens, greedy. ``LOOKAHEAD_CONFIG='{"step_nodes": 127}'`` overrides config fields. The policy's merge and learn
are wrapped (this script only reads what they pass); every output is checked against plain ``generate``.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch

import lookahead.policy as policy_module
from benchmarks.replay import FLAT_CURVE
from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.draft import ORIGINS
from lookahead.heads import DraftHeads
from lookahead.models import load_smollm2


def held(tokens: np.ndarray, parents: np.ndarray, truth: list[int]) -> int:
    """How many tokens of ``truth`` a tree holds as a path from its root."""
    node, d = -1, 0
    while d < len(truth):
        kids = np.flatnonzero((parents == node) & (tokens == truth[d]))
        if not len(kids):
            break
        node, d = int(kids[0]), d + 1
    return d


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workload", nargs="?", default="code-completion")
    ap.add_argument("heads", nargs="?", default="feature")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = load_smollm2(dtype=torch.float32)
    steps: list[dict] = []
    merge, learn = policy_module.merge_proposals, policy_module.DraftPolicy.learn

    def merge_logged(proposals, *a, **k):
        steps.append({"proposals": [(o, p.tokens.copy(), p.parents.copy()) for o, p in proposals]})
        return merge(proposals, *a, **k)

    def learn_logged(self, draft, accepted_nodes, emitted, *a, **k):
        steps[-1].update(kept=(draft.tokens.copy(), draft.parents.copy()), accepted=len(accepted_nodes),
                         emitted=list(emitted))
        return learn(self, draft, accepted_nodes, emitted, *a, **k)

    policy_module.merge_proposals, policy_module.DraftPolicy.learn = merge_logged, learn_logged
    overrides = json.loads(os.environ.get("LOOKAHEAD_CONFIG", "{}"))
    report, calls_total, tokens_total = [], 0, 0
    for prompt in build_workloads([args.workload], args.prompts)[args.workload]:
        ids = encode(prompt, tok, "cpu")["input_ids"]
        plain = model.generate(ids, max_new_tokens=128, do_sample=False)[0, ids.shape[1]:].tolist()
        heads = None if args.heads == "none" else DraftHeads.bundled(args.heads, cost=(0.0003, 0.0001))
        decoder = LookaheadDecoder(LookaheadConfig(cost_curve=FLAT_CURVE, **overrides), heads=heads)
        steps.clear()
        out = model.generate(ids, max_new_tokens=128, do_sample=False, custom_generate=decoder)
        assert out[0, ids.shape[1]:].tolist() == plain, f"{prompt.id}: not plain generate's output"
        pos, rows = 0, []
        for st in (s for s in steps if "kept" in s):
            truth = plain[pos:pos + 64]
            per = {}
            for o, t, p in st["proposals"]:
                per[ORIGINS[o]] = max(per.get(ORIGINS[o], 0), held(t, p, truth))
            rows.append({"position": pos, "accepted": st["accepted"], "kept_held": held(*st["kept"], truth),
                         "source_held": per})
            pos += len(st["emitted"])
        best = sum(max(r["source_held"].values(), default=0) for r in rows)
        accepted = sum(r["accepted"] for r in rows)
        calls_total, tokens_total = calls_total + len(rows), tokens_total + len(plain)
        print(f"{prompt.id}: {len(rows)} calls, {accepted} draft tokens accepted; the sources' own trees held {best}")
        report.append({"prompt": prompt.id, "steps": rows})
    print(f"tokens per call {tokens_total / calls_total:.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
