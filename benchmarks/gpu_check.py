"""The CUDA check: exactness of the decoder on a GPU, and the GPU's cost curve (run where there is one).

    python -m benchmarks.gpu_check [--parts tiny,sampling,curves,static] [--device cuda] [--out gpu-check.json]
        [--shapes smollm2-135m,llama-8b] [--static-prompts 4]

The test suite runs on a CPU (CI has no GPU); this script runs the same headline checks on a GPU:

- ``tiny``: greedy output of :class:`~lookahead.LookaheadDecoder` identical to plain ``generate``, token
  for token, on the test suite's tiny random models (float64, six architectures: ``tests/tiny.py``), on a
  prompt that repeats and one that does not, with the calibrated budget, the full tree every step (no budget:
  ``_tuning=Tuning(adaptive=False)``), a lookahead window (``window=4``) and the widest steps
  (``cost_curve="flat"``: 255 nodes); and a left-padded batch of four rows (``lookahead/batch.py``).
- ``sampling``: the decoder's samples of the next two tokens against their exact distribution (chi-square,
  as ``tests/test_sampling.py``), drawn on the GPU.
- ``curves``: the forward's cost t(k) of k new tokens after a 1024-token context, k = 1 to 256 (timed here:
  :func:`forward_times`), and t(k) / t(1), of random-weight Llama models of SmolLM2-135M's and an 8B model's
  shapes in bfloat16; and one decoder call's host work per step on the last of them (the 8B one).
- ``static`` (only when named in ``--parts``): SmolLM2 in fp32 and bf16 on code editing, code completion and
  chat (4 prompts each: ``--static-prompts``; 128 new tokens; ``benchmarks/static_bench.py``), each prompt back
  to back: plain eager, plain static compiled (as plain static ``generate`` compiles on CUDA: CUDA graphs),
  prompt lookup, the decoder eager and the decoder on the static cache compiled; per method the median speed-up
  against plain static compiled, tokens per call, host time per step, compile time, recompiles and identical
  outputs. In fp32 the decoder's outputs must be plain eager's.

Prints one JSON line per check and writes them all to ``--out``. Exit status 1 when an exactness check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPETITIVE = [3, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11]
NO_REPEAT = [3, 41, 7, 88, 19, 64, 2, 53, 30, 77, 9]
BATCH = [[5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 8, 9, 10, 11, 5, 6, 7], [3, 4, 3, 4, 3, 4, 3, 4, 12, 13],
         [20, 21, 22, 23, 24, 25, 26, 20, 21, 22, 23], [40, 41]]


def check_tiny(device: str) -> list[dict]:
    import torch

    from lookahead import LookaheadDecoder
    from lookahead._tuning import Tuning

    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from tiny import TINY_ARCHS, tiny_model

    results = []
    # "wide": a flat curve, so that max_draft_tokens="auto" takes its widest steps (255 nodes, the sources' wide
    # trees) whatever this GPU's own curve says
    variants = {"calibrated": {}, "full-tree": {"_tuning": Tuning(adaptive=False)}, "window": {"window": 4},
                "wide": {"cost_curve": "flat"}}
    for arch in TINY_ARCHS:
        model = tiny_model(arch).to(device)
        for prompt_name, prompt in (("repetitive", REPETITIVE), ("no-repeat", NO_REPEAT)):
            ids = torch.tensor([prompt], device=device)
            plain = model.generate(ids, do_sample=False, max_new_tokens=48, eos_token_id=None).tolist()
            for name, kw in variants.items():
                dec = LookaheadDecoder(**kw)
                ours = model.generate(ids, do_sample=False, max_new_tokens=48, eos_token_id=None,
                                      custom_generate=dec).tolist()
                results.append({"check": "greedy", "arch": arch, "prompt": prompt_name, "variant": name,
                                "identical": ours == plain, "calls": dec.stats.target_calls,
                                "tokens": dec.stats.new_tokens, "step_nodes": dec.stats.step_nodes})
        width = max(len(p) for p in BATCH)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in BATCH], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in BATCH], device=device)
        plain = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=32,
                               eos_token_id=None).tolist()
        dec = LookaheadDecoder()
        ours = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=32,
                              eos_token_id=None, custom_generate=dec).tolist()
        results.append({"check": "greedy-batch", "arch": arch, "rows": len(BATCH), "identical": ours == plain,
                        "calls": dec.stats.target_calls})
    return results


def check_sampling(device: str, n: int = 1500) -> list[dict]:
    import numpy as np
    import torch

    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    import test_sampling as ts

    from lookahead import LookaheadDecoder
    from lookahead._tuning import Tuning

    from tiny import peaky_llama

    model = peaky_llama(ts.VOCAB)
    settings = ts.SETTINGS["temperature"]
    exact = ts._exact_two_token_distribution(model, settings)  # on the CPU, by enumeration
    model = model.to(device)
    torch.manual_seed(2024)
    dec = LookaheadDecoder(_tuning=Tuning(trie_capacity=4096, adaptive=False))  # the full tree every step
    ids = torch.tensor([ts.PROMPT], device=device)
    counts = np.zeros((ts.VOCAB, ts.VOCAB))
    drafted = accepted = 0
    for _ in range(n):
        out = model.generate(ids, custom_generate=dec, do_sample=True, max_new_tokens=2, eos_token_id=None,
                             pad_token_id=0, **settings)
        a, b = out[0, len(ts.PROMPT):].tolist()
        counts[a, b] += 1
        drafted += dec.stats.drafted
        accepted += dec.stats.accepted
    p = ts._pvalue(counts, exact)
    return [{"check": "sampled-chi-square", "samples": n, "pvalue": p, "drafted": drafted, "accepted": accepted,
             "identical": p > ts.LEVEL}]


def _random_llama(shape: str, device: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if shape == "smollm2-135m":
        cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                          tie_word_embeddings=True)
    else:  # an 8B model's shapes (Llama 3 8B)
        cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    model.generation_config.pad_token_id = 0
    return model


def forward_times(model, sizes: list[int], context: int = 1024, repeats: int = 3) -> dict[int, float]:
    """``{k: seconds}``: one forward of ``k`` new tokens after a ``context``-token prefix (random ids), the fastest
    of ``repeats``. The prefix is prefilled once; each timed forward's ``k`` entries are cropped off again."""
    import torch
    from transformers import DynamicCache

    from lookahead.compat import cache_kwarg_name

    device = model.device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (1, context + max(sizes)), generator=gen).to(device)
    cache = DynamicCache(config=model.config)
    kwargs = {cache_kwarg_name(model): cache, "use_cache": True}
    times = {}
    with torch.inference_mode():
        model(input_ids=ids[:, :context], **kwargs)
        for k in sizes:
            new = ids[:, context : context + k]  # [1, k]
            pos = torch.arange(context, context + k, device=device)[None]  # [1, k]
            best = float("inf")
            for _ in range(repeats):
                sync()
                t = time.perf_counter()
                model(input_ids=new, position_ids=pos, **kwargs)
                sync()
                best = min(best, time.perf_counter() - t)
                cache.crop(-k)
            times[k] = best
    return times


