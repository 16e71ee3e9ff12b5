"""A SmolLM2-135M fp32 step with a draft tree's mask, after T cached tokens, with transformers' SDPA attention
repeating the grouped keys and values per query head (``repeat_kv``, the default with a mask) against SDPA's own
grouped-query attention (``TRANSFORMERS_SDPA_FORCE_GQA=1``, what ``compat.FORCED_GQA`` sets around such steps on a
CPU); interleaved, 11 rounds, medians; then whether the logits are the same bit for bit. 2 torch threads, the linear
layers as ``nn.Linear`` computes them.

    PYTHONPATH=. python benchmarks/results/host-step/masked_gqa.py [T ...]
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time

import torch

from lookahead import compat
from lookahead.kv_cache import new_cache
from lookahead.models import load_smollm2


def mask_of(context: int, rows: int) -> torch.Tensor:
    """[1, 1, rows, context + rows]: every cached column visible, the new rows causal (a chain of drafts)."""
    mask = torch.zeros(1, 1, rows, context + rows)
    mask[..., context:] = torch.triu(torch.full((rows, rows), torch.finfo(torch.float32).min), 1)
    return mask


def main() -> None:
    torch.set_num_threads(2)
    model, _ = load_smollm2()
    gen = torch.Generator().manual_seed(0)
    for context in [int(x) for x in sys.argv[1:]] or [300, 1500]:
        cache = new_cache(model)
        with torch.no_grad():
            model(torch.randint(100, 40000, (1, context), generator=gen), past_key_values=cache, use_cache=True)
            times: dict = {}
            for _ in range(11):
                for rows in (2, 16):
                    new, pos = torch.randint(100, 40000, (1, rows), generator=gen), torch.arange(context, context + rows)
                    for forced in (False, True):
                        with compat.FORCED_GQA if forced else contextlib.nullcontext():
                            t = time.perf_counter()
                            model(new, past_key_values=cache, position_ids=pos[None], use_cache=True,
                                  attention_mask=mask_of(context, rows))
                            times.setdefault((rows, forced), []).append((time.perf_counter() - t) * 1e3)
                        cache.crop(-rows)
            logits = []
            new, pos = torch.randint(100, 40000, (1, 16), generator=gen), torch.arange(context, context + 16)
            for forced in (False, True):
                with compat.FORCED_GQA if forced else contextlib.nullcontext():
                    logits.append(model(new, past_key_values=cache, position_ids=pos[None], use_cache=True,
                                        attention_mask=mask_of(context, 16)).logits)
                cache.crop(-16)
        for rows in (2, 16):
            repeated, grouped = statistics.median(times[(rows, False)]), statistics.median(times[(rows, True)])
            print(f"T={context} rows={rows}: keys repeated {repeated:.1f} ms, grouped in SDPA {grouped:.1f} ms "
                  f"({grouped / repeated:.3f})")
        print(f"T={context}: logits bit for bit equal: {torch.equal(logits[0], logits[1])}")


if __name__ == "__main__":
    main()
