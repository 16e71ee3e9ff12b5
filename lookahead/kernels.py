"""Numba kernels of the per-step draft decision: arrays in, arrays out, no Python objects.

A step's budget touches every draft node a few times (its cells, its path probability, the
sorted choice); in NumPy that is dozens of small-array calls per step, about 0.1-0.2 ms of host
time, which a GPU forward of a few milliseconds would feel. Each kernel here is one call. The
arithmetic is written in the same order as the NumPy reference it replaced, so the decisions are
bit-for-bit the same (``tests/test_budget.py`` checks hand-worked values;
``python -m benchmarks.replay`` reproduces its committed tables).

Terms: a tree is parent-first (``parents[i] < i``, -1 for a child of the root); a node's *cell* is
(origin, match bucket, depth, rank) as defined in ``acceptance.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def keep_nodes(tokens, parents, origin, match, depth, rank, agreement, keep):
    """A draft's node arrays cut to the nodes ``keep`` int64[m] (increasing, closed under parents), in one pass:
    (int64[6, m]: tokens, parents re-indexed among the kept nodes, match, depth, rank, agreement; origin[m]; ok),
    three returns because each returned array costs its boxing; ``ok`` False when a kept node's parent is not kept.

    Example: tokens ``[5, 6, 7, 8]``, parents ``[-1, -1, 0, 1]``, keep ``[0, 1, 3]`` -> tokens ``[5, 6, 8]``,
    parents ``[-1, -1, 1]``, each other array's entries 0, 1 and 3.
    """
    n, m = parents.shape[0], keep.shape[0]
    new_index = np.full(n, -1, np.int64)
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
def best_chain(parents, weights):
    """The nodes (sorted) of the root-to-node path of a parent-first tree whose summed ``weights`` float[n] is the
    largest (equal sums: the node met first); empty for an empty tree. With acceptance probabilities as weights
    (a node's includes its ancestors') the sum is the path's expected accepted tokens; with ones, its depth.

    Example: parents ``[-1, 0, -1, 2, 3]``, weights ``[0.9, 0.1, 0.5, 0.4, 0.3]`` -> path sums ``[0.9, 1.0, 0.5,
    0.9, 1.2]`` -> ``[2, 3, 4]``.
    """
    n = parents.shape[0]
    total = np.empty(n)
    best = -1
    for i in range(n):
        p = parents[i]
        total[i] = weights[i] + (total[p] if p >= 0 else 0.0)
        if best < 0 or total[i] > total[best]:
            best = i
    count = 0
    j = best
    while j >= 0:
        count += 1
        j = parents[j]
    out = np.empty(count, np.int64)
    j = best
    for c in range(count - 1, -1, -1):
        out[c] = j
        j = parents[j]
    return out


@njit(cache=True)
def shallowest_nodes(depth, count):
    """int64[min(count, n)]: the ``count`` shallowest nodes of depths ``depth`` int64[n] (equal depths: the earlier
    first), in increasing order: what ``np.sort(np.argsort(depth, kind="stable")[:count])`` gives, in linear time.
    In a parent-first tree a node's parent is shallower, so the nodes kept are closed under parents.

    Example: depths ``[1, 2, 3, 1, 2]``, count 3 -> ``[0, 1, 3]`` (both depth-1 nodes, then the first depth-2 one).
    """
    n = depth.shape[0]
    count = max(min(count, n), 0)
    deepest = 0
    for i in range(n):
        deepest = max(deepest, depth[i])
    per_depth = np.zeros(deepest + 2, np.int64)
    for i in range(n):
        per_depth[depth[i]] += 1
    cut, below = 0, 0  # every node shallower than ``cut`` is kept, and the first ``count - below`` at ``cut``
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
def belief_log_ratio(c, accepted, off_scale):
    """The log-likelihood ratio of tried nodes' outcomes, copying against not (``acceptance.CopyBelief``): per node
    of estimated conditional acceptance ``c`` float64[t] (clipped to [1e-6, 1 - 1e-6]) add ``log(1 / off_scale)``
    if ``accepted`` bool[t], else ``log((1 - c) / (1 - off_scale * c))``.

    Example: ``c`` ``[0.87, 0.5]``, accepted ``[False, True]``, off_scale 0.3 -> ``-1.74 + 1.20 = -0.54``.
    """
    total = 0.0
    for i in range(c.shape[0]):
        if accepted[i]:
            total += np.log(1.0 / off_scale)
        else:
            x = min(max(c[i], 1e-6), 1 - 1e-6)
            total += np.log((1.0 - x) / (1.0 - off_scale * x))
    return total


@njit(cache=True)
def window_step(levels, out, ngram, shift, draws, cursor):
    """One Jacobi step of the lookahead window (``window.LookaheadWindow.advance``) in one pass: from its levels
    int64[L, W] and the top level's outputs int64[W], (the new levels int64[L', W] (a new array), the harvested
    n-grams int64[W, N] (``N`` = ``ngram``; [0, N] while filling), the next unread index of ``draws``). The outputs
    become the newest level (the oldest is dropped once ``L == N - 1``); then every level slides ``shift``
    columns left and its new right-hand columns take ``draws[cursor:]`` in row-major order.

    Example: levels ``[[5, 6, 7], [8, 9, 4]]``, outputs ``[1, 2, 3]``, N 3, shift 1, draws ``[20, 21]``, cursor 0
    -> levels ``[[9, 4, 20], [2, 3, 21]]``, n-grams ``[[5, 8, 1], [6, 9, 2], [7, 4, 3]]``, cursor 2.
    """
    n_levels, width = levels.shape
    full = n_levels == ngram - 1
    kept = n_levels - 1 if full else n_levels  # old levels that stay, below the outputs
    first = n_levels - kept
    grams = np.empty((width if full else 0, ngram), np.int64)
    if full:
        for j in range(width):
            for lev in range(n_levels):
                grams[j, lev] = levels[lev, j]
            grams[j, n_levels] = out[j]
    new = np.empty((kept + 1, width), np.int64)
    for lev in range(kept + 1):
        for j in range(width - shift):
            new[lev, j] = levels[first + lev, j + shift] if lev < kept else out[j + shift]
        for j in range(width - shift, width):
            new[lev, j] = draws[cursor]
            cursor += 1
    return new, grams, cursor


@njit(cache=True)
def depth_rank(parents):
    """(depth int64[n], rank int64[n], ok): depth 1 for a child of the root; rank 0 for an only child,
    else 1 + its place among its siblings; ``ok`` False when ``parents`` is not parent-first.

    Example: parents ``[-1, -1, 0, 0, 1]`` -> depths ``[1, 1, 2, 2, 2]``, ranks ``[1, 2, 1, 2, 0]``.
    """
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
    rank = np.zeros(n, np.int64)
    for i in range(n):
        if count[parents[i] + 1] > 1:
            rank[i] = place[i] + 1
    return depth, rank, True


@njit(cache=True)
def _conditional(o, ctx, d, r, prior_a, prior_b, tried, accepted, tried_pool, accepted_pool, pool_weight, depth_lift):
    a = prior_a[ctx, r]
    b = prior_b[ctx, r]
    pooled = (accepted_pool[o, ctx, r] + a) / (tried_pool[o, ctx, r] + a + b)
    pooled = 1.0 - (1.0 - pooled) * depth_lift ** d  # the depth cell's target: deeper, likelier to go on
    return (accepted[o, ctx, d, r] + pool_weight * pooled) / (tried[o, ctx, d, r] + pool_weight)


@njit(cache=True)
def _cell(match, agreement, depth, rank, n_ctx, max_depth, max_rank):
    """A node's cell: context (its match bucket; the second half of the contexts when another source agreed),
    depth and rank cells."""
    buckets = n_ctx // 2
    ctx = min(max(match, 1), buckets) - 1 + (buckets if agreement > 0 else 0)
    return ctx, min(depth - 1, max_depth - 1), min(rank, max_rank - 1)


@njit(cache=True)
def node_probabilities(parents, origin, match, agreement, depth, rank, prior_a, prior_b, tried, accepted, tried_pool,
                       accepted_pool, pool_weight, depth_lift):
    """float64[n]: P(node accepted), the product of the conditional estimates ``c`` down its path.

    ``agreement``: per node, how many other sources drafted it (``Draft.agreement``: an agreed node's context is in
    the second half of the contexts). ``tried``/``accepted``: float64[origins, contexts, depths, ranks] counts;
    ``*_pool``: the same summed over depths; ``prior_a``/``prior_b``: float64[contexts, ranks]. A depth cell
    ``d`` (0-based) shrinks towards ``1 - (1 - pooled) * depth_lift ** d``.
    Example (priors only, ``depth_lift`` 1): a chain of two only children whose ``c`` is 0.6 each -> ``[0.6,
    0.36]``; with ``depth_lift`` 0.5 the second level's ``c`` is ``1 - 0.4 * 0.5 = 0.8`` -> ``[0.6, 0.48]``.
    """
    n_ctx, max_depth, max_rank = tried.shape[1], tried.shape[2], tried.shape[3]
    prob = np.empty(len(parents))
    for i in range(len(parents)):
        ctx, d, r = _cell(match[i], agreement[i], depth[i], rank[i], n_ctx, max_depth, max_rank)
        c = _conditional(origin[i], ctx, d, r, prior_a, prior_b, tried, accepted, tried_pool, accepted_pool,
                         pool_weight, depth_lift)
        prob[i] = c * prob[parents[i]] if parents[i] >= 0 else c
    return prob


@njit(cache=True)
def choose(probs, cost_table, extra_rows, extra_gain, margin, max_k):
    """(node indices int64[k], sorted; expected tokens per second of the choice): the best prefix by
    probability (ties: lower index first, so parents before children), at most ``max_k`` long, maximising
    ``(1 + extra_gain + sum of chosen probs) / cost_table[1 + extra_rows + k]``; a ``k > 0`` must beat
    ``k = 0`` by the factor ``margin``.

    Example: probs ``[0.9, 0.8, 0.1]``, cost table ``[_, 1, 1.1, 1.2, 2]`` -> ``([0, 1], 2.25)``.
    """
    order = np.argsort(-probs, kind="mergesort")  # stable
    k, rate = _best_prefix(probs, order, cost_table, extra_rows, extra_gain, margin, max_k)
    return np.sort(order[:k]), rate


@njit(cache=True)
def choose_with_window(probs, cost_table, window_rows, window_gain, margin, max_k):
    """:func:`choose` without the window's rows and with them (``window_rows`` more rows, ``window_gain`` more
    expected tokens), from one sort: (order int64[n] of the nodes by probability, stable; k and rate without the
    window; k and rate with it). The caller keeps ``np.sort(order[:k])`` of the choice it takes.

    Example: probs ``[0.9, 0.8, 0.1]``, cost table ``[_, 1, 1.1, 1.2, 2, 2.1, 2.2]``, 2 window rows adding 1.5
    tokens -> order ``[0, 1, 2]``; without the window (2, 2.7 / 1.2 = 2.25), with it (0, 2.5 / 1.2 = 2.08): the window
    alone beats it with any node.
    """
    order = np.argsort(-probs, kind="mergesort")  # stable
    k, rate = _best_prefix(probs, order, cost_table, 0, 0.0, margin, max_k)
    k_w, rate_w = _best_prefix(probs, order, cost_table, window_rows, window_gain, margin, max_k)
    return order, k, rate, k_w, rate_w


@njit(cache=True)
def _best_prefix(probs, order, cost_table, extra_rows, extra_gain, margin, max_k):
    """(k, rate): :func:`choose`'s best prefix length of ``order`` (the nodes by probability) and its rate."""
    n = len(probs)
    base = 1.0 + extra_gain
    best_k, best_rate, first_rate = 0, 0.0, 0.0
    total = 0.0
    for k in range(max(min(n, max_k), 0) + 1):
        if k:
            total += probs[order[k - 1]]
        rate = (base + total) / cost_table[1 + extra_rows + k]
        if k == 0:
            first_rate = rate
            best_rate = rate
        elif rate > best_rate:
            best_k, best_rate = k, rate
    if best_rate < margin * first_rate:
        best_k, best_rate = 0, first_rate
    return best_k, best_rate


