"""Numba helpers the stores share, each inlined into its caller: a pair hash, a best-first heap, ``bucket``.

:data:`MIX1` / :data:`MIX2` (splitmix64 multipliers) are used by ``lookahead.recycle``'s pair keys too.
"""

from __future__ import annotations

import numpy as np
from numba import njit

MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, inline="always")
def pair_slot(a, b, mask):
    """Slot of ``(a, b)`` (both < 2**32) in a table of ``mask + 1`` (a power of two) entries: the splitmix64
    finaliser of ``(a << 32) | b``, masked."""
    x = (np.uint64(a) << np.uint64(32)) | np.uint64(b)
    x ^= x >> np.uint64(30)
    x *= MIX1
    x ^= x >> np.uint64(27)
    x *= MIX2
    x ^= x >> np.uint64(31)
    return np.int64(x & np.uint64(mask))


@njit(cache=True, inline="always")
def _before(score, depth, tie, a, b):
    """Entry ``a`` pops before entry ``b``: higher score, then shallower, then higher tie."""
    if score[a] != score[b]:
        return score[a] > score[b]
    if depth[a] != depth[b]:
        return depth[a] < depth[b]
    return tie[a] > tie[b]


@njit(cache=True, inline="always")
def heap_push(heap, n, e, score, depth, tie):
    """Push entry ``e`` onto ``heap[:n]`` (keys ``score``, ``depth``, ``tie`` indexed by entry); returns ``n + 1``.
    Entries pop by score desc, depth asc, tie desc: scores ``[0.2, 0.9, 0.5]`` pop as 1, 2, 0."""
    i = n
    while i > 0:  # sift up
        p = (i - 1) >> 1
        if _before(score, depth, tie, e, heap[p]):
            heap[i] = heap[p]
            i = p
        else:
            break
    heap[i] = e
    return n + 1


@njit(cache=True, inline="always")
def heap_pop(heap, n, score, depth, tie):
    """(the entry that pops first from ``heap[:n]``, ``n - 1``); ``n`` must be > 0."""
    top = heap[0]
    n -= 1
    last = heap[n]
    i = 0
    while True:  # sift down
        j = 2 * i + 1
        if j >= n:
            break
        if j + 1 < n and _before(score, depth, tie, heap[j + 1], heap[j]):
            j += 1
        if _before(score, depth, tie, heap[j], last):
            heap[i] = heap[j]
            i = j
        else:
            break
    heap[i] = last
    return top, n


@njit(cache=True, inline="always")
def bucket(x, edges):
    """1 + how many of ``edges`` (increasing) ``x`` reaches: ``1 + edges.searchsorted(x, side="right")``.
    Example: edges ``[4, 16]``: 3 -> 1, 4 -> 2, 20 -> 3."""
    b = 1
    for e in range(edges.shape[0]):
        b += edges[e] <= x
    return b
