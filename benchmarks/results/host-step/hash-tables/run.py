"""The copy source's suffix index and the n-gram trie per decoding step, as a decode uses them: learn a step's
tokens, then propose.

    PYTHONPATH=OLD_CHECKOUT python benchmarks/results/host-step/hash-tables/run.py
    PYTHONPATH=NEW_CHECKOUT python benchmarks/results/host-step/hash-tables/run.py

The decoder's default sizes (``copy_capacity`` 65536 tokens; ``trie_capacity`` 262144 nodes of up to 12 tokens),
a 160-token prompt of a 40-token block repeated, then 300 steps of 5 new tokens (a flat-curve step's mean).
``warm``: steps back to back; ``evicted``: 64 MB written between steps, as a forward evicts a CPU's caches.
Median over 5 runs of the mean us per step.
"""

import statistics
import time

import numpy as np

from lookahead.cache import NgramTrie, SuffixIndex


def run(kind: str, evict: bool) -> float:
    rng = np.random.default_rng(0)
    prompt = np.tile(rng.integers(3, 256, 40), 4)
    steps = rng.integers(3, 256, (300, 5))
    junk = np.zeros(8_000_000)
    if kind == "suffix":
        index = SuffixIndex(1 << 16)
        index.extend(prompt)
    else:
        index = NgramTrie(12, 1 << 18)
        index.insert(prompt)
    total = 0.0
    for new in steps:
        if evict:
            junk += 1.0
        t = time.perf_counter()
        if kind == "suffix":
            index.extend(new)
            index.propose(56, 32, 4, 8)
        else:
            index.insert(new)
            index.propose(new[-3:], 16, 10, 3, with_match=True)
        total += time.perf_counter() - t
    return total / len(steps) * 1e6


if __name__ == "__main__":
    for kind in ("suffix", "trie"):
        run(kind, False)  # JIT
        for evict in (False, True):
            us = statistics.median(run(kind, evict) for _ in range(5))
            print(f"{kind} {'evicted' if evict else 'warm'}: {us:.1f} us per step")