@njit(cache=True)
def record(parents, origin, match, agreement, depth, rank, accepted_nodes, prior_a, prior_b, tried, accepted,
           tried_pool, accepted_pool, pool_weight, decay, depth_lift):
    """Learn one verified tree in place: every node whose parent was accepted (or is the root) was
    *tried*; counts decay by ``decay`` first. Returns (c float64[t], hit bool[t]) of the ``t`` tried
    nodes in index order, ``c`` as estimated before this update.

    Example: parents ``[-1, -1, 0, 2]``, accepted ``[0]``: nodes 0, 1, 2 were tried (node 3's parent was
    rejected), and only node 0 was accepted.
    """
    n = len(parents)
    ok = np.zeros(n, np.bool_)
    for j in accepted_nodes:
        ok[j] = True
    n_ctx, max_depth, max_rank = tried.shape[1], tried.shape[2], tried.shape[3]
    c = np.empty(n)
    hit = np.empty(n, np.bool_)
    t = 0
    for i in range(n):
        if parents[i] < 0 or ok[parents[i]]:
            ctx, d, r = _cell(match[i], agreement[i], depth[i], rank[i], n_ctx, max_depth, max_rank)
            c[t] = _conditional(origin[i], ctx, d, r, prior_a, prior_b, tried, accepted, tried_pool,
                                accepted_pool, pool_weight, depth_lift)
            hit[t] = ok[i]
            t += 1
    tried *= decay
    accepted *= decay
    tried_pool *= decay
    accepted_pool *= decay
    for i in range(n):
        if parents[i] < 0 or ok[parents[i]]:
            ctx, d, r = _cell(match[i], agreement[i], depth[i], rank[i], n_ctx, max_depth, max_rank)
            o = origin[i]
            tried[o, ctx, d, r] += 1.0
            tried_pool[o, ctx, r] += 1.0
            if ok[i]:
                accepted[o, ctx, d, r] += 1.0
                accepted_pool[o, ctx, r] += 1.0
    return c[:t], hit[:t]


