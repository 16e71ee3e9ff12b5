"""The bundled heads' priced cost against what their proposals take inside a decode: SmolLM2-135M in float32, 2 torch
threads, 128 new tokens, greedy, the default config plus ``DraftHeads.bundled()``, each prompt twice with a new
decoder. Prints the call's steps and tokens per call, the heads' proposals, nodes and seconds (``HeadsStats``), the
cost they were priced at (``HeadsSource.cost``: seconds for the base and per level of the tree), the forward's mean
seconds per call and the first points of the cost curve.

    python benchmarks/results/heads/cost_in_decode.py [PROMPT_ID ...]   # default: HumanEval/102 and /123, chat-1
"""
import sys
import time

import torch

from lookahead import LookaheadDecoder
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.heads import DraftHeads, HeadsSource
from lookahead.models import load_smollm2


def main() -> None:
    torch.set_num_threads(2)
    model, tok = load_smollm2()
    heads = DraftHeads.bundled()
    wanted = sys.argv[1:] or ["HumanEval/123", "HumanEval/102", "chat-1"]
    for prompts in build_workloads(["code-completion", "chat"], 8).values():
        for p in prompts:
            if p.id not in wanted:
                continue
            inputs = encode(p, tok, "cpu")
            for rep in range(2):
                d = LookaheadDecoder(heads=heads)
                t = time.perf_counter()
                model.generate(**inputs, max_new_tokens=128, do_sample=False, custom_generate=d)
                wall = time.perf_counter() - t
                src = next(s for s in d.policy.sources if isinstance(s, HeadsSource))
                hs, s = src.stats, d.stats
                print(p.id, rep, f"wall {wall:.2f} calls {s.target_calls} tpc {s.tokens_per_call:.2f}",
                      f"heads proposals {hs.proposals} nodes {hs.nodes} seconds {hs.seconds:.3f} per proposal "
                      f"{hs.seconds / max(hs.proposals, 1) * 1e3:.2f} ms",
                      f"priced cost base {src.cost[0] * 1e3:.2f} ms per level {src.cost[1] * 1e3:.2f} ms",
                      f"forward {s.time_forward / s.target_calls * 1e3:.1f} ms/call",
                      "curve", s.cost_curve[:3] if s.cost_curve else None)


if __name__ == "__main__":
    main()
