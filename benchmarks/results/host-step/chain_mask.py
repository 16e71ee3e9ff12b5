"""A SmolLM2-135M fp32 step of a causal chain of 3 and 8 rows after 500 cached tokens on a CPU: with no mask passed
(transformers builds a boolean one for rows after cached ones, which SDPA converts in every layer) against the
step's additive 4D mask passed in (what ``SingleCall.pack`` now passes on a CPU). Both with grouped-query attention
in SDPA (``compat.FORCED_GQA``) and the linears the other way round, as the decoder's fp32 steps of a few rows run;
15 rounds, the order alternated, medians; the logits compared bit for bit every round. 2 torch threads.

    PYTHONPATH=. python benchmarks/results/host-step/chain_mask.py
"""

from __future__ import annotations

import statistics
import time

import torch

from lookahead import compat
from lookahead.kv_cache import new_cache
from lookahead.linear_layout import TransposedLinears, linear_modules
from lookahead.models import load_smollm2

CONTEXT = 500


def main() -> None:
    torch.set_num_threads(2)
    model, _ = load_smollm2()
    gen = torch.Generator().manual_seed(0)
    times: dict = {}
    with torch.no_grad(), TransposedLinears(linear_modules(model), 16), compat.FORCED_GQA:
        cache = new_cache(model)
        model(torch.randint(100, 40000, (1, CONTEXT), generator=gen), past_key_values=cache, use_cache=True)
        for round_ in range(15):
            for rows in (3, 8):
                new, pos = torch.randint(100, 40000, (1, rows), generator=gen), torch.arange(CONTEXT, CONTEXT + rows)
                mask = torch.zeros(1, 1, rows, CONTEXT + rows)
                mask[..., CONTEXT:] = torch.triu(torch.full((rows, rows), torch.finfo(torch.float32).min), 1)
                logits = {}
                for passed in ((False, True) if round_ % 2 else (True, False)):
                    t = time.perf_counter()
                    logits[passed] = model(new, past_key_values=cache, position_ids=pos[None], use_cache=True,
                                           attention_mask=mask if passed else None).logits
                    times.setdefault((rows, passed), []).append((time.perf_counter() - t) * 1e3)
                    cache.crop(-rows)
                assert torch.equal(logits[False], logits[True])
    for rows in (3, 8):
        built, passed = (statistics.median(times[(rows, p)]) for p in (False, True))
        print(f"{rows}-row chain after {CONTEXT}: transformers' mask {built:.2f} ms, the step's 4D mask {passed:.2f} ms "
              f"({passed / built:.3f}); logits bit for bit equal in every round")


if __name__ == "__main__":
    main()
