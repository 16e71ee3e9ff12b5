"""Whole SmolLM2 forwards by rows in three linear layouts: ``nn.Linear`` (MKL), the other way round
(``linear_layout.TransposedLinears``, as the decoder runs 2-4 rows on this CPU), and every product of 2 or more
rows through oneDNN's linear (``torch.ops.mkldnn._linear_pointwise``, unpacked weights). One row is ``nn.Linear``
in all three. After 300 tokens of context, interleaved rounds; the median of each size relative to the one-row
step.

Run from the repository root: ``PYTHONPATH=. python benchmarks/results/host-step/onednn_layout.py [float32|bfloat16] [rounds]``
"""

import statistics
import sys
import time

import torch
from transformers import DynamicCache

from lookahead.linear_layout import ONEDNN, LinearPlan, StepLinears, TransposedLinears, linear_modules
from lookahead.models import load_smollm2

SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)


def OneDnnLinears(modules, max_rows):  # noqa: N802 - used as the layouts' classes are
    """Rows 2..max_rows of every module through oneDNN's linear (``linear_layout.onednn_linear``)."""
    return StepLinears(modules, LinearPlan.uniform(ONEDNN, max_rows))


def main():
    dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else "float32")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    torch.set_num_threads(2)
    model, _ = load_smollm2(dtype=dtype)
    modules = linear_modules(model)
    gen = torch.Generator().manual_seed(0)
    cache = DynamicCache()
    with torch.no_grad():
        model(torch.randint(100, 10000, (1, 300), generator=gen), past_key_values=cache, use_cache=True)

    def step(m):
        ids = torch.randint(100, 10000, (1, m), generator=gen)
        t = time.perf_counter()
        model(ids, position_ids=torch.arange(300, 300 + m)[None], past_key_values=cache, use_cache=True,
              logits_to_keep=m)
        seconds = time.perf_counter() - t
        cache.crop(-m)
        return seconds

    layouts = {"nn.Linear": None, "transposed": TransposedLinears, "oneDNN": OneDnnLinears}
    times = {(name, m): [] for name in layouts for m in SIZES}
    with torch.no_grad():
        for _ in range(rounds):
            for m in SIZES:
                for name, kind in layouts.items():
                    if kind is None:
                        times[(name, m)].append(step(m))
                    else:
                        with kind(modules, max(SIZES)):
                            times[(name, m)].append(step(m))
    base = statistics.median(times[("nn.Linear", 1)])
    print(f"{dtype}, 2 threads, {rounds} rounds; one-row nn.Linear step {base * 1e3:.1f} ms; cost relative to it:")
    print("rows       " + " ".join(f"{m:>5d}" for m in SIZES))
    for name in layouts:
        print(f"{name:<11}" + " ".join(f"{statistics.median(times[(name, m)]) / base:5.2f}" for m in SIZES))


if __name__ == "__main__":
    main()