@njit(cache=True)
def fill_step_mask(mask, p, parents, window_visible, col_visible, neg):
    """Fill the additive attention mask of one step in place: 0 where a row sees a column, ``neg`` elsewhere.

    ``mask``: float[q, past_len + q] with q = p + n + m rows (pending tokens, tree nodes, window rows).
    Pending rows are causal among themselves; node ``i`` sees the pending tokens, itself and its
    ancestors (``parents``, parent-first); window rows see the pending tokens and what
    ``window_visible`` bool[m, m] allows; tree and window rows never see each other. Every row sees
    the cached columns, except those ``col_visible`` bool[past_len + p] marks as padding (an empty
    ``col_visible`` means no padding).

    Example: p = 1, parents ``[-1, -1, 0]``, no cache: rows ``p a b c`` see ``p``, ``p a``, ``p b``, ``p a c``.
    """
    q = mask.shape[0]
    past = mask.shape[1] - q
    mask[:, :past] = 0.0
    _step_block(mask, past, p, parents, window_visible, neg)
    if len(col_visible):
        for j in range(past + p):
            if not col_visible[j]:
                mask[:, j] = neg


@njit(cache=True, inline="always")
def _step_block(mask, past, p, parents, window_visible, neg):
    """The step's own block ``mask[:q, past:past + q]`` (see :func:`fill_step_mask`)."""
    n = len(parents)
    m = window_visible.shape[0]
    q = p + n + m
    for r in range(q):
        for c in range(past, past + q):
            mask[r, c] = neg
    for i in range(p):
        for j in range(i + 1):
            mask[i, past + j] = 0
    for i in range(n):
        row = p + i
        for j in range(p):
            mask[row, past + j] = 0
        a = i
        while a >= 0:  # itself and its ancestors
            mask[row, past + p + a] = 0
            a = parents[a]
    for i in range(m):
        row = p + n + i
        for j in range(p):
            mask[row, past + j] = 0
        for j in range(m):
            if window_visible[i, j]:
                mask[row, past + p + n + j] = 0


