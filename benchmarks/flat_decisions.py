"""The decoder's decisions on the flat cost curve (the GPU regime), with no clock involved: tokens per call and the
tokens of each prompt, with ``heads=None`` or, with ``--pinned-heads``, the bundled heads at a pinned cost (their
own cost is otherwise timed once per process, so a flat-curve call's choices vary from process to process). Run it
under two installs and compare the files::

    PYTHONPATH=/tmp/old_site python benchmarks/flat_decisions.py --out before.json   # from outside the checkout
    python -m benchmarks.flat_decisions --out after.json
    python -m benchmarks.flat_decisions --compare before.json after.json
"""

from __future__ import annotations

import argparse
import json
import statistics

FLAT = ((1, 0.010), (2, 0.010), (256, 0.0102))


HEADS_COST = (2e-4, 2e-4)  # the heads' seconds (base, per level) beside the 10 ms step: the bench's pinned cost


def decide(workloads: list[str], n: int, max_new: int, pinned_heads: bool) -> dict:
    import torch

    import lookahead
    from lookahead import LookaheadDecoder
    from lookahead.tools.bench.runner import encode
    from lookahead.tools.bench.workloads import build_workloads
    from lookahead.tools.models import load_smollm2

    torch.set_num_threads(2)
    model, tok = load_smollm2()
    heads = None
    if pinned_heads:
        from lookahead.heads import DraftHeads

        heads = DraftHeads.bundled().with_settings(cost=HEADS_COST)
    rows = []
    for wl, ps in build_workloads(workloads, n).items():
        for p in ps:
            ids = encode(p, tok, "cpu")["input_ids"]
            decoder = LookaheadDecoder(cost_curve=FLAT, heads=heads)
            seq = model.generate(ids, max_new_tokens=max_new, do_sample=False, custom_generate=decoder)
            rows.append({"workload": wl, "prompt": p.id, "tokens_per_call": decoder.stats.tokens_per_call,
                         "tokens": seq[0, ids.shape[1]:].tolist()})
    return {"where": lookahead.__file__, "rows": rows}


def compare(before: dict, after: dict) -> list[str]:
    lines = ["| workload | prompts | before flat tokens/call | after flat tokens/call | same decisions |",
             "|---|---|---|---|---|"]
    pairs = list(zip(before["rows"], after["rows"]))
    for wl in [*dict.fromkeys(b["workload"] for b, _ in pairs), "all"]:
        ps = [(b, a) for b, a in pairs if wl == "all" or b["workload"] == wl]
        same = sum(b["tokens"] == a["tokens"] and b["tokens_per_call"] == a["tokens_per_call"] for b, a in ps)
        lines.append(f"| {wl} | {len(ps)} | {statistics.mean(b['tokens_per_call'] for b, _ in ps):.2f} | "
                     f"{statistics.mean(a['tokens_per_call'] for _, a in ps):.2f} | {same}/{len(ps)} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="code-editing,code-completion,chat")
    ap.add_argument("--prompts-per-workload", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--pinned-heads", action="store_true", help="draft with the bundled heads at a pinned cost")
    ap.add_argument("--out", help="write this install's decisions here (JSON)")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="print the table of two files")
    args = ap.parse_args()
    if args.compare:
        before, after = (json.load(open(path)) for path in args.compare)
        print("\n".join(compare(before, after)))
        return
    result = decide(args.workloads.split(","), args.prompts_per_workload, args.max_new_tokens, args.pinned_heads)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
