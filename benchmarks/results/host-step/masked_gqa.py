"""A SmolLM2-135M fp32 step of several rows after T cached tokens, with transformers' SDPA attention repeating the
grouped keys and values per query head (``repeat_kv``, its default with a mask) against SDPA's own grouped-query
attention (``TRANSFORMERS_SDPA_FORCE_GQA=1``, what ``compat.FORCED_GQA`` sets around such steps on a CPU): 2 and 16
rows with a draft tree's mask (here a chain's, passed as a 4D mask), and 3 and 8 rows of a causal chain passed
without one (transformers builds its mask). Interleaved, 11 rounds, medians; then whether the logits are the same
bit for bit. 2 torch threads, the linear layers as ``nn.Linear`` computes them.

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

CASES = ((2, True), (16, True), (3, False), (8, False))  # (rows, with a 4D mask)


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
                for rows, masked in CASES:
                    new, pos = torch.randint(100, 40000, (1, rows), generator=gen), torch.arange(context, context + rows)
                    mask = mask_of(context, rows) if masked else None
                    for forced in (False, True):
                        with compat.FORCED_GQA if forced else contextlib.nullcontext():
                            t = time.perf_counter()
                            model(new, past_key_values=cache, position_ids=pos[None], use_cache=True,
                                  attention_mask=mask)
                            times.setdefault((rows, masked, forced), []).append((time.perf_counter() - t) * 1e3)
                        cache.crop(-rows)
            equal = True
            for rows, masked in CASES:
                logits = []
                new, pos = torch.randint(100, 40000, (1, rows), generator=gen), torch.arange(context, context + rows)
                for forced in (False, True):
                    with compat.FORCED_GQA if forced else contextlib.nullcontext():
                        logits.append(model(new, past_key_values=cache, position_ids=pos[None], use_cache=True,
                                            attention_mask=mask_of(context, rows) if masked else None).logits)
                    cache.crop(-rows)
                equal = equal and torch.equal(logits[0], logits[1])
        for rows, masked in CASES:
            repeated, grouped = (statistics.median(times[(rows, masked, forced)]) for forced in (False, True))
            kind = "tree mask" if masked else "causal chain"
            print(f"T={context} rows={rows} ({kind}): keys repeated {repeated:.1f} ms, grouped in SDPA {grouped:.1f} ms "
                  f"({grouped / repeated:.3f})")
        print(f"T={context}: logits bit for bit equal in every case: {equal}")


if __name__ == "__main__":
    main()
