"""Numba kernels of the n-gram trie: pure functions over preallocated NumPy arrays.

The trie lives in four arrays that :class:`lookahead.cache.trie.NgramTrie` allocates once:

``nodes``  int32 ``(capacity + 1, 8)``, one row per node slot, row 0 the root. Columns:
           ``TOKEN``, ``PARENT``; ``FIRST_CHILD``, ``LAST_CHILD`` and ``NEXT_SIBLING``,
           ``PREV_SIBLING`` (a doubly linked child list per node); ``GROUP`` (see below).
           A free slot has ``TOKEN == -1`` and its ``NEXT_SIBLING`` links the free list.
           Column ``GROUP_HEAD`` is indexed by *group id*, not by node (see below).
``stats``  int64 ``(capacity + 1, 3)``: ``COUNT``; ``LAST_USED`` (the step of the token that
           last recorded the n-gram); ``CHILD_SUM`` (sum of the children's counts).
``table``  int32, a power-of-two open-addressing hash table (linear probing, load <= 1/2) from
           ``(parent, token)`` to the child's slot; 0 marks an empty entry (the root is never
           a child). A child lookup is O(1) however many children a node has (the root has one
           per vocabulary entry seen). Eviction rebuilds it, and borrows it as scratch space
           first (as ``capacity`` int64 last_used values, then as keep flags), so eviction
           allocates nothing. The kernels take the table as the array they are given: ``NgramTrie``
           passes a prefix of its allocation sized to the live nodes (:func:`rehash` moves the entries
           into a larger one), and the whole of it wherever an insert could evict.
``state``  int64: the scalars below (``S_*``), then ``max_n`` slots ``S_OPEN + k`` holding the
           node of the open path of length ``k + 1`` (the n-gram ending at the last token).

Sorted children. Every child list is kept sorted by (count desc, last_used desc), the order in
which ``propose`` wants siblings, so a proposal reads only the first few children of a node
instead of scanning them all (a frequent token can have thousands). Each update of a node is
"count += 1 and become the most recent", which moves it to the front of the run of siblings
with the new count. Runs of equal count are *groups* (the O(1) LFU scheme): ``GROUP`` of a node
is its group id, ``nodes[g, GROUP_HEAD]`` is the first node of group ``g`` (group ids share the
row index space; free group ids are chained through the same column). So an update is O(1):
the target run is the group just before the node's own group.

Every kernel takes the arrays and mutates them in place; none allocates per node. Columns are
grouped into few 2-D arrays because each array argument costs ~0.15 us of Numba dispatch.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .primitives import heap_pop, heap_push, pair_slot

# columns of ``nodes``
TOKEN, PARENT, FIRST_CHILD, LAST_CHILD, NEXT_SIBLING, PREV_SIBLING, GROUP, GROUP_HEAD = range(8)
NODE_COLUMNS = 8
# columns of ``stats``
COUNT, LAST_USED, CHILD_SUM = 0, 1, 2
STAT_COLUMNS = 3
# slots of ``state``
S_MAX_N, S_CAPACITY, S_N_LIVE, S_FREE_HEAD, S_STEP, S_N_OPEN, S_N_EVICTIONS, S_GROUP_FREE, S_HIGH = range(9)
S_OPEN = 9  # state[S_OPEN + k]: node of the open path of length k + 1
# S_HIGH: the rows up to it may hold nodes or group ids (rows written since the last reset: every node slot or group
# id used, and a few hundred free rows past them). The rows above it are those of a new trie (``fresh_rows``: free,
# chained to the next row) whatever they hold: they are written only when a free list reaches them (``_reach``), so
# a new or reset trie touches no memory it does not use.

# kernel status codes
OK, ERR_TOKEN, ERR_EVICT = 0, -1, -2
INT32_MAX = 2**31 - 1



def table_size(capacity: int) -> int:
    """Hash-table entries for ``capacity`` nodes: a power of two >= 2 * capacity (load <= 1/2;
    viewed as int64 it holds ``capacity`` values, which eviction needs)."""
    return 1 << (2 * capacity - 1).bit_length()


# -- hash table ----------------------------------------------------------------------------------


@njit(cache=True)
def rehash(nodes, table, state):
    """Zero ``table`` (a power of two of at least twice the live nodes: a prefix of the trie's table, or all of
    it) and put every live node's ``(parent, token)`` entry into it: the same lookups in a table of another size.
    O(slots used since the last reset)."""
    table[:] = 0
    mask = table.shape[0] - 1
    for v in range(1, min(state[S_HIGH], state[S_CAPACITY]) + 1):
        if nodes[v, TOKEN] >= 0:
            i = pair_slot(nodes[v, PARENT], nodes[v, TOKEN], mask)
            while table[i] != 0:
                i = (i + 1) & mask
            table[i] = v


@njit(cache=True, inline="always")
def find_child(nodes, table, parent, token):
    """Slot of the child of ``parent`` with ``token``, or 0 when there is none."""
    mask = table.shape[0] - 1
    i = pair_slot(parent, token, mask)
    while True:
        v = table[i]
        if v == 0:
            return 0
        if nodes[v, TOKEN] == token and nodes[v, PARENT] == parent:
            return v
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def _init_node(nodes, stats, x, token, parent, count, last_used):
    """Fill slot ``x`` as a childless node ``token`` under ``parent`` (sibling links are the caller's)."""
    nodes[x, TOKEN] = token
    nodes[x, PARENT] = parent
    nodes[x, FIRST_CHILD] = 0
    nodes[x, LAST_CHILD] = 0
    stats[x, COUNT] = count
    stats[x, LAST_USED] = last_used
    stats[x, CHILD_SUM] = 0


# -- whole-trie operations -------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _free_node(nodes, stats, v, next_free):
    """Slot ``v`` as a free one, ``next_free`` the next in the free list (its group-id column is not touched)."""
    nodes[v, TOKEN] = -1
    nodes[v, PARENT] = 0
    nodes[v, FIRST_CHILD] = 0
    nodes[v, LAST_CHILD] = 0
    nodes[v, NEXT_SIBLING] = next_free
    nodes[v, PREV_SIBLING] = 0
    nodes[v, GROUP] = 0
    stats[v, COUNT] = 0
    stats[v, LAST_USED] = 0
    stats[v, CHILD_SUM] = 0


@njit(cache=True, inline="always")
def fresh_rows(nodes, stats, cap, lo, hi):
    """Write rows ``lo .. hi`` (inclusive, ``1 <= lo``, ``hi <= cap``) as a new trie's: free node slots and free
    group ids, each chained to the next row (0 in the row of the capacity), token -1, every other column 0."""
    for v in range(lo, hi + 1):
        link = v + 1 if v < cap else 0
        _free_node(nodes, stats, v, link)
        nodes[v, GROUP_HEAD] = link


REACH_ROWS = 512
"""Rows :func:`_write_ahead` writes at least when it writes (28 kB): once per so many new nodes."""


@njit(cache=True)
def _write_ahead(nodes, stats, state, v):
    """Rows ``S_HIGH + 1`` to ``v``, or to ``REACH_ROWS`` past ``S_HIGH`` (at most the capacity), written as a new
    trie's; ``S_HIGH`` raised to the last of them."""
    high = state[S_HIGH]
    last = min(max(v, high + REACH_ROWS), state[S_CAPACITY])
    fresh_rows(nodes, stats, state[S_CAPACITY], high + 1, last)
    state[S_HIGH] = last


@njit(cache=True, inline="always")
def _reach(nodes, stats, state, v):
    """Before row ``v`` (at most the capacity) is read: the rows above ``S_HIGH`` up to ``v`` written as a new
    trie's (they may never have been: see ``S_HIGH``), a few hundred at a time (:func:`_write_ahead`)."""
    if v > state[S_HIGH]:
        _write_ahead(nodes, stats, state, v)


@njit(cache=True)
def reset(nodes, stats, table, state):
    """Empty trie: every node slot but the root free (free list 1, 2, ..., capacity), step 0.

    O(live nodes), not O(capacity): the rows above ``S_HIGH`` count as a new trie's whether or not they were
    written, so a reset writes the root's row and the state, and zeroes the hash-table entries of the live nodes
    (all of the table when more than a quarter of the capacity was in use). New arrays (``NgramTrie``'s
    ``_empty_arrays``: a zeroed table, node rows never written) need only this, so a new trie writes a few hundred
    bytes, however large its capacity, and its memory is touched as nodes are made."""
    cap = state[S_CAPACITY]
    high = state[S_HIGH]
    if 4 * high >= cap:
        table[:] = 0
    else:  # the live nodes' entries: find them all first (probing needs the table intact), then zero them
        mask = table.shape[0] - 1
        found = np.empty(high + 1, np.int64)
        n_found = 0
        for v in range(1, high + 1):
            if nodes[v, TOKEN] >= 0:
                i = pair_slot(nodes[v, PARENT], nodes[v, TOKEN], mask)
                while table[i] != v:
                    i = (i + 1) & mask
                found[n_found] = i
                n_found += 1
        for j in range(n_found):
            table[found[j]] = 0
    nodes[0, :] = 0
    nodes[0, TOKEN] = -1
    nodes[0, PARENT] = -1
    stats[0, :] = 0
    state[S_HIGH] = 0
    state[S_N_LIVE] = 0
    state[S_FREE_HEAD] = 1
    state[S_GROUP_FREE] = 1
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


@njit(cache=True, inline="always")
def _flag_path(nodes, table, u):
    """Flag node ``u`` and its ancestors in ``table``, up to the first one already flagged; returns
    how many it flagged."""
    n = 0
    while table[u] == 0:
        table[u] = 1
        n += 1
        u = nodes[u, PARENT]
    return n


@njit(cache=True)
def _mark_kept(nodes, stats, table, state, thr):
    """Keep flags in ``table[: capacity + 1]``: 1 for every node with ``last_used > thr``, for every
    node of the current stream's open path, and for all their ancestors (the root included).
    Returns how many nodes are kept, the root not counted."""
    cap = state[S_CAPACITY]
    table[: cap + 1] = 0
    table[0] = 1
    kept = 0
    for v in range(1, cap + 1):
        if nodes[v, TOKEN] >= 0 and stats[v, LAST_USED] > thr:
            kept += _flag_path(nodes, table, v)
    for k in range(state[S_N_OPEN]):
        kept += _flag_path(nodes, table, state[S_OPEN + k])
    return kept


@njit(cache=True)
def evict(nodes, stats, table, state):
    """LRU eviction. Returns True when at least ``max_n`` slots are free afterwards.

    With ``s`` the last step, ``T = min(the (capacity // 4)-th smallest last_used, s - 2 max_n)``;
    keep every node with ``last_used > T``, the nodes of the current stream's open path (the
    parents of its next token's n-grams), and all their ancestors; free the rest. O(capacity).

    Why this frees >= max_n slots when ``capacity >= 4 max_n**2`` and one stream is written (it
    runs when fewer than max_n are free, so more than ``capacity - max_n`` nodes live): a step
    sets last_used on at most max_n nodes, and an ancestor of a node used at step u was itself
    used at step >= u - max_n + 1. So the kept nodes with last_used <= T (ancestors of nodes used
    after T) were last used in the max_n - 1 steps up to T: at most max_n (max_n - 1) of them. If T
    is the (capacity // 4)-th smallest, at least capacity // 4 >= max_n**2 nodes have last_used
    <= T and at least max_n**2 - max_n (max_n - 1) = max_n of them go. Otherwise T = s - 2 max_n
    and at most 2 max_n**2 + max_n (max_n - 1) nodes are kept, leaving >= max_n**2 + max_n free.

    Several streams (one per thread) break the ancestor argument: a stream that was parked and
    reopened extends n-grams last used long ago, and its open path itself may be old. So when
    the pass above would free fewer than max_n slots, the threshold rises to ``s - 2 max_n`` and
    then to ``s - 1``. The last always suffices: it keeps the n-grams ending at the last token,
    the open path, and their ancestors, at most 2 * max_n (max_n + 1) / 2 <= capacity / 2 nodes.
    Example (max_n 3, capacity 36): thread A writes 1 2 3, thread B then fills the trie with 100,
    101, ...; A's next insert evicts, and A's old open path ``(3)``, ``(2, 3)``, ``(1, 2, 3)`` stays
    with its ancestors, so that insert extends live nodes.
    """
    max_n = state[S_MAX_N]
    cap = state[S_CAPACITY]
    s = state[S_STEP]
    _reach(nodes, stats, state, cap)  # the passes below read every row (a full trie has written nearly all)
    # 1. threshold (table as scratch)
    scratch = table.view(np.int64)
    n = 0
    for v in range(1, cap + 1):
        if nodes[v, TOKEN] >= 0:
            scratch[n] = stats[v, LAST_USED]
            n += 1
    k = cap // 4
    if n < k or k < 1:
        return cap - state[S_N_LIVE] >= max_n
    thr = min(kth_smallest(scratch, n, k - 1), s - 2 * max_n)
    # 2. keep flags (table as scratch), raising the threshold while too few slots would be freed
    kept = _mark_kept(nodes, stats, table, state, thr)
    if cap - kept < max_n and thr < s - 2 * max_n:
        thr = s - 2 * max_n
        kept = _mark_kept(nodes, stats, table, state, thr)
    if cap - kept < max_n:
        thr = s - 1
        kept = _mark_kept(nodes, stats, table, state, thr)
    # 3. drop evicted children from the (sorted) child lists of kept nodes; regroup; child sums
    g_next = 1
    for v in range(cap + 1):
        if table[v] == 0:
            continue
        prev = 0
        total = 0
        c = nodes[v, FIRST_CHILD]
        while c != 0:
            nxt = nodes[c, NEXT_SIBLING]
            if table[c] != 0:
                nodes[c, PREV_SIBLING] = prev
                if prev == 0:
                    nodes[v, FIRST_CHILD] = c
                else:
                    nodes[prev, NEXT_SIBLING] = c
                cnt = stats[c, COUNT]
                total += cnt
                if prev != 0 and stats[prev, COUNT] == cnt:
                    nodes[c, GROUP] = nodes[prev, GROUP]
                else:
                    nodes[g_next, GROUP_HEAD] = c
                    nodes[c, GROUP] = g_next
                    g_next += 1
                prev = c
            c = nxt
        if prev == 0:
            nodes[v, FIRST_CHILD] = 0
        else:
            nodes[prev, NEXT_SIBLING] = 0
        nodes[v, LAST_CHILD] = prev
        stats[v, CHILD_SUM] = total
    if g_next <= cap:  # chain the unused group ids
        for g in range(g_next, cap):
            nodes[g, GROUP_HEAD] = g + 1
        nodes[cap, GROUP_HEAD] = 0
        state[S_GROUP_FREE] = g_next
    else:
        state[S_GROUP_FREE] = 0
    # 4. free the rest (descending, so the free list hands out low slots first)
    head = state[S_FREE_HEAD]
    freed = 0
    for v in range(cap, 0, -1):
        if nodes[v, TOKEN] >= 0 and table[v] == 0:
            _free_node(nodes, stats, v, head)
            head = v
            freed += 1
    state[S_FREE_HEAD] = head
    state[S_N_LIVE] -= freed
    state[S_N_EVICTIONS] += 1
    # 5. rebuild the hash table (no live node lies above S_HIGH)
    rehash(nodes, table, state)
    return cap - state[S_N_LIVE] >= max_n


@njit(cache=True)
def insert(nodes, stats, table, state, tokens):
    """Append ``tokens`` to the current stream; returns a status code.

    For each token (step ``s``) every open path of length < max_n is extended by one child
    lookup, the token itself starts a new length-1 path, and each of these nodes gets
    ``count += 1`` and ``last_used = s`` (created if missing): O(max_n) lookups per token.
    Nothing is changed when a token is out of [0, 2**31 - 1] (``ERR_TOKEN``).

    The per-node update is written out in this loop rather than in helper functions: Numba's
    inlining of array-taking helpers left reference-count calls in the loop (4x slower).
    """
    n = tokens.shape[0]
    for j in range(n):
        if tokens[j] < 0 or tokens[j] > INT32_MAX:
            return ERR_TOKEN
    max_n = state[S_MAX_N]
    cap = state[S_CAPACITY]
    # The rows this call can take, written first (see S_HIGH), so the loop below never checks: a node slot is freed
    # only by an eviction, which writes every row, so until one the free list's head is the first row never used,
    # and the call takes at most n * max_n rows from it; group ids, fewer than the live nodes, stay below them.
    if state[S_FREE_HEAD] != 0:
        _reach(nodes, stats, state, min(state[S_FREE_HEAD] + n * max_n, cap))
    mask = table.shape[0] - 1
    for j in range(n):
        t = tokens[j]
        if cap - state[S_N_LIVE] < max_n:
            if not evict(nodes, stats, table, state):
                return ERR_EVICT
        s = state[S_STEP] + 1
        state[S_STEP] = s
        n_open = state[S_N_OPEN]
        # k > 0: extend the open path of length k by t; k = 0: the path (t,) below the root
        for k in range(min(n_open, max_n - 1), -1, -1):
            parent = state[S_OPEN + k - 1] if k > 0 else 0
            i = pair_slot(parent, t, mask)
            while True:
                x = table[i]
                if x == 0 or (nodes[x, TOKEN] == t and nodes[x, PARENT] == parent):
                    break
                i = (i + 1) & mask
            if x != 0:
                # -- existing node: count c -> c + 1, most recent; keep the sibling list sorted.
                # Its place is the front of the group of count c + 1, which (if it exists) is
                # the group just before x's own group g.
                c = stats[x, COUNT]
                px = nodes[x, PREV_SIBLING]
                nx = nodes[x, NEXT_SIBLING]
                if px != 0 or nx != 0:  # (an only child needs no move)
                    g = nodes[x, GROUP]
                    h = nodes[g, GROUP_HEAD]
                    y = nodes[h, PREV_SIBLING]  # last node of the group before g, 0 if none
                    others = h != x or (nx != 0 and nodes[nx, GROUP] == g)  # g has more members
                    if h == x and others:
                        nodes[g, GROUP_HEAD] = nx
                    join = y != 0 and stats[y, COUNT] == c + 1
                    if join:
                        g2 = nodes[y, GROUP]
                        b = nodes[g2, GROUP_HEAD]
                    else:
                        g2 = 0
                        b = h
                    if b != x and (join or others):  # move x to just before b
                        if px != 0:
                            nodes[px, NEXT_SIBLING] = nx
                        else:
                            nodes[parent, FIRST_CHILD] = nx
                        if nx != 0:
                            nodes[nx, PREV_SIBLING] = px
                        else:
                            nodes[parent, LAST_CHILD] = px
                        pb = nodes[b, PREV_SIBLING]
                        nodes[x, PREV_SIBLING] = pb
                        nodes[x, NEXT_SIBLING] = b
                        nodes[b, PREV_SIBLING] = x
                        if pb != 0:
                            nodes[pb, NEXT_SIBLING] = x
                        else:
                            nodes[parent, FIRST_CHILD] = x
                    if join:
                        nodes[g2, GROUP_HEAD] = x
                        nodes[x, GROUP] = g2
                        if not others:  # g is empty now: free it
                            nodes[g, GROUP_HEAD] = state[S_GROUP_FREE]
                            state[S_GROUP_FREE] = g
                    elif others:  # a new group of its own, just before g
                        g2 = state[S_GROUP_FREE]
                        state[S_GROUP_FREE] = nodes[g2, GROUP_HEAD]
                        nodes[g2, GROUP_HEAD] = x
                        nodes[x, GROUP] = g2
                    # else: x, alone in g, stays in place and g now holds count c + 1
                stats[x, COUNT] = c + 1
                stats[x, LAST_USED] = s
                stats[parent, CHILD_SUM] += 1
            else:
                # -- new node, count 1 (the lowest count): the front of the last group if that
                # group has count 1, else a new group at the end of the list
                x = state[S_FREE_HEAD]
                state[S_FREE_HEAD] = nodes[x, NEXT_SIBLING]
                state[S_N_LIVE] += 1
                table[i] = x
                _init_node(nodes, stats, x, t, parent, 1, s)
                stats[parent, CHILD_SUM] += 1
                last = nodes[parent, LAST_CHILD]
                if last != 0 and stats[last, COUNT] == 1:
                    g = nodes[last, GROUP]
                    h = nodes[g, GROUP_HEAD]
                    pb = nodes[h, PREV_SIBLING]
                    nodes[x, PREV_SIBLING] = pb
                    nodes[x, NEXT_SIBLING] = h
                    nodes[h, PREV_SIBLING] = x
                    if pb != 0:
                        nodes[pb, NEXT_SIBLING] = x
                    else:
                        nodes[parent, FIRST_CHILD] = x
                    nodes[g, GROUP_HEAD] = x
                    nodes[x, GROUP] = g
                else:
                    nodes[x, PREV_SIBLING] = last
                    nodes[x, NEXT_SIBLING] = 0
                    if last != 0:
                        nodes[last, NEXT_SIBLING] = x
                    else:
                        nodes[parent, FIRST_CHILD] = x
                    nodes[parent, LAST_CHILD] = x
                    g = state[S_GROUP_FREE]
                    state[S_GROUP_FREE] = nodes[g, GROUP_HEAD]
                    nodes[g, GROUP_HEAD] = x
                    nodes[x, GROUP] = g
            state[S_OPEN + k] = x
        state[S_N_OPEN] = min(n_open + 1, max_n)
    return OK


# -- proposals ------------------------------------------------------------------------------------


@njit(cache=True)
def insert_rows(nodes, stats, table, state, rows):
    """Each row of ``rows`` int64[r, n] as a stream of its own (:func:`insert` after the open path is closed:
    no n-gram spans two rows, nor what came before and the first row), in one call; returns a status code (the
    first row's that failed; the rows before it stay inserted). The open path is the last row's afterwards,
    as ``reset_stream`` then ``insert`` per row leaves it.

    Example: rows ``[[1, 2], [2, 3]]`` records 1, 2, (1, 2), 2, 3, (2, 3), and not (2, 2)."""
    for i in range(rows.shape[0]):
        state[S_N_OPEN] = 0
        status = insert(nodes, stats, table, state, rows[i])
        if status != OK:
            return status
    return OK


@njit(cache=True)
def propose(nodes, stats, table, state, ctx, max_depth, max_match, out_tokens, out_parents, out_match):
    """Draft tree for ``ctx`` written to ``out_tokens[:k]``, ``out_parents[:k]``; returns ``k``
    (at most ``len(out_tokens)``, the caller's max_nodes), or ``ERR_TOKEN``. Read-only on the trie.
    ``out_match[0]`` receives the match length: how many of the context's last tokens the tree
    continues (0 when it is empty).

    Best-first with lazy siblings: a child list is sorted in pop order, so a node's next sibling is
    pushed only when the node is popped, and its first child only when it is selected. Each pop
    pushes at most two entries: no scan of child lists, and a heap of at most 2 * max_nodes + 1.
    (Sorted by count, siblings are sorted by score too: two distinct counts below 2**52 never
    round to equal scores.)
    """
    n = ctx.shape[0]
    max_n = state[S_MAX_N]
    mm = min(max(max_match, 1), max_n - 1)
    for i in range(max(n - mm, 0), n):  # only the last mm tokens are read
        if ctx[i] < 0 or ctx[i] > INT32_MAX:
            return ERR_TOKEN
    out_match[0] = 0
    max_nodes = out_tokens.shape[0]
    if max_nodes <= 0 or max_depth <= 0:
        return 0
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
        return 0
    out_match[0] = length
    dlim = min(max_depth, max_n - length)
    # 2. best-first selection. Entry e: es[e] = (score, parent's score);
    #    ei[e] = (node, depth, last_used, pop index of the parent or -1)
    size = 2 * max_nodes + 1
    es = np.empty((size, 2), np.float64)
    ints = np.empty((size + max_nodes, 5), np.int64)
    ei = ints[:size]
    # selected, in pop order: node, parent's pop index, first and last selected child, next sibling
    sel = ints[size:]
    heap = np.empty(size, np.int64)
    key_score, key_depth, key_tie = es[:, 0], ei[:, 1], ei[:, 2]  # the heap's order: (-score, depth, -last_used)
    first_root = -1
    last_root = -1
    c = nodes[match, FIRST_CHILD]
    es[0, 0] = np.float64(stats[c, COUNT]) / np.float64(stats[match, CHILD_SUM])
    es[0, 1] = 1.0
    ei[0, 0] = c
    ei[0, 1] = 1
    ei[0, 2] = stats[c, LAST_USED]
    ei[0, 3] = -1
    heap[0] = 0
    n_heap = 1
    n_ent = 1
    n_sel = 0
    while n_heap > 0 and n_sel < max_nodes:
        top, n_heap = heap_pop(heap, n_heap, key_score, key_depth, key_tie)
        x = ei[top, 0]
        depth = ei[top, 1]
        ppop = ei[top, 3]
        score = es[top, 0]
        # select x; siblings arrive in output order, so append to the parent's selected children
        me = n_sel
        n_sel += 1
        sel[me, 0] = x
        sel[me, 1] = ppop
        sel[me, 2] = -1
        sel[me, 3] = -1
        sel[me, 4] = -1
        if ppop < 0:
            if last_root < 0:
                first_root = me
            else:
                sel[last_root, 4] = me
            last_root = me
        else:
            if sel[ppop, 2] < 0:
                sel[ppop, 2] = me
            else:
                sel[sel[ppop, 3], 4] = me
            sel[ppop, 3] = me
        # push the next sibling, then the first child
        for which in range(2):
            if which == 0:
                y = nodes[x, NEXT_SIBLING]
                parent_score = es[top, 1]
                total = stats[nodes[x, PARENT], CHILD_SUM]
                d = depth
                pp = ppop
            else:
                if depth >= dlim:
                    break
                y = nodes[x, FIRST_CHILD]
                parent_score = score
                total = stats[x, CHILD_SUM]
                d = depth + 1
                pp = me
            if y == 0:
                continue
            e = n_ent
            n_ent += 1
            es[e, 0] = parent_score * np.float64(stats[y, COUNT]) / np.float64(total)
            es[e, 1] = parent_score
            ei[e, 0] = y
            ei[e, 1] = d
            ei[e, 2] = stats[y, LAST_USED]
            ei[e, 3] = pp
            n_heap = heap_push(heap, n_heap, e, key_score, key_depth, key_tie)
    # 3. breadth-first output: queue over the selected tree (reuse ``heap`` as the queue)
    order = heap
    pos = 0
    c = first_root
    while c >= 0:
        order[pos] = c
        out_parents[pos] = -1
        pos += 1
        c = sel[c, 4]
    head = 0
    while head < pos:
        j = order[head]
        c = sel[j, 2]
        while c >= 0:
            order[pos] = c
            out_parents[pos] = head
            pos += 1
            c = sel[c, 4]
        head += 1
    for k in range(n_sel):
        out_tokens[k] = nodes[sel[order[k], 0], TOKEN]
    return n_sel


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


# -- persistence and streams ------------------------------------------------------------------------

# ``build`` status codes (with the index of the offending row)
BUILD_OK, BAD_PARENT, BAD_TOKEN, BAD_COUNT, BAD_LAST_USED, BAD_DEPTH, BAD_ORDER, DUPLICATE, TOO_MANY = range(9)


@njit(cache=True)
def export(nodes, stats, token, parent, count, last_used):
    """Every live node, breadth-first from the root and siblings in list order, into the output arrays
    (``len(token)`` must be the number of live nodes): ``parent[i]`` is the output index of the node's
    parent (-1 for a child of the root), always ``< i``. Returns the number written, or -1 when the
    outputs are too short. Read-only on the trie."""
    n_out = token.shape[0]
    slots = np.empty(n_out, np.int64)
    n = 0
    h = -1
    v = 0
    while True:
        c = nodes[v, FIRST_CHILD]
        while c != 0:
            if n >= n_out:
                return -1
            slots[n] = c
            token[n] = nodes[c, TOKEN]
            parent[n] = h
            count[n] = stats[c, COUNT]
            last_used[n] = stats[c, LAST_USED]
            n += 1
            c = nodes[c, NEXT_SIBLING]
        h += 1
        if h >= n:
            return n
        v = slots[h]


@njit(cache=True)
def build(nodes, stats, table, state, token, parent, count, last_used, step, n_evictions):
    """Fill a just-``reset`` trie with the nodes ``export`` wrote; returns ``(status, row)``.

    Node ``i`` goes to slot ``i + 1``; each is appended to its parent's child list, which must
    therefore arrive sorted (count desc, last_used desc), and equal counts in a run share a group.
    Every row is checked (parent before child, token in int32 range, count >= 1, 1 <= last_used <=
    step, depth <= max_n, sibling order, no duplicate (parent, token)); on the first bad row the
    status says why and the arrays are left half-built (the caller discards them). The result
    starts a new stream, at ``step``.
    """
    n = token.shape[0]
    max_n = state[S_MAX_N]
    cap = state[S_CAPACITY]
    if n > cap:
        return TOO_MANY, n
    _reach(nodes, stats, state, n)  # the slots and group ids the nodes take
    mask = table.shape[0] - 1
    depth = np.zeros(n + 1, np.int64)
    g_next = 1
    for i in range(n):
        v = i + 1
        p = np.int64(parent[i]) + 1  # slot of the parent, 0 = root
        if p < 0 or p > i:
            return BAD_PARENT, i
        t = np.int64(token[i])
        if t < 0 or t > INT32_MAX:
            return BAD_TOKEN, i
        c = count[i]
        if c < 1:
            return BAD_COUNT, i
        lu = last_used[i]
        if lu < 1 or lu > step:
            return BAD_LAST_USED, i
        d = depth[p] + 1
        if d > max_n:
            return BAD_DEPTH, i
        depth[v] = d
        h = pair_slot(p, t, mask)
        while table[h] != 0:
            x = table[h]
            if nodes[x, TOKEN] == t and nodes[x, PARENT] == p:
                return DUPLICATE, i
            h = (h + 1) & mask
        table[h] = v
        _init_node(nodes, stats, v, t, p, c, lu)
        nodes[v, NEXT_SIBLING] = 0
        last = nodes[p, LAST_CHILD]
        same = False
        if last != 0:
            lc = stats[last, COUNT]
            if lc < c or (lc == c and stats[last, LAST_USED] < lu):
                return BAD_ORDER, i
            nodes[last, NEXT_SIBLING] = v
            same = lc == c
        else:
            nodes[p, FIRST_CHILD] = v
        nodes[v, PREV_SIBLING] = last
        nodes[p, LAST_CHILD] = v
        stats[p, CHILD_SUM] += c
        if same:
            nodes[v, GROUP] = nodes[last, GROUP]
        else:
            nodes[g_next, GROUP_HEAD] = v
            nodes[v, GROUP] = g_next
            g_next += 1
    # free slots n + 1 .. cap and group ids g_next .. cap: chained as a new trie's (rows up to n written above,
    # the rest above S_HIGH)
    state[S_N_LIVE] = n
    state[S_FREE_HEAD] = n + 1 if n < cap else 0
    state[S_GROUP_FREE] = g_next if g_next <= cap else 0
    state[S_STEP] = step  # (S_HIGH: set by the _reach above, past the rows and group ids used)
    state[S_N_OPEN] = 0
    state[S_N_EVICTIONS] = n_evictions
    return BUILD_OK, n


@njit(cache=True)
def open_tail(nodes, state, out):
    """The tokens of the current stream's longest open path (its last ``state[S_N_OPEN]`` tokens),
    oldest first, into ``out[:k]``; returns ``k``."""
    k = state[S_N_OPEN]
    if k == 0:
        return 0
    v = state[S_OPEN + k - 1]
    for i in range(k - 1, -1, -1):
        out[i] = nodes[v, TOKEN]
        v = nodes[v, PARENT]
    return k


@njit(cache=True)
def reopen(nodes, table, state, tail):
    """Make ``tail`` (a stream's last tokens, oldest first) the open path again, as far as its
    n-grams still exist: the open path of length ``k`` is the node of the last ``k`` tokens, found
    from the root, for k = 1, 2, ... until one is missing (evicted, or cleared). Returns how many."""
    n = min(tail.shape[0], state[S_MAX_N])
    m = tail.shape[0]
    k = 0
    while k < n:
        v = 0
        for i in range(m - k - 1, m):
            v = find_child(nodes, table, v, tail[i])
            if v == 0:
                break
        if v == 0:
            break
        state[S_OPEN + k] = v
        k += 1
    state[S_N_OPEN] = k
    return k
