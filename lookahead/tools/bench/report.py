"""A bench run's reports: the JSON file, the Markdown tables and the PNG plot (``write_reports``)."""

from __future__ import annotations

import json
import os

from ..plots import plot_bench


def _f(x, fmt: str = "{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


def markdown(result: dict) -> str:
    """The run's context, one row per workload and method, then prompt by prompt."""
    ctx, settings = result["context"], result["settings"]
    model, hw, v = ctx["model"], ctx["hardware"], ctx["versions"]
    hardware = hw["gpu"] or f"{hw['cpu']} ({hw['cpu_count']} CPUs; torch threads: {hw['torch_threads']})"
    if hw.get("load_average_at_start") is not None:
        hardware += (f"; load average (1/5/15 min) {'/'.join(map(str, hw['load_average_at_start']))} at start, "
                     f"{'/'.join(map(str, hw.get('load_average_at_end') or []))} at end")
    mode = ctx["mode"] + (" (" + ", ".join(f"{k}={x}" for k, x in settings["sampling"].items()) + ")"
                          if settings.get("sampling") else "")
    git = v.get("git")
    if git:
        git = f"; git {git['commit'][:10]}" + (f" with uncommitted changes to {', '.join(git['modified'])}"
                                               if git["modified"] else "")
    lines = [
        "# lookahead benchmark", "",
        f"- model: {model['name']} ({model['class']}, {_count(model['parameters'])} parameters, {model['dtype']}, "
        f"{model['device']})",
        f"- hardware: {hardware}",
        f"- decoding: {mode}; {ctx['exact']}",
        f"- output length: max_new_tokens={settings['max_new_tokens']}; prompts: "
        + ", ".join(f"{wl} {n}" for wl, n in settings["prompts_per_workload"].items()),
        f"- versions: torch {v['torch']}, transformers {v['transformers']}, lookahead {v['lookahead']}, "
        f"python {v['python']}{git or ''}",
        f"- {settings['order']}; warm-up: {settings['warmup'] or 'none'}",
        f"- timing: {settings['timing']}",
        f"- state: {settings['state']}",
        f"- speed-up = {settings['speedup'].split(': ', 1)[-1]}; target calls = {settings['target_calls']}",
    ]
    if ctx.get("command"):
        lines.append(f"- command: `{ctx['command']}`")
    lines += ["", "Methods:", ""] + [f"- `{name}`: {m['description']}" for name, m in result["methods"].items()]
    lines += ["", "| workload | method | prompts | speed-up (median) | min–max | IQR | tokens/call | ms/call "
              "| tokens/s | identical |", "|---|---|---:|---:|---|---|---:|---:|---:|---:|"]
    for row in result["summary"]:
        if row["status"] != "ok":
            lines.append(f"| {row['workload']} | {row['method']} | 0 | {row['status']} | | | | | | |")
            continue
        ident = "–" if row["identical"] is None else f"{row['identical']}/{row['prompts']}"
        lines.append(
            f"| {row['workload']} | {row['method']} | {row['prompts']} | {_f(row['speedup_median'])}x | "
            f"{_f(row['speedup_min'])}–{_f(row['speedup_max'])} | {_f(row['speedup_q1'])}–{_f(row['speedup_q3'])} "
            f"| {_f(row['tokens_per_call'])} | {_f(row['ms_per_call'], '{:.0f}')} | "
            f"{_f(row['tokens_per_s'], '{:.1f}')} | {ident} |")
    lines += _first_calls(result.get("first_calls")) + _per_prompt(result)
    if result["unsupported"]:
        lines += ["", "Unsupported in this mode:", ""]
        lines += [f"- `{name}`: {why}" for name, why in result["unsupported"].items()]
    if result["mismatches"]:
        lines += ["", "Outputs NOT identical to plain generate (a bug unless at a near-tie of the top-2 logits):", ""]
        for mm in result["mismatches"]:
            d = mm["mismatch"]
            gap = f", plain's top-2 logit gap there {d['top2_gap']:.4f}" if "top2_gap" in d else ""
            lines.append(f"- {mm['workload']} / {mm['prompt_id']} / `{mm['method']}`: first difference at new "
                         f"token {d['first_difference']}{gap}")
    return "\n".join(lines) + "\n"


def _first_calls(firsts: dict | None) -> list[str]:
    """The run's first call of each method (the warm-up, which the medians leave out)."""
    if not firsts:
        return []
    lines = ["", f"The process's first call of each method (not in the medians): at most {firsts['max_new_tokens']} "
             f"new tokens on {firsts['prompt']}, one method after the other, in this order: "
             f"{', '.join(firsts['order'])}. Plain runs first, so its call pays the one-time costs of the process's "
             "first generate of any kind (torch's and transformers' set-up on first use), as a user's first call "
             "does; each later method then pays only its own (a decoder: its kernels, cost curve and corpus) and is "
             "spared torch's. In a fresh `python -m lookahead bench` these are the process's first calls; where the "
             "process ran generate before the bench, this run's first.", "",
             "| method | seconds | new tokens | target calls | tokens/call | time / plain's first call "
             "| decoded plain |", "|---|---:|---:|---:|---:|---:|---|"]
    for name, r in firsts["methods"].items():
        lines.append(f"| {name} | {r['status']} | | | | | |" if r["status"] != "ok" else
                     f"| {name} | {r['seconds']:.3f} | {r['new_tokens']} | {r['target_calls']} | "
                     f"{_f(r['tokens_per_call'])} | {_f(r['seconds_vs_plain'])}x | {r['decoded_plain'] or '–'} |")
    return lines


def _per_prompt(result: dict) -> list[str]:
    """Prompt by prompt: each method's speed-up against plain and its tokens per target call."""
    methods = [m for m in result["methods"] if m != "plain"]
    keyed = {(r["workload"], r["prompt_id"], r["method"]): r for r in result["records"]}
    prompts = list(dict.fromkeys((r["workload"], r["prompt_id"]) for r in result["records"]))
    if not methods or not prompts:
        return []
    lines = ["", "Per prompt: speed-up against plain `generate` (tokens per target call):", "",
             "| workload | prompt | new tokens | " + " | ".join(methods) + " |",
             "|---|---|---:|" + "---:|" * len(methods)]
    for wl, pid in prompts:
        cells = []
        for m in methods:
            r = keyed.get((wl, pid, m), {})
            ok = r.get("status") == "ok" and r.get("speedup_vs_plain") is not None
            cells.append(f"{r['speedup_vs_plain']:.2f}x ({r['tokens_per_call']:.2f})" if ok else r.get("status", "–"))
        lines.append(f"| {wl} | {pid} | {keyed.get((wl, pid, 'plain'), {}).get('new_tokens', '–')} | "
                     + " | ".join(cells) + " |")
    return lines


def write_reports(result: dict, out_dir: str) -> dict[str, str]:
    """Write ``bench.json``, ``bench.md`` and ``bench.png`` into ``out_dir``; returns their paths by kind."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {kind: os.path.join(out_dir, f"bench.{ext}") for kind, ext in
             (("json", "json"), ("markdown", "md"), ("plot", "png"))}
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    with open(paths["markdown"], "w", encoding="utf-8") as f:
        f.write(markdown(result))
    plot_bench(result, paths["plot"])
    return paths
