"""The step timer (``call.step_timer``) after 128, 512 and 1024 tokens of context, fastest of 5, per row count.

    python benchmarks/results/amx/ctx.py bfloat16
"""
import sys
import time

import torch

from lookahead import call, compat
from lookahead.kv_cache import new_cache
from lookahead.models import load_smollm2

torch.set_num_threads(2)
dtype = getattr(torch, sys.argv[1])
model, _ = load_smollm2(dtype=dtype)
ck, kl = compat.cache_kwarg_name(model), compat.supports_logits_to_keep(model)
sizes = (1, 4, 16, 32, 64)
for ctx in (128, 512, 1024):
    timer = call.step_timer(model, lambda: new_cache(model), ck, kl, 8, time.perf_counter, context=ctx, max_rows=64)
    best = {k: min(timer(k) for _ in range(5)) for k in sizes}
    print(ctx, " ".join(f"{k}:{best[k]*1000:.1f}({best[k]/best[1]:.2f})" for k in sizes), flush=True)
