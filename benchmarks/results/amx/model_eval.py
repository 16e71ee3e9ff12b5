"""Deterministic (needs `whole-tree.patch` for its default variants): fp32 SmolLM2, a pinned cost curve; modelled speed = new tokens * t(1) / sum of t(rows) per step.

    python benchmarks/results/amx/model_eval.py chat,code-editing,code-completion amx-bf16 4 0 '{"cut": {"whole_probe": [0, 0]}, "arm": {}}'
"""
import json
import sys

import numpy as np
import torch

from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.cost import CostModel
from lookahead.models import load_smollm2
from lookahead.tuning import BudgetTuning

torch.set_num_threads(1)
CURVES = {"amx-bf16": [(1, 0.0574), (2, 0.0600), (4, 0.0613), (8, 0.0627), (16, 0.0634), (32, 0.0736), (64, 0.0903)],
          "fp32": [(1, 0.0531), (2, 0.0606), (4, 0.0811), (8, 0.1000), (16, 0.1131), (32, 0.1308), (64, 0.1828)]}
curve = CostModel(CURVES[sys.argv[2]])
n_prompts = int(sys.argv[3]) if len(sys.argv) > 3 else 4
skip = int(sys.argv[4]) if len(sys.argv) > 4 else 0
variants = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {"cut": {"whole_probe": [0, 0]}, "arm": {}, "fixed": None}
model, tok = load_smollm2(dtype=torch.float32)
wl = build_workloads(sys.argv[1].split(","), n_prompts + skip)
for w, prompts in wl.items():
    res = {k: [] for k in variants}
    for p in prompts[skip:]:
        inputs = encode(p, tok, "cpu")
        line = []
        for name, tun in variants.items():
            if tun is None:
                dec = LookaheadDecoder(LookaheadConfig(adaptive=False))
            else:
                t = {k: tuple(v) if isinstance(v, list) else v for k, v in tun.items()}
                dec = LookaheadDecoder(LookaheadConfig(cost_curve=tuple(CURVES[sys.argv[2]])), tuning=BudgetTuning(**t))
            out = model.generate(**inputs, max_new_tokens=128, do_sample=False, custom_generate=dec)
            n = out.shape[1] - inputs["input_ids"].shape[1]
            rows = np.array([1 + a + b for a, b in dec.stats.budgets[1:]])  # the prefill excluded
            cost = float(curve(rows).sum()) + float(curve(1))  # the first emitted token: the prefill's, priced as a step
            speed = n * float(curve(1)) / cost
            res[name].append(speed)
            line.append(f"{name} {speed:.2f}x({n / dec.stats.target_calls:.2f})")
        print(w, p.id, " ".join(line), flush=True)
    print(w, "median", {k: round(float(np.median(v)), 3) for k, v in res.items()},
          "geomean", {k: round(float(np.exp(np.mean(np.log(v)))), 3) for k, v in res.items()}, flush=True)