_BLOCK = 16  # logits per block of _one_top's first pass, whose block maxima bound the top k from below


@njit(cache=True, nogil=True)
def _has_nan(row):
    """Whether ``row`` holds a NaN (branch-free: it vectorises)."""
    bad = False
    for j in range(row.shape[0]):
        bad |= row[j] != row[j]
    return bad


@njit(cache=True, nogil=True)
def _first_nan(row):
    """The index of the first NaN of ``row``, which holds one (:func:`_has_nan`): ``torch.argmax``'s answer then."""
    i = 0
    while row[i] == row[i]:
        i += 1
    return i


@njit(cache=True, nogil=True, fastmath={"nnan"})
def _block_maxima(row, out):
    """Each block of :data:`_BLOCK` logits' maximum into ``out`` float32[>= ceil(V / _BLOCK)], for a row without
    NaN (:func:`_has_nan`): told so, the compiler vectorises the maximum. A zero's sign may come out either way,
    which no comparison sees."""
    v = row.shape[0]
    t = 0
    for a in range(0, v - _BLOCK + 1, _BLOCK):  # this loop's form is what vectorises (a stride in t does not)
        m = row[a]
        for j in range(a + 1, a + _BLOCK):
            x = row[j]
            m = x if x > m else m
        out[t] = m
        t += 1
    a = t * _BLOCK
    if a < v:
        m = row[a]
        for j in range(a + 1, v):
            x = row[j]
            m = x if x > m else m
        out[t] = m


@njit(cache=True, nogil=True, inline="always")
def _insert(x, j, k, ids, vals, m):
    """Put value ``x`` of id ``j`` into the top ``k`` kept so far (``m`` of them, in ``ids`` / ``vals`` largest first,
    an equal earlier value ahead), when there is room or it beats the last; returns how many are kept."""
    p = m if m < k else k - 1
    while p > 0 and vals[p - 1] < x:  # strict: an equal earlier value stays ahead
        vals[p] = vals[p - 1]
        ids[p] = ids[p - 1]
        p -= 1
    vals[p] = x
    ids[p] = j
    return m + 1 if m < k else m


@njit(cache=True, nogil=True)
def _insert_top(row, a, b, low, k, ids, vals, m):
    """Offer ``row[a:b]``'s entries of at least ``low`` to the top ``k`` kept so far (``m`` of them, in ``ids`` /
    ``vals`` largest first, an equal earlier value ahead); returns how many are kept."""
    thr = vals[k - 1] if m == k else -np.inf
    for j in range(a, b):
        x = row[j]
        if x >= low and (x > thr or (m < k and x == x)):
            m = _insert(x, j, k, ids, vals, m)
            thr = vals[k - 1] if m == k else -np.inf
    return m


RANKED_MAXIMA = 24
""":func:`_one_top` finds the k-th largest of at most this many block maxima by counting (branch-free, O(n^2):
a vocabulary of up to 384); more, it inserts them into a top k."""
RANKED = 32
""":func:`_one_top` places at most this many candidates by counting; more (ties at the bound), one by one."""


@njit(cache=True, nogil=True)
def _top_scratch(v, k):
    """:func:`_one_top`'s scratch arrays for rows of ``v`` logits: (block maxima, the top ``k`` of them (ids,
    values), the candidates (values, ids), the blocks offered)."""
    nb = (v + _BLOCK - 1) // _BLOCK
    return (np.empty(nb, np.float32), np.empty(k, np.int64), np.empty(k, np.float32), np.empty(v, np.float32),
            np.empty(v, np.int64), np.empty(nb, np.int64))


