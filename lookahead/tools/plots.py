"""PNG plots of one call's budget and of a bench run (matplotlib), each on its own Agg ``Figure``: neither pyplot's
figure list nor the process's backend is touched."""

from __future__ import annotations


def _figure(width: float, height: float, ratios: list[int]):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("the plots need matplotlib: pip install matplotlib") from err
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)  # attaches itself as fig.canvas: savefig renders with Agg
    return fig, fig.subplots(1, 2, gridspec_kw={"width_ratios": ratios})


def plot_budgets(stats, path: str) -> str:
    """A PNG at ``path``: per step of ``stats`` (a ``DecodeStats``) the draft nodes verified, window rows and draft
    tokens accepted, beside the cost curve it priced with."""
    fig, (ax1, ax2) = _figure(12, 4, [3, 1])
    steps = range(len(stats.budgets))
    nodes = [b[0] for b in stats.budgets]
    window = [b[1] for b in stats.budgets]
    ax1.bar(steps, nodes, width=0.9, color="C0", label="draft nodes verified")
    if any(window):
        ax1.bar(steps, window, width=0.9, bottom=nodes, color="C2", alpha=0.6, label="window rows")
    accepted = stats.accepted_per_step[: len(nodes)]
    ax1.scatter(range(len(accepted)), accepted, s=10, color="C1", zorder=3, label="draft tokens accepted")
    ax1.set_xlabel("step (one target call each)")
    ax1.set_ylabel("tokens")
    ax1.set_title(f"{stats.new_tokens} tokens in {stats.target_calls} target calls "
                  f"({stats.tokens_per_call:.2f} tokens/call)", fontsize=9)
    ax1.legend(fontsize=8)
    if stats.cost_curve:
        ax2.plot([k for k, _ in stats.cost_curve], [t * 1e3 for _, t in stats.cost_curve], marker="o")
        ax2.set_xscale("log", base=2)
        ax2.set_xlabel("new tokens in one forward")
        ax2.set_ylabel("ms")
        ax2.set_title("cost curve (at the call's start)", fontsize=9)
    else:
        ax2.text(0.5, 0.5, "fixed budget:\nno cost curve", ha="center", va="center", transform=ax2.transAxes)
        ax2.set_axis_off()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def plot_bench(result: dict, path: str) -> str:
    """A PNG at ``path``: a bench run's speed-up per workload and method beside the accepted-length histogram."""
    fig, (ax1, ax2) = _figure(13, 4.8, [3, 2])
    rows = [r for r in result["summary"] if r["status"] == "ok" and r["method"] != "plain"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    width = 0.8 / max(len(methods), 1)
    colors = {m: f"C{j}" for j, m in enumerate(methods)}  # one colour per method in both panels
    for j, m in enumerate(methods):
        shown = [(i + (j - (len(methods) - 1) / 2) * width, r) for i, wl in enumerate(workloads) for r in rows
                 if r["workload"] == wl and r["method"] == m and r["speedup_median"] is not None]
        for x, r in shown:
            dots = [rec["speedup_vs_plain"] for rec in result.get("records", []) if rec["method"] == m
                    and rec["workload"] == r["workload"] and rec.get("speedup_vs_plain") is not None]
            offsets = [(k - (len(dots) - 1) / 2) * width * 0.5 / max(len(dots), 1) for k in range(len(dots))]
            ax1.scatter([x + o for o in offsets], dots, s=9, color="black", zorder=3, linewidths=0)
        med = [r["speedup_median"] for _, r in shown]
        spread = [[r["speedup_median"] - r["speedup_min"] for _, r in shown],
                  [r["speedup_max"] - r["speedup_median"] for _, r in shown]]
        ax1.bar([x for x, _ in shown], med, width, yerr=spread, capsize=3, label=m, color=colors[m], ecolor="gray")
    ax1.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax1.set_xticks(range(len(workloads)), workloads, fontsize=8)
    ax1.set_ylabel("speed-up vs plain generate (tokens/s ratio)")
    ctx = result["context"]
    hw = ctx["hardware"]["gpu"] or f"{ctx['hardware']['cpu']}, torch threads: {ctx['hardware']['torch_threads']}"
    ax1.set_title(f"{ctx['model']['name']}, {ctx['mode']}, max {result['settings']['max_new_tokens']} new tokens\n"
                  f"{hw}; bar: median over prompts, dots: each prompt, whiskers: min-max", fontsize=9)
    if methods:
        ax1.legend(fontsize=8)
    else:
        ax1.text(0.5, 0.5, "no method beside plain ran", ha="center", va="center", transform=ax1.transAxes)
    hists = [r for r in rows if r["workload"] == "all" and r.get("accepted_hist")]
    if hists:
        top = max(int(k) for r in hists for k in r["accepted_hist"])
        w = 0.8 / len(hists)
        for j, r in enumerate(hists):
            counts = {int(k): v for k, v in r["accepted_hist"].items()}
            total = sum(counts.values())
            ax2.bar([k + (j - (len(hists) - 1) / 2) * w for k in range(top + 1)],
                    [counts.get(k, 0) / total for k in range(top + 1)], w, label=r["method"],
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
