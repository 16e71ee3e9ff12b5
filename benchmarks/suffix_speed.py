"""Speed of the suffix index (``lookahead.cache.SuffixIndex``): microseconds per appended token and per proposal.

    python -m benchmarks.suffix_speed [--tokens 200000] [--calls 20000]

Streams (deterministic): ``synthetic``, ``stdlib-b`` and ``stdlib-w`` as in ``benchmarks/trie_speed.py``
(Zipf phrases over 32000 ids; Python stdlib source as bytes; the same source as words), plus two
worst cases for the suffix-link walks: ``run`` (one token repeated) and ``period-7``.

Columns (times in microseconds):
  bulk      extend by the whole stream in one call (capacity >= the stream), per token
  x1, x4    a fresh index extended by 1 or 4 tokens per call (what a decoder does each step; Python
            call included), per token
  rebuild   bulk with capacity 2**14, so the index is rebuilt over its last 2**13 tokens every 2**13
            tokens, per token (``rebuilds`` times)
  propose   a decode loop: extend by one token, then propose (48 nodes, 32 deep, 4 branches of 8,
            min_match 1), per proposal, Python call included; ``draft`` is the mean number of nodes
            and ``match`` the mean match length
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from benchmarks.trie_speed import stdlib_bytes, stdlib_words, synthetic_stream
from lookahead.cache import SuffixIndex


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench(name: str, stream: np.ndarray, calls: int) -> dict:
    n = len(stream)
    row: dict = {"stream": name, "tokens": n, "vocab": len(np.unique(stream))}
    big = SuffixIndex(capacity=1 << (n - 1).bit_length())
    row["bulk"] = timed(lambda: big.extend(stream)) / n * 1e6
    for per in (1, 4):
        index = SuffixIndex(capacity=1 << (n - 1).bit_length())
        chunks = [stream[i:i + per] for i in range(0, n, per)]

        def feed(index=index, chunks=chunks):
            for c in chunks:
                index.extend(c)

        row[f"x{per}"] = timed(feed) / n * 1e6
    small = SuffixIndex(capacity=1 << 14)
    row["rebuild"] = timed(lambda: small.extend(stream)) / n * 1e6
    row["rebuilds"] = small.rebuilds

    dec = SuffixIndex(capacity=1 << 16)
    start = max(n - calls, 0)
    dec.extend(stream[:start])
    steps = [stream[i:i + 1] for i in range(start, n)]
    sizes, matches = [], []

    def decode():
        for t in steps:
            dec.extend(t)
            sizes.append(len(dec.propose(48, 32, 4, 8, 1)[0]))

    total = timed(decode)
    ext_only = SuffixIndex(capacity=1 << 16)
    ext_only.extend(stream[:start])
    t_ext = timed(lambda: [ext_only.extend(t) for t in steps])
    row["propose"] = (total - t_ext) / len(steps) * 1e6
    row["draft"] = float(np.mean(sizes))
    probe = SuffixIndex(capacity=1 << 16)
    probe.extend(stream[:start])
    for t in steps[:2000]:
        probe.extend(t)
        matches.append(probe.match_length)
    row["match"] = float(np.mean(matches))
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=200_000)
    ap.add_argument("--calls", type=int, default=20_000)
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    SuffixIndex(capacity=16)
    print(f"warm-up (JIT compile or cache load): {time.perf_counter() - t0:.2f} s")
    streams = {
        "synthetic": synthetic_stream(args.tokens),
        "stdlib-b": stdlib_bytes(args.tokens),
        "stdlib-w": stdlib_words(args.tokens),
        "run": np.full(args.tokens, 7, np.int64),
        "period-7": np.tile(np.arange(7, dtype=np.int64), args.tokens // 7 + 1)[: args.tokens],
    }
    rows = [bench(name, s, args.calls) for name, s in streams.items()]
    print(f"\n{os.cpu_count()} CPUs; times in microseconds (us)")
    head = (f"{'stream':<10} {'tokens':>7} {'vocab':>6} | {'bulk':>5} {'x1':>5} {'x4':>5} {'rebuild':>7} "
            f"{'(n)':>4} | {'propose':>7} {'draft':>5} {'match':>7}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['stream']:<10} {r['tokens']:>7} {r['vocab']:>6} | {r['bulk']:>5.2f} {r['x1']:>5.2f} "
              f"{r['x4']:>5.2f} {r['rebuild']:>7.2f} {r['rebuilds']:>4} | {r['propose']:>7.2f} {r['draft']:>5.1f} "
              f"{r['match']:>7.1f}")


if __name__ == "__main__":
    main()
