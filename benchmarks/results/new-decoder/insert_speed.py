"""The n-gram trie's insert speed, as a decode feeds it: 20k Zipf-distributed tokens (5000 distinct) in inserts of 4.

    PYTHONPATH=<checkout> python benchmarks/results/new-decoder/insert_speed.py

Prints the median of 5 runs in ms for a new trie of 2^18 nodes (no eviction) and of 2^14 (evicting), each run
including the trie's construction.
"""

import statistics
import time

import numpy as np

from lookahead.cache import NgramTrie

TOKENS = np.random.default_rng(0).zipf(1.3, 20000) % 5000


def fill(capacity: int) -> None:
    trie = NgramTrie(max_n=8, capacity=capacity)
    for i in range(0, len(TOKENS), 4):
        trie.insert(TOKENS[i:i + 4])


def median_ms(capacity: int, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fill(capacity)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


if __name__ == "__main__":
    fill(1 << 14)  # compile or load the kernels
    print(f"2^18 nodes {median_ms(1 << 18):.1f} ms   2^14 nodes (evicting) {median_ms(1 << 14):.1f} ms")
