"""Forward time of k new tokens after 300 tokens of context, relative to one, for SmolLM2 in bf16 and fp32.

    python benchmarks/results/step-pricing/forward_ratios.py

Each k is timed 3 times in each of 3 rounds (the fastest kept), the new entries cropped off again; 2 threads.
"""

import time

import torch

from lookahead.models import load_smollm2

SIZES = (1, 2, 4, 8, 16, 32, 64)


def ratios(dtype) -> dict[int, float]:
    model, _ = load_smollm2(dtype=dtype)
    ids = torch.randint(0, 1000, (1, 300))
    best: dict[int, float] = {}
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
        for _ in range(3):
            for k in SIZES:
                x = torch.randint(0, 1000, (1, k))
                t = time.perf_counter()
                for _ in range(3):
                    model(x, cache=cache, use_cache=True)
                    cache.crop(-k)
                best[k] = min(best.get(k, float("inf")), (time.perf_counter() - t) / 3)
    return best


def main() -> None:
    torch.set_num_threads(2)
    for dtype in (torch.bfloat16, torch.float32):
        best = ratios(dtype)
        print(dtype, " ".join(f"{k}:{best[k] * 1000:.1f}ms({best[k] / best[1]:.2f})" for k in SIZES))


if __name__ == "__main__":
    main()
