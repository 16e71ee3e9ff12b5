"""Numba kernels of the n-gram trie, mutating in place the four arrays :func:`empty_arrays` allocates (once
per :class:`~lookahead.cache.trie.NgramTrie`).

``nodes``  int32 ``(capacity + 1, 8)``, row 0 the root: ``TOKEN``, ``PARENT``, a doubly linked child list
           (``FIRST_CHILD``, ``LAST_CHILD``, ``NEXT_SIBLING``, ``PREV_SIBLING``), ``GROUP``, and ``GROUP_HEAD``
           (indexed by group id, not node). A free slot has ``TOKEN == -1``; ``NEXT_SIBLING`` links the free list.
``stats``  int64 ``(capacity + 1, 3)``: ``COUNT``, ``LAST_USED`` (step that last recorded it), ``CHILD_SUM``.
``table``  int32 power-of-two hash (linear probing, load <= 1/2) from ``(parent, token)`` to the child's slot, 0 =
           empty: a prefix sized to the live nodes, or all of it where an insert could evict (eviction's scratch).
``state``  int64: the scalars ``S_*``, then ``S_OPEN + k``: the node of the open path of length ``k + 1``.

Child lists are sorted by (count desc, last_used desc), ``propose``'s sibling order; runs of equal count are
*groups* (O(1) LFU: ``nodes[g, GROUP_HEAD]`` is group ``g``'s first node; free group ids chain through it). An
update (count +1, most recent) moves a node to the front of the group just before its own.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .primitives import INT32_MAX, heap_pop, heap_push, pair_slot, place, table_size

TOKEN, PARENT, FIRST_CHILD, LAST_CHILD, NEXT_SIBLING, PREV_SIBLING, GROUP, GROUP_HEAD = range(8)  # nodes
NODE_COLUMNS = 8
COUNT, LAST_USED, CHILD_SUM = 0, 1, 2  # stats
STAT_COLUMNS = 3
S_MAX_N, S_CAPACITY, S_N_LIVE, S_FREE_HEAD, S_STEP, S_N_OPEN, S_N_EVICTIONS, S_GROUP_FREE, S_HIGH = range(9)
S_OPEN = 9  # state[S_OPEN + k]: node of the open path of length k + 1
# Rows above S_HIGH count as a new trie's (``fresh_rows``) whatever they hold; ``reach`` writes them.
REACH_ROWS = 512  # the fewest rows reach writes at once
OK, ERR_TOKEN, ERR_EVICT = 0, -1, -2


@njit(cache=True)
def rehash(nodes, table, state):
    """Zero ``table`` (a power of two >= twice the live nodes) and enter every live node into it."""
    table[:] = 0
    mask = table.shape[0] - 1
    for v in range(1, min(state[S_HIGH], state[S_CAPACITY]) + 1):
        if nodes[v, TOKEN] >= 0:
            place(table, mask, nodes[v, PARENT], nodes[v, TOKEN], v)


@njit(cache=True, inline="always")
def probe(nodes, table, mask, parent, token):
    """``(slot, node)``: where ``table`` (``mask + 1`` slots) holds the child of ``parent`` with ``token``, else the
    empty slot ending its probe sequence, and 0."""
    i = pair_slot(parent, token, mask)
    while True:
        x = table[i]
        if x == 0 or (nodes[x, TOKEN] == token and nodes[x, PARENT] == parent):
            return i, x
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def find_child(nodes, table, parent, token):
    """Slot of the child of ``parent`` with ``token``, or 0 when there is none."""
    return probe(nodes, table, table.shape[0] - 1, parent, token)[1]


@njit(cache=True, inline="always")
def init_node(nodes, stats, x, token, parent, count, last_used):
    """Fill slot ``x`` as a childless node ``token`` under ``parent`` (sibling links are the caller's)."""
    nodes[x, TOKEN] = token
    nodes[x, PARENT] = parent
    nodes[x, FIRST_CHILD] = 0
    nodes[x, LAST_CHILD] = 0
    stats[x, COUNT] = count
    stats[x, LAST_USED] = last_used
    stats[x, CHILD_SUM] = 0


@njit(cache=True, inline="always")
def _link_before(nodes, parent, x, b):
    """Link ``x`` into ``parent``'s child list just before ``b`` (a child)."""
    pb = nodes[b, PREV_SIBLING]
    nodes[x, PREV_SIBLING] = pb
    nodes[x, NEXT_SIBLING] = b
    nodes[b, PREV_SIBLING] = x
    if pb != 0:
        nodes[pb, NEXT_SIBLING] = x
    else:
        nodes[parent, FIRST_CHILD] = x


@njit(cache=True, inline="always")
def _free_node(nodes, stats, v, next_free):
    """Slot ``v`` made free, linked to ``next_free`` (its ``GROUP_HEAD`` is not touched)."""
    init_node(nodes, stats, v, -1, 0, 0, 0)
    nodes[v, NEXT_SIBLING] = next_free
    nodes[v, PREV_SIBLING] = 0
    nodes[v, GROUP] = 0


@njit(cache=True, inline="always")
def fresh_rows(nodes, stats, cap, lo, hi):
    """Rows ``lo .. hi`` (inclusive, ``1 <= lo``, ``hi <= cap``) as a new trie's: free slots and group ids, each
    chained to the next row (0 at ``cap``)."""
    for v in range(lo, hi + 1):
        link = v + 1 if v < cap else 0
        _free_node(nodes, stats, v, link)
        nodes[v, GROUP_HEAD] = link


@njit(cache=True)
def _write_ahead(nodes, stats, state, v):
    high = state[S_HIGH]
    last = min(max(v, high + REACH_ROWS), state[S_CAPACITY])
    fresh_rows(nodes, stats, state[S_CAPACITY], high + 1, last)
    state[S_HIGH] = last


@njit(cache=True, inline="always")
def reach(nodes, stats, state, v):
    """Call before row ``v`` (<= capacity) is read: rows ``S_HIGH + 1 .. max(v, S_HIGH + REACH_ROWS)`` (<=
    capacity) are written as a new trie's, ``S_HIGH`` raised."""
    if v > state[S_HIGH]:
        _write_ahead(nodes, stats, state, v)


@njit(cache=True)
def reset(nodes, stats, table, state):
    """Empty trie (free list 1, 2, ..., capacity; step 0) in O(live nodes): writes the root row and the state and
    zeroes the live entries of ``table``; enough for new arrays with a zeroed table."""
    cap = state[S_CAPACITY]
    high = state[S_HIGH]
    if 4 * high >= cap:
        table[:] = 0
    else:  # find all live entries first (probing needs the table intact), then zero them
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
    state[S_N_LIVE:S_OPEN] = 0
    state[S_FREE_HEAD] = 1
    state[S_GROUP_FREE] = 1


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
    """Flag ``u`` and its ancestors in ``table`` up to the first already flagged; returns how many it flagged."""
    n = 0
    while table[u] == 0:
        table[u] = 1
        n += 1
        u = nodes[u, PARENT]
    return n


@njit(cache=True)
def _mark_kept(nodes, stats, table, state, thr):
    """Keep flags in ``table[: capacity + 1]`` for nodes with ``last_used > thr``, the open path, and their
    ancestors (root included); returns how many are kept, root not counted."""
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
    """LRU eviction, O(capacity); returns True when at least ``max_n`` slots are free afterwards. With ``s`` the
    last step, ``T = min((capacity // 4)-th smallest last_used, s - 2 max_n)``: keep nodes with ``last_used > T``,
    the open path (parents of the next token's n-grams) and all their ancestors; free the rest. With one stream and
    ``capacity >= 4 max_n**2`` this frees >= max_n: an ancestor of a node used at step u was used at >= u - max_n
    + 1, so at most max_n (max_n - 1) kept nodes have last_used <= T. Parked streams of other threads break that
    argument, so if too few would go, T rises to ``s - 2 max_n``, then ``s - 1`` (keeps <= max_n (max_n + 1))."""
    max_n = state[S_MAX_N]
    cap = state[S_CAPACITY]
    s = state[S_STEP]
    reach(nodes, stats, state, cap)  # the passes below read every row
    # 1. threshold (table as int64 scratch, room for capacity values)
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
    for g in range(g_next, cap + 1):  # chain the unused group ids
        nodes[g, GROUP_HEAD] = g + 1 if g < cap else 0
    state[S_GROUP_FREE] = g_next if g_next <= cap else 0
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
    """Append ``tokens`` (int64[n]) to the current stream; returns ``OK``, ``ERR_TOKEN`` (a token outside
    [0, 2**31 - 1]: nothing changed) or ``ERR_EVICT``. Per token (step ``s``): each open path shorter than max_n and
    the new path ``(t,)`` get their child ``t`` (created if missing) with ``count += 1``, ``last_used = s``."""
    n = tokens.shape[0]
    for j in range(n):
        if tokens[j] < 0 or tokens[j] > INT32_MAX:
            return ERR_TOKEN
    max_n = state[S_MAX_N]
    cap = state[S_CAPACITY]
    # the at most n * max_n rows this call takes, written up front (the free list is in row order until an eviction)
    if state[S_FREE_HEAD] != 0:
        reach(nodes, stats, state, min(state[S_FREE_HEAD] + n * max_n, cap))
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
            i, x = probe(nodes, table, mask, parent, t)
            if x != 0:
                # existing node: count c -> c + 1, moved to the front of group c + 1 (just before its group g)
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
                        _link_before(nodes, parent, x, b)
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
                # new node, count 1: front of the last group if it has count 1, else a new group at the end
                x = state[S_FREE_HEAD]
                state[S_FREE_HEAD] = nodes[x, NEXT_SIBLING]
                state[S_N_LIVE] += 1
                table[i] = x
                init_node(nodes, stats, x, t, parent, 1, s)
                stats[parent, CHILD_SUM] += 1
                last = nodes[parent, LAST_CHILD]
                if last != 0 and stats[last, COUNT] == 1:
                    g = nodes[last, GROUP]
                    _link_before(nodes, parent, x, nodes[g, GROUP_HEAD])
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


@njit(cache=True)
def insert_rows(nodes, stats, table, state, rows):
    """Each row of ``rows`` int64[r, n] inserted as a stream of its own; returns the first failing row's status
    (earlier rows stay inserted). The last row's open path stays."""
    for i in range(rows.shape[0]):
        state[S_N_OPEN] = 0
        status = insert(nodes, stats, table, state, rows[i])
        if status != OK:
            return status
    return OK


@njit(cache=True)
def propose(nodes, stats, table, state, ctx, max_depth, max_match, out_tokens, out_parents, out_match):
    """Draft tree for ``ctx`` into ``out_tokens[:k]``, ``out_parents[:k]``; returns ``k <= len(out_tokens)`` or
    ``ERR_TOKEN``; ``out_match[0]`` = match length (0 when empty). Read-only. Best-first with lazy siblings: child
    lists are in pop order, so a popped node pushes only its next sibling and (once selected) its first child."""
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
    # 2. best-first. es[e] = (score, parent's score); ei[e] = (node, depth, last_used, parent's pop index)
    size = 2 * max_nodes + 1
    es = np.empty((size, 2), np.float64)
    ints = np.empty((size + max_nodes + 1, 4), np.int64)
    ei = ints[:size]
    # sel[j]: the j-th popped node (row 0: the match): node, first and last selected child, next selected sibling
    sel = ints[size:]
    heap = np.empty(size, np.int64)
    key_score, key_depth, key_tie = es[:, 0], ei[:, 1], ei[:, 2]  # the heap's order: (-score, depth, -last_used)
    sel[0, 1] = -1
    c = nodes[match, FIRST_CHILD]
    es[0, 0] = np.float64(stats[c, COUNT]) / np.float64(stats[match, CHILD_SUM])
    es[0, 1] = 1.0
    ei[0, 0] = c
    ei[0, 1] = 1
    ei[0, 2] = stats[c, LAST_USED]
    ei[0, 3] = 0
    heap[0] = 0
    n_heap = 1
    n_ent = 1
    n_sel = 1
    while n_heap > 0 and n_sel <= max_nodes:
        top, n_heap = heap_pop(heap, n_heap, key_score, key_depth, key_tie)
        x = ei[top, 0]
        depth = ei[top, 1]
        ppop = ei[top, 3]
        score = es[top, 0]
        # select x; siblings arrive in output order, so append to the parent's selected children
        me = n_sel
        n_sel += 1
        sel[me, 0] = x
        sel[me, 1] = -1
        sel[me, 3] = -1
        if sel[ppop, 1] < 0:
            sel[ppop, 1] = me
        else:
            sel[sel[ppop, 2], 3] = me
        sel[ppop, 2] = me
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
    # 3. breadth-first output: a queue over the selected tree from the match (``heap`` reused as the queue)
    order = heap
    order[0] = 0
    pos = 1
    head = 0
    while head < pos:
        c = sel[order[head], 1]
        while c >= 0:
            order[pos] = c
            out_parents[pos - 1] = head - 1
            pos += 1
            c = sel[c, 3]
        head += 1
    for k in range(n_sel - 1):
        out_tokens[k] = nodes[sel[order[k + 1], 0], TOKEN]
    return n_sel - 1


@njit(cache=True)
def open_tail(nodes, state, out):
    """The current stream's last ``k = state[S_N_OPEN]`` tokens, oldest first, into ``out[:k]``; returns ``k``."""
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
    """Reopen the path of ``tail`` (a stream's last tokens, oldest first) for k = 1, 2, ... while the node of its
    last ``k`` tokens exists; returns how many."""
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


def empty_arrays(max_n: int, capacity: int):
    """``(nodes, stats, table, state)`` of an empty trie; node rows stay unwritten until used (``S_HIGH``)."""
    nodes = np.empty((capacity + 1, NODE_COLUMNS), np.int32)
    stats = np.empty((capacity + 1, STAT_COLUMNS), np.int64)
    table = np.zeros(table_size(capacity), np.int32)
    state = np.zeros(S_OPEN + max_n, np.int64)
    state[S_MAX_N] = max_n
    state[S_CAPACITY] = capacity
    reset(nodes, stats, table, state)
    return nodes, stats, table, state
