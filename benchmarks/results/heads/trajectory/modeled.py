"""How much one prompt's decode moves under a change that should not matter, beside what the heads change: each
prompt decoded by several decoders, each step priced on one fixed cost curve (no clock in the comparison).

    PYTHONPATH=. python benchmarks/results/heads/trajectory/modeled.py [--prompts 8] [--out FILE.json]

SmolLM2-135M fp32, 2 threads, 128 new tokens, greedy, a fresh decoder per prompt. Every decoder prices with the
curve the decoder keeps for this model on this machine (the calibrated, persisted one: the same object for every
run), so a decode is deterministic. A prompt's *modeled time* is the sum over its forwards of that curve at the
forward's rows, plus the heads' own priced seconds for every tree they drafted (pinned: 1 ms a level, about what
the heads cost inside a decode on this CPU, ``cost_in_decode.txt``). Variants:

- ``default``: ``LookaheadDecoder()`` (drafts from the corpus kept for the model);
- ``margin-1.03`` / ``margin-1.07`` / ``decay-0.965`` / ``decay-0.975``: the default with one budget setting
  moved a little (``BudgetTuning.margin`` 1.05, ``decay`` 0.97; a margin moved by 0.01 or 0.02 changed no
  decision): changes no one would expect to make a prompt faster or slower, which show how far a prompt's decode
  moves when any small decision changes;
- ``heads``: ``LookaheadDecoder(heads=DraftHeads.bundled())`` (no corpus beside the heads, as ``corpus="auto"``);
- ``heads+corpus``: the heads beside the bundled corpus.

Prints, per workload and variant, modeled time over the default's per prompt (geomean, range) and tokens per call.
"""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import torch

from lookahead import LookaheadDecoder, call
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.corpus import DraftCorpus
from lookahead.heads import DraftHeads, HeadsSource
from lookahead.models import load_smollm2
from lookahead.tuning import BudgetTuning

WORKLOADS = ("code-completion", "code-editing", "chat")
HEADS_COST = (0.0, 0.001)  # seconds: base, per level


def variants(heads: DraftHeads, corpus: DraftCorpus) -> dict:
    return {
        "default": lambda: LookaheadDecoder(),
        "margin-1.03": lambda: LookaheadDecoder(tuning=BudgetTuning(margin=1.03)),
        "margin-1.07": lambda: LookaheadDecoder(tuning=BudgetTuning(margin=1.07)),
        "decay-0.965": lambda: LookaheadDecoder(tuning=BudgetTuning(decay=0.965)),
        "decay-0.975": lambda: LookaheadDecoder(tuning=BudgetTuning(decay=0.975)),
        "heads": lambda: LookaheadDecoder(heads=heads),
        "heads+corpus": lambda: LookaheadDecoder(heads=heads, corpus=corpus),
    }


def count_rows() -> list[int]:
    """A list that every later target forward (``call.forward``) appends its input rows to; clear it per decode."""
    rows: list[int] = []
    forward = call.forward

    def counting(setup, stats, ids, *a, **k):
        rows.append(int(ids.shape[1]))
        return forward(setup, stats, ids, *a, **k)

    call.forward = counting
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(2)
    model, tok = load_smollm2(dtype=torch.float32)
    heads = DraftHeads.bundled(cost=HEADS_COST, dtype="bfloat16")
    corpus = DraftCorpus.bundled()
    rows = count_rows()
    makers = variants(heads, corpus)
    records = []
    items = build_workloads(list(WORKLOADS), args.prompts)
    model.generate(**encode(items[WORKLOADS[0]][0], tok, "cpu"), max_new_tokens=8, do_sample=False,
                   custom_generate=LookaheadDecoder())  # the curve found (or measured) once, before any timed run
    for workload in WORKLOADS:
        for prompt in items[workload]:
            enc = encode(prompt, tok, "cpu")
            reference = None
            for name, make in makers.items():
                decoder = make()
                rows.clear()
                out = model.generate(**enc, max_new_tokens=128, do_sample=False, custom_generate=decoder)
                if reference is None:
                    reference = out
                cost = decoder.policy.budget.cost if decoder.policy.budget is not None else None
                source = next((s for s in decoder.policy.sources if isinstance(s, HeadsSource)), None)
                modeled = float(np.sum(cost(np.array(rows)))) if cost is not None else float("nan")
                depths = np.array(source_depths.pop(id(source), []) if source is not None else [])
                heads_s = float(np.sum(source.seconds(depths))) if source is not None else 0.0
                s = decoder.stats
                records.append({"workload": workload, "prompt": prompt.id, "variant": name,
                                "calls": s.target_calls, "tokens": s.new_tokens, "forward_modeled_s": modeled,
                                "heads_modeled_s": heads_s, "identical": bool(torch.equal(out, reference))})
                print(json.dumps(records[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f, indent=1)
    report(records)


source_depths: dict[int, list[int]] = {}
_propose = HeadsSource.propose


def _recording(self, context, max_nodes, max_depth):
    proposal = _propose(self, context, max_nodes, max_depth)
    if proposal is not None:
        source_depths.setdefault(id(self), []).append(min(max_depth, self.limits()[1]))
    return proposal


HeadsSource.propose = _recording


def report(records: list[dict]) -> None:
    by = {(r["workload"], r["prompt"], r["variant"]): r for r in records}
    names = list(dict.fromkeys(r["variant"] for r in records))
    for workload in WORKLOADS:
        prompts = list(dict.fromkeys(r["prompt"] for r in records if r["workload"] == workload))
        for name in names:
            ratios, calls, tokens = [], 0, 0
            for p in prompts:
                r, d = by[(workload, p, name)], by[(workload, p, "default")]
                ratios.append((r["forward_modeled_s"] + r["heads_modeled_s"]) / d["forward_modeled_s"])
                calls, tokens = calls + r["calls"], tokens + r["tokens"]
            print(f"{workload:16s} {name:13s} modeled time / default's per prompt: {spread(ratios)}  "
                  f"tokens/call {tokens / calls:.2f}  {sorted(round(x, 2) for x in ratios)}")


def spread(ratios: list[float]) -> str:
    """'geomean G range A-B' of per-prompt ratios."""
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    return f"geomean {geo:.3f} range {min(ratios):.2f}-{max(ratios):.2f}"


if __name__ == "__main__":
    main()
