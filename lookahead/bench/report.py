"""Reports of a benchmark run: the JSON file, the Markdown table and the PNG plot."""

from __future__ import annotations

import json
import os


def _f(x, fmt: str = "{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


def _git(g: dict | None) -> str:
    if not g:
        return ""
    mod = f" with uncommitted changes to {', '.join(g['modified'])}" if g["modified"] else ""
    return f"; git {g['commit'][:10]}{mod}"


def markdown(result: dict) -> str:
    """The run's context, then one row per workload and method: speed-up vs plain (median, min–max,
    IQR), tokens per target call, tokens/s, identical outputs."""
    ctx, settings = result["context"], result["settings"]
    model, hw, v = ctx["model"], ctx["hardware"], ctx["versions"]
    hardware = hw["gpu"] or f"{hw['cpu']} ({hw['cpu_count']} CPUs; torch threads: {hw['torch_threads']})"
    if hw.get("load_average_at_start") is not None:
        hardware += (f"; load average (1/5/15 min) {'/'.join(map(str, hw['load_average_at_start']))} at start, "
                     f"{'/'.join(map(str, hw.get('load_average_at_end') or []))} at end")
    mode = ctx["mode"]
    if settings.get("sampling"):
        mode += " (" + ", ".join(f"{k}={val}" for k, val in settings["sampling"].items()) + ")"
    n_prompts = ", ".join(f"{wl} {n}" for wl, n in settings["prompts_per_workload"].items())
    lines = [
        "# lookahead benchmark",
        "",
        f"- model: {model['name']} ({model['class']}, {_count(model['parameters'])} parameters, "
        f"{model['dtype']}, {model['device']})",
        f"- hardware: {hardware}",
        f"- decoding: {mode}; {ctx['exact']}",
        f"- output length: max_new_tokens={settings['max_new_tokens']}; prompts: {n_prompts}",
        f"- versions: torch {v['torch']}, transformers {v['transformers']}, lookahead {v['lookahead']}, "
        f"python {v['python']}" + _git(v.get("git")),
        f"- {settings['order']}; warm-up: {settings['warmup'] or 'none'}",
        f"- timing: {settings.get('timing', 'one run per prompt and method')}",
        f"- state: {settings.get('state', 'not recorded')}",
        f"- speed-up = {settings['speedup'].split(': ', 1)[-1]}; target calls = {settings['target_calls']}",
    ]
    if ctx.get("command"):
        lines.append(f"- command: `{ctx['command']}`")
    lines += ["", "Methods:", ""]
    for name, m in result["methods"].items():
        lines.append(f"- `{name}`: {m['description']}")
    lines += [
        "",
        "| workload | method | prompts | speed-up (median) | min–max | IQR | tokens/call | ms/call | tokens/s "
        "| identical |",
        "|---|---|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for row in result["summary"]:
        if row["status"] != "ok":
            lines.append(f"| {row['workload']} | {row['method']} | 0 | {row['status']} | | | | | | |")
            continue
        ident = "–" if row["identical"] is None else f"{row['identical']}/{row['prompts']}"
        lines.append(
            f"| {row['workload']} | {row['method']} | {row['prompts']} | {_f(row['speedup_median'])}x | "
            f"{_f(row['speedup_min'])}–{_f(row['speedup_max'])} | {_f(row['speedup_q1'])}–{_f(row['speedup_q3'])} | "
            f"{_f(row['tokens_per_call'])} | {_f(row['ms_per_call'], '{:.0f}')} | {_f(row['tokens_per_s'], '{:.1f}')} "
            f"| {ident} |"
        )
    lines += _per_prompt(result)
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
        plain = keyed.get((wl, pid, "plain"), {})
        cells = []
        for m in methods:
            r = keyed.get((wl, pid, m))
            if r is None or r.get("status") != "ok" or r.get("speedup_vs_plain") is None:
                cells.append(r.get("status", "–") if r else "–")
            else:
                cells.append(f"{r['speedup_vs_plain']:.2f}x ({r['tokens_per_call']:.2f})")
        lines.append(f"| {wl} | {pid} | {plain.get('new_tokens', '–')} | " + " | ".join(cells) + " |")
    return lines


def plot(result: dict, path: str) -> str:
    """Speed-up per workload and method (median bar, min–max whisker) beside the accepted-length histogram.

    Draws on its own ``Figure`` with the Agg canvas, so neither pyplot's figure list nor the process's
    matplotlib backend is touched (a notebook or GUI user keeps theirs).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [r for r in result["summary"] if r["status"] == "ok" and r["method"] != "plain"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig = Figure(figsize=(13, 4.8))
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas: savefig renders with Agg
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / max(len(methods), 1)
    colors = {m: f"C{j}" for j, m in enumerate(methods)}  # one colour per method in both panels
    for j, m in enumerate(methods):
        xs, med, lo, hi = [], [], [], []
        for i, wl in enumerate(workloads):
            r = next((r for r in rows if r["workload"] == wl and r["method"] == m), None)
            if r is None or r["speedup_median"] is None:
                continue
            x = i + (j - (len(methods) - 1) / 2) * width
            xs.append(x)
            med.append(r["speedup_median"])
            lo.append(r["speedup_median"] - r["speedup_min"])
            hi.append(r["speedup_max"] - r["speedup_median"])
            per_prompt = [rec["speedup_vs_plain"] for rec in result.get("records", [])
                          if rec["method"] == m and rec.get("speedup_vs_plain") is not None
                          and (wl == "all" or rec["workload"] == wl)]
            if per_prompt and wl != "all":  # each prompt as a dot: the spread a median hides
                offsets = [(k - (len(per_prompt) - 1) / 2) * width * 0.5 / max(len(per_prompt), 1)
                           for k in range(len(per_prompt))]
                ax1.scatter([x + o for o in offsets], per_prompt, s=9, color="black", zorder=3, linewidths=0)
        ax1.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=m, color=colors[m], ecolor="gray")
    ax1.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax1.set_xticks(range(len(workloads)), workloads)
    ax1.set_ylabel("speed-up vs plain generate (tokens/s ratio)")
    ctx = result["context"]
    hw = ctx["hardware"]["gpu"] or f"{ctx['hardware']['cpu']}, torch threads: {ctx['hardware']['torch_threads']}"
    ax1.set_title(f"{ctx['model']['name']}, {ctx['mode']}, max {result['settings']['max_new_tokens']} new tokens\n"
                  f"{hw}; bar: median over prompts, dots: each prompt, whiskers: min–max", fontsize=9)
    if methods:
        ax1.legend(fontsize=8)
    else:
        ax1.text(0.5, 0.5, "no method beside plain ran", ha="center", va="center", transform=ax1.transAxes)

    hist_rows = [r for r in rows if r["workload"] == "all" and r.get("accepted_hist")]
    if hist_rows:
        top = max(max(int(k) for k in r["accepted_hist"]) for r in hist_rows)
        hw2 = 0.8 / len(hist_rows)
        for j, r in enumerate(hist_rows):
            total = sum(r["accepted_hist"].values())
            ks = list(range(top + 1))
            fr = [r["accepted_hist"].get(k, r["accepted_hist"].get(str(k), 0)) / total for k in ks]
            ax2.bar([k + (j - (len(hist_rows) - 1) / 2) * hw2 for k in ks], fr, hw2, label=r["method"],
                    color=colors.get(r["method"]))
        ax2.set_xticks(range(top + 1))
        ax2.legend(fontsize=8)
    else:
        ax2.text(0.5, 0.5, "no decoder statistics", ha="center", va="center", transform=ax2.transAxes)
    ax2.set_xlabel("draft tokens accepted in a step")
    ax2.set_ylabel("fraction of steps (all workloads)")
    ax2.set_title("accepted length per target call", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def write_reports(result: dict, out_dir: str, stem: str = "bench") -> dict[str, str]:
    """Write ``{stem}.json``, ``{stem}.md`` and ``{stem}.png`` into ``out_dir``; return their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {k: os.path.join(out_dir, f"{stem}.{ext}") for k, ext in
             (("json", "json"), ("markdown", "md"), ("plot", "png"))}
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, sort_keys=False)
        f.write("\n")
    with open(paths["markdown"], "w", encoding="utf-8") as f:
        f.write(markdown(result))
    plot(result, paths["plot"])
    return paths
