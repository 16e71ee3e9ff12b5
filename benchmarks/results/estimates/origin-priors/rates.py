"""Raw acceptance counts per (origin, agreement, match bucket, depth, rank) over decodes (no decay).

    PYTHONPATH=. python benchmarks/results/estimates/origin-priors/rates.py heads|none flat|default SKIP OUT.npz
    PYTHONPATH=. python benchmarks/results/estimates/origin-priors/show.py OUT.npz

SmolLM2-135M (bundled), fp32, one thread, 128 new tokens, greedy, 8 prompts of each of code completion, code
editing and chat (after the first SKIP), a fresh decoder per prompt; ``flat``: the flat cost curve of
``benchmarks.heads``; ``heads``: the bundled feature heads, their cost pinned at 0.3 ms + 0.1 ms per level. A node
counts as tried when its parent was accepted (or it is a root child), as ``kernels.record`` counts it.
"""

import sys

import numpy as np
import torch

from benchmarks.replay import FLAT_CURVE
from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.budget import Budget
from lookahead.draft import ORIGINS
from lookahead.heads import DraftHeads
from lookahead.models import load_smollm2

WORKLOADS = ["code-completion", "code-editing", "chat"]


def main() -> None:
    heads_on, curve, skip, out = sys.argv[1] == "heads", sys.argv[2], int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    model, tok = load_smollm2(dtype=torch.float32)
    tried = np.zeros((len(ORIGINS), 4, 3, 16, 4))  # origin, agreement (3: 3 or more), match bucket, depth, rank
    accepted = np.zeros_like(tried)
    record = Budget.record

    def counting(self, draft, accepted_nodes, *args, **kwargs):
        kept = {int(j) for j in accepted_nodes}
        for i in range(len(draft.tokens)):
            parent = int(draft.parents[i])
            if parent < 0 or parent in kept:
                cell = (int(draft.origin[i]), min(int(draft.agreement[i]), 3), min(max(int(draft.match[i]), 1), 3) - 1,
                        min(int(draft.depth[i]) - 1, 15), min(int(draft.rank[i]), 3))
                tried[cell] += 1
                accepted[cell] += i in kept
        return record(self, draft, accepted_nodes, *args, **kwargs)

    Budget.record = counting
    seen = build_workloads(WORKLOADS, skip) if skip else {}
    for wl, prompts in build_workloads(WORKLOADS, 8 + skip).items():
        skipped = {p.id for p in seen.get(wl, [])}
        for p in [p for p in prompts if p.id not in skipped][:8]:
            heads = DraftHeads.bundled("feature", cost=(0.0003, 0.0001)) if heads_on else None
            config = LookaheadConfig(cost_curve=FLAT_CURVE) if curve == "flat" else LookaheadConfig()
            model.generate(**encode(p, tok, "cpu"), max_new_tokens=128, do_sample=False,
                           custom_generate=LookaheadDecoder(config, heads=heads))
            print(wl, p.id, int(tried.sum()), int(accepted.sum()), flush=True)
    np.savez_compressed(out, tried=tried, accepted=accepted)


if __name__ == "__main__":
    main()
