"""The budget's estimates on recorded outputs, noise-free: variants of its constants, its headroom, its calibration.

Each variant is :class:`~lookahead._tuning.Tuning` with some fields replaced; every recorded prompt is
replayed with a fresh decoder (:func:`benchmarks.replay.replay`) on three cost curves: the recording's own
(the machine it was recorded on), a step curve (``--curve``, default this CPU family's fp32 step curve
at 2 threads) and a bf16-like one, and the flat GPU-like curve. Prompts are split into the benchmark's own
(``lookahead.tools.bench``'s first four per workload: the prompts the goals are measured on, which must not
steer the constants) and the others (the set the constants may be chosen on). For each split the mean
modelled speed-up and the worst prompt are printed, plus the code-editing median.

Two more views of the same recordings:

- ``--oracle``: the speed-up of a budget that knew, each step, how many of the proposed nodes would be
  accepted (it verifies exactly those, or nothing when they do not pay): how much the choice, not the
  drafts, leaves unused.
- ``--calibration [--plot PNG]``: a reliability table. Each step the sources' whole proposal (before the
  budget cut it) is judged against the recorded text, and each node's estimated probability is set
  beside whether it would have been accepted, over every prompt, binned.

Example::

    python -m benchmarks.replay_tuning benchmarks/results/replay-smollm2-16.json \\
        --variant margin=1.0 --variant depth_cells=16,margin=1.02 --oracle --calibration --plot calib.png
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from dataclasses import replace

import numpy as np

from benchmarks.replay import FLAT_CURVE, replay
from lookahead._tuning import DEFAULT, Tuning
from lookahead.cache import NgramTrie
from lookahead.config import LookaheadConfig
from lookahead.cost import CostModel
from lookahead.drafting.draft import ORIGINS
from lookahead.drafting.policy import DraftPolicy, Limits
from lookahead.verify.sampled import greedy_verify_argmax

STEP_FP32 = ((1, 0.0559), (2, 0.1019), (16, 0.1019), (32, 0.1212), (64, 0.1756))
"""fp32 step curve of SmolLM2-135M, 2 threads, 2-core AMD EPYC (AVX-512, no AMX): t(2..16) = 1.83 t(1)."""
STEP_BF16 = ((1, 0.0340), (2, 0.0340), (4, 0.0373), (8, 0.0402), (16, 0.0469), (32, 0.0599), (64, 0.0883))
"""bf16 step curve of the same model and machine: verification nearly free up to 8 tokens."""


def benchmark_prompt_ids() -> set[str]:
    """The prompt ids ``python -m lookahead bench --prompts-per-workload 4`` runs (the goals' prompts)."""
    from lookahead.tools.bench.workloads import build_workloads

    workloads = build_workloads(["code-completion", "code-editing", "chat"], 4)
    return {p.id for prompts in workloads.values() for p in prompts}


def parse_variant(text: str) -> tuple[str, dict]:
    """``"margin=1.0,depth_cells=16"`` -> (the text, {"margin": 1.0, "depth_cells": 16}); a list value (no commas
    split inside its brackets) becomes a tuple: ``"match_scale=[0.5,1,1.3]"`` -> {"match_scale": (0.5, 1, 1.3)}."""
    fields = {}
    for part in filter(None, re.split(r",(?![^\[]*\])", text)):
        name, _, value = part.partition("=")
        if name not in Tuning.__dataclass_fields__:
            raise ValueError(f"--variant: {name!r} is not a Tuning field")
        parsed = json.loads(value)
        fields[name] = tuple(parsed) if isinstance(parsed, list) else parsed
    return text, fields


def evaluate(records: dict, tuning: Tuning, cost: CostModel, held_out: set[str]) -> dict:
    """Per split (``tune``: prompts not in ``held_out``, ``held_out``), the mean and worst modelled speed-up;
    ``code_editing_median`` over every code-editing prompt."""
    config = LookaheadConfig()
    speed = {pid: replay(r["prompt"], r["output"], r["max_new_tokens"], config, cost, None, tuning)["speedup"]
             for pid, r in records["prompts"].items()}
    out = {}
    for split, ids in (("tune", [p for p in speed if p not in held_out]),
                       ("held_out", [p for p in speed if p in held_out])):
        values = [speed[p] for p in ids]
        out[split] = {"mean": statistics.mean(values), "worst": min(values), "prompts": len(values)} if values else None
    ce = [speed[p] for p, r in records["prompts"].items() if r["workload"] == "code-editing"]
    out["code_editing_median"] = statistics.median(ce) if ce else None
    return out


def _policy(tuning: Tuning, record: dict, cost: CostModel | None) -> DraftPolicy:
    """A fresh policy of the default config with ``tuning`` (no window, no model predictions: a recording has
    neither), started on ``record``."""
    tuning = replace(tuning, recycle_k=0)
    policy = DraftPolicy(LookaheadConfig(window=0), NgramTrie(max_n=tuning.ngram_size, capacity=tuning.trie_capacity),
                         None, tuning)
    policy.start(record["prompt"], Limits(len(record["prompt"]) + record["max_new_tokens"]), cost)
    return policy


def _walk(draft, output: list[int], i: int):
    """The greedy verdict of ``draft`` drafted before output position ``i`` (the recorded text decides)."""
    argmax = [output[i + d] if i + d < len(output) else -1 for d in [0, *draft.depth.tolist()]]
    return greedy_verify_argmax(argmax, draft.tokens.tolist(), draft.parents.tolist())


def oracle(record: dict, cost: CostModel) -> dict:
    """Modelled speed-up, target calls (the prefill included), the summed ``cost`` of the calls after the prefill
    (in the curve's units: no clock is read) and tokens per call of a budget that knew each step's outcome: of the
    full proposal it verifies the ``a`` nodes that will be accepted when ``(1 + a) / t(1 + a)`` beats
    ``1 / t(1)``, else nothing."""
    output = record["output"]
    policy = _policy(Tuning(adaptive=False), record, None)
    i, calls, priced = 0, 0, 0.0
    while i < len(output):
        length = len(record["prompt"]) + i
        draft = policy.draft(length, length, length - 1)
        nodes = _walk(draft, output, i).nodes
        if not (nodes and (1 + len(nodes)) / float(cost(1 + len(nodes))) > 1 / float(cost(1))):
            nodes = []
        emitted = output[i : i + len(nodes) + 1]
        policy.learn(draft.keep(list(nodes)), list(range(len(nodes))), emitted)
        priced += float(cost(1 + len(nodes))) if calls else 0.0  # the prefill left out, as replay() does
        calls += 1
        i += len(emitted)
    plain = (len(output) - 1) * float(cost(1))
    return {"speedup": plain / priced if priced else 1.0, "calls": calls, "modelled_cost": priced,
            "tokens_per_call": len(output) / calls}


def calibration(records: dict, cost: CostModel) -> dict[str, np.ndarray]:
    """Every proposed node of every step of the default decoder (replayed on ``cost``): ``predicted`` (the
    budget's probability), ``accepted`` (whether the recorded text would have accepted it) and ``origin``."""
    predicted, accepted, origin = [], [], []
    for record in records["prompts"].values():
        output = record["output"]
        full = _policy(Tuning(adaptive=False), record, None)  # the same sources, no cut
        policy = _policy(DEFAULT, record, cost)
        i = 0
        while i < len(output):
            length = len(record["prompt"]) + i
            proposal = full.draft(length, length, length - 1)
            if len(proposal):
                predicted.append(policy.budget.node_probabilities(proposal))
                hit = np.zeros(len(proposal), dtype=bool)
                hit[_walk(proposal, output, i).nodes] = True
                accepted.append(hit)
                origin.append(proposal.origin)
            draft = policy.draft(length, length, length - 1)
            verdict = _walk(draft, output, i)
            emitted = output[i : i + len(verdict.nodes) + 1]
            policy.learn(draft, verdict.nodes, emitted, None, 1 + len(draft), float(cost(1 + len(draft))))
            full.learn(proposal.keep([]), [], emitted)
            i += len(emitted)
    return {"predicted": np.concatenate(predicted), "accepted": np.concatenate(accepted),
            "origin": np.concatenate(origin)}


BINS = (0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def calibration_table(cal: dict[str, np.ndarray]) -> str:
    """Markdown: per bin of the estimate, the nodes, their mean estimate and how many were accepted (all, and
    per origin)."""
    origins = [k for k in range(len(ORIGINS)) if np.any(cal["origin"] == k)]
    lines = ["| estimated | nodes | mean estimate | accepted | "
             + " | ".join(f"accepted: {ORIGINS[k]}" for k in origins) + " |", "|---" * (4 + len(origins)) + "|"]
    p, a = cal["predicted"], cal["accepted"]
    for lo, hi in zip(BINS[:-1], BINS[1:]):
        m = (p >= lo) & ((p < hi) if hi < 1 else (p <= hi))
        if m.any():
            per = [f"{a[m & (cal['origin'] == k)].mean():.3f}" if np.any(m & (cal["origin"] == k)) else "-"
                   for k in origins]
            lines.append(f"| {lo:.2f}-{hi:.2f} | {int(m.sum())} | {p[m].mean():.3f} | {a[m].mean():.3f} | "
                         + " | ".join(per) + " |")
    return "\n".join(lines)


def plot_calibration(cal: dict[str, np.ndarray], path: str, title: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="calibrated")
    p, a = cal["predicted"], cal["accepted"]
    for k, name in enumerate(ORIGINS):
        sel = cal["origin"] == k
        xs, ys = [], []
        for lo, hi in zip(BINS[:-1], BINS[1:]):
            m = sel & (p >= lo) & ((p < hi) if hi < 1 else (p <= hi))
            if m.sum() >= 30:
                xs.append(p[m].mean())
                ys.append(a[m].mean())
        if xs:
            ax.plot(xs, ys, marker="o", label=f"{name} ({int(sel.sum())} nodes)")
    ax.set_xlabel("the budget's estimate of P(accepted)")
    ax.set_ylabel("accepted, judged by the recorded text")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replay_tuning", description=__doc__.split("\n\n")[0])
    parser.add_argument("recording")
    parser.add_argument("--variant", action="append", default=[], help="Tuning fields to replace, "
                        "e.g. margin=1.0,depth_cells=16 (repeatable; the default tuning always runs first)")
    parser.add_argument("--oracle", action="store_true", help="also the speed-up of a budget that knew each outcome")
    parser.add_argument("--calibration", action="store_true", help="also the estimates' reliability table")
    parser.add_argument("--plot", help="with --calibration: draw it (PNG) on the step-fp32 curve")
    args = parser.parse_args(argv)
    records = json.load(open(args.recording))
    curves = {"recorded": CostModel([tuple(p) for p in records["cost_curve"]]), "step-fp32": CostModel(list(STEP_FP32)),
              "step-bf16": CostModel(list(STEP_BF16)), "flat": CostModel(list(FLAT_CURVE))}
    held_out = benchmark_prompt_ids()
    base = DEFAULT
    print("| variant | curve | others: mean / worst | benchmark's: mean / worst | code editing median |")
    print("|---|---|---|---|---|")
    for label, fields in [("default", {})] + [parse_variant(v) for v in args.variant]:
        tuning = replace(base, **fields)
        for name, cost in curves.items():
            r = evaluate(records, tuning, cost, held_out)

            def cell(s):
                return f"{s['mean']:.3f} / {s['worst']:.3f} ({s['prompts']})" if s else "-"
            print(f"| {label} | {name} | {cell(r['tune'])} | {cell(r['held_out'])} | {r['code_editing_median']:.3f} |",
                  flush=True)
    workloads = list(dict.fromkeys(r["workload"] for r in records["prompts"].values()))
    if args.oracle:
        print("\n| curve | " + " | ".join(f"{wl}: default / oracle (median)" for wl in workloads) + " |")
        print("|---" * (1 + len(workloads)) + "|")
        for name, cost in curves.items():
            cells = []
            for wl in workloads:
                recs = [r for r in records["prompts"].values() if r["workload"] == wl]
                default = statistics.median(replay(r["prompt"], r["output"], r["max_new_tokens"], LookaheadConfig(),
                                                   cost)["speedup"] for r in recs)
                cells.append(f"{default:.2f}x / {statistics.median(oracle(r, cost)['speedup'] for r in recs):.2f}x")
            print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    if args.calibration:
        cal = calibration(records, curves["step-fp32"])
        print("\nEstimates against outcomes (step-fp32 curve, every proposed node of every step):\n")
        print(calibration_table(cal))
        if args.plot:
            plot_calibration(cal, args.plot, f"{len(records['prompts'])} recorded prompts, fresh decoder per prompt")
            print(f"\nwrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
