"""Every replayed prompt's target calls and budgets, recorded and flat curves, default and fixed policies."""

import json
import sys

from benchmarks.replay import FLAT_CURVE, replay_all
from lookahead.config import LookaheadConfig
from lookahead.cost import CostModel

out = {}
for name in ["replay-smollm2.json", "replay-smollm2-16.json"]:
    rec = json.load(open(f"benchmarks/results/{name}"))
    curve = CostModel(rec["cost_curve"]) if "cost_curve" in rec else None
    for label, cost in [("recorded", curve), ("flat", CostModel(FLAT_CURVE))]:
        for cname, cfg in [("default", LookaheadConfig()), ("fixed", LookaheadConfig(adaptive=False))]:
            r = replay_all(rec, cfg, cost)
            out[f"{name}/{label}/{cname}"] = {pid: (p["target_calls"], p["budgets"]) for pid, p in r["per_prompt"].items()}
json.dump(out, open(sys.argv[1], "w"))
print(len(out))
