"""The step cost by rows in both linear layouts, and the output layer's one-row product against two rows.

Whole decoding steps (``call.step_timer``: mask, forward, row reads, KV keep) of the bundled SmolLM2 in fp32
after ``context`` tokens, every size from 1 to 16 rows (and 20, 24, 32), with every linear layer through
``nn.Linear`` and the other way round (``linear_layout.TransposedLinears``), in 7 interleaved rounds; the median
of each, relative to the one-row ``nn.Linear`` step. Then the 49152 x 576 output layer alone on 1 and 2 threads.

Run from the repository root: ``PYTHONPATH=. python benchmarks/results/cheap-rows/step_shape.py [context]``
"""

import statistics
import sys
import time

import torch

from lookahead import call, compat
from lookahead.kv_cache import new_cache
from lookahead.linear_layout import TransposedLinears, linear_modules
from lookahead.models import load_smollm2


def median_ms(f, reps=30):
    for _ in range(3):
        f()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def main():
    torch.set_num_threads(2)
    model, _ = load_smollm2(dtype=torch.float32)
    context = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    time_one = call.step_timer(model, lambda: new_cache(model), compat.cache_kwarg_name(model),
                               compat.supports_logits_to_keep(model), 8, time.perf_counter, context=context, max_rows=32)
    modules = linear_modules(model)
    sizes = list(range(1, 17)) + [20, 24, 32]
    res = {(layout, k): [] for layout in ("linear", "T") for k in sizes}
    for r in range(7):
        for k in sizes if r % 2 else sizes[::-1]:
            res[("linear", k)].append(time_one(k))
            with TransposedLinears(modules, 32):
                res[("T", k)].append(time_one(k))
    base = statistics.median(res[("linear", 1)])
    print(f"context {context}; one-row nn.Linear step {base * 1e3:.1f} ms (median); ratios to it:")
    for k in sizes:
        lin, t = statistics.median(res[("linear", k)]), statistics.median(res[("T", k)])
        print(f"rows {k:2d}: nn.Linear {lin / base:.2f}, other way round {t / base:.2f} "
              f"(fastest {min(res[('T', k)]) / base:.2f})")
    weight = model.lm_head.weight.detach()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        x1, x2 = torch.randn(1, weight.shape[1]), torch.randn(2, weight.shape[1])
        with torch.no_grad():
            one = median_ms(lambda x=x1: torch.nn.functional.linear(x, weight))
            two = median_ms(lambda x=x2: (weight @ x.t()).t())
        print(f"output layer, {threads} thread(s): 1 row through nn.Linear {one:.1f} ms, 2 rows the other way "
              f"round {two:.1f} ms")


if __name__ == "__main__":
    main()
