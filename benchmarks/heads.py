"""Trained draft heads on SmolLM2: tokens per call with a flat cost curve, speed on this CPU, and the plots.

    python -m benchmarks.heads bench --curve flat [--kinds medusa,feature] [--heads DIR] [--heads-cost B,L] \
        [--out FILE.json]
    python -m benchmarks.heads bench --curve cpu --kinds medusa [--repeats 3] [--out FILE.json]
    python -m benchmarks.heads bench --curve cpu --kinds feature --heads-dtype float32,auto  # one method per dtype
    python -m benchmarks.heads plot TRAIN_REPORT.json --out curve.png

``bench`` runs the benchmark's own runner (``lookahead.bench.runner.run_bench``) on the workloads chat,
code-editing and code-completion (4 prompts each, 128 new tokens, greedy, a fresh decoder per prompt) with the
methods ``plain``, ``lookahead`` (the default decoder) and ``lookahead+heads-KIND`` (the default decoder plus
the heads of ``--heads``, by default the bundled ones). ``--curve flat`` prices every step with
``((1, .010), (2, .010), (256, .0102))`` (the GPU regime: tokens per call is the speed-up, independent of
this machine's timing); ``--curve cpu`` uses each decoder's calibrated curve of this CPU (the speed figures).
``--heads-cost BASE,PER_LEVEL`` pins the heads' own seconds per step (``HeadsSettings.cost``) instead of
measuring them here: with the flat curve, a GPU's cost of the heads rather than this CPU's.
It prints, per workload and method, tokens per call, identical outputs, accepted draft tokens by origin and
the speed ratio against plain, and per prompt the ratio of ``lookahead+heads`` to ``lookahead`` time (with
``--aa`` also of a second run of ``lookahead``: the noise floor of that ratio).

``plot`` draws the training loss curves of a ``heads_train`` run's ``report.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections import Counter

WORKLOADS = ("chat", "code-editing", "code-completion")


def heads_method(name: str, heads, config):
    from lookahead import LookaheadDecoder
    from lookahead.bench.methods import Method

    def make():
        return Method(name, f"LookaheadDecoder({config}, heads={heads!r})",
                      settings={**dataclasses.asdict(config), "heads": repr(heads)},
                      decoder=LookaheadDecoder(config, heads=heads))

    m = make()
    m.factory = make
    return m


def decoder_method(name: str, config):
    from lookahead import LookaheadDecoder
    from lookahead.bench.methods import Method

    def make():
        return Method(name, f"LookaheadDecoder({config})", settings=dataclasses.asdict(config),
                      decoder=LookaheadDecoder(config))

    m = make()
    m.factory = make
    return m


def summary(result: dict) -> dict:
    """Per workload and method: tokens per call, identical outputs, accepted tokens by origin, speed-ups."""
    out: dict = {}
    for rec in result["records"]:
        if rec.get("status") != "ok":
            continue
        row = out.setdefault(rec["workload"], {}).setdefault(rec["method"], {
            "tokens": 0, "calls": 0, "identical": 0, "prompts": 0, "accepted_by_origin": Counter(),
            "drafted_by_origin": Counter(), "speedups": [], "wall": []})
        row["tokens"] += rec["new_tokens"]
        row["calls"] += rec["target_calls"]
        row["identical"] += bool(rec["identical_to_plain"])
        row["prompts"] += 1
        row["speedups"].append(rec.get("speedup_vs_plain"))
        row["wall"].append(rec["wall_s"])
        stats = rec.get("decoder_stats") or {}
        row["accepted_by_origin"].update(stats.get("accepted_by_origin") or {})
        row["drafted_by_origin"].update(stats.get("drafted_by_origin") or {})
    for methods in out.values():
        for row in methods.values():
            row["tokens_per_call"] = row["tokens"] / row["calls"]
            ups = [s for s in row["speedups"] if s is not None]
            row["speedup_median"] = statistics.median(ups) if ups else None
            row["speedup_min"] = min(ups) if ups else None
            row["accepted_by_origin"] = dict(row["accepted_by_origin"])
            row["drafted_by_origin"] = dict(row["drafted_by_origin"])
        base = methods.get("lookahead")
        for name, row in methods.items():
            if name != "lookahead" and name.startswith("lookahead") and base is not None:
                row["time_vs_lookahead"] = [round(a / b, 3) for a, b in zip(row["wall"], base["wall"])]
    return out


def bench(args) -> int:
    import torch

    from lookahead import LookaheadConfig
    from lookahead.bench.methods import plain
    from lookahead.bench.runner import run_bench
    from lookahead.bench.workloads import build_workloads
    from lookahead.heads import DraftHeads
    from lookahead.models import load_smollm2

    from .replay import FLAT_CURVE

    torch.set_num_threads(args.threads)
    model, tok = load_smollm2(dtype=getattr(torch, args.dtype))
    config = LookaheadConfig(cost_curve=FLAT_CURVE) if args.curve == "flat" else LookaheadConfig()
    methods = [plain(), decoder_method("lookahead", config)]
    if args.aa:  # the default decoder twice: how far its per-prompt time moves by chance
        methods.append(decoder_method("lookahead-again", config))
    dtypes = args.heads_dtype.split(",")
    for kind in args.kinds.split(","):
        cost = None if args.heads_cost is None else tuple(float(c) for c in args.heads_cost.split(","))
        for dtype in dtypes:
            heads = (DraftHeads.load(f"{args.heads}/{kind}", cost=cost, dtype=dtype) if args.heads else
                     DraftHeads.bundled(kind, cost=cost, dtype=dtype))
            name = f"lookahead+heads-{kind}" + (f"-{dtype}" if len(dtypes) > 1 else "")
            methods.append(heads_method(name, heads, config))
    workloads = build_workloads(list(WORKLOADS), args.prompts)
    result = run_bench(model, tok, workloads, methods, max_new_tokens=args.tokens, progress=not args.no_progress,
                       model_name="SmolLM2-135M-Instruct (bundled)", command="python -m benchmarks.heads "
                       + " ".join(sys.argv[1:]), repeats=args.repeats)
    result["heads_summary"] = summary(result)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, default=str)
    for wl, methods_ in result["heads_summary"].items():
        for name, row in methods_.items():
            extra = f" time/lookahead {row['time_vs_lookahead']}" if "time_vs_lookahead" in row else ""
            speed = (f" speed-up median {row['speedup_median']:.2f} min {row['speedup_min']:.2f}"
                     if row["speedup_median"] else "")
            print(f"{wl:16s} {name:24s} tokens/call {row['tokens_per_call']:.2f} identical "
                  f"{row['identical']}/{row['prompts']}{speed} accepted {row['accepted_by_origin']}{extra}")
    return 1 if result["mismatches"] else 0


def plot(args) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    with open(args.report, encoding="utf-8") as f:
        report = json.load(f)
    fig, ax = plt.subplots(figsize=(7, 4))
    for kind, losses in report["losses"].items():
        losses = np.asarray(losses)
        span = max(1, len(losses) // 60)
        smooth = np.convolve(losses, np.ones(span) / span, mode="valid")
        ax.plot(np.arange(len(smooth)) + span, smooth, label=f"{kind} (mean over {span} steps)")
    ax.set_xlabel("training step (256 rows each)")
    ax.set_ylabel("weighted loss over the K heads / levels")
    ax.set_title("Draft heads for SmolLM2-135M-Instruct: training loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.heads", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--curve", choices=["flat", "cpu"], default="flat")
    b.add_argument("--kinds", default="medusa,feature")
    b.add_argument("--heads", default=None, help="a heads_train output folder (default: the bundled heads)")
    b.add_argument("--prompts", type=int, default=4)
    b.add_argument("--tokens", type=int, default=128)
    b.add_argument("--repeats", type=int, default=1)
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--heads-cost", default=None, metavar="BASE,PER_LEVEL",
                   help="pin the heads' own seconds per step (default: measured on this machine)")
    b.add_argument("--aa", action="store_true", help="also run the default decoder a second time (A/A control)")
    b.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    b.add_argument("--heads-dtype", default="auto", metavar="DTYPE[,DTYPE]",
                   help="what the heads compute in (HeadsSettings.dtype: auto, float32, bfloat16); several, "
                        "comma-separated: one method each")
    b.add_argument("--out", default=None)
    b.add_argument("--no-progress", action="store_true")
    p = sub.add_parser("plot")
    p.add_argument("report")
    p.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    return bench(args) if args.command == "bench" else plot(args)


if __name__ == "__main__":
    sys.exit(main())
