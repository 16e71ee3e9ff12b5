"""Speed of the n-gram trie (``lookahead.cache.NgramTrie``): microseconds per inserted token and per proposal.

    python benchmarks/trie_speed.py [--tokens 200000] [--calls 20000] [--max-n 8]

Streams (deterministic):
  synthetic  vocab 32000: Zipf-chosen "phrases" (4-40 tokens) with 5% random tokens between them
  stdlib-b   Python stdlib source, one token per byte (vocab <= 256: few, very bushy nodes)
  stdlib-w   the same source split into words/punctuation/whitespace runs, ids by first appearance

Columns:
  bulk       insert the whole stream in one call (capacity 2**20), us per token
  x4         a fresh trie fed 4 tokens per call (what a decoder does each step), us per token
  evict      bulk insert with capacity 2**16, so LRU eviction runs repeatedly, us per token
  propose    propose(the 16 tokens before a random position, max_nodes=16, max_depth=8, max_match=mm)
             on the full trie, us per call, for mm = max_n - 1 (the default) and mm = 3 (the
             decoder's default); `draft` is the mean number of nodes returned. A match of L tokens
             leaves max_n - L levels, so long matches give small, sure drafts.
  decode     a fresh trie: propose (mm=3) from the stream so far, then insert the next token, us
             per step
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lookahead.cache import NgramTrie  # noqa: E402


def synthetic_stream(n: int, vocab: int = 32000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    phrases = [rng.zipf(1.3, rng.integers(4, 41)) % vocab for _ in range(3000)]
    out: list[np.ndarray] = []
    total = 0
    while total < n:
        p = phrases[min(int(rng.zipf(1.2)) - 1, len(phrases) - 1)]
        noise = rng.integers(0, vocab, rng.poisson(0.05 * len(p)))
        out += [p, noise]
        total += len(p) + len(noise)
    return np.concatenate(out)[:n].astype(np.int64)


def stdlib_source(n_bytes: int) -> bytes:
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= n_bytes:
            break
    return b"".join(chunks)


def stdlib_bytes(n: int) -> np.ndarray:
    return np.frombuffer(stdlib_source(n)[:n], np.uint8).astype(np.int64)


def stdlib_words(n: int) -> np.ndarray:
    text = stdlib_source(8 * n).decode("utf-8", "replace")
    ids: dict[str, int] = {}
    toks = [ids.setdefault(w, len(ids)) for w in re.findall(r"\w+|[^\w\s]|\s+", text)[:n]]
    return np.array(toks, np.int64)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench(name: str, stream: np.ndarray, calls: int, max_n: int) -> dict:
    n = len(stream)
    row: dict = {"stream": name, "tokens": n, "vocab": len(np.unique(stream))}

    trie = NgramTrie(max_n=max_n, capacity=1 << 20)
    row["bulk"] = timed(lambda: trie.insert(stream)) / n * 1e6
    row["nodes"] = len(trie)
    row["ev_big"] = trie.n_evictions

    small = NgramTrie(max_n=max_n, capacity=1 << 20)
    chunks = [stream[i:i + 4] for i in range(0, n, 4)]

    def feed():
        for c in chunks:
            small.insert(c)

    row["x4"] = timed(feed) / n * 1e6

    ev = NgramTrie(max_n=max_n, capacity=1 << 16)
    row["evict"] = timed(lambda: ev.insert(stream)) / n * 1e6
    row["n_ev"] = ev.n_evictions

    rng = np.random.default_rng(1)
    pos = rng.integers(16, n, calls)
    ctxs = [stream[p - 16:p] for p in pos]
    for mm in (max_n - 1, 3):
        sizes = []

        def prop(mm=mm, sizes=sizes):
            for c in ctxs:
                sizes.append(len(trie.propose(c, 16, 8, mm)[0]))

        row[f"propose{mm}"] = timed(prop) / calls * 1e6
        row[f"draft{mm}"] = float(np.mean(sizes))

    dec = NgramTrie(max_n=max_n, capacity=1 << 20)
    steps = min(n, calls)
    dec.insert(stream[:16])
    ctx_views = [stream[i - 16:i] for i in range(16, steps)]
    next_tok = [stream[i:i + 1] for i in range(16, steps)]

    def decode():
        for c, t in zip(ctx_views, next_tok, strict=True):
            dec.propose(c, 16, 8, 3)
            dec.insert(t)

    row["decode"] = timed(decode) / len(ctx_views) * 1e6
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=200_000)
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--max-n", type=int, default=8)
    args = ap.parse_args()

    t0 = time.perf_counter()
    NgramTrie(max_n=args.max_n, capacity=4 * args.max_n**2)
    print(f"warm-up (JIT compile or cache load): {time.perf_counter() - t0:.2f} s")
    streams = {
        "synthetic": synthetic_stream(args.tokens),
        "stdlib-b": stdlib_bytes(args.tokens),
        "stdlib-w": stdlib_words(args.tokens),
    }
    rows = [bench(name, s, args.calls, args.max_n) for name, s in streams.items()]

    mm = args.max_n - 1
    print(f"\nmax_n={args.max_n}, {os.cpu_count()} CPUs; times in microseconds (us)")
    head = (f"{'stream':<10} {'tokens':>7} {'vocab':>6} {'nodes':>7} | {'bulk':>5} {'x4':>5} {'evict':>5} "
            f"{'(n_ev)':>6} | {f'propose mm={mm}':>13} {'draft':>5} | {'propose mm=3':>12} {'draft':>5} | "
            f"{'decode':>6}")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['stream']:<10} {r['tokens']:>7} {r['vocab']:>6} {r['nodes']:>7} | {r['bulk']:>5.2f} "
              f"{r['x4']:>5.2f} {r['evict']:>5.2f} {r['n_ev']:>6} | {r[f'propose{mm}']:>13.2f} "
              f"{r[f'draft{mm}']:>5.1f} | {r['propose3']:>12.2f} {r['draft3']:>5.1f} | {r['decode']:>6.2f}")

if __name__ == "__main__":
    main()
