"""The same-check: tokens, target calls and budgets of SmolLM2 on 2 prompts per workload, flat and steep curves
(run at two commits, compared with a diff)."""

import json
import sys

import torch

import lookahead
from lookahead import LookaheadDecoder
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.models import load_smollm2

torch.set_num_threads(1)
model, tok = load_smollm2()
wl = build_workloads(["code-editing", "code-completion", "chat"], 2)
FLAT = ((1, .010), (2, .010), (256, .0102))
STEEP = ((1, .030), (2, .036), (4, .045), (8, .055), (16, .07), (32, .1), (64, .16))
out = {}
for _name, prompts in wl.items():
    for p in prompts:
        inputs = encode(p, tok, model.device)
        for label, curve in (("flat", FLAT), ("steep", STEEP)):
            dec = LookaheadDecoder(cost_curve=curve, window_width=0) if hasattr(lookahead.LookaheadConfig(), "window_columns") else LookaheadDecoder(cost_curve=curve)
            o = model.generate(**inputs, max_new_tokens=64, do_sample=False, custom_generate=dec)
            out[f"{p.id}/{label}"] = {"tokens": o[0].tolist(), "calls": dec.stats.target_calls, "budgets": dec.stats.budgets}
json.dump(out, open(sys.argv[1], "w"))
print(lookahead.__file__, len(out))