def check_curves(device: str, shapes: tuple[str, ...] = ("smollm2-135m", "llama-8b")) -> list[dict]:
    import torch

    from lookahead import LookaheadDecoder

    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    results = []
    for shape in shapes:
        model = _random_llama(shape, device)
        times = forward_times(model, sizes, context=1024, repeats=3)
        results.append({"check": "cost-curve", "model": shape, "dtype": "bfloat16", "context": 1024,
                        "ms": {k: round(t * 1e3, 3) for k, t in times.items()},
                        "relative": {k: round(t / times[1], 3) for k, t in times.items()}})
        if shape == shapes[-1]:  # one call's host work per step, on a prompt that repeats
            gen = torch.Generator().manual_seed(1)
            block = torch.randint(5, 30000, (1, 60), generator=gen)  # [1, 60]
            ids = block.repeat(1, 4).to(device)
            with torch.inference_mode():
                sync()
                t = time.perf_counter()
                plain = model.generate(ids, do_sample=False, max_new_tokens=128, eos_token_id=None)
                sync()
                t_plain = time.perf_counter() - t
                dec = LookaheadDecoder()
                model.generate(ids, do_sample=False, max_new_tokens=8, eos_token_id=None, custom_generate=dec)
                sync()
                t = time.perf_counter()
                ours = model.generate(ids, do_sample=False, max_new_tokens=128, eos_token_id=None,
                                      custom_generate=dec)
                sync()
                t_ours = time.perf_counter() - t
            s = dec.stats
            steps = max(s.target_calls, 1)
            results.append({
                "check": "host-work", "model": shape, "plain_s": t_plain, "ours_s": t_ours,
                "speedup": t_plain / t_ours, "calls": s.target_calls, "tokens": s.new_tokens,
                "identical": plain.tolist() == ours.tolist(),
                "ms_per_step": {name: round(1e3 * getattr(s, name) / steps, 3) for name in
                                ("time_propose", "time_forward", "time_verify", "time_bookkeeping")}})
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return results


