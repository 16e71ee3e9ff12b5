"""Numba kernels of the n-gram trie: pure functions over preallocated NumPy arrays.

The trie lives in four arrays that :class:`cache.trie.NgramTrie` allocates once:

``nodes``  int32 ``(capacity + 1, 4)``, one row per node slot; columns ``TOKEN``, ``PARENT``,
           ``FIRST_CHILD``, ``NEXT_SIBLING``. Row 0 is the root. A free slot has ``TOKEN == -1``
           and its ``NEXT_SIBLING`` links the free list. Child lists are singly linked, unordered.
``stats``  int64 ``(capacity + 1, 2)``: columns ``COUNT`` and ``LAST_USED`` (the step of the
           token that last recorded the node's n-gram).
``table``  int64, a power-of-two open-addressing hash table (linear probing) from
           ``(parent, token)`` to the child's slot; 0 marks an empty entry (the root is never
           a child). It makes a child lookup O(1) however many children a node has (the root
           has one per vocabulary entry seen). Eviction rebuilds it, and borrows it as scratch
           space first (selection buffer, keep flags), so eviction allocates nothing.
``state``  int64: the scalars below (``S_*``), then ``max_n`` slots ``S_OPEN + k`` holding the
           node of the open path of length ``k + 1`` (the n-gram ending at the last token).

Every kernel takes the arrays and mutates them in place; none allocates per node. Rows are
grouped into few 2-D arrays because each array argument costs ~0.15 us of Numba dispatch.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# columns of ``nodes``
TOKEN, PARENT, FIRST_CHILD, NEXT_SIBLING = 0, 1, 2, 3
# columns of ``stats``
COUNT, LAST_USED = 0, 1
# slots of ``state``
S_MAX_N, S_CAPACITY, S_N_LIVE, S_FREE_HEAD, S_STEP, S_N_OPEN, S_N_EVICTIONS = 0, 1, 2, 3, 4, 5, 6
S_OPEN = 8  # state[S_OPEN + k]: node of the open path of length k + 1

# kernel status codes
OK, ERR_TOKEN, ERR_EVICT = 0, 1, 2
INT32_MAX = 2**31 - 1

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def table_size(capacity: int) -> int:
    """Hash-table entries for ``capacity`` nodes: a power of two, load factor <= 2/3."""
    need = capacity + capacity // 2 + 1
    return 1 << (need - 1).bit_length()


@njit(cache=True, inline="always")
def _slot(parent, token, mask):
    """splitmix64 finaliser of the key ``(parent << 32) | token``."""
    x = (np.uint64(parent) << np.uint64(32)) | np.uint64(token)
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return np.int64(x & np.uint64(mask))


@njit(cache=True, inline="always")
def find_child(nodes, table, parent, token):
    """Slot of the child of ``parent`` with ``token``, or 0 when there is none."""
    mask = table.shape[0] - 1
    i = _slot(parent, token, mask)
    while True:
        v = table[i]
        if v == 0:
            return 0
        if nodes[v, TOKEN] == token and nodes[v, PARENT] == parent:
            return v
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def _child_or_new(nodes, stats, table, state, parent, token):
    """Slot of the child of ``parent`` with ``token``; a new zero-count node if there is none."""
    mask = table.shape[0] - 1
    i = _slot(parent, token, mask)
    while True:
        v = table[i]
        if v == 0:
            break
        if nodes[v, TOKEN] == token and nodes[v, PARENT] == parent:
            return v
        i = (i + 1) & mask
    v = state[S_FREE_HEAD]
    state[S_FREE_HEAD] = nodes[v, NEXT_SIBLING]
    state[S_N_LIVE] += 1
    nodes[v, TOKEN] = token
    nodes[v, PARENT] = parent
    nodes[v, FIRST_CHILD] = 0
    nodes[v, NEXT_SIBLING] = nodes[parent, FIRST_CHILD]
    nodes[parent, FIRST_CHILD] = v
    stats[v, COUNT] = 0
    stats[v, LAST_USED] = 0
    table[i] = v
    return v


@njit(cache=True)
def reset(nodes, stats, table, state):
    """Empty trie: every slot but the root free (free list 1, 2, ..., capacity), step 0."""
    cap = state[S_CAPACITY]
    nodes[:, TOKEN] = -1
    nodes[:, PARENT] = 0
    nodes[:, FIRST_CHILD] = 0
    nodes[0, PARENT] = -1
    for v in range(1, cap):
        nodes[v, NEXT_SIBLING] = v + 1
    nodes[cap, NEXT_SIBLING] = 0
    nodes[0, NEXT_SIBLING] = 0
    stats[:, :] = 0
    table[:] = 0
    state[S_N_LIVE] = 0
    state[S_FREE_HEAD] = 1 if cap > 0 else 0
    state[S_STEP] = 0
    state[S_N_OPEN] = 0
    state[S_N_EVICTIONS] = 0


@njit(cache=True)
def kth_smallest(a, n, k):
    """Value of rank ``k`` (0-based) among ``a[:n]``; reorders ``a[:n]`` (Hoare's FIND)."""
    lo = 0
    hi = n - 1
    while lo < hi:
        x = a[lo]
        y = a[(lo + hi) >> 1]
        z = a[hi]
        pivot = max(min(x, y), min(max(x, y), z))  # median of three
        i = lo
        j = hi
        while i <= j:
            while a[i] < pivot:
                i += 1
            while a[j] > pivot:
                j -= 1
            if i <= j:
                t = a[i]
                a[i] = a[j]
                a[j] = t
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            return a[k]
    return a[k]


@njit(cache=True)
def evict(nodes, stats, table, state):
    """LRU eviction. Returns True when at least ``max_n`` slots are free afterwards.

    With ``s`` the last step, ``T = min(the (capacity // 4)-th smallest last_used, s - 2 max_n)``;
    a node goes when its whole subtree has ``last_used <= T``. Equivalently: keep every node with
    ``last_used > T`` and all its ancestors, free the rest. O(capacity).
    """
    max_n = state[S_MAX_N]
    cap = state[S_CAPACITY]
    s = state[S_STEP]
    # 1. threshold (table as scratch)
    n = 0
    for v in range(1, cap + 1):
        if nodes[v, TOKEN] >= 0:
            table[n] = stats[v, LAST_USED]
            n += 1
    k = cap // 4
    if n < k or k < 1:
        return cap - state[S_N_LIVE] >= max_n
    thr = min(kth_smallest(table, n, k - 1), s - 2 * max_n)
    # 2. keep flags (table as scratch): recent nodes and their ancestors
    table[: cap + 1] = 0
    table[0] = 1
    for v in range(1, cap + 1):
        if nodes[v, TOKEN] >= 0 and stats[v, LAST_USED] > thr:
            u = v
            while table[u] == 0:
                table[u] = 1
                u = nodes[u, PARENT]
    # 3. unlink evicted children from the child lists of kept nodes
    for v in range(cap + 1):
        if table[v] == 0:
            continue
        prev = 0
        c = nodes[v, FIRST_CHILD]
        while c != 0:
            nxt = nodes[c, NEXT_SIBLING]
            if table[c] != 0:
                if prev == 0:
                    nodes[v, FIRST_CHILD] = c
                else:
                    nodes[prev, NEXT_SIBLING] = c
                prev = c
            c = nxt
        if prev == 0:
            nodes[v, FIRST_CHILD] = 0
        else:
            nodes[prev, NEXT_SIBLING] = 0
    # 4. free the rest (descending, so the free list hands out low slots first)
    head = state[S_FREE_HEAD]
    freed = 0
    for v in range(cap, 0, -1):
        if nodes[v, TOKEN] >= 0 and table[v] == 0:
            nodes[v, TOKEN] = -1
            nodes[v, PARENT] = 0
            nodes[v, FIRST_CHILD] = 0
            nodes[v, NEXT_SIBLING] = head
            stats[v, COUNT] = 0
            stats[v, LAST_USED] = 0
            head = v
            freed += 1
    state[S_FREE_HEAD] = head
    state[S_N_LIVE] -= freed
    state[S_N_EVICTIONS] += 1
    # 5. rebuild the hash table
    table[:] = 0
    mask = table.shape[0] - 1
    for v in range(1, cap + 1):
        if nodes[v, TOKEN] >= 0:
            i = _slot(nodes[v, PARENT], nodes[v, TOKEN], mask)
            while table[i] != 0:
                i = (i + 1) & mask
            table[i] = v
    return cap - state[S_N_LIVE] >= max_n


@njit(cache=True)
def insert(nodes, stats, table, state, tokens):
    """Append ``tokens`` to the current stream; returns a status code.

    For each token (step ``s``) every open path of length < max_n is extended by one child
    lookup, the token itself starts a new length-1 path, and each of these nodes gets
    ``count += 1`` and ``last_used = s``: O(max_n) lookups per token.
    Nothing is changed when a token is out of [0, 2**31 - 1] (``ERR_TOKEN``).
    """
    n = tokens.shape[0]
    for j in range(n):
        if tokens[j] < 0 or tokens[j] > INT32_MAX:
            return ERR_TOKEN
    max_n = state[S_MAX_N]
    cap = state[S_CAPACITY]
    for j in range(n):
        t = tokens[j]
        if cap - state[S_N_LIVE] < max_n:
            if not evict(nodes, stats, table, state):
                return ERR_EVICT
        s = state[S_STEP] + 1
        state[S_STEP] = s
        n_open = state[S_N_OPEN]
        for k in range(min(n_open, max_n - 1), 0, -1):
            v = _child_or_new(nodes, stats, table, state, state[S_OPEN + k - 1], t)
            stats[v, COUNT] += 1
            stats[v, LAST_USED] = s
            state[S_OPEN + k] = v
        v = _child_or_new(nodes, stats, table, state, 0, t)
        stats[v, COUNT] += 1
        stats[v, LAST_USED] = s
        state[S_OPEN] = v
        state[S_N_OPEN] = min(n_open + 1, max_n)
    return OK


@njit(cache=True, inline="always")
def _better(es, ei, a, b):
    """Entry ``a`` pops before entry ``b``: key (-score, depth, -last_used)."""
    if es[a] != es[b]:
        return es[a] > es[b]
    if ei[a, 1] != ei[b, 1]:
        return ei[a, 1] < ei[b, 1]
    return ei[a, 2] > ei[b, 2]


@njit(cache=True)
def _expand(nodes, stats, node, score, depth, ppop, r, buf, es, ei, n_ent, heap, n_heap):
    """Push the best ``r`` children of ``node`` (the only ones that can still be selected).

    ``score(child) = score * count(child) / S`` with ``S`` the count sum of all children. Siblings
    share ``score / S``, so their order is (count desc, last_used desc). Returns the new
    ``(es, ei, n_ent, heap, n_heap)`` (the entry arrays grow by doubling when full).
    """
    total = 0
    nb = 0
    c = nodes[node, FIRST_CHILD]
    while c != 0:
        cnt = stats[c, COUNT]
        lu = stats[c, LAST_USED]
        total += cnt
        if nb < r or cnt > buf[nb - 1, 1] or (cnt == buf[nb - 1, 1] and lu > buf[nb - 1, 2]):
            i = nb if nb < r else r - 1
            while i > 0 and (buf[i - 1, 1] < cnt or (buf[i - 1, 1] == cnt and buf[i - 1, 2] < lu)):
                buf[i, 0] = buf[i - 1, 0]
                buf[i, 1] = buf[i - 1, 1]
                buf[i, 2] = buf[i - 1, 2]
                i -= 1
            buf[i, 0] = c
            buf[i, 1] = cnt
            buf[i, 2] = lu
            if nb < r:
                nb += 1
        c = nodes[c, NEXT_SIBLING]
    if n_ent + nb > es.shape[0]:
        size = max(2 * es.shape[0], n_ent + nb)
        es2 = np.empty(size, np.float64)
        ei2 = np.empty((size, 4), np.int64)
        heap2 = np.empty(size, np.int64)
        es2[:n_ent] = es[:n_ent]
        ei2[:n_ent] = ei[:n_ent]
        heap2[:n_heap] = heap[:n_heap]
        es, ei, heap = es2, ei2, heap2
    fs = np.float64(total)
    for b in range(nb):
        e = n_ent
        n_ent += 1
        es[e] = score * np.float64(buf[b, 1]) / fs
        ei[e, 0] = buf[b, 0]
        ei[e, 1] = depth
        ei[e, 2] = buf[b, 2]
        ei[e, 3] = ppop
        # sift up
        i = n_heap
        n_heap += 1
        while i > 0:
            p = (i - 1) >> 1
            if _better(es, ei, e, heap[p]):
                heap[i] = heap[p]
                i = p
            else:
                break
        heap[i] = e
    return es, ei, n_ent, heap, n_heap


@njit(cache=True)
def propose(nodes, stats, table, state, ctx, max_nodes, max_depth, max_match):
    """Draft tree for the context ``ctx``: returns ``(status, tokens int64[k], parents int32[k])``.

    See the package docstring for the rules. Read-only on the trie.
    """
    n = ctx.shape[0]
    for i in range(n):
        if ctx[i] < 0 or ctx[i] > INT32_MAX:
            return ERR_TOKEN, np.empty(0, np.int64), np.empty(0, np.int32)
    max_n = state[S_MAX_N]
    mm = min(max(max_match, 1), max_n - 1)
    max_nodes = min(max_nodes, state[S_N_LIVE])
    if max_nodes <= 0 or max_depth <= 0:
        return OK, np.empty(0, np.int64), np.empty(0, np.int32)
    # 1. match: the longest suffix (<= mm tokens) whose node has children
    match = 0
    length = min(mm, n)
    while length > 0:
        v = 0
        for i in range(n - length, n):
            v = find_child(nodes, table, v, ctx[i])
            if v == 0:
                break
        if v != 0 and nodes[v, FIRST_CHILD] != 0:
            match = v
            break
        length -= 1
    if match == 0:
        return OK, np.empty(0, np.int64), np.empty(0, np.int32)
    dlim = min(max_depth, max_n - length)
    # 2. best-first selection. Entries: es = score; ei = (node, depth, last_used, parent pop index)
    size = 4 * max_nodes + 16
    es = np.empty(size, np.float64)
    ei = np.empty((size, 4), np.int64)
    heap = np.empty(size, np.int64)
    buf = np.empty((max_nodes, 3), np.int64)
    sel = np.empty((max_nodes, 4), np.int64)  # node, parent pop index, count, last_used
    es, ei, n_ent, heap, n_heap = _expand(nodes, stats, match, 1.0, 1, -1, max_nodes, buf,
                                          es, ei, 0, heap, 0)
    n_sel = 0
    while n_heap > 0 and n_sel < max_nodes:
        top = heap[0]
        n_heap -= 1
        last = heap[n_heap]
        i = 0
        while True:  # sift down
            c = 2 * i + 1
            if c >= n_heap:
                break
            if c + 1 < n_heap and _better(es, ei, heap[c + 1], heap[c]):
                c += 1
            if _better(es, ei, heap[c], last):
                heap[i] = heap[c]
                i = c
            else:
                break
        heap[i] = last
        node = ei[top, 0]
        depth = ei[top, 1]
        sel[n_sel, 0] = node
        sel[n_sel, 1] = ei[top, 3]
        sel[n_sel, 2] = stats[node, COUNT]
        sel[n_sel, 3] = stats[node, LAST_USED]
        n_sel += 1
        if depth < dlim and n_sel < max_nodes and nodes[node, FIRST_CHILD] != 0:
            es, ei, n_ent, heap, n_heap = _expand(nodes, stats, node, es[top], depth + 1, n_sel - 1,
                                                  max_nodes - n_sel, buf, es, ei, n_ent, heap, n_heap)
    # 3. breadth-first output. Child lists per selected node (index n_sel = the matched node),
    #    kept sorted by (count desc, last_used desc).
    first = np.full(n_sel + 1, -1, np.int64)
    nxt = np.empty(n_sel, np.int64)
    for j in range(n_sel):
        p = sel[j, 1] if sel[j, 1] >= 0 else n_sel
        cnt = sel[j, 2]
        lu = sel[j, 3]
        prev = -1
        c = first[p]
        while c >= 0 and (sel[c, 2] > cnt or (sel[c, 2] == cnt and sel[c, 3] > lu)):
            prev = c
            c = nxt[c]
        nxt[j] = c
        if prev < 0:
            first[p] = j
        else:
            nxt[prev] = j
    order = np.empty(n_sel, np.int64)
    out_idx = np.empty(n_sel, np.int64)
    pos = 0
    c = first[n_sel]
    while c >= 0:
        order[pos] = c
        out_idx[c] = pos
        pos += 1
        c = nxt[c]
    head = 0
    while head < pos:
        c = first[order[head]]
        head += 1
        while c >= 0:
            order[pos] = c
            out_idx[c] = pos
            pos += 1
            c = nxt[c]
    tokens = np.empty(n_sel, np.int64)
    parents = np.empty(n_sel, np.int32)
    for k in range(n_sel):
        j = order[k]
        tokens[k] = nodes[sel[j, 0], TOKEN]
        parents[k] = -1 if sel[j, 1] < 0 else out_idx[sel[j, 1]]
    return OK, tokens, parents


@njit(cache=True)
def live_nodes(nodes, stats):
    """``(slot, token, parent, count, last_used)`` rows of all live nodes, slot ascending."""
    n = 0
    for v in range(1, nodes.shape[0]):
        if nodes[v, TOKEN] >= 0:
            n += 1
    out = np.empty((n, 5), np.int64)
    n = 0
    for v in range(1, nodes.shape[0]):
        if nodes[v, TOKEN] >= 0:
            out[n, 0] = v
            out[n, 1] = nodes[v, TOKEN]
            out[n, 2] = nodes[v, PARENT]
            out[n, 3] = stats[v, COUNT]
            out[n, 4] = stats[v, LAST_USED]
            n += 1
    return out
