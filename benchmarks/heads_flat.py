"""Tokens per target call on a flat cost curve (the GPU regime), task family by family: the default decoder
without heads, and with each draft-heads folder given (their own cost pinned at ``HEADS_FLAT_COST``, the bundled
corpus beside them, as ``heads="auto"`` drafts for the bundled model). Every output is compared with plain's.

    python -m benchmarks.heads_flat --out FILE.json [--prompts-per-workload 3] HEADS_DIR [HEADS_DIR ...]

SmolLM2-135M-Instruct in fp32 on the CPU, greedy, 128 new tokens; a fresh decoder per prompt. Writes per family and
method: new tokens, target calls (counted on the model's decoder), tokens per call, whether every output was plain's.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

import torch

FAMILIES = ("code-completion", "code-editing", "chat", "qa", "translation", "summarization", "math", "rag",
            "multi-turn")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("heads", nargs="*", help="folders of saved draft heads (DraftHeads.load)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts-per-workload", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    from lookahead.corpus import DraftCorpus
    from lookahead.heads import DraftHeads
    from lookahead.tools.bench.methods import HEADS_FLAT_COST, METHODS, Method, decoder_method
    from lookahead.tools.bench.runner import run_bench
    from lookahead.tools.bench.workloads import build_workloads
    from lookahead.tools.models import load_smollm2

    torch.set_num_threads(args.threads)
    model, tok = load_smollm2()
    methods = [METHODS["plain"](), METHODS["lookahead-flat-no-heads"]()]
    for folder in args.heads:
        heads = DraftHeads.load(folder).with_settings(cost=HEADS_FLAT_COST)
        name = f"flat+{folder.rstrip('/')}"
        methods.append(Method(name, "", factory=functools.partial(
            decoder_method, name, cost_curve="flat", heads=heads, corpus=DraftCorpus.bundled())).fresh())
    res = run_bench(model, tok, build_workloads(list(FAMILIES), args.prompts_per_workload), methods,
                    max_new_tokens=128, progress=False)
    table: dict = {}
    for r in res["records"]:
        if r["method"] == "plain":
            continue
        cell = table.setdefault(r["workload"], {}).setdefault(
            r["method"], {"prompts": 0, "new_tokens": 0, "target_calls": 0, "identical": True})
        cell["prompts"] += 1
        cell["new_tokens"] += r["new_tokens"]
        cell["target_calls"] += r["target_calls"]
        cell["identical"] &= bool(r["identical_to_plain"])
    for cells in table.values():
        for cell in cells.values():
            cell["tokens_per_call"] = round(cell["new_tokens"] / max(cell["target_calls"], 1), 3)
    given = sys.argv[1:] if argv is None else argv
    out = {"command": "python -m benchmarks.heads_flat " + " ".join(given), "context": res["context"],
           "heads_cost_seconds": HEADS_FLAT_COST, "families": table}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    for family, cells in table.items():
        print(family, {m: c["tokens_per_call"] for m, c in cells.items()})


if __name__ == "__main__":
    main()
