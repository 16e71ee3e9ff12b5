"""The decoder's own phase times per step (``DecodeStats.time_propose`` / ``time_verify`` / ``time_bookkeeping``) on
``host_overhead.py``'s tiny model: 12 calls of 300 new tokens, the first two dropped, median and min over the rest.

    PYTHONPATH=<checkout> python benchmarks/results/host-step/instructions/phases.py always|flat|never

``propose``: drafting and packing the step; ``verify``: reading the logits and the verdict; ``book``: emitting,
stopping criteria, KV cache, learning (the stats' own bookkeeping is in none of them).
"""

import statistics
import sys

import torch

from benchmarks.host_overhead import generate, make_decoder, prompt_ids, tiny_model


def main() -> None:
    torch.set_num_threads(1)
    model, ids = tiny_model(), prompt_ids()
    method = sys.argv[1] if len(sys.argv) > 1 else "always"
    phases = {"propose": [], "verify": [], "book": []}
    for r in range(12):
        decoder = make_decoder(method)
        generate(model, ids, decoder, 300)
        s = decoder.stats
        n = len(s.budgets)
        if r >= 2:
            for name, seconds in (("propose", s.time_propose), ("verify", s.time_verify),
                                  ("book", s.time_bookkeeping)):
                phases[name].append(seconds / n * 1e6)
    print(method, "  ".join(f"{k} {statistics.median(v):.1f} (min {min(v):.1f})" for k, v in phases.items()),
          "us per step")


if __name__ == "__main__":
    main()
