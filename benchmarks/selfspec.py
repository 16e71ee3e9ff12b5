"""Draft passes on SmolLM2: layer skip, early exit, low rank, a (truncated) draft model.

Each method runs alone (no n-gram, copy or model-prediction drafts) on the same prompts as plain ``generate``,
greedy, in three settings:

- ``cpu``: the decoder as a user gets it, its budget pricing drafts with this CPU's calibrated cost curve;
- ``flat``: the flat cost curve ``((1, .010), (2, .010), (256, .0102))`` (the GPU regime: tokens per call is
  the speed-up there), the draft pass priced at its measured cost ratio;
- ``always``: ``adaptive=False``: every step drafts the full chain (what acceptance and draft cost are
  when the pass always runs).

Per method and setting: identical to plain (every prompt), tokens per target call, acceptance (chain tokens
the target emitted too / chain tokens tried), draft forwards per step and the cost of one draft forward
(measured: its time over one target forward's), wall time and speed against plain on the same prompt.

    python benchmarks/selfspec.py --prompts 2 --max-new-tokens 64 --out benchmarks/results/selfspec.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

FLAT = ((1, 0.010), (2, 0.010), (256, 0.0102))
METHODS = ("self-layer-skip", "self-early-exit", "self-low-rank", "draft-model")
SETTINGS = ("cpu", "flat", "always")


def make_decoder(method: str, setting: str):
    from dataclasses import replace

    from lookahead.bench.methods import METHODS as REGISTRY

    decoder = REGISTRY[method]().decoder
    if setting == "flat":
        decoder.config = replace(decoder.config, cost_curve=FLAT)
    elif setting == "always":
        decoder.config = replace(decoder.config, adaptive=False)
    decoder.policy.config = decoder.config
    return decoder


def run(prompts: int, max_new_tokens: int, workloads: list[str], methods, settings) -> dict:
    from lookahead.bench.runner import encode
    from lookahead.bench.workloads import build_workloads
    from lookahead.models import load_smollm2

    model, tok = load_smollm2()
    gen = {"max_new_tokens": max_new_tokens, "do_sample": False, "pad_token_id": tok.eos_token_id}
    records = []
    for wl, items in build_workloads(workloads, prompts).items():
        for prompt in items:
            inputs = encode(prompt, tok, "cpu")
            t = time.perf_counter()
            ref = model.generate(**inputs, **gen)
            plain_s = time.perf_counter() - t
            new = ref.shape[1] - inputs["input_ids"].shape[1]
            for method in methods:
                for setting in settings:
                    decoder = make_decoder(method, setting)
                    model.generate(**inputs, **{**gen, "max_new_tokens": 4}, custom_generate=decoder)  # warm-up
                    t = time.perf_counter()
                    out = model.generate(**inputs, **gen, custom_generate=decoder)
                    seconds = time.perf_counter() - t
                    src = next(s for s in decoder.policy.sources if s.priced).report()
                    st = decoder.stats
                    rec = {"workload": wl, "prompt": prompt.id, "prompt_tokens": inputs["input_ids"].shape[1],
                           "method": method, "setting": setting, "identical": bool(torch.equal(out, ref)),
                           "new_tokens": st.new_tokens, "target_calls": st.target_calls,
                           "tokens_per_call": st.new_tokens / st.target_calls, "seconds": seconds,
                           "plain_seconds": plain_s, "plain_new_tokens": new,
                           "speed": (st.new_tokens / seconds) / (new / plain_s),
                           "verified_accepted": sum(st.accepted_per_step), "source": src}
                    records.append(rec)
                    print(f"{wl:13s} {prompt.id:16s} {method:16s} {setting:6s} same={rec['identical']} "
                          f"tok/call={rec['tokens_per_call']:.2f} speed={rec['speed']:.2f} "
                          f"acc={src['accepted']}/{src['tried']} fwd={src['forwards']} ratio={src['cost_ratio']:.2f} "
                          f"info={ {k: v for k, v in src['info'].items() if k != 'candidates'} }", flush=True)
    return {"records": records, "threads": torch.get_num_threads(), "max_new_tokens": max_new_tokens,
            "summary": summarise(records)}


def summarise(records: list[dict]) -> list[dict]:
    rows = []
    for method in dict.fromkeys(r["method"] for r in records):
        for setting in dict.fromkeys(r["setting"] for r in records):
            rs = [r for r in records if r["method"] == method and r["setting"] == setting]
            if not rs:
                continue
            tried = sum(r["source"]["tried"] for r in rs)
            draft_s = sum(r["source"]["seconds"] for r in rs)
            fwd = sum(r["source"]["forwards"] for r in rs)
            rows.append({
                "method": method, "setting": setting, "prompts": len(rs),
                "identical": sum(r["identical"] for r in rs),
                "tokens_per_call": sum(r["new_tokens"] for r in rs) / sum(r["target_calls"] for r in rs),
                "acceptance": (sum(r["source"]["accepted"] for r in rs) / tried) if tried else None,
                "draft_forwards_per_token": fwd / sum(r["new_tokens"] for r in rs),
                "draft_ms_per_forward": 1e3 * draft_s / fwd if fwd else None,
                "cost_ratio": statistics.median(r["source"]["cost_ratio"] for r in rs),
                "draft_share_of_time": draft_s / sum(r["seconds"] for r in rs),
                "speed_median": statistics.median(r["speed"] for r in rs),
                "speed_min": min(r["speed"] for r in rs),
                "info": {k: v for k, v in rs[0]["source"]["info"].items()},
            })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=2, help="prompts per workload")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--workloads", default="code-editing,chat")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="write the records and summary as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    result = run(args.prompts, args.max_new_tokens, args.workloads.split(","), args.methods.split(","),
                 args.settings.split(","))
    for row in result["summary"]:
        print(json.dumps(row))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
