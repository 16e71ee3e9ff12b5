"""bf16 on a CPU, code editing: the decoder priced by a measured curve, by a learnt one, and prompt lookup.

    python -m benchmarks.bf16_steps [--prompts 8] [--max-new-tokens 128] [--threads 2] [--out FILE.json]

In one process (SmolLM2-135M-Instruct in bfloat16, an empty ``LOOKAHEAD_CACHE`` of its own), every code-editing
prompt runs plain ``generate``, prompt lookup (``prompt_lookup_num_tokens=10``), the decoder pricing drafts with a
curve measured by timed synthetic steps (``Tuning(calibrate=True)``, what ``warmup --calibrate`` does, measured once
and then kept) and the default decoder, which learns its curve from its own steps (kept in the process); each has
a curve registry of its own. The order
rotates prompt by prompt; one untimed call of each comes first. Per method: speed-up against plain (per prompt, the
median), tokens per target call, milliseconds per call, and the decoder's host work per step (drafting, verifying
and bookkeeping, the forward excluded). Then the two curves side by side: what a bf16 step of ``k`` rows costs as
measured by timing, and as learnt from the decoding steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    import torch

    from lookahead.user_cache import cache_dir

    models = os.path.join(cache_dir(), "models")  # converted weights, linked in (not converted again)
    os.environ["LOOKAHEAD_CACHE"] = tempfile.mkdtemp(prefix="lookahead-bf16-")
    if os.path.isdir(models):
        os.symlink(models, os.path.join(os.environ["LOOKAHEAD_CACHE"], "models"))

    torch.set_num_threads(args.threads)
    from lookahead import LookaheadDecoder
    from lookahead._tuning import Tuning
    from lookahead.cost import Calibrations
    from lookahead.tools.bench.runner import encode
    from lookahead.tools.bench.workloads import build_workloads
    from lookahead.tools.models import load_smollm2

    model, tok = load_smollm2()
    model = model.to(torch.bfloat16)
    prompts = build_workloads(["code-editing"], args.prompts)["code-editing"]
    pad = model.generation_config.eos_token_id
    pad = pad[0] if isinstance(pad, (list, tuple)) else pad
    decoders = {"measured": [], "learnt": []}
    registries = {"measured": Calibrations(), "learnt": Calibrations()}  # each its own curve, kept in the process
    methods = {
        "plain": lambda: {},
        "prompt-lookup": lambda: {"prompt_lookup_num_tokens": 10},
        "measured": lambda: {"custom_generate": decoders["measured"][-1]},
        "learnt": lambda: {"custom_generate": decoders["learnt"][-1]},
    }

    def run(name: str, inputs: dict, max_new: int) -> dict:
        if name == "measured":
            decoders[name].append(LookaheadDecoder(_tuning=Tuning(calibrate=True), _calibrations=registries[name]))
        elif name == "learnt":
            decoders[name].append(LookaheadDecoder(_calibrations=registries[name]))
        calls = [0]
        hook = model.register_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=max_new, do_sample=False, pad_token_id=pad, **methods[name]())
        seconds = time.perf_counter() - t
        hook.remove()
        new = out.shape[1] - inputs["input_ids"].shape[1]
        rec = {"seconds": seconds, "new_tokens": new, "forwards": calls[0]}
        if name in decoders:
            s = decoders[name][-1].stats
            steps = max(1, len(s.budgets))
            rec.update(steps=len(s.budgets), target_calls=s.target_calls, forward_s=s.time_forward,
                       host_ms_per_step=1000 * (s.time_propose + s.time_verify + s.time_bookkeeping) / steps,
                       mean_rows=statistics.mean(1 + n + w for n, w in s.budgets) if s.budgets else 1.0,
                       curve=[(int(k), float(t)) for k, t in (s.cost_curve or ())])
        return rec

    first = encode(prompts[0], tok, "cpu")
    for name in methods:  # untimed: plain pays torch's one-time costs, "measured" times its curve
        run(name, first, 16)
    records = []
    names = list(methods)
    for i, p in enumerate(prompts):
        inputs = encode(p, tok, "cpu")
        rec = {"prompt": p.id}
        for name in names[i % 4:] + names[: i % 4]:
            rec[name] = run(name, inputs, args.max_new_tokens)
        records.append(rec)
        print(p.id, {n: round(rec["plain"]["seconds"] / rec[n]["seconds"] * rec[n]["new_tokens"]
                              / max(1, rec["plain"]["new_tokens"]), 2) for n in names[1:]}, flush=True)
    summary = {}
    for name in names[1:]:
        speed = [r["plain"]["seconds"] / r[name]["seconds"] * r[name]["new_tokens"] / max(1, r["plain"]["new_tokens"])
                 for r in records]
        tokens = sum(r[name]["new_tokens"] for r in records)
        forwards = sum(r[name]["forwards"] for r in records)
        row = {"speedup_median": statistics.median(speed), "speedup_min": min(speed),
               "tokens_per_call": tokens / forwards, "ms_per_call": 1000 * sum(r[name]["seconds"] for r in records)
               / forwards}
        if name in decoders:
            row["host_ms_per_step"] = statistics.median(r[name]["host_ms_per_step"] for r in records)
            row["mean_rows_per_step"] = statistics.mean(r[name]["mean_rows"] for r in records)
            row["curve_last_call"] = records[-1][name]["curve"]
        summary[name] = row
    plain_ms = 1000 * sum(r["plain"]["seconds"] for r in records) / sum(r["plain"]["forwards"] for r in records)
    print(f"plain: {plain_ms:.1f} ms per call")
    for name, row in summary.items():
        print(f"{name}: {row['speedup_median']:.2f}x median (min {row['speedup_min']:.2f}x), "
              f"{row['tokens_per_call']:.2f} tokens/call, {row['ms_per_call']:.1f} ms/call"
              + (f", host {row['host_ms_per_step']:.2f} ms/step, {row['mean_rows_per_step']:.1f} rows/step"
                 if "host_ms_per_step" in row else ""))
    for name in decoders:
        pts = summary[name]["curve_last_call"]
        print(f"{name} curve (ms): " + ", ".join(f"{k}: {1000 * t:.1f}" for k, t in pts if k <= 64))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python -m benchmarks.bf16_steps " + " ".join(argv or []), "plain_ms_per_call":
                       plain_ms, "summary": summary, "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
