"""One decoder reused across prompts, its acceptance estimates carried from call to call
(``BudgetTuning.carry_trials``) or not, each step priced on the kept CPU curve (no clock in the comparison).

    PYTHONPATH=. python benchmarks/results/estimates/carry_modeled.py [--prompts 8] [--carry 0,2,4,8] [--out FILE.json]

SmolLM2-135M fp32, 2 threads, 128 new tokens, greedy. Per ``carry_trials`` value, one ``LookaheadDecoder`` decodes
every prompt of the three workloads in one sequence, the workloads interleaved (completion, edit, chat, completion,
...), as a script that serves mixed requests would; then again with the workloads one after another. A prompt's
*modeled time* is the kept curve summed over its forwards' rows (as ``heads/trajectory/modeled.py``). Prints, per
order, workload and value, modeled time over ``carry_trials=0``'s per prompt (geomean, range) and tokens per call.
Every output is checked against the first value's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from lookahead import LookaheadDecoder
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.models import load_smollm2
from lookahead.tuning import BudgetTuning

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "heads" / "trajectory"))
from modeled import count_rows, spread  # noqa: E402

WORKLOADS = ("code-completion", "code-editing", "chat")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--carry", default="0,2,4,8")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    model, tok = load_smollm2(dtype=torch.float32)
    rows = count_rows()
    items = build_workloads(list(WORKLOADS), args.prompts)
    interleaved = [(w, items[w][i]) for i in range(args.prompts) for w in WORKLOADS]
    grouped = [(w, p) for w in WORKLOADS for p in items[w]]
    model.generate(**encode(interleaved[0][1], tok, "cpu"), max_new_tokens=8, do_sample=False,
                   custom_generate=LookaheadDecoder())
    records, reference = [], {}
    for order, sequence in (("interleaved", interleaved), ("grouped", grouped)):
        for carry in (float(c) for c in args.carry.split(",")):
            decoder = LookaheadDecoder(tuning=BudgetTuning(carry_trials=carry))
            for workload, prompt in sequence:
                rows.clear()
                out = model.generate(**encode(prompt, tok, "cpu"), max_new_tokens=128, do_sample=False,
                                     custom_generate=decoder)
                key = (workload, prompt.id)
                reference.setdefault(key, out)
                s = decoder.stats
                records.append({"order": order, "carry": carry, "workload": workload, "prompt": prompt.id,
                                "calls": s.target_calls, "tokens": s.new_tokens,
                                "modeled_s": float(np.sum(decoder.policy.budget.cost(np.array(rows)))),
                                "identical": bool(torch.equal(out, reference[key]))})
                print(json.dumps(records[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)
    report(records)


def report(records: list[dict]) -> None:
    by = {(r["order"], r["carry"], r["prompt"]): r for r in records}
    for order in dict.fromkeys(r["order"] for r in records):
        carries = list(dict.fromkeys(r["carry"] for r in records if r["order"] == order))
        for workload in WORKLOADS:
            prompts = list(dict.fromkeys(r["prompt"] for r in records if r["workload"] == workload))
            for carry in carries:
                ratios = [by[(order, carry, p)]["modeled_s"] / by[(order, carries[0], p)]["modeled_s"] for p in prompts]
                calls = sum(by[(order, carry, p)]["calls"] for p in prompts)
                tokens = sum(by[(order, carry, p)]["tokens"] for p in prompts)
                same = all(by[(order, carry, p)]["identical"] for p in prompts)
                print(f"{order:11s} {workload:16s} carry {carry:4.0f}: modeled time / carry {carries[0]:.0f}'s per prompt "
                      f"{spread(ratios)}  tokens/call {tokens / calls:.2f}  identical {same}")


if __name__ == "__main__":
    main()
