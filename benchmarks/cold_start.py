"""The first call's tax: the first ``generate`` of a fresh process, plain and with the decoder.

    python -m benchmarks.cold_start [--threads 2] [--rounds 3] [--tokens 32] [--out FILE.json]

Each measurement is its own fresh Python process (the model loads from its converted copy first, not
timed). It times the first ``generate`` of a ``--tokens``-token greedy answer to one chat prompt, then a
second one in the same process:

- ``plain``: plain ``generate``;
- ``decoder``: ``LookaheadDecoder()`` with the user's cache as it is (after ``python -m lookahead warmup
  --calibrate``: a kept cost curve, compiled kernels);
- ``decoder-uncalibrated``: the same with ``LOOKAHEAD_CACHE`` pointing at an empty folder, so the call
  measures the cost curve itself (the converted weights are linked in from the user's cache, and the
  kernels stay compiled: Numba's cache is not there).

The processes alternate plain / decoder / decoder-uncalibrated for ``--rounds`` rounds, and each figure
is the median of its rounds. The goal is written against the median of ``plain``'s first calls:
``first decoder call <= 1.1 x plain first call + 0.2 s``. ``--demo`` also times ``python -m lookahead
demo`` end to end, once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[2]))
from lookahead.tools.demo import chat_inputs
from lookahead.tools.models import load_smollm2
model, tok = load_smollm2()
inputs = chat_inputs(tok, "Write a Python function that returns the sum of a list of numbers.")
kw = dict(max_new_tokens=int(sys.argv[3]), do_sample=False)
out = {}
if sys.argv[1] == "plain":
    for name in ("first", "second"):
        t = time.perf_counter(); model.generate(**inputs, **kw); out[name] = time.perf_counter() - t
else:
    from lookahead import LookaheadDecoder
    for name in ("first", "second"):
        d = LookaheadDecoder()
        t = time.perf_counter(); model.generate(**inputs, **kw, custom_generate=d)
        out[name] = time.perf_counter() - t
        out[name + "_calibration"] = d.stats.time_calibration
        out[name + "_calls"] = d.stats.target_calls
print(json.dumps(out))
"""


def child(mode: str, threads: int, tokens: int, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(threads), str(tokens)], env=env,
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--demo", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from lookahead.user_cache import cache_dir

    runs: dict[str, list[dict]] = {"plain": [], "decoder": [], "decoder-uncalibrated": []}
    models = os.path.join(cache_dir(), "models")
    with tempfile.TemporaryDirectory() as empty_root:
        for r in range(args.rounds):
            for mode in runs:
                env = dict(os.environ)
                if mode == "decoder-uncalibrated":
                    fresh = os.path.join(empty_root, f"round{r}")
                    os.makedirs(fresh)
                    if os.path.isdir(models):  # the converted weights, not a kept curve
                        os.symlink(models, os.path.join(fresh, "models"))
                    env["LOOKAHEAD_CACHE"] = fresh
                runs[mode].append(child("plain" if mode == "plain" else "decoder", args.threads, args.tokens, env))
                print(mode, runs[mode][-1], file=sys.stderr, flush=True)
    med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in runs.items()}
    budget = 1.1 * med["plain"]["first"] + 0.2
    result = {"threads": args.threads, "tokens": args.tokens, "rounds": args.rounds, "runs": runs,
              "median": med, "goal_seconds": budget}
    if args.demo:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "lookahead", "demo"], check=True, capture_output=True)
        result["demo_seconds"] = time.perf_counter() - t
    for mode, m in med.items():
        print(f"{mode:22s} first {m['first']:.2f} s  second {m['second']:.2f} s"
              + (f"  (calibration {m['first_calibration']:.2f} s)" if "first_calibration" in m else ""))
    print(f"goal: first decoder call <= 1.1 x {med['plain']['first']:.2f} + 0.2 = {budget:.2f} s")
    if "demo_seconds" in result:
        print(f"demo end to end: {result['demo_seconds']:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