@njit(cache=True, nogil=True)
def _kth_largest(x, n, k, ids, vals):
    """The ``k``-th largest of ``x[:n]`` (``n >= k``), counted with multiplicity; ``ids`` / ``vals``: scratch of
    ``k``. Few values (:data:`RANKED_MAXIMA`) are counted: fewer than ``k`` values exceed a value exactly when it
    is at least the k-th largest, so that is the least such value (no branch on the data, which a fresh row's
    logits would mispredict); many are inserted into a top ``k``.

    Example: ``[3., 7., 7., 1.]``, k=2 -> 7.; k=3 -> 3."""
    if n <= RANKED_MAXIMA:
        low = np.inf
        for t in range(n):
            v = x[t]
            r = 0
            for u in range(n):
                r += x[u] > v
            low = min(low, v) if r < k else low
        return low
    _insert_top(x, 0, n, -np.inf, k, ids, vals, 0)
    return vals[k - 1]


@njit(cache=True, nogil=True)
def _one_top(row, k, ids, vals, maxima, low_ids, low_vals, cand_v, cand_i, blocks):
    """One row ``row`` float32[V]: its argmax (returned) and its ``k`` largest entries into ``ids`` int64[k] /
    ``vals`` float32[k], largest first (the other arguments: :func:`_top_scratch`'s).

    The argmax is exactly ``torch.argmax``'s: the first maximal index, or the first NaN's index when the
    row holds a NaN. Among equal values the earlier index comes first. Every block's maximum (branch-free),
    then the k-th largest of those maxima is a lower bound of the k-th largest entry (k blocks each hold an
    entry that large): the entries of the blocks whose maximum reaches it that reach it too are the
    candidates, gathered in order without a branch on their values, and ranked by counting
    (:func:`_kth_largest`'s way; more than :data:`RANKED`, as in a row of ``-inf``, are inserted). A row with a
    NaN, or of fewer than ``k`` blocks, is offered whole; for ``k`` = 1 the blocks holding the maximum are. On a
    CPU this is several times faster than ``argmax`` plus ``topk``; the branch-free steps matter because each
    step's rows are new data, on which a branch on their values is mispredicted (65 rows of 256, k = 8: 51 -> 31
    us; ``benchmarks/results/host-step.md``).

    Example: ``[1., 5., 5., 2.]``, k=2 -> argmax 1, ids ``[1, 2]``, vals ``[5., 5.]``.
    """
    v = row.shape[0]
    nb = maxima.shape[0]
    for j in range(k):
        vals[j] = -np.inf
        ids[j] = -1
    nan = _has_nan(row)
    if nan or nb < k:  # the whole row (with a NaN, the first NaN is the argmax)
        _insert_top(row, 0, v, -np.inf, k, ids, vals, 0)
        return _first_nan(row) if nan else ids[0]
    _block_maxima(row, maxima)
    if k == 1:  # the blocks holding the maximum, offered in order (one comparison an entry: no ranking pays)
        _insert_top(maxima, 0, nb, -np.inf, 1, low_ids, low_vals, 0)
        low = low_vals[0]
        m = 0
        for t in range(nb):
            if maxima[t] >= low:
                m = _insert_top(row, t * _BLOCK, min(t * _BLOCK + _BLOCK, v), low, 1, ids, vals, m)
        return ids[0]
    low = _kth_largest(maxima, nb, k, low_ids, low_vals)
    q = 0  # the blocks to offer, in order: each written, kept when its maximum reaches low
    for t in range(nb):
        blocks[q] = t
        q += maxima[t] >= low
    c = 0  # their entries of at least low, in order, gathered the same way
    for s in range(q):
        t = blocks[s]
        for j in range(t * _BLOCK, min(t * _BLOCK + _BLOCK, v)):
            x = row[j]
            cand_v[c] = x
            cand_i[c] = j
            c += x >= low
    if c <= RANKED:  # c >= k (k blocks reach low)
        for e in range(c):
            x = cand_v[e]
            r = 0
            for f in range(c):
                r += (cand_v[f] > x) | ((cand_v[f] == x) & (f < e))
            if r < k:
                vals[r] = x
                ids[r] = cand_i[e]
        return ids[0]
    m = 0  # many candidates (ties at low, as in a row of -inf): a top k by insertion
    for e in range(c):
        if m < k or cand_v[e] > vals[k - 1]:
            m = _insert(cand_v[e], cand_i[e], k, ids, vals, m)
    return ids[0]


@njit(cache=True, nogil=True)
def greedy_walk(argmax, tokens, parents):
    """The greedy verdict of a parent-first draft tree given every row's argmax (row 0: the last context
    token, row ``1 + i``: node ``i``): (accepted nodes int64[a], emitted tokens int64[a + 1]). From row 0,
    follow the child whose token is the row's argmax (the first such child) while there is one; the
    last row's argmax is the bonus token.

    Example: argmax ``[5, 9, 3, 4]``, tokens ``[5, 7, 9]``, parents ``[-1, -1, 0]`` -> nodes ``[0, 2]``
    (5, then 9 under it), tokens ``[5, 9, 4]``.
    """
    n = tokens.shape[0]
    nodes = np.empty(n, np.int64)
    out = np.empty(n + 1, np.int64)
    a = 0
    row = 0
    while True:
        x = argmax[row]
        out[a] = x
        child = -1
        for i in range(row, n):  # a node's children come after it (parent-first): scan from row - 1 + 1
            if parents[i] == row - 1 and tokens[i] == x:
                child = i
                break
        if child < 0:
            return nodes[:a], out[: a + 1]
        nodes[a] = child
        a += 1
        row = child + 1


