"""What a cheaper 5-64-row fp32 step would buy, in the policy replay (timing-free): the 16-prompt recording replayed
on two step curves read as steps, both from one interleaved ``onednn_layout.py`` run (fp32, 7 rounds): the best
of ``nn.Linear`` and the other way round at each size (the decoder's layouts), and the same with oneDNN's linear
where it was cheaper (5 rows and up). Prints the modelled median speed-up and tokens per call per workload.

Run from the repository root: ``PYTHONPATH=. python benchmarks/results/host-step/replay_onednn.py``
"""
import json

from benchmarks.replay import replay_all
from lookahead import LookaheadConfig
from lookahead.cost import CostModel

# relative to the one-row step (onednn_layout.py float32 7); nn.Linear at 1 row, the cheaper layout above
LAYOUTS = {1: 1.0, 2: 0.77, 3: 1.01, 4: 1.09, 5: 1.43, 6: 1.73, 8: 1.61, 12: 1.87, 16: 1.71, 24: 2.24, 32: 2.29,
           48: 3.08, 64: 3.63}
WITH_ONEDNN = {**LAYOUTS, 6: 1.35, 8: 1.41, 12: 1.63, 16: 1.64, 24: 1.90, 32: 2.01, 48: 2.72, 64: 3.22}

with open("benchmarks/results/replay-smollm2-16.json") as f:
    rec = json.load(f)
for name, curve in (("layouts", LAYOUTS), ("layouts + oneDNN", WITH_ONEDNN)):
    cost = CostModel([(k, 0.06 * v) for k, v in curve.items()], steps=True)
    s = replay_all(rec, LookaheadConfig(), cost)
    print(name, {wl: (round(v["speedup_median"], 3), round(v["tokens_per_call"], 2)) for wl, v in s["summary"].items()})
