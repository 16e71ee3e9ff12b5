"""Whole-forward time of SmolLM2-135M with k new tokens: torch's linears vs the Numba kernels.

For each thread count (``--threads``, default 1 and 2): a ``--context``-token prefill of random ids
into a ``DynamicCache``, then ``--repeats`` rounds; in each round every ``k`` of ``--sizes`` runs one
forward on each path (``logits_to_keep=k``; the forward's rows are cropped off the cache again), the
order of the two paths alternating per round so drift hits both alike. A path's time at ``k`` is its
median over the rounds; the table gives it relative to torch's one-token forward (the median of
torch at ``k = 1``). The argmax of every logit row is compared between the paths (first round).

Then the output head alone (``lm_head``, 49152x576): ``F.linear`` vs the kernel on random rows, medians.

Run from the repository root (about 2 minutes)::

    python -m benchmarks.cpu_linear [--threads 1,2] [--repeats 7] [--out benchmarks/results/cpu-linear.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np
import torch

from lookahead import compat
from lookahead.cpu_linear import covered_linears, fast_linears, linear_into

SIZES = (1, 2, 4, 8, 16, 32, 64)


def forward_table(model, sizes, context: int, repeats: int) -> tuple[dict, int]:
    """({(path, k): [seconds per round]}, number of logit rows whose argmax differed between the paths)."""
    from transformers import DynamicCache

    cache_kwarg = compat.cache_kwarg_name(model)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, context + max(sizes)), generator=gen)
    cache = DynamicCache(config=model.config)
    times: dict = {(p, k): [] for p in ("torch", "kernel") for k in sizes}
    mismatches = 0

    def forward(k):
        pos = torch.arange(context, context + k)[None]
        t = time.perf_counter()
        out = model(input_ids=ids[:, context:context + k], position_ids=pos, use_cache=True,
                    logits_to_keep=k, **{cache_kwarg: cache})
        elapsed = time.perf_counter() - t
        cache.crop(-k)
        return elapsed, out.logits[0].argmax(-1)

    with torch.no_grad():
        model(input_ids=ids[:, :context], use_cache=True, **{cache_kwarg: cache})
        for k in sizes:  # warm-up: compile, first-call costs
            forward(k)
            with fast_linears(model):
                forward(k)
        for rnd in range(repeats):
            for k in sizes:
                argmax = {}
                for path in (("torch", "kernel") if rnd % 2 == 0 else ("kernel", "torch")):
                    if path == "kernel":
                        with fast_linears(model):
                            elapsed, argmax[path] = forward(k)
                    else:
                        elapsed, argmax[path] = forward(k)
                    times[path, k].append(elapsed)
                if rnd == 0:
                    mismatches += int((argmax["torch"] != argmax["kernel"]).sum())
    return times, mismatches


def head_table(weight: torch.Tensor, sizes, repeats: int) -> dict:
    """{(path, k): median seconds} of the output head alone on random rows."""
    w = weight.detach()
    wn = w.numpy()
    empty = np.zeros(0, np.float32)
    threads = torch.get_num_threads()
    out: dict = {}
    for k in sizes:
        x = torch.randn(k, w.shape[1], generator=torch.Generator().manual_seed(k))
        y = np.empty((k, w.shape[0]), np.float32)
        runs = {"torch": [], "kernel": []}
        linear_into(x.numpy(), wn, empty, y, threads)
        for rnd in range(repeats):
            for path in (("torch", "kernel") if rnd % 2 == 0 else ("kernel", "torch")):
                t = time.perf_counter()
                if path == "torch":
                    torch.nn.functional.linear(x, w)
                else:
                    linear_into(x.numpy(), wn, empty, y, threads)
                runs[path].append(time.perf_counter() - t)
        for path, values in runs.items():
            out[path, k] = statistics.median(values)
    return out


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--out", default="benchmarks/results/cpu-linear.md")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))

    from lookahead.models import load_smollm2

    model, _ = load_smollm2()
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor())
    lines = ["# Numba linear kernels vs torch on a CPU (issue 15)", "",
             "Command: `" + " ".join(["python -m benchmarks.cpu_linear", *(argv or [])]) + "`", "",
             f"Hardware: {os.cpu_count()} CPUs, {cpu}; torch {torch.__version__}; "
             f"model SmolLM2-135M fp32, {len(covered_linears(model))} `nn.Linear` routed; "
             f"context {args.context} random tokens; {args.repeats} rounds, medians.", ""]
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        load_before = open("/proc/loadavg").read().split()[:3]
        times, mismatches = forward_table(model, sizes, args.context, args.repeats)
        head = head_table(model.lm_head.weight, sizes, args.repeats)
        load_after = open("/proc/loadavg").read().split()[:3]
        base = statistics.median(times["torch", 1])
        lines += [f"## {threads} thread{'s' if threads > 1 else ''}", "",
                  f"Load average (1, 5, 15 min) before: {' '.join(load_before)}; after: {' '.join(load_after)}.",
                  f"torch's one-token forward: {base * 1e3:.1f} ms. Argmax differences between the paths "
                  f"(every logit row, first round): {mismatches}.", "",
                  "Whole forward, relative to torch's one-token forward:", "",
                  "| new tokens k | " + " | ".join(map(str, sizes)) + " |",
                  "|---|" + "---|" * len(sizes)]
        for path, label in (("torch", "torch eager"), ("kernel", "Numba kernels")):
            lines.append(f"| {label} | " + " | ".join(
                f"{statistics.median(times[path, k]) / base:.2f}" for k in sizes) + " |")
        lines += ["", "Output head alone (49152x576), ms:", "",
                  "| rows k | " + " | ".join(map(str, sizes)) + " |", "|---|" + "---|" * len(sizes)]
        for path, label in (("torch", "torch `F.linear`"), ("kernel", "Numba kernel")):
            lines.append(f"| {label} | " + " | ".join(f"{head[path, k] * 1e3:.1f}" for k in sizes) + " |")
        lines.append("")
        print("\n".join(lines[-14:]), flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    return text


if __name__ == "__main__":
    main()
