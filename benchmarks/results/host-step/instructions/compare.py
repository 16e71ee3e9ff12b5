"""Per-step instructions of ``run.sh``'s two checkouts, per method, and the functions whose counts moved most.

    python benchmarks/results/host-step/instructions/compare.py OUT_DIR [--top 12] [--json OUT.json]
"""

import argparse
import glob
import json
import os
import re
import subprocess


def steps(log: str) -> int:
    with open(log) as f:
        return int(re.search(r"steps (\d+)", f.read()).group(1))


def by_function(callgrind: str) -> dict[str, int]:
    """Instructions per function (callgrind_annotate's list; JIT-compiled code, which has no name, as one entry)."""
    out = subprocess.run(["callgrind_annotate", "--threshold=100", callgrind], capture_output=True, text=True).stdout
    counts: dict[str, int] = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+(.*)", line)
        if m:
            name = m.group(2).split(" [")[0].strip()
            name = "(JIT-compiled code)" if name.startswith("???:0x") else name
            counts[name] = counts.get(name, 0) + int(m.group(1).replace(",", ""))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json")
    args = ap.parse_args()
    report = {}
    methods = sorted({os.path.basename(p)[4:-10] for p in glob.glob(f"{args.out}/new-*.callgrind")})
    for m in methods:
        per = {}
        for v in ("base", "new"):
            n = steps(f"{args.out}/{v}-{m}.log")
            per[v] = (n, {k: c / n for k, c in by_function(f"{args.out}/{v}-{m}.callgrind").items()})
        (nb, b), (nn, n) = per["base"], per["new"]
        total_b, total_n = b.pop("PROGRAM TOTALS"), n.pop("PROGRAM TOTALS")
        moved = sorted(set(b) | set(n), key=lambda k: -abs(n.get(k, 0) - b.get(k, 0)))[: args.top]
        report[m] = {"steps": [nb, nn], "per_step": [round(total_b), round(total_n)],
                     "moved": {k: round(n.get(k, 0) - b.get(k, 0)) for k in moved}}
        print(f"{m}: {nb} / {nn} steps; instructions per step {total_b:,.0f} -> {total_n:,.0f} "
              f"({total_n - total_b:+,.0f}, {total_n / total_b - 1:+.2%})")
        for k in moved:
            print(f"    {n.get(k, 0) - b.get(k, 0):+10,.0f}  {k[:110]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
