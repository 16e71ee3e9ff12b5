"""What a new decoder costs before it decodes: construction, a batch's row policies, and a batched first call.

    PYTHONPATH=<checkout> python benchmarks/results/new-decoder/setup_cost.py [--rounds 7]

Only the public API (``LookaheadDecoder``, ``policies_for``, ``generate(custom_generate=...)``), so the same script
measures any checkout (with ``lookahead/cache`` linked to its ``cache/`` folder). One torch thread. Prints, per
measure, the median over rounds (each round a new decoder) in ms, and the resident memory a measure added (MB):

- ``decoder``: ``LookaheadDecoder()``;
- ``rows N``: ``policies_for(N)`` on a new decoder, what a batch of N rows builds inside its first ``generate``;
- ``batch 16, first call``: a new decoder's first ``generate`` of 16 rows x 24 new tokens on ``host_overhead.py``'s
  tiny model, and ``batch 16, rows made before`` the same call on a new decoder whose 16 row policies were made
  before the timer started (``policies_for(16)``): their difference is what the call pays to make them. (A decoder
  that already decoded this batch would not do: what its policies learned makes the same prompts' call faster.)
"""

import argparse
import gc
import json
import os
import statistics
import sys
import time

import torch

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", ".."))  # the repository root, last: benchmarks.*
from benchmarks.host_overhead import prompt_ids, tiny_model  # noqa: E402
from lookahead import LookaheadDecoder  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def timed(make, rounds: int) -> tuple[float, float]:
    """(median ms, median MB of resident memory added) of ``make()`` over ``rounds`` calls, each result kept until
    the next call has been measured (so memory freed by one round is not handed to the next)."""
    times, grown, keep = [], [], None
    for _ in range(rounds):
        gc.collect()
        before = rss_mb()
        t = time.perf_counter()
        result = make()
        times.append((time.perf_counter() - t) * 1e3)
        grown.append(rss_mb() - before)
        keep = result  # noqa: F841  (held: its memory stays resident while the next round is measured)
    return statistics.median(times), statistics.median(grown)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    import lookahead

    model, ids = tiny_model(), prompt_ids(16)
    kw = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False)
    warm = LookaheadDecoder()
    model.generate(ids, custom_generate=warm, **kw)  # compile and calibrate once, outside the timings
    out = {"lookahead": os.path.dirname(lookahead.__file__)}
    out["decoder"] = timed(LookaheadDecoder, args.rounds)
    for rows in (4, 16, 64):
        out[f"rows {rows}"] = timed(lambda rows=rows: LookaheadDecoder().policies_for(rows), args.rounds)

    def first_call():
        decoder = LookaheadDecoder()
        model.generate(ids, custom_generate=decoder, **kw)
        return decoder

    def rows_made_before():
        decoder = LookaheadDecoder()
        decoder.policies_for(16)
        t = time.perf_counter()
        model.generate(ids, custom_generate=decoder, **kw)
        return (time.perf_counter() - t) * 1e3

    out["batch 16, first call"] = timed(first_call, args.rounds)
    out["batch 16, rows made before"] = (statistics.median(rows_made_before() for _ in range(args.rounds)), 0.0)
    for name, value in out.items():
        if name != "lookahead":
            print(f"{name:24s} {value[0]:9.2f} ms {value[1]:8.1f} MB")
    print("lookahead from", out["lookahead"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
