"""Batched decoding: throughput of ``LookaheadDecoder`` against plain batched ``generate`` (greedy, CPU).

    python -m benchmarks.batch [--sizes 1,4,8,16] [--workloads code,chat,mix] [--max-new-tokens 128]
        [--threads 1] [--device cpu] [--dtype float32] [--compare-padded] [--out benchmarks/results/batch]

Per workload and batch size ``B``: the first ``B`` prompts of the workload (``code``: code-editing
prompts, ``chat``: chat questions, ``mix``: alternately a code edit and a chat, starting with the code
edit; prompts from :mod:`lookahead.bench.workloads`), as chat messages through SmolLM2's template,
left-padded in one batch. Three runs in this order: plain batched ``generate`` (A), the decoder, plain
again (A'), so the A/A ratio shows the noise in the same conditions. Greedy, the model's own EOS (rows
finish at different lengths; finished rows are padded), ``max_new_tokens`` per row.

Throughput: generated tokens (each row's own, up to and including its EOS; not the padding) per second
of the whole ``generate`` call, over the batch. ``speed-up``: plain's seconds (the mean of A and A') over
ours. ``tok/call/row``: per row, its tokens over the forwards it took part in, mean over the rows. Every
row of ours is compared with plain's, token for token. A fresh decoder per measurement (the cost curve is
calibrated once per process, before the first timed call). Writes ``<out>.json`` and ``<out>.png`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time


def prompts_for(workload: str, n: int) -> list:
    from lookahead.bench.workloads import chat, code_editing

    if workload == "code":
        return code_editing(n)
    if workload == "chat":
        return chat(n)
    if workload == "mix":
        code, talk = code_editing(n), chat(n)
        return [(code if i % 2 == 0 else talk)[i // 2] for i in range(n)]
    raise ValueError(f"unknown workload {workload!r}: code, chat or mix")


def encode(tokenizer, prompts) -> dict:
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p.text}], tokenize=False,
                                           add_generation_prompt=True) for p in prompts]
    tokenizer.padding_side = "left"
    return tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)


def generated_tokens(out, prompt_len: int, eos: set[int]) -> list[int]:
    """Per row: tokens it generated, up to and including its first EOS (not the padding after it)."""
    counts = []
    for row in out[:, prompt_len:].tolist():
        n = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        counts.append(n)
    return counts


def measure(model, tokenizer, decoder, workload: str, size: int, max_new_tokens: int, padded=None) -> dict:
    import torch

    inputs = encode(tokenizer, prompts_for(workload, size)).to(model.device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    kw = dict(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, (list, tuple)) else [eos])
    runs = {}
    with torch.inference_mode():
        names = ("plain", "ours") + (("ours-padded",) if padded is not None else ()) + ("plain-again",)
        for name in names:
            extra = {"custom_generate": {"ours": decoder, "ours-padded": padded}[name]} if name.startswith("ours") else {}
            sync()
            t0 = time.perf_counter()
            out = model.generate(**inputs, **kw, **extra)
            sync()
            runs[name] = (out, time.perf_counter() - t0)
    plain, ours = runs["plain"][0], runs["ours"][0]
    prompt_len = inputs["input_ids"].shape[1]
    tokens = sum(generated_tokens(plain, prompt_len, eos))
    plain = plain.cpu()

    def identical_rows(out) -> int:
        out = out.cpu()
        return sum(bool(plain.shape == out.shape and (plain[i] == out[i]).all()) for i in range(size))

    t_plain = (runs["plain"][1] + runs["plain-again"][1]) / 2
    extra = {}
    if padded is not None:  # the same decoder with one padded prompt forward (batch_prefill="padded")
        extra = {"ours_padded_s": runs["ours-padded"][1], "speedup_padded": t_plain / runs["ours-padded"][1],
                 "identical_rows_padded": identical_rows(runs["ours-padded"][0]),
                 "prefill_groups": getattr(decoder, "prefill_groups", None)}
    per_row = [s.tokens_per_call for s in getattr(decoder, "row_stats", [decoder.stats])]
    return {
        "workload": workload, "batch": size, "prompt_tokens": prompt_len, "new_tokens": tokens,
        "plain_s": runs["plain"][1], "plain_again_s": runs["plain-again"][1], "ours_s": runs["ours"][1],
        "plain_tok_s": tokens / t_plain, "ours_tok_s": tokens / runs["ours"][1],
        "speedup": t_plain / runs["ours"][1], "aa": runs["plain-again"][1] / runs["plain"][1],
        "tokens_per_call_per_row": sum(per_row) / len(per_row), "target_calls": decoder.stats.target_calls,
        "identical_rows": identical_rows(ours), "rows": size, **extra,
    }


def table(results: list[dict]) -> str:
    lines = ["| workload | batch | prompt tokens | new tokens | plain tok/s | ours tok/s | speed-up | tok/call/row "
             "| forwards | A/A (A'/A time) | identical rows |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['workload']} | {r['batch']} | {r['prompt_tokens']} | {r['new_tokens']} | "
                     f"{r['plain_tok_s']:.1f} | {r['ours_tok_s']:.1f} | {r['speedup']:.2f}x | "
                     f"{r['tokens_per_call_per_row']:.2f} | {r['target_calls']} | {r['aa']:.2f} | "
                     f"{r['identical_rows']}/{r['rows']} |")
    if any("speedup_padded" in r for r in results):
        lines += ["", "| workload | batch | speed-up (prompt in groups, the default) | speed-up (one padded prompt forward) "
                  "| prompt groups (row indices) | identical rows (padded) |", "|---|---|---|---|---|---|"]
        for r in results:
            if "speedup_padded" in r:
                lines.append(f"| {r['workload']} | {r['batch']} | {r['speedup']:.2f}x | {r['speedup_padded']:.2f}x | "
                             f"{r['prefill_groups']} | {r['identical_rows_padded']}/{r['rows']} |")
    return "\n".join(lines)


def plot(results: list[dict], path: str, title: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for i, workload in enumerate(sorted({r["workload"] for r in results})):
        rs = sorted((r for r in results if r["workload"] == workload), key=lambda r: r["batch"])
        sizes = [r["batch"] for r in rs]
        ax.plot(sizes, [r["plain_tok_s"] for r in rs], "--o", color=f"C{i}", label=f"{workload}: plain")
        ax.plot(sizes, [r["ours_tok_s"] for r in rs], "-s", color=f"C{i}", label=f"{workload}: LookaheadDecoder")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("generated tokens per second (whole batch)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,4,8,16")
    parser.add_argument("--workloads", default="mix,code,chat")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default: %(default)s)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--compare-padded", action="store_true",
                        help="also run the decoder with batch_prefill='padded' (one padded prompt forward)")
    parser.add_argument("--out", default="benchmarks/results/batch")
    args = parser.parse_args(argv)

    import torch

    from lookahead import LookaheadDecoder
    from lookahead.models import load_smollm2

    torch.set_num_threads(args.threads)
    model, tokenizer = load_smollm2(getattr(torch, args.dtype), args.device)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    sizes = [int(s) for s in args.sizes.split(",")]
    results = []
    load_start = os.getloadavg()
    with torch.inference_mode():  # calibrate the cost curve (once per process) outside the timed calls
        curve = LookaheadDecoder().cost_curve(model)
    for workload in args.workloads.split(","):
        for size in sizes:  # a fresh decoder: no table learned from the same prompts at a smaller size
            padded = LookaheadDecoder(batch_prefill="padded") if args.compare_padded else None
            r = measure(model, tokenizer, LookaheadDecoder(), workload, size, args.max_new_tokens, padded)
            r["load_avg_1m"] = os.getloadavg()[0]
            results.append(r)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}), flush=True)
    command = "python -m benchmarks.batch " + " ".join(argv if argv is not None else sys.argv[1:])
    cpu = subprocess.run(["sh", "-c", "lscpu | grep 'Model name' | head -1"], capture_output=True, text=True).stdout
    meta = {"command": command.strip(), "cpu": cpu.split(":", 1)[-1].strip(), "cores": os.cpu_count(),
            "torch_threads": args.threads, "device": args.device, "dtype": args.dtype,
            "gpu": torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None, "python": platform.python_version(), "torch": torch.__version__,
            "load_avg_start": load_start, "load_avg_end": os.getloadavg(), "max_new_tokens": args.max_new_tokens,
            "cost_curve": curve.points}
    with open(args.out + ".json", "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
    where = "CPU" if args.device == "cpu" else meta["gpu"]
    plot(results, args.out + ".png", f"SmolLM2-135M {args.dtype}, {where}, greedy: batched generate")
    print(table(results))
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
