"""The bundled feature heads' proposal time (1 and 6 levels) in fp32 and bf16, and a torch profile of it.

    python benchmarks/results/amx/heads_prof.py
"""
import time

import numpy as np
import torch

from lookahead.heads import DraftHeads, bind, feature_propose
from lookahead.models import load_smollm2

torch.set_num_threads(2)
torch.set_grad_enabled(False)
model, _ = load_smollm2(dtype=torch.bfloat16)
heads = DraftHeads.bundled()
print("vocab", len(heads.vocab_ids), "hidden", heads.hidden_size)
for dt in (torch.float32, torch.bfloat16):
    b = bind(heads, model, dt)
    h = torch.randn(heads.hidden_size, dtype=torch.bfloat16)
    for depth in (1, 6):
        ts = []
        for _ in range(30):
            t = time.perf_counter()
            feature_propose(b, h, 100, 63, depth, 8, 4)
            ts.append(time.perf_counter() - t)
        print(dt, depth, f"{min(ts)*1000:.2f} ms min, {np.median(ts)*1000:.2f} median")
    with torch.profiler.profile() as prof:
        for _ in range(10):
            feature_propose(b, h, 100, 63, 6, 8, 4)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
