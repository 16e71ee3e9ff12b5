"""Forward time of k new tokens after 300 tokens of context, relative to one, for SmolLM2 in bf16 and fp32.

    python benchmarks/results/step-pricing/forward_ratios.py

``cost.measure_cost_curve`` times them (bare forwards, interleaved rounds, the fastest kept); 2 threads.
"""

import torch

from lookahead.cost import measure_cost_curve
from lookahead.kv_cache import new_cache
from lookahead.models import load_smollm2

SIZES = (1, 2, 4, 8, 16, 32, 64)


def main() -> None:
    torch.set_num_threads(2)
    for dtype in (torch.bfloat16, torch.float32):
        model, _ = load_smollm2(dtype=dtype)
        curve = measure_cost_curve(model, lambda m=model: new_cache(m), SIZES, context=300, repeats=3)
        t = dict(curve.points)
        print(dtype, " ".join(f"{k}:{t[k] * 1000:.1f}ms({t[k] / t[1]:.2f})" for k in SIZES),
              "(provisional)" if curve.provisional else "")


if __name__ == "__main__":
    main()
