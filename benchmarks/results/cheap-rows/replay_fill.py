"""The frequent tokens on and off in the policy replay (timing-free): modelled speed-up and tokens per call on the
16-prompt recording, on the flat curve and on this CPU's fp32 and bf16 step curves read as steps. The replay has
no logits, so the model-prediction source is off in it and more steps have nothing else to draft than in a decode.

Run from the repository root: ``PYTHONPATH=. python benchmarks/results/cheap-rows/replay_fill.py``
"""
import json

from benchmarks.replay import FLAT_CURVE, replay_all
from lookahead import LookaheadConfig
from lookahead.cost import CostModel


def measured_curve(run: str) -> CostModel:
    """The step curve the decoder priced with in one of this folder's bench runs (read as steps)."""
    with open(f"benchmarks/results/cheap-rows/{run}/bench.json") as f:
        records = json.load(f)["records"]
    stats = next(r["decoder_stats"] for r in records if r["method"] == "lookahead")
    return CostModel([tuple(p) for p in stats["cost_curve"]], steps=True)


with open("benchmarks/results/replay-smollm2-16.json") as f:
    rec = json.load(f)
curves = {"flat": CostModel(FLAT_CURVE), "fp32-steps": measured_curve("float32-greedy"),
          "bf16-steps": measured_curve("bfloat16-greedy")}
for name, cost in curves.items():
    for fill in (3, 0):
        s = replay_all(rec, LookaheadConfig(fill_nodes=fill), cost)
        print(name, "fill", fill, {wl: (round(v["speedup_median"], 3), round(v["tokens_per_call"], 2))
                                   for wl, v in s["summary"].items()})
