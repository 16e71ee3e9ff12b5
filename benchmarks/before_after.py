"""Two installs of lookahead side by side in one run: speed against plain ``generate``, prompt by prompt, both orders.

Each install runs in a worker process of its own (``PYTHONPATH`` picks it: ``--before`` is a folder holding an older
``lookahead`` package, e.g. ``pip install --no-deps --target /tmp/old_site <old checkout>``; the other worker uses the
``lookahead`` this interpreter imports). Both load SmolLM2-135M-Instruct in fp32 with the same torch threads. For
every prompt the driver asks one worker, then the other (the order alternates prompt by prompt), to decode it with
plain ``generate``, the default ``LookaheadDecoder()`` and plain again (the A/A control), in a rotated order, and
with the decoder on the flat cost curve (the GPU regime, where tokens per call is the speed-up; no clock involved).

Per prompt and install: the decoder's speed-up over plain (tokens per second, measured back to back), the A/A
ratio, tokens per call on the measured and on the flat curve, and whether the output is plain's. The table compares
the two installs prompt by prompt (after / before of the speed-up).

    python -m benchmarks.before_after --before /tmp/old_site --workloads code-editing,code-completion,chat \\
        --prompts-per-workload 8 --max-new-tokens 128 --threads 2 --out benchmarks/results/before-after
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

FLAT = ((1, 0.010), (2, 0.010), (256, 0.0102))

WORKER = r'''
import inspect, json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
import lookahead
from lookahead import LookaheadDecoder
try:  # an older install's loader first: a newer one's tools may be importable beside it
    from lookahead.models import load_smollm2
except ImportError:
    from lookahead.tools.models import load_smollm2
model, tok = load_smollm2()

def run(ids, max_new, decoder):
    extra = {} if decoder is None else {"custom_generate": decoder}
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False, **extra)
    return out[0, len(ids):].tolist(), time.perf_counter() - t

warm = [1, 2, 3] * 10
run(warm, 8, None); run(warm, 8, LookaheadDecoder()); run(warm, 8, LookaheadDecoder(cost_curve=FLAT))
print(json.dumps({"ready": lookahead.__file__}), flush=True)  # warmed up (curves measured) before any timing
for line in sys.stdin:
    job = json.loads(line)
    ids, max_new, rot = job["ids"], job["max_new"], job["rotate"]
    order = ["plain", "lookahead", "plain-again"]
    order = order[rot % 3:] + order[:rot % 3]
    res = {}
    for name in order:
        decoder = LookaheadDecoder() if name == "lookahead" else None
        out, seconds = run(ids, max_new, decoder)
        res[name] = {"tokens": out, "seconds": seconds}
        if decoder is not None:
            res[name]["tokens_per_call"] = decoder.stats.tokens_per_call
    flat = LookaheadDecoder(cost_curve=FLAT)
    out, _ = run(ids, max_new, flat)
    res["flat"] = {"tokens": out, "tokens_per_call": flat.stats.tokens_per_call}
    print(json.dumps(res), flush=True)
'''.replace("FLAT", repr(FLAT))


class Worker:
    def __init__(self, label: str, pythonpath: str | None, threads: int):
        env = dict(os.environ)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
        self.label = label
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(threads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd="/")
        self.where = json.loads(self._line())["ready"]

    def _line(self) -> str:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the {self.label} worker ended")
            if line.startswith("{"):
                return line

    def ask(self, job: dict) -> dict:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def prompts(workloads: list[str], n: int) -> list[tuple[str, str, list[int]]]:
    from lookahead.tools.bench.runner import encode
    from lookahead.tools.bench.workloads import build_workloads
    from lookahead.tools.models import load_smollm2

    _, tok = load_smollm2()
    out = []
    for wl, ps in build_workloads(workloads, n).items():
        for p in ps:
            out.append((wl, p.id, encode(p, tok, "cpu")["input_ids"][0].tolist()))
    return out


def summarise(rows: list[dict], labels: list[str]) -> list[str]:
    def gm(xs):
        return statistics.geometric_mean(xs) if xs else float("nan")

    lines = ["| workload | prompts | " + " | ".join(
        f"{lb} speed-up (median, min) | {lb} A/A | {lb} tokens/call | {lb} flat tokens/call | {lb} identical"
        for lb in labels) + " | after/before (geomean, range) |", "|---|---|" + "---|" * (5 * len(labels) + 1)]
    for wl in [*dict.fromkeys(r["workload"] for r in rows), "all"]:
        rs = [r for r in rows if wl == "all" or r["workload"] == wl]
        cells = []
        for lb in labels:
            sp = [r[lb]["speedup"] for r in rs]
            cells.append(f"{statistics.median(sp):.2f}x ({min(sp):.2f}x) | {statistics.median(r[lb]['aa'] for r in rs):.2f}"
                         f" | {statistics.mean(r[lb]['tpc'] for r in rs):.2f} | "
                         f"{statistics.mean(r[lb]['flat_tpc'] for r in rs):.2f} | "
                         f"{sum(r[lb]['identical'] for r in rs)}/{len(rs)}")
        ratio = [r[labels[1]]["speedup"] / r[labels[0]]["speedup"] for r in rs]
        lines.append(f"| {wl} | {len(rs)} | " + " | ".join(cells) +
                     f" | {gm(ratio):.3f} ({min(ratio):.2f}-{max(ratio):.2f}) |")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="a folder holding the older lookahead package (its PYTHONPATH)")
    ap.add_argument("--workloads", default="code-editing,code-completion,chat")
    ap.add_argument("--prompts-per-workload", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench-out/before-after")
    args = ap.parse_args(argv)
    jobs = prompts(args.workloads.split(","), args.prompts_per_workload)
    workers = [Worker("before", args.before, args.threads), Worker("after", None, args.threads)]
    labels = [w.label for w in workers]
    rows = []
    start = time.time()
    try:
        for i, (wl, pid, ids) in enumerate(jobs):
            row = {"workload": wl, "prompt": pid, "prompt_tokens": len(ids)}
            for w in (workers if i % 2 == 0 else workers[::-1]):
                res = w.ask({"ids": ids, "max_new": args.max_new_tokens, "rotate": i})
                plain, la, again = res["plain"], res["lookahead"], res["plain-again"]
                n = len(plain["tokens"])
                row[w.label] = {"speedup": (len(la["tokens"]) / la["seconds"]) / (n / plain["seconds"]),
                                "aa": plain["seconds"] / again["seconds"], "tpc": la["tokens_per_call"],
                                "flat_tpc": res["flat"]["tokens_per_call"],
                                "identical": la["tokens"] == plain["tokens"] and res["flat"]["tokens"] == plain["tokens"],
                                "plain_s": plain["seconds"], "lookahead_s": la["seconds"], "new_tokens": n}
            rows.append(row)
            print(f"{wl} {pid}: " + ", ".join(f"{lb} {row[lb]['speedup']:.2f}x ({row[lb]['tpc']:.2f})"
                                                for lb in labels), flush=True)
    finally:
        for w in workers:
            w.close()
    os.makedirs(args.out, exist_ok=True)
    table = summarise(rows, labels)
    command = "python -m benchmarks.before_after " + " ".join(sys.argv[1:] if argv is None else argv)
    with open(os.path.join(args.out, "before-after.json"), "w") as f:
        json.dump({"command": command, "where": {w.label: w.where for w in workers}, "settings": vars(args),
                   "seconds": time.time() - start, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "before-after.md"), "w") as f:
        f.write(f"`{command}`\n\n" + "\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
