"""Wall clock, back to back per prompt (order rotated): plain, plain again (A/A) and decoder variants chosen by name.

    python benchmarks/results/in-call/ab.py WORKLOADS VARIANTS [DTYPE] [PROMPTS]
    python benchmarks/results/in-call/ab.py chat,code-editing default,refine,fixed bfloat16 4

Prints, per prompt, each variant's speed against plain (and its tokens per target call), then medians.
"""
import sys
import time

import numpy as np
import torch

from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.heads import DraftHeads
from lookahead.models import load_smollm2

HEADS = DraftHeads.bundled()
VARIANTS = {
    "default": lambda: LookaheadDecoder(),
    "refine": lambda: LookaheadDecoder(LookaheadConfig(refine_cost=True)),
    "fixed": lambda: LookaheadDecoder(LookaheadConfig(adaptive=False)),
    "heads": lambda: LookaheadDecoder(heads=HEADS),
    "heads-refine": lambda: LookaheadDecoder(LookaheadConfig(refine_cost=True), heads=HEADS),
    "heads-fixed": lambda: LookaheadDecoder(LookaheadConfig(adaptive=False), heads=HEADS),
}
torch.set_num_threads(2)
dtype = getattr(torch, sys.argv[3] if len(sys.argv) > 3 else "bfloat16")
n_prompts = int(sys.argv[4]) if len(sys.argv) > 4 else 4
model, tok = load_smollm2(dtype=dtype)
variants = {"plain": None, "plain2": None, **{v: VARIANTS[v] for v in sys.argv[2].split(",")}}
wl = build_workloads(sys.argv[1].split(","), n_prompts)
warm = encode(next(iter(wl.values()))[0], tok, "cpu")
for make in variants.values():
    model.generate(**warm, max_new_tokens=16, do_sample=False, **({"custom_generate": make()} if make else {}))
res = {}
for w, prompts in wl.items():
    for i, p in enumerate(prompts):
        inputs = encode(p, tok, "cpu")
        names = list(variants)
        names = names[i % len(names):] + names[:i % len(names)]
        row, outs = {}, {}
        for name in names:
            make = variants[name]
            dec = make() if make else None
            t = time.perf_counter()
            out = model.generate(**inputs, max_new_tokens=128, do_sample=False, **({"custom_generate": dec} if dec else {}))
            dt = time.perf_counter() - t
            n = out.shape[1] - inputs["input_ids"].shape[1]
            row[name] = (n / dt, n / dec.stats.target_calls if dec else 1.0)
            outs[name] = out[0].tolist()
        base = row["plain"][0]
        same = "".join("=" if outs[k] == outs["plain"] else "x" for k in variants if k != "plain")
        print(w, p.id, same, " ".join(f"{k} {v[0]/base:.2f}x({v[1]:.2f})" for k, v in row.items() if k != "plain"),
              flush=True)
        res.setdefault(w, []).append({k: (v[0] / base, v[1]) for k, v in row.items()})
for w, rows in res.items():
    print(w, "median", {k: (round(float(np.median([r[k][0] for r in rows])), 2),
                            round(float(np.median([r[k][1] for r in rows])), 2)) for k in rows[0]})