def check_static(device: str, prompts: int = 4, max_new_tokens: int = 128) -> list[dict]:
    """``benchmarks/static_bench.py`` on ``device``: one row per dtype and workload, each method's medians over its
    prompts. Greedy identity is against plain eager ``generate``: the decoder's must hold in fp32 (bf16 may differ
    at near ties, and so may the other methods'; they are reported, not checked)."""
    import torch

    from benchmarks.static_bench import DECODERS, aggregate, run, summary
    from lookahead.tools.bench.workloads import build_workloads
    from lookahead.tools.models import load_smollm2

    workloads = build_workloads(["code-editing", "code-completion", "chat"], prompts)
    out = []
    for dtype in ("float32", "bfloat16"):
        model, tok = load_smollm2(dtype=getattr(torch, dtype), device=device)
        for wl, rows in run(model, tok, workloads, device, max_new_tokens).items():
            print(f"{dtype} {wl}\n{summary(rows)}", file=sys.stderr, flush=True)
            methods = aggregate(rows)
            ours = all(methods[m]["identical"] == methods[m]["prompts"] for m in DECODERS)
            out.append({"check": "static", "dtype": dtype, "workload": wl, "new_tokens": max_new_tokens,
                        "identical": ours if dtype == "float32" else None, "methods": methods, "prompts": rows})
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="tiny,sampling,curves")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", default="smollm2-135m,llama-8b", help="the curves' random models")
    parser.add_argument("--static-prompts", type=int, default=4, help="the static part's prompts per workload")
    parser.add_argument("--out", default="gpu-check.json")
    args = parser.parse_args(argv)

    import torch
    import transformers

    meta = {"torch": torch.__version__, "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None}
    print(json.dumps(meta), flush=True)
    shapes = tuple(args.shapes.split(","))
    parts = {"tiny": check_tiny, "sampling": check_sampling, "curves": lambda d: check_curves(d, shapes),
             "static": lambda d: check_static(d, args.static_prompts)}
    results, failed = [], False
    for part in args.parts.split(","):
        t = time.perf_counter()
        try:
            rows = parts[part](args.device)
        except Exception:  # one part's crash must not hide the others' results
            rows = [{"check": part, "error": traceback.format_exc()}]
        for row in rows:
            row["part_seconds"] = round(time.perf_counter() - t, 1)
            failed |= ("error" in row) or (row.get("identical") is False and row["check"] != "host-work")
            print(json.dumps(row), flush=True)
        results += rows
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
