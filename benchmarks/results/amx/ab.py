"""Wall clock, bf16, back to back per prompt (order rotated): plain, plain again (A/A), the decoder with and without
the whole-tree arm, with and without the bundled heads. Needs `whole-tree.patch` applied (``whole_probe``).

    python benchmarks/results/amx/ab.py chat,code-completion,code-editing
"""
import sys
import time

import numpy as np
import torch

from lookahead import LookaheadDecoder
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.heads import DraftHeads
from lookahead.models import load_smollm2
from lookahead.tuning import BudgetTuning

HEADS = DraftHeads.bundled()
torch.set_num_threads(2)
dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "bfloat16")
model, tok = load_smollm2(dtype=dtype)
variants = {
    "plain": None,
    "plain2": None,
    "default": lambda: LookaheadDecoder(),
    "cut": lambda: LookaheadDecoder(tuning=BudgetTuning(whole_probe=(0, 0))),
    "heads": lambda: LookaheadDecoder(heads=HEADS),
    "heads-cut": lambda: LookaheadDecoder(heads=HEADS, tuning=BudgetTuning(whole_probe=(0, 0))),
}
wl = build_workloads(sys.argv[1].split(","), 4)
warm = encode(next(iter(wl.values()))[0], tok, "cpu")
for make in variants.values():
    model.generate(**warm, max_new_tokens=16, do_sample=False, **({"custom_generate": make()} if make else {}))
res = {}
for w, prompts in wl.items():
    for i, p in enumerate(prompts):
        inputs = encode(p, tok, "cpu")
        names = list(variants)
        names = names[i % len(names):] + names[:i % len(names)]
        row = {}
        for name in names:
            make = variants[name]
            dec = make() if make else None
            t = time.perf_counter()
            out = model.generate(**inputs, max_new_tokens=128, do_sample=False, **({"custom_generate": dec} if dec else {}))
            dt = time.perf_counter() - t
            n = out.shape[1] - inputs["input_ids"].shape[1]
            row[name] = (n / dt, n / dec.stats.target_calls if dec else 1.0)
        base = row["plain"][0]
        print(w, p.id, " ".join(f"{k} {v[0]/base:.2f}x({v[1]:.2f})" for k, v in row.items() if k != "plain"), flush=True)
        res.setdefault(w, []).append({k: v[0] / base for k, v in row.items()})
for w, rows in res.items():
    print(w, "median", {k: round(float(np.median([r[k] for r in rows])), 2) for k in rows[0]})
