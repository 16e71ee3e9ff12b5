"""Static caches and compiled steps: the decoder on the fast path plain ``generate`` users take.

    python -m benchmarks.static_bench [--device cpu|cuda] [--dtype float32,bfloat16] [--prompts 2]
        [--max-new-tokens 96] [--workloads code-editing,code-completion,chat] [--out static.json]

Per dtype and prompt, back to back, each after a warm-up call (whose time, the compilation's on a compiled
path, is reported apart):

- ``plain``: plain ``generate`` (dynamic cache, eager);
- ``plain-static``: plain ``generate(cache_implementation="static")``, compiled as transformers compiles it (on
  CUDA by itself; on a CPU with a ``compile_config`` that asks for every device, backend inductor);
- ``lookahead``: the decoder, dynamic cache, eager;
- ``lookahead-static``: the decoder on the same static cache, its steps compiled per bucket the same way;
- ``lookahead-static-eager``: the decoder on a static cache, not compiled.

The static methods share one ``StaticCache`` of :data:`CACHE_LENGTH` columns (reset before every call), as
plain ``generate`` keeps one cache per model across calls: every call then has the same shapes, and each
compiled graph (plain's one-token step, the decoder's buckets) compiles once for the whole run.

Reported per method: wall time, tokens per target call, the ratio against ``plain-static`` and against
``plain`` (same run, same prompt), whether the output equals ``plain``'s (greedy; fp32: every one), the
warm-up's time, and the decoder's host time per step (its time outside the forward, ``stats``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

CACHE_LENGTH = 1024
"""Columns of the static cache every static call of the run shares."""


def _compile_config(device: str):
    from transformers import CompileConfig

    if device.startswith("cuda"):
        return None  # transformers compiles a static cache's steps on CUDA by itself (reduce-overhead)
    config = CompileConfig(fullgraph=True, dynamic=False, backend="inductor", mode="default")
    config._compile_all_devices = True  # on a CPU: only when asked for every device
    return config


def run(model, tok, prompts, device: str, max_new_tokens: int) -> list[dict]:
    import torch
    from transformers import GenerationConfig

    from lookahead import LookaheadDecoder
    from lookahead.bench.runner import encode

    compiled = _compile_config(device)
    base = dict(max_new_tokens=max_new_tokens, do_sample=False)
    static = dict(base, cache_implementation="static")
    if compiled is not None:
        static["compile_config"] = compiled
    methods = {
        "plain": (base, None),
        "plain-static": (static, None),
        "lookahead": (base, lambda: LookaheadDecoder()),
        "lookahead-static": (static, lambda: LookaheadDecoder()),
        "lookahead-static-eager": (dict(static, compile_config=None, disable_compile=True), lambda: LookaheadDecoder()),
    }
    from transformers import StaticCache

    from lookahead.compat import cache_kwarg_name

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    shared = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    cache_name = cache_kwarg_name(model)
    rows = []
    for prompt in prompts:
        inputs = encode(prompt, tok, model.device)
        row = {"prompt": prompt.id, "methods": {}}
        outputs = {}
        for name, (kw, make) in methods.items():
            on_static = kw.get("cache_implementation") == "static"
            gen = GenerationConfig(**{k: v for k, v in kw.items() if k not in ("compile_config", "cache_implementation")},
                                   pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            if kw.get("compile_config") is not None:
                gen.compile_config = kw["compile_config"]

            def cache_kw(on_static=on_static):
                if not on_static:
                    return {}
                shared.reset()
                return {cache_name: shared}

            extra = {}
            t = time.perf_counter()
            warm = make() if make else None
            if warm is not None:
                extra = {"custom_generate": warm}
            model.generate(**inputs, generation_config=gen, **extra, **cache_kw())  # warm-up: compiles, calibrates
            sync()
            warm_s = time.perf_counter() - t
            dec = make() if make else None
            extra = {"custom_generate": dec} if dec is not None else {}
            sync()
            kw_cache = cache_kw()
            t = time.perf_counter()
            out = model.generate(**inputs, generation_config=gen, **extra, **kw_cache)
            sync()
            seconds = time.perf_counter() - t
            new = out.shape[1] - inputs["input_ids"].shape[1]
            outputs[name] = out
            entry = {"seconds": seconds, "new_tokens": new, "warmup_s": warm_s}
            if dec is not None:
                s = dec.stats
                entry.update(tokens_per_call=s.tokens_per_call, target_calls=s.target_calls,
                             host_ms_per_step=1e3 * (s.time_propose + s.time_verify + s.time_bookkeeping)
                             / max(s.target_calls, 1),
                             compile_s=getattr(warm.stats, "time_compile", 0.0) if warm is not None else 0.0)
            row["methods"][name] = entry
        for name, entry in row["methods"].items():
            entry["identical_to_plain"] = bool(torch.equal(outputs[name], outputs["plain"]))
            entry["vs_plain"] = row["methods"]["plain"]["seconds"] / entry["seconds"]
            entry["vs_plain_static"] = row["methods"]["plain-static"]["seconds"] / entry["seconds"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def summary(rows: list[dict]) -> str:
    names = list(rows[0]["methods"])
    lines = ["| method | vs plain-static (median, min) | vs plain (median) | tokens/call | host ms/step | "
             "warm-up s (median) | identical |", "|---|---|---|---|---|---|---|"]
    for name in names:
        es = [r["methods"][name] for r in rows]
        vs = [e["vs_plain_static"] for e in es]
        tpc = [e.get("tokens_per_call", 1.0) for e in es]
        host = [e["host_ms_per_step"] for e in es if "host_ms_per_step" in e]
        lines.append(f"| {name} | {statistics.median(vs):.2f}x, {min(vs):.2f}x | "
                     f"{statistics.median(e['vs_plain'] for e in es):.2f}x | {statistics.median(tpc):.2f} | "
                     f"{statistics.median(host):.2f} | " if host else
                     f"| {name} | {statistics.median(vs):.2f}x, {min(vs):.2f}x | "
                     f"{statistics.median(e['vs_plain'] for e in es):.2f}x | 1.00 | - | ")
        lines[-1] += (f"{statistics.median(e['warmup_s'] for e in es):.1f} | "
                      f"{sum(e['identical_to_plain'] for e in es)}/{len(es)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", help="comma-separated: float32,bfloat16")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per workload")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--workloads", default="code-editing,code-completion,chat")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch

    from lookahead.bench.workloads import build_workloads
    from lookahead.models import load_smollm2

    if args.threads:
        torch.set_num_threads(args.threads)
    workloads = build_workloads(args.workloads.split(","), args.prompts)
    result = {"device": args.device, "max_new_tokens": args.max_new_tokens, "runs": {}}
    for dtype in args.dtype.split(","):
        model, tok = load_smollm2(dtype=getattr(torch, dtype), device=args.device)
        for wl, prompts in workloads.items():
            print(f"# {dtype} {wl}", file=sys.stderr, flush=True)
            rows = run(model, tok, prompts, args.device, args.max_new_tokens)
            result["runs"][f"{dtype}/{wl}"] = rows
            print(f"\n{dtype}, {wl}:\n" + summary(rows), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
