"""Numba kernels of drafting: subsets of a draft and the merge of the sources' trees. Arrays in, arrays
out; a tree is parent-first (``parents[i] < i``, -1 for a child of the root)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _gather(keep, tokens, parents, origin, match, depth, rank, agreement):
    """:func:`keep_nodes`, ``keep`` in any order that puts a parent before its children."""
    m = keep.shape[0]
    new_index = np.full(parents.shape[0], -1, np.int64)
    ints = np.empty((6, m), np.int64)
    out_origin = np.empty(m, origin.dtype)
    ok = True
    for j in range(m):
        i = keep[j]
        new_index[i] = j
        p = parents[i]
        kept_parent = -1 if p < 0 else new_index[p]
        if p >= 0 and kept_parent < 0:
            ok = False
        ints[0, j], ints[1, j], ints[2, j] = tokens[i], kept_parent, match[i]
        ints[3, j], ints[4, j], ints[5, j] = depth[i], rank[i], agreement[i]
        out_origin[j] = origin[i]
    return ints, out_origin, ok


@njit(cache=True)
def keep_nodes(tokens, parents, origin, match, depth, rank, agreement, keep):
    """A draft's node arrays cut to the nodes ``keep`` int64[m] (increasing, closed under parents): (int64[6, m]:
    tokens, parents re-indexed among the kept nodes, match, depth, rank, agreement; origin[m]; ok: False when a kept
    node's parent is not kept). Example: tokens ``[5, 6, 7, 8]``, parents ``[-1, -1, 0, 1]``, keep ``[0, 1, 3]`` ->
    tokens ``[5, 6, 8]``, parents ``[-1, -1, 1]``."""
    return _gather(keep, tokens, parents, origin, match, depth, rank, agreement)


@njit(cache=True)
def shallowest_nodes(depth, count):
    """int64[min(count, n)]: ``np.sort(np.argsort(depth, kind="stable")[:count])`` in linear time, the ``count``
    shallowest nodes (equal depths: the earlier first); in a parent-first tree they are closed under parents.
    Example: depths ``[1, 2, 3, 1, 2]``, count 3 -> ``[0, 1, 3]``."""
    n = depth.shape[0]
    count = max(min(count, n), 0)
    deepest = depth.max() if n else 0
    per_depth = np.zeros(deepest + 2, np.int64)
    for i in range(n):
        per_depth[depth[i]] += 1
    cut, below = 0, 0  # keep every node shallower than ``cut``, and the first ``count - below`` at ``cut``
    while cut <= deepest and below + per_depth[cut] <= count:
        below += per_depth[cut]
        cut += 1
    at_cut = count - below
    out = np.empty(count, np.int64)
    m = 0
    for i in range(n):
        d = depth[i]
        if d < cut:
            out[m] = i
            m += 1
        elif d == cut and at_cut > 0:
            out[m] = i
            m += 1
            at_cut -= 1
    return out


@njit(cache=True)
def merge_trees(tokens, parents, origin, match, starts, limit):
    """The union of trees ``t`` = nodes ``starts[t]:starts[t + 1]`` (``parents`` local, parent-first) as a
    :class:`~lookahead.drafting.draft.Draft`'s first seven arrays: (int64[6, m]: tokens, parents, match, depth, rank,
    agreement; origin int8[m]). Each path's first node, depth-first (children right after their parent, siblings in
    the order first drafted), keeps its origin, match and rank in its own tree; agreement counts the later trees that
    hold its path. Over ``limit`` nodes: the ``limit`` shallowest (:func:`shallowest_nodes`). Example:
    ``sources.merge_proposals``."""
    n = tokens.shape[0]
    merged = np.empty(n, np.int64)  # node -> its path's first node
    up = np.empty(n, np.int64)  # node -> its parent's path's first node (-1: the root)
    first_child = np.full(n + 1, -1, np.int64)  # per first node (+1; 0: the root)
    next_sibling = np.full(n, -1, np.int64)
    depth = np.zeros(n, np.int64)
    is_first = np.zeros(n, np.bool_)
    place = np.empty(n, np.int64)  # among its siblings in its own tree
    count = np.zeros(n, np.int64)  # children per node (global index), counted in its own tree
    agreement = np.zeros(n, np.int64)  # per first node: the later trees that hold its path
    voted = np.empty(n, np.int64)  # per first node: the last tree that holds its path (its own, at first)
    for t in range(starts.shape[0] - 1):
        roots = 0
        for i in range(starts[t], starts[t + 1]):
            p = parents[i]
            if p >= 0:
                place[i] = count[starts[t] + p]
                count[starts[t] + p] += 1
            else:
                place[i] = roots
                roots += 1
            mp = up[i] = merged[starts[t] + p] if p >= 0 else -1
            c = first_child[mp + 1]
            while c != -1 and tokens[c] != tokens[i]:
                c = next_sibling[c]
            if c == -1:
                c = i
                is_first[i] = True
                depth[i] = 1 if mp < 0 else depth[mp] + 1
                next_sibling[i] = first_child[mp + 1]
                first_child[mp + 1] = i
                voted[i] = t
            elif voted[c] != t:
                agreement[c] += 1
                voted[c] = t
            merged[i] = c
        for i in range(starts[t], starts[t + 1]):
            p = parents[i]
            siblings = count[starts[t] + p] if p >= 0 else roots
            place[i] = 0 if siblings == 1 else 1 + place[i]
    # depth-first preorder: children lists are latest-drafted first, so the stack pops the earliest-drafted first
    order = np.empty(int(is_first.sum()), np.int64)
    stack = np.empty(n + 1, np.int64)
    stack[0], top, m = -1, 1, 0  # the root first
    while top:
        top -= 1
        v = stack[top]
        if v >= 0:
            order[m] = v
            m += 1
        c = first_child[v + 1]
        while c != -1:
            stack[top] = c
            top += 1
            c = next_sibling[c]
    if m > limit:  # the shallowest ``limit`` (parents are shallower: the kept nodes stay a tree)
        order = order[shallowest_nodes(depth[order], limit)]
    ints, new_origin, _ = _gather(order, tokens, up, origin, match, depth, place, agreement)
    return ints, new_origin
