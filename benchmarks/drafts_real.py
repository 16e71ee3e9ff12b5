"""Real decoding runs of the draft sources on recorded prompts: tokens per target call and exactness.

    python -m benchmarks.drafts_real benchmarks/results/replay-smollm2-16.json [--prompts 16] \\
        [--methods default,no-model] [--scope workload|run|prompt] [--curve flat|recorded] [--out runs.json]

The replay (``benchmarks/replay.py``) cannot run the model-prediction source exactly: it learns from
every verified row's logits, the rejected rows' included, which a recording lacks. This runs the
real :class:`~lookahead.LookaheadDecoder` on SmolLM2 over the recording's first ``--prompts`` prompts of
each workload (the recorded prompt ids, the recorded ``max_new_tokens``) and compares every output
with the recorded plain greedy one, token for token. With ``--curve flat`` (default) the budget
prices steps with :data:`benchmarks.replay.FLAT_CURVE`, the GPU regime, where tokens per call is the
speed-up; ``recorded`` uses the recording's calibrated CPU curve. Several methods run one after the
other. ``--scope`` says how long one decoder lives: ``workload`` (default: one per method and workload,
reused across that workload's prompts in recording order, as a server answering one kind of request;
with ``recycle_keep`` the successor table carries over), ``run`` (one per method, across all the
workloads in turn) or ``prompt`` (a fresh decoder per prompt: every table starts empty).

Methods (``LookaheadConfig`` fields over the default): ``default``; ``no-model`` (``recycle_k=0``);
``no-keep`` (``recycle_keep=False``); ``trie-only`` (``copy_nodes=0, recycle_k=0``); ``model-only``
(``tree_nodes=0, copy_nodes=0``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

METHODS = {
    "default": {},
    "no-model": {"recycle_k": 0},
    "no-keep": {"recycle_keep": False},
    "trie-only": {"copy_nodes": 0, "recycle_k": 0},
    "model-only": {"tree_nodes": 0, "copy_nodes": 0},
}


def run(model, records: dict, methods: list[str], prompts: int, curve, workloads: list[str] | None = None,
        progress: bool = True, scope: str = "workload") -> dict:
    """Per method: per prompt id {calls, tokens, identical, seconds}, and per workload the totals."""
    import torch

    from lookahead import LookaheadConfig, LookaheadDecoder
    from lookahead.bench.runner import _generate_kwargs

    chosen = {}
    for pid, r in records["prompts"].items():
        wl = r["workload"]
        if (workloads is None or wl in workloads) and sum(1 for p in chosen.values() if p["workload"] == wl) < prompts:
            chosen[pid] = r
    out = {}
    for method in methods:
        config = LookaheadConfig(cost_curve=tuple(map(tuple, curve)), **METHODS[method])
        dec, current = None, None
        per = {}
        for pid, r in chosen.items():
            if dec is None or scope == "prompt" or (scope == "workload" and r["workload"] != current):
                dec, current = LookaheadDecoder(config), r["workload"]
            ids = torch.tensor([r["prompt"]])
            t = time.perf_counter()
            with torch.inference_mode():
                seq = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), custom_generate=dec,
                                     **_generate_kwargs(model, r["max_new_tokens"], False))
            got = seq[0, len(r["prompt"]):].tolist()
            s = dec.stats
            per[pid] = {"workload": r["workload"], "calls": s.target_calls, "tokens": s.new_tokens,
                        "identical": got == r["output"], "seconds": time.perf_counter() - t,
                        "accepted_by_origin": dict(s.accepted_by_origin)}
            if progress:
                print(f"{method:10s} {pid:28s} {r['workload']:16s} {s.new_tokens / s.target_calls:5.2f} tokens/call "
                      f"{'same' if per[pid]['identical'] else 'DIFFERENT'} {dict(s.accepted_by_origin)}",
                      file=sys.stderr, flush=True)
        summary = {}
        for wl in dict.fromkeys(p["workload"] for p in per.values()):
            rows = [p for p in per.values() if p["workload"] == wl]
            summary[wl] = {"prompts": len(rows), "tokens_per_call": sum(p["tokens"] for p in rows)
                           / sum(p["calls"] for p in rows), "identical": sum(p["identical"] for p in rows)}
        out[method] = {"per_prompt": per, "summary": summary}
    return out


def table(results: dict) -> str:
    lines = ["| workload | method | prompts | tokens/call | identical to plain |", "|---|---|---:|---:|---:|"]
    first = next(iter(results.values()))
    for wl in first["summary"]:
        for method, res in results.items():
            s = res["summary"][wl]
            lines.append(f"| {wl} | {method} | {s['prompts']} | {s['tokens_per_call']:.2f} | "
                         f"{s['identical']}/{s['prompts']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.drafts_real", description=__doc__.split("\n\n")[0])
    ap.add_argument("recording")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per workload (default 16)")
    ap.add_argument("--methods", default="default,no-model", help=f"comma-separated, of {', '.join(METHODS)}")
    ap.add_argument("--workloads", default="code-completion,code-editing,chat")
    ap.add_argument("--curve", choices=["flat", "recorded"], default="flat")
    ap.add_argument("--scope", choices=["workload", "run", "prompt"], default="workload",
                    help="how long one decoder (and its successor table) lives (default: workload)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args(argv)

    import torch

    from benchmarks.replay import FLAT_CURVE
    from lookahead.models import load_smollm2

    torch.set_num_threads(args.threads)
    with open(args.recording, encoding="utf-8") as f:
        records = json.load(f)
    model, _ = load_smollm2()
    curve = FLAT_CURVE if args.curve == "flat" else records["cost_curve"]
    results = run(model, records, args.methods.split(","), args.prompts, curve, args.workloads.split(","),
                  scope=args.scope)
    print(table(results))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
