"""Measures of a parent-first tree (``parents[i] < i``, -1 for a child of the root) that only the optional
paths take: each node's depth and rank (step masks, the heads) and the best chain (a model that takes no tree
mask)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def depth_rank(parents):
    """(depth int64[n], rank int64[n], ok): depth 1 for a child of the root; rank 0 for an only child, else 1 + its
    place among its siblings; ``ok`` False when ``parents`` is not parent-first.
    Example: parents ``[-1, -1, 0, 0, 1]`` -> depths ``[1, 1, 2, 2, 2]``, ranks ``[1, 2, 1, 2, 0]``."""
    n = len(parents)
    depth = np.zeros(n, np.int64)
    place = np.zeros(n, np.int64)
    count = np.zeros(n + 1, np.int64)  # children seen so far per parent (index 0: the root)
    for i in range(n):
        p = parents[i]
        if p >= i:
            return depth, place, False
        depth[i] = 1 if p < 0 else depth[p] + 1
        place[i] = count[p + 1]
        count[p + 1] += 1
    for i in range(n):  # place -> rank
        place[i] = place[i] + 1 if count[parents[i] + 1] > 1 else 0
    return depth, place, True


def tree_depth_rank(parents) -> tuple[np.ndarray, np.ndarray]:
    """(depth, rank) int64[n] of a parent-first tree (:func:`depth_rank`); raises ValueError otherwise."""
    parents = np.asarray(parents, dtype=np.int64)
    depth, rank, ok = depth_rank(parents)
    if not ok:
        bad = int(np.flatnonzero(parents >= np.arange(len(parents)))[0])
        raise ValueError(f"parents must be parent-first (parents[i] < i); got parents[{bad}]={parents[bad]}")
    return depth, rank


@njit(cache=True)
def best_chain(parents, weights):
    """The nodes (sorted) of the root-to-node path whose summed ``weights`` float[n] is the largest (equal sums: the
    node met first); empty for an empty tree. With acceptance probabilities as weights the sum is the path's expected
    accepted tokens; with ones, its depth. Example: parents ``[-1, 0, -1, 2, 3]``, weights ``[0.9, 0.1, 0.5, 0.4,
    0.3]`` -> path sums ``[0.9, 1.0, 0.5, 0.9, 1.2]`` -> ``[2, 3, 4]``."""
    n = parents.shape[0]
    total = np.empty(n)
    best = -1
    for i in range(n):
        p = parents[i]
        total[i] = weights[i] + (total[p] if p >= 0 else 0.0)
        if best < 0 or total[i] > total[best]:
            best = i
    path = np.empty(n, np.int64)  # from the node up to the root
    count = 0
    while best >= 0:
        path[count] = best
        count += 1
        best = parents[best]
    return path[:count][::-1].copy()
