"""The decoder's forwards timed in place (a forward hook), by rows, against the kept step curve; bf16, default decoder
with and without the bundled heads.

    python benchmarks/results/amx/steps.py chat,code-editing
"""
import sys
import time
from collections import defaultdict

import numpy as np
import torch

from lookahead import LookaheadDecoder
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.heads import DraftHeads
from lookahead.models import load_smollm2

torch.set_num_threads(2)
model, tok = load_smollm2(dtype=torch.bfloat16)
times = []
t0 = [0.0]
model.register_forward_pre_hook(lambda m, a, kw: t0.__setitem__(0, time.perf_counter()), with_kwargs=True)
def post(m, a, kw, out):
    ids = kw.get("input_ids") if kw.get("input_ids") is not None else a[0]
    times.append((ids.shape[1], time.perf_counter() - t0[0]))
model.register_forward_hook(post, with_kwargs=True)
wl = build_workloads(sys.argv[1].split(","), 4)
heads = DraftHeads.bundled()
by = defaultdict(list)
for _name, prompts in wl.items():
    for p in prompts:
        inputs = encode(p, tok, "cpu")
        for h in (None, heads):
            times.clear()
            dec = LookaheadDecoder(heads=h)
            model.generate(**inputs, max_new_tokens=128, do_sample=False, custom_generate=dec)
            for k, t in times[1:]:
                by[k].append(t)
curve = dict(dec.stats.cost_curve)
for k in sorted(by):
    v = np.array(by[k]) * 1000
    print(f"rows {k:3d} n {len(v):4d} median {np.median(v):6.1f} ms  min {v.min():6.1f}")
print("curve", {k: round(v * 1000, 1) for k, v in curve.items()})