@njit(cache=True, nogil=True)
def rows_top(logits, argmax_rows, top_rows, k, argmax, ids, vals):
    """:func:`_one_top` over a batch: for each row ``i`` of ``logits`` float32[b, q, V], the argmax of its first
    ``argmax_rows[i]`` query rows into ``argmax`` int64[b, q] and, for its first ``top_rows[i]`` (at most
    ``argmax_rows[i]``), their ``k`` largest entries into ``ids`` int64[b, q, k] / ``vals`` float32[b, q, k]
    (the same pass). Entries past those counts are left unset. ``k`` = 0: argmax only.

    Example: logits ``[[[1., 5., 5.], [3., 0., 1.]]]``, argmax_rows ``[2]``, top_rows ``[1]``, k = 1 -> argmax
    ``[[1, 0]]``, ids ``[[[1], [unset]]]``.
    """
    b, q, v = logits.shape
    scratch = _top_scratch(v, max(k, 1))
    maxima = scratch[0]
    for i in range(b):
        for j in range(argmax_rows[i]):
            row = logits[i, j]
            if k and j < top_rows[i]:
                argmax[i, j] = _one_top(row, k, ids[i, j], vals[i, j], *scratch)
            else:
                argmax[i, j] = _row_argmax(row, maxima)
    return argmax


@njit(cache=True, nogil=True)
def _row_argmax(row, maxima):
    """``torch.argmax`` of one row float32[V] (the first maximal index, or the first NaN's), in two branch-free
    passes and one short scan: the row's NaN check, every block's maximum (:func:`_block_maxima`, into
    ``maxima``), then the first block holding the largest is scanned for its first entry equal to it.

    Example: ``[1., 5., 3., 5.]`` -> 1; ``[1., nan, 7.]`` -> 1."""
    v = row.shape[0]
    if _has_nan(row):
        return _first_nan(row)
    _block_maxima(row, maxima)
    nb = (v + _BLOCK - 1) // _BLOCK
    best = 0
    for t in range(1, nb):
        if maxima[t] > maxima[best]:
            best = t
    m = maxima[best]
    for c in range(best * _BLOCK, min(best * _BLOCK + _BLOCK, v)):
        if row[c] == m:
            return c
    return best * _BLOCK  # not reached: the block holds its maximum


@njit(cache=True, nogil=True)
def greedy_walks(argmax, tokens, parents, counts):
    """:func:`greedy_walk` for every row of a batch at once: row ``i``'s tree is ``tokens[i, :counts[i]]`` /
    ``parents[i, :counts[i]]`` (int64[b, w] each) and its rows' argmax ``argmax[i, :1 + counts[i]]``. Returns
    (nodes int64[b, w], accepted int64[b], emitted int64[b, w + 1]): row ``i`` accepted ``nodes[i, :accepted[i]]``
    and emits ``emitted[i, :accepted[i] + 1]``.

    Example: argmax ``[[5, 9, 3, 4], [7, 0, 0, 0]]``, tokens ``[[5, 7, 9], [5, 0, 0]]``, parents
    ``[[-1, -1, 0], [-1, 0, 0]]``, counts ``[3, 1]`` -> row 0 accepts ``[0, 2]`` and emits ``[5, 9, 4]``; row 1
    accepts nothing and emits ``[7]``.
    """
    b, w = tokens.shape
    nodes = np.empty((b, w), np.int64)
    accepted = np.zeros(b, np.int64)
    emitted = np.empty((b, w + 1), np.int64)
    for i in range(b):
        n = counts[i]
        a = 0
        row = 0
        while True:
            x = argmax[i, row]
            emitted[i, a] = x
            child = -1
            for c in range(row, n):
                if parents[i, c] == row - 1 and tokens[i, c] == x:
                    child = c
                    break
            if child < 0:
                break
            nodes[i, a] = child
            a += 1
            row = child + 1
        accepted[i] = a
    return nodes, accepted, emitted


