"""Small Numba helpers the stores share: the hash of a pair of ids, and the best-first heap of a proposal.

- :func:`pair_slot`: the splitmix64 finaliser of ``(a << 32) | b``, masked to a power-of-two table (the trie's
  ``(parent, token)`` table, the suffix automaton's ``(state, token)`` edges). :data:`MIX1` / :data:`MIX2` are
  its multipliers, which the model-prediction table's pair keys (``lookahead.recycle``) use too.
- :func:`heap_push` / :func:`heap_pop`: a binary heap of entry indices ordered by (score descending, depth
  ascending, tie descending), the order in which a best-first proposal takes its candidates.
- :func:`bucket`: a proposal's match on the acceptance estimates' scale (1 + the bucket edges it reaches).

Each is ``inline="always"``: it compiles into its caller's loop, as if written there.
"""

from __future__ import annotations

import numpy as np
from numba import njit

MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, inline="always")
def pair_slot(a, b, mask):
    """The slot of the key ``(a, b)`` (both below 2**32) in a table of ``mask + 1`` entries: the splitmix64
    finaliser of ``(a << 32) | b``, masked. Example: equal pairs always share a slot; ``(1, 2)`` and ``(2, 1)``
    almost never do."""
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

    Example: pushing entries 0, 1, 2 with scores ``[0.2, 0.9, 0.5]`` then popping thrice gives 1, 2, 0.
    """
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
