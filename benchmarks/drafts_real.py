"""Real decoding runs of the draft sources on recorded prompts: tokens per target call and exactness.

    python -m benchmarks.drafts_real benchmarks/results/replay-smollm2-16.json [--prompts 16] \\
        [--methods default,no-model,prompt-lookup] [--scope workload|run|prompt] [--curve flat|recorded] \
        [--sample] [--out runs.json]

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
(``tree_nodes=0, copy_nodes=0``); ``window`` / ``window-w8`` (the lookahead window on, W=4 / W=8 and G=8);
``prompt-lookup``: transformers' prompt lookup decoding
(``prompt_lookup_num_tokens=10``), its target calls counted by a forward pre-hook, in the same run.

``--sample``: temperature 0.7, top-p 0.9 (the bench's sampling), ``torch.manual_seed(i)`` before the
i-th prompt of every method; outputs are then the same *distribution* as plain sampling, not the
same tokens, and "identical" is not reported.
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
    "window": {"window_width": 4, "window_candidates": 4},  # the Jacobi lookahead window (W=4, N=4, G=4)
    "window-w8": {"window_width": 8, "window_candidates": 8},
}


PROMPT_LOOKUP = "prompt-lookup"


def run(model, records: dict, methods: list[str], prompts: int, curve, workloads: list[str] | None = None,
        progress: bool = True, scope: str = "workload", sample: bool = False) -> dict:
    """Per method: per prompt id {calls, tokens, identical, seconds}, and per workload the totals."""


    chosen = {}
    for pid, r in records["prompts"].items():
        wl = r["workload"]
        if (workloads is None or wl in workloads) and sum(1 for p in chosen.values() if p["workload"] == wl) < prompts:
            chosen[pid] = r
    out = {}
    forwards = [0]
    hook = model.register_forward_pre_hook(lambda *a: forwards.__setitem__(0, forwards[0] + 1))
    try:
        for method in methods:
            out[method] = _run_method(model, chosen, method, curve, scope, sample, progress, forwards)
    finally:
        hook.remove()
    return out


def _run_method(model, chosen: dict, method: str, curve, scope: str, sample: bool, progress: bool,
                forwards: list[int]) -> dict:
    import torch

    from lookahead import LookaheadConfig, LookaheadDecoder
    from lookahead.bench.runner import _generate_kwargs

    lookup = method == PROMPT_LOOKUP
    config = None if lookup else LookaheadConfig(cost_curve=tuple(map(tuple, curve)), **METHODS[method])
    dec, current = None, None
    per = {}
    for i, (pid, r) in enumerate(chosen.items()):
        if not lookup and (dec is None or scope == "prompt" or (scope == "workload" and r["workload"] != current)):
            dec, current = LookaheadDecoder(config), r["workload"]
        ids = torch.tensor([r["prompt"]])
        kwargs = _generate_kwargs(model, r["max_new_tokens"], sample)
        kwargs.update({"prompt_lookup_num_tokens": 10} if lookup else {"custom_generate": dec})
        torch.manual_seed(i)
        forwards[0] = 0
        t = time.perf_counter()
        with torch.inference_mode():
            seq = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
        got = seq[0, len(r["prompt"]):].tolist()
        tokens = len(got) if lookup else dec.stats.new_tokens
        calls = forwards[0] if lookup else dec.stats.target_calls
        per[pid] = {"workload": r["workload"], "calls": calls, "tokens": tokens,
                    "identical": None if sample else got == r["output"], "seconds": time.perf_counter() - t,
                    "accepted_by_origin": {} if lookup else dict(dec.stats.accepted_by_origin)}
        if progress:
            same = "sampled" if sample else "same" if per[pid]["identical"] else "DIFFERENT"
            print(f"{method:10s} {pid:28s} {r['workload']:16s} {tokens / calls:5.2f} tokens/call {same} "
                  f"{per[pid]['accepted_by_origin']}", file=sys.stderr, flush=True)
    summary = {}
    for wl in dict.fromkeys(p["workload"] for p in per.values()):
        rows = [p for p in per.values() if p["workload"] == wl]
        summary[wl] = {"prompts": len(rows), "tokens_per_call": sum(p["tokens"] for p in rows)
                       / sum(p["calls"] for p in rows),
                       "identical": None if sample else sum(p["identical"] for p in rows)}
    return {"per_prompt": per, "summary": summary}


def table(results: dict) -> str:
    lines = ["| workload | method | prompts | tokens/call | identical to plain |", "|---|---|---:|---:|---:|"]
    first = next(iter(results.values()))
    for wl in first["summary"]:
        for method, res in results.items():
            s = res["summary"][wl]
            same = "sampled" if s["identical"] is None else f"{s['identical']}/{s['prompts']}"
            lines.append(f"| {wl} | {method} | {s['prompts']} | {s['tokens_per_call']:.2f} | {same} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.drafts_real", description=__doc__.split("\n\n")[0])
    ap.add_argument("recording")
    ap.add_argument("--prompts", type=int, default=16, help="prompts per workload (default 16)")
    ap.add_argument("--methods", default="default,no-model",
                    help=f"comma-separated, of {', '.join([*METHODS, PROMPT_LOOKUP])}")
    ap.add_argument("--sample", action="store_true", help="temperature 0.7, top-p 0.9 instead of greedy")
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
                  scope=args.scope, sample=args.sample)
    print(table(results))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
