"""Static caches and compiled steps: the decoder on the fast path plain ``generate`` users take, beside plain
``generate``'s own ways.

    python -m benchmarks.static_bench [--device cpu|cuda] [--dtype float32,bfloat16] [--prompts 4]
        [--max-new-tokens 128] [--workloads code-editing,code-completion,chat] [--methods NAME,...]
        [--threads N] [--out static.json]

SmolLM2-135M-Instruct, greedy. Per dtype and prompt, the methods back to back:

- ``plain``: plain ``generate`` (dynamic cache, eager);
- ``plain-static``: plain ``generate(cache_implementation="static")``, compiled as transformers compiles it (on
  CUDA by itself, CUDA graphs; on a CPU with a ``compile_config`` that asks for every device, backend inductor);
- ``prompt-lookup``: plain ``generate(prompt_lookup_num_tokens=10)`` (transformers' n-gram drafts, eager);
- ``lookahead``: ``LookaheadDecoder()``, dynamic cache, eager;
- ``lookahead-static``: the decoder on the same static cache, its steps compiled per bucket the same way.

The static methods share one ``StaticCache`` of :data:`CACHE_LENGTH` columns (reset before every call), as plain
``generate`` keeps one cache per model across calls: every call has the same shapes, and each compiled graph
(plain's one-token step, the decoder's buckets) compiles once for the whole run. Before the timed calls each
method runs once untimed on the first workload's first prompt, and the static ones also on every other
workload's first prompt (a workload's drafts may take other buckets); that first call's time is reported apart.

Reported per method (and per workload, the median over its prompts): wall time; the speed-up against
``plain-static`` and against ``plain`` on the same prompt; tokens per target-model call (plain: 1; prompt lookup:
new tokens per forward, counted by a forward hook; the decoder: its ``stats``); the decoder's host time per step
(drafting, packing, emitting, KV cache, learning: ``stats.time_propose + time_bookkeeping``) and its verification
time per step apart (on a GPU that includes waiting for the forward); compile time (TorchDynamo's and
Inductor's, every call of the method); recompiles (graphs compiled during timed calls, after the warm-up); and
whether the output equals ``plain``'s token for token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

CACHE_LENGTH = 1024
"""Columns of the static cache every static call of the run shares."""

METHODS = ("plain", "plain-static", "prompt-lookup", "lookahead", "lookahead-static")
DECODERS = ("lookahead", "lookahead-static")


def _compile_config(device: str):
    from transformers import CompileConfig

    if device.startswith("cuda"):
        return None  # transformers compiles a static cache's steps on CUDA by itself (reduce-overhead)
    config = CompileConfig(fullgraph=True, dynamic=False, backend="inductor", mode="default")
    config._compile_all_devices = True  # on a CPU: only when asked for every device
    return config


def _dynamo_totals() -> tuple[float, int]:
    """(seconds TorchDynamo and Inductor spent compiling so far, graphs compiled so far) in this process."""
    try:
        from torch._dynamo.utils import compilation_time_metrics, counters
    except ImportError:  # another torch's private names: no figures
        return 0.0, 0
    return sum(compilation_time_metrics.get("_compile.compile_inner", ())), int(counters["stats"]["unique_graphs"])


def _methods(device: str, max_new_tokens: int, names) -> dict:
    """name -> (generate settings, whether it runs on the shared static cache, whether it is the decoder)."""
    base = dict(max_new_tokens=max_new_tokens, do_sample=False)
    static = dict(base, cache_implementation="static")
    compiled = _compile_config(device)
    if compiled is not None:
        static["compile_config"] = compiled
    table = {"plain": (base, False, False), "plain-static": (static, True, False),
             "prompt-lookup": (dict(base, prompt_lookup_num_tokens=10), False, False),
             "lookahead": (base, False, True), "lookahead-static": (static, True, True)}
    return {name: table[name] for name in names}


def run(model, tok, workloads: dict, device: str, max_new_tokens: int, methods=METHODS) -> dict[str, list[dict]]:
    """``{workload: [one row per prompt]}``; each row ``{"prompt", "methods": {name: figures}}``."""
    import torch
    from transformers import GenerationConfig, StaticCache

    from lookahead import LookaheadDecoder
    from lookahead.compat import cache_kwarg_name
    from lookahead.tools.bench.runner import encode

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    shared = StaticCache(config=model.config, max_cache_len=CACHE_LENGTH)
    cache_name = cache_kwarg_name(model)
    forwards = [0]

    def count_forward(module, args, kwargs):
        forwards[0] += 1

    def call(name: str, inputs: dict) -> tuple[torch.Tensor, float, object, int, float, int]:
        """One generate of method ``name``: (output, seconds, decoder or None, forwards, compile s, graphs)."""
        kw, on_static, is_decoder = table[name]
        gen = GenerationConfig(**{k: v for k, v in kw.items() if k not in ("compile_config", "cache_implementation")},
                               pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        if kw.get("compile_config") is not None:
            gen.compile_config = kw["compile_config"]
        extra = {}
        if on_static:
            shared.reset()
            extra[cache_name] = shared
        dec = LookaheadDecoder() if is_decoder else None
        if dec is not None:
            extra["custom_generate"] = dec
        hook = model.register_forward_pre_hook(count_forward, with_kwargs=True) if name == "prompt-lookup" else None
        forwards[0] = 0
        compile_s, graphs = _dynamo_totals()
        try:
            sync()
            t = time.perf_counter()
            out = model.generate(**inputs, generation_config=gen, **extra)
            sync()
            seconds = time.perf_counter() - t
        finally:
            if hook is not None:
                hook.remove()
        compile_after, graphs_after = _dynamo_totals()
        return out, seconds, dec, forwards[0], compile_after - compile_s, graphs_after - graphs

    table = _methods(device, max_new_tokens, methods)
    first_call, compile_s = {}, dict.fromkeys(table, 0.0)
    for i, (wl, prompts) in enumerate(workloads.items()):  # the untimed warm-ups: compile, calibrate
        inputs = encode(prompts[0], tok, model.device)
        for name, (_, on_static, _) in table.items():
            if i == 0 or on_static:
                _, seconds, _, _, compiled, _ = call(name, inputs)
                first_call.setdefault(name, seconds)
                compile_s[name] += compiled
                print(f"# warm-up {name} on {wl}: {seconds:.1f} s", file=sys.stderr, flush=True)

    result = {}
    for wl, prompts in workloads.items():
        rows = result[wl] = []
        for prompt in prompts:
            inputs = encode(prompt, tok, model.device)
            row = {"prompt": prompt.id, "methods": {}}
            outputs = {}
            for name in table:
                out, seconds, dec, forwards_run, compiled, graphs = call(name, inputs)
                compile_s[name] += compiled
                new = out.shape[1] - inputs["input_ids"].shape[1]
                outputs[name] = out
                entry = {"seconds": seconds, "new_tokens": new, "recompiles": graphs, "first_call_s": first_call[name],
                         "tokens_per_call": 1.0}
                if name == "prompt-lookup":
                    entry.update(tokens_per_call=new / max(forwards_run, 1), target_calls=forwards_run)
                if dec is not None:
                    s, steps = dec.stats, max(dec.stats.target_calls, 1)
                    entry.update(tokens_per_call=s.tokens_per_call, target_calls=s.target_calls,
                                 host_ms_per_step=1e3 * (s.time_propose + s.time_bookkeeping) / steps,
                                 verify_ms_per_step=1e3 * s.time_verify / steps)
                row["methods"][name] = entry
            for name, entry in row["methods"].items():
                if "plain" in outputs:
                    entry["identical_to_plain"] = bool(torch.equal(outputs[name], outputs["plain"]))
                    entry["vs_plain"] = row["methods"]["plain"]["seconds"] / entry["seconds"]
                if "plain-static" in outputs:
                    entry["vs_plain_static"] = row["methods"]["plain-static"]["seconds"] / entry["seconds"]
            rows.append(row)
            print(json.dumps({"workload": wl, **row}), file=sys.stderr, flush=True)
    for rows in result.values():  # compile time over the whole run, warm-ups included: every row shows the total
        for row in rows:
            for name, entry in row["methods"].items():
                entry["compile_s"] = compile_s[name]
    return result


def aggregate(rows: list[dict]) -> dict[str, dict]:
    """Per method, over one workload's prompts: medians, recompiles summed, identical outputs counted."""
    out = {}
    for name in rows[0]["methods"]:
        es = [r["methods"][name] for r in rows]

        def median(key, es=es):
            values = [e[key] for e in es if key in e]
            return statistics.median(values) if values else None

        out[name] = {"vs_plain_static": median("vs_plain_static"), "vs_plain": median("vs_plain"),
                     "tokens_per_call": median("tokens_per_call"), "host_ms_per_step": median("host_ms_per_step"),
                     "verify_ms_per_step": median("verify_ms_per_step"), "seconds": median("seconds"),
                     "compile_s": es[0]["compile_s"], "first_call_s": es[0]["first_call_s"],
                     "recompiles": sum(e["recompiles"] for e in es),
                     "identical": sum(e.get("identical_to_plain", False) for e in es), "prompts": len(es)}
    return out