@njit(cache=True, nogil=True)
def first_stops(tokens, offsets, starts, limits, eos):
    """Per row of a batch's emitted tokens, the first one at which the sequence stops on the host-checkable
    criteria: its length reaches the row's limit (``max_length``) or the token is an EOS id.

    ``tokens`` int64[total]: every row's emitted tokens, row ``i``'s at ``offsets[i]:offsets[i + 1]``;
    ``starts`` int64[b]: the row's sequence length before them; ``limits`` int64[b]; ``eos`` int64[e].
    Returns (index int64[b]: the stopping token's place in the row's tokens, or -1; by_limit bool[b]: it
    stopped on its length rather than an EOS id).

    Example: tokens ``[4, 2, 7, 5]``, offsets ``[0, 3, 4]``, starts ``[10, 18]``, limits ``[20, 19]``, eos
    ``[2]`` -> index ``[1, 0]``, by_limit ``[False, True]``.
    """
    b = starts.shape[0]
    index = np.full(b, -1, np.int64)
    by_limit = np.zeros(b, np.bool_)
    for i in range(b):
        for j in range(offsets[i], offsets[i + 1]):
            t = tokens[j]
            end = starts[i] + j - offsets[i] + 1
            hit = end >= limits[i]
            if hit:
                by_limit[i] = True
            else:
                for e in range(eos.shape[0]):
                    if eos[e] == t:
                        hit = True
                        break
            if hit:
                index[i] = j - offsets[i]
                break
    return index, by_limit


@njit(cache=True, nogil=True)
def apply_bans(argmax, ids, vals, counts, lengths, ban_ids, ban_offsets, ban_lo, ban_hi):
    """Turn every verified row's argmax into the argmax of its *processed* scores under token bans, in place.

    Row ``j`` of batch row ``i`` (``j < counts[i]``) continues a sequence of ``lengths[i, j]`` tokens; rule ``r``
    bans ``ban_ids[ban_offsets[r]:ban_offsets[r + 1]]`` while ``ban_lo[r] <= length < ban_hi[r]``. Its processed
    argmax is the first of its top-k ``ids[i, j]`` / ``vals[i, j]`` (largest first; equal values: lower id first)
    not banned. Returns False when some row cannot be decided from its top-k (every candidate banned or at
    -inf, or the row's argmax is not its top-1: a NaN), so the caller processes the scores instead.

    Example: ids ``[[[2, 7, 5]]]`` (top-3 of one row), argmax ``[[2]]``, lengths ``[[6]]``, one rule banning
    ``[2]`` while length < 8 -> argmax ``[[7]]``.
    """
    b = counts.shape[0]
    k = ids.shape[2]
    for i in range(b):
        for j in range(counts[i]):
            length = lengths[i, j]
            if argmax[i, j] != ids[i, j, 0]:
                return False
            chosen = -1
            for c in range(k):
                t = ids[i, j, c]
                banned = False
                for r in range(ban_lo.shape[0]):
                    if ban_lo[r] <= length < ban_hi[r]:
                        for e in range(ban_offsets[r], ban_offsets[r + 1]):
                            if ban_ids[e] == t:
                                banned = True
                                break
                    if banned:
                        break
                if not banned:
                    if vals[i, j, c] == -np.inf:
                        return False
                    chosen = t
                    break
            if chosen < 0:
                return False
            argmax[i, j] = chosen
    return True


@njit(cache=True, nogil=True)
def greedy_row(logits, rows, k, tokens, parents, depth, length, ban_ids, ban_offsets, ban_lo, ban_hi, argmax, ids,
               vals):
    """One row's greedy step verified from its logits in one call: :func:`rows_top`, then (when there are ban
    rules) :func:`apply_bans`, then :func:`greedy_walk`.

    ``logits`` float32[1, q, V]: the root's row, the draft's ``n`` nodes' (``tokens`` / ``parents`` / ``depth``
    int64[n]), then window rows; the first ``rows`` (``1 + n`` and the window's) get their argmax into
    ``argmax`` int64[1, q], the first ``1 + n`` their top ``k`` into ``ids`` int64[1, q, k] / ``vals``
    float32[1, q, k]. ``length``: the sequence's length before the step (the root row follows it, node ``j``'s
    row ``length + depth[j]`` tokens). Rules ``ban_*`` as :func:`apply_bans`'s (empty: none). Returns (decided,
    accepted nodes int64[a], emitted tokens int64[a + 1]); not decided (a row whose bans its top-k cannot settle:
    the caller processes its scores), both empty.

    Example: logits rows with argmax ``[5, 9, 4]``, tokens ``[5, 7]``, parents ``[-1, -1]``, no bans -> (True,
    ``[0]``, ``[5, 9]``).
    """
    n = tokens.shape[0]
    top_rows = np.empty(1, np.int64)
    top_rows[0] = n + 1
    arg_rows = np.empty(1, np.int64)
    arg_rows[0] = rows
    rows_top(logits, arg_rows, top_rows, k, argmax, ids, vals)
    if ban_lo.shape[0]:
        lengths = np.empty((1, n + 1), np.int64)
        lengths[0, 0] = length
        for j in range(n):
            lengths[0, 1 + j] = length + depth[j]
        if not apply_bans(argmax, ids, vals, top_rows, lengths, ban_ids, ban_offsets, ban_lo, ban_hi):
            none = np.empty(0, np.int64)
            return False, none, none
    nodes, out = greedy_walk(argmax[0], tokens, parents)
    return True, nodes, out


