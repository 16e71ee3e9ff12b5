"""How deep each kind of heads' own tree holds the emitted tokens, with every other draft source off.

    PYTHONPATH=. python benchmarks/results/context-head/heads_alone.py code-completion /tmp/heads-run feature,context

Flat cost curve, heads' cost pinned, 8 prompts, 128 new tokens, greedy (``HeadsSource.stats.reached``: per
proposal, the tokens of the emitted text its tree held from the root, whether or not the budget verified them).
"""

import sys

import numpy as np
import torch

from benchmarks.replay import FLAT_CURVE
from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.heads import DraftHeads, HeadsSource
from lookahead.models import load_smollm2

ALONE = dict(tree_nodes=0, copy_nodes=0, recycle_k=0, fill_nodes=0, window_width=0)


def main() -> None:
    workload, folder, kinds = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    torch.set_num_threads(1)
    model, tok = load_smollm2(dtype=torch.float32)
    prompts = build_workloads([workload], 8)[workload]
    for kind in kinds:
        reached = []
        for p in prompts:
            heads = DraftHeads.load(f"{folder}/{kind}", cost=(0.0003, 0.0001))
            decoder = LookaheadDecoder(LookaheadConfig(cost_curve=FLAT_CURVE, **ALONE), heads=heads)
            model.generate(**encode(p, tok, "cpu"), max_new_tokens=128, do_sample=False, custom_generate=decoder)
            reached.extend(next(s for s in decoder.policy.sources if isinstance(s, HeadsSource)).stats.reached)
        r = np.array(reached)
        print(f"{kind}: proposals {len(r)}, held >= 1: {(r >= 1).mean():.3f}, >= 2: {(r >= 2).mean():.3f}, "
              f">= 3: {(r >= 3).mean():.3f}, mean {r.mean():.3f}")


if __name__ == "__main__":
    main()