def summary(rows: list[dict]) -> str:
    """One workload's Markdown table."""
    def num(x, unit=""):
        return "-" if x is None else f"{x:.2f}{unit}"

    lines = ["| method | vs plain-static (median) | vs plain (median) | tokens/call | host ms/step | verify ms/step "
             "| compile s | first call s | recompiles | identical |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, a in aggregate(rows).items():
        lines.append(f"| {name} | {num(a['vs_plain_static'], 'x')} | {num(a['vs_plain'], 'x')} | "
                     f"{a['tokens_per_call']:.2f} | {num(a['host_ms_per_step'])} | {num(a['verify_ms_per_step'])} | "
                     f"{a['compile_s']:.1f} | {a['first_call_s']:.1f} | {a['recompiles']} | "
                     f"{a['identical']}/{a['prompts']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", help="comma-separated: float32,bfloat16")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per workload")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--workloads", default="code-editing,code-completion,chat")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    methods = args.methods.split(",")
    if set(methods) - set(METHODS):
        ap.error(f"unknown methods {sorted(set(methods) - set(METHODS))}; known: {', '.join(METHODS)}")
    import torch

    from lookahead.tools.bench.workloads import build_workloads
    from lookahead.tools.models import load_smollm2

    if args.threads:
        torch.set_num_threads(args.threads)
    workloads = build_workloads(args.workloads.split(","), args.prompts)
    result = {"device": args.device, "max_new_tokens": args.max_new_tokens, "runs": {}}
    for dtype in args.dtype.split(","):
        model, tok = load_smollm2(dtype=getattr(torch, dtype), device=args.device)
        for wl, rows in run(model, tok, workloads, args.device, args.max_new_tokens, methods).items():
            result["runs"][f"{dtype}/{wl}"] = rows
            print(f"\n{dtype}, {wl}:\n" + summary(rows), flush=True)
        del model
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