@njit(cache=True)
def fill_step_block(mask, past, p, parents, window_visible, col_visible, neg, clean_from, rows_used):
    """One step's additive mask written in place into a preallocated buffer ``mask`` [rows, columns] (any
    integer or float view: it only ever holds 0 and ``neg``): the block ``mask[:q, past:past + q]`` as
    :func:`fill_step_mask` would write it (q = p + n + m rows: pending tokens, tree nodes, window rows), after
    restoring the buffer's invariant that every column before ``past`` is visible (0) in every row, but the
    padding columns ``col_visible`` marks False (an empty ``col_visible``: none): columns ``clean_from .. past
    - 1`` (the last step's block, now cached) of the first ``rows_used`` rows (the most rows any step wrote).

    Example: past 3, p 1, parents ``[-1, 0]``, clean_from 2, rows_used 4: column 2 of rows 0-3 becomes 0, and
    rows 0-2 of columns 3-5 become the block ``[[0, n, n], [0, 0, n], [0, 0, 0]]`` (n: ``neg``).
    """
    for r in range(rows_used):
        for c in range(clean_from, past):
            mask[r, c] = neg if (len(col_visible) and not col_visible[c]) else 0
    _step_block(mask, past, p, parents, window_visible, neg)

@njit(cache=True)
def fill_step(mask, inputs, past, pending, pending_pos, tokens, depth, parents, window_tokens, window_offsets,
              window_visible, col_visible, neg, clean_from, rows_used):
    """:func:`fill_step_block` and the step's inputs in one call: ``inputs`` int64[2, >= q] gets the ids (row 0) and
    positions (row 1) of the ``p`` pending tokens (``pending`` / ``pending_pos``), the tree's nodes (``tokens``,
    one past the last pending position plus ``depth`` - 1) and the window's rows (``window_tokens`` at the last
    pending position plus ``window_offsets``), as ``tree.step_inputs`` gives them.

    Example: pending ``[7]`` at 9, tokens ``[5, 6]`` of depths ``[1, 2]``, no window -> inputs
    ``[[7, 5, 6], [9, 10, 11]]`` and the block of :func:`fill_step_block`."""
    p = pending.shape[0]
    n = tokens.shape[0]
    fill_step_block(mask, past, p, parents, window_visible, col_visible, neg, clean_from, rows_used)
    last = pending_pos[p - 1]
    for i in range(p):
        inputs[0, i] = pending[i]
        inputs[1, i] = pending_pos[i]
    for j in range(n):
        inputs[0, p + j] = tokens[j]
        inputs[1, p + j] = last + depth[j]
    for j in range(window_tokens.shape[0]):
        inputs[0, p + n + j] = window_tokens[j]
        inputs[1, p + n + j] = last + window_offsets[j]


@njit(cache=True)
def fill_static_block(mask, past, p, parents, window_visible, col_visible, neg, clean_from, dirty_to, rows_used,
                      q):
    """One step's additive mask in a preallocated buffer over a static cache's every column (``mask`` [rows,
    max_cache_len], holding only 0 and ``neg``, all ``neg`` when new): the step's ``q`` rows (pending tokens,
    tree nodes, window rows, then dummy rows up to the bucket's size) see the cached columns (but padding:
    ``col_visible`` False; empty: none), and in the block ``mask[:q, past:past + q]`` what :func:`fill_step_mask`
    gives them; a dummy row sees the pending tokens and itself; every later column is hidden.

    The buffer keeps, for its first ``rows_used`` rows, every column before ``clean_from`` right and every
    column from ``dirty_to`` on hidden; this restores columns ``clean_from .. dirty_to - 1`` (cached now, or an
    earlier step's block), and fills the cached columns of rows never used before.

    Example: past 2, p 1, parents ``[-1]``, q 3 (one dummy): rows ``p a d`` see columns ``0 1 p``, ``0 1 p a``,
    ``0 1 p d``; every column from 5 on is hidden.
    """
    for r in range(rows_used, q):  # rows never used: their cached columns
        for c in range(past):
            mask[r, c] = neg if (len(col_visible) and not col_visible[c]) else 0
    for r in range(rows_used):
        for c in range(clean_from, min(dirty_to, mask.shape[1])):
            if c < past:
                mask[r, c] = neg if (len(col_visible) and not col_visible[c]) else 0
            else:
                mask[r, c] = neg
    _step_block(mask, past, p, parents, window_visible, neg)
    real = p + len(parents) + window_visible.shape[0]
    for r in range(real, q):  # dummy rows: the pending tokens and themselves
        for j in range(p):
            mask[r, past + j] = 0
        mask[r, past + r] = 0


@njit(cache=True)
def fill_batch_masks(mask, p, parents, col_visible, neg):
    """:func:`fill_step_mask` for every row of a batch: ``mask`` float[b, q, T + q], ``parents`` int64[b, w] (a
    dummy node: -1, a child of the root that nothing else sees), ``col_visible`` bool[b, T + p]."""
    empty = np.zeros((0, 0), np.bool_)
    for i in range(mask.shape[0]):
        fill_step_mask(mask[i], p, parents[i], empty, col_visible[i], neg)
