"""The exact-acceptance core: which drafted tokens the target model itself would have produced.

Greedy: from the root, take the argmax ``x`` of the target's *processed* logits at the node (the user's processors
applied with that node's own prefix); accept the child carrying ``x`` and go on from it, else emit ``x`` (the
correction, or the bonus token after an accepted leaf) and stop. Sampling (a draft is a point mass): at each node draw
``y ~ p`` by inverse CDF from the uniform of the emitted *position*; accept the child carrying ``y``, else emit ``y``.
Every emitted token has exactly the target's distribution, and a seed gives the same text whatever was drafted.

Example (greedy): tokens ``[5, 7, 9]``, parents ``[-1, -1, 0]``, argmax of the rows (root, nodes) ``[5, 9, 3, 4]``:
accept node 0 (5), then node 2 (9), then emit 4: nodes ``[0, 2]``, tokens ``[5, 9, 4]``.

Here Numba kernels read the rows (:func:`rows_top`), apply token bans (:func:`apply_bans`) and walk the tree;
processed scores and sampling walk it in ``sampled.py``; a batch verifies in ``batch.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numba import njit


@dataclass
class Verdict:
    """Outcome of one step: ``nodes`` the accepted draft nodes, root to leaf; ``tokens`` their tokens, then one more;
    ``scores`` / ``raw`` (when asked for) the processed scores / raw logits float[1, V] at each emitted position."""

    nodes: list[int]
    tokens: list[int]
    scores: list[torch.Tensor] | None = None
    raw: list[torch.Tensor] | None = None


def greedy_verdict(argmax: np.ndarray, draft) -> Verdict:
    """One row's greedy verdict from its rows' argmax int64[>= 1 + n] (its root, then its nodes)."""
    if not len(draft):
        return Verdict([], [int(argmax[0])])
    nodes, tokens = greedy_walk(argmax, draft.tokens, draft.parents)
    return Verdict(nodes.tolist(), tokens.tolist())


def _ban_arrays(rules) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``compat.token_bans``' rules as :func:`apply_bans` takes them: (ids, offsets, lo, hi) int64, rule ``r`` banning
    ``ids[offsets[r]:offsets[r + 1]]`` while ``lo[r] <= length < hi[r]``."""
    ids = np.concatenate([r[0] for r in rules]).astype(np.int64)
    offsets = np.cumsum([0] + [len(r[0]) for r in rules]).astype(np.int64)
    return ids, offsets, np.array([r[1] for r in rules], np.int64), np.array([r[2] for r in rules], np.int64)


_NO_BANS = (np.zeros(0, np.int64),) * 4


class Verifier:
    """One row's verification (a batch's: ``batch.BatchVerifier``). ``processors``: per row (in the call's row
    order), its processors as one function or None; ``rules``: the processors as token bans (``compat.token_bans``)
    or None; ``keep_scores`` / ``keep_raw``: verdicts carry the processed scores / raw logits."""

    def __init__(self, device: torch.device, vocab: int, processors: list, rules, sampling: bool,
                 keep_scores: bool = False, keep_raw: bool = False):
        self.device, self.on_cpu = device, device.type == "cpu"
        self.argmax_by_max = self.on_cpu and vocab >= 1024  # ``max`` finds the argmax faster there (same indices)
        self.sampling, self.keep_scores, self.keep_raw = sampling, keep_scores, keep_raw
        greedy = not sampling and not (keep_scores or keep_raw)
        self.argmax_verdicts = greedy and (all(p is None for p in processors) or rules is not None)
        self.bans = _ban_arrays(rules) if greedy and rules else None
        self.ban_width = len(np.unique(self.bans[0])) + 1 if self.bans else 0  # a top-k holding an allowed token

    def read_rows(self, logits: torch.Tensor, argmax_rows: np.ndarray | None, top_rows: np.ndarray, k: int):
        """Host readout of ``logits`` [b, q, V]: (argmax int64[b, q] of row ``i``'s first ``argmax_rows[i]`` rows, or
        None when not asked; (ids int64[b, q, k], logits float32[b, q, k]) of its first ``top_rows[i]`` rows, or None
        when ``k`` is 0). On a GPU both copies arrive in one synchronisation."""
        b, q, v = logits.shape
        if not k:
            if argmax_rows is None:
                return None, None
            am = logits.max(-1).indices if self.argmax_by_max else logits.argmax(-1)
            return am.cpu().numpy(), None
        if self.on_cpu:
            arr = (logits.detach() if logits.requires_grad else logits).numpy()
            argmax = np.empty((b, q), np.int64)
            ids, vals = np.empty((b, q, k), np.int64), np.empty((b, q, k), np.float32)
            rows_top(arr, top_rows if argmax_rows is None else argmax_rows, top_rows, k, argmax, ids, vals)
            return (argmax if argmax_rows is not None else None), (ids, vals)
        rows = int(top_rows.max()) if len(top_rows) else 0
        t = logits[:, :max(rows, 1)].topk(min(k, v), -1)
        queue = self.device.type == "cuda" and argmax_rows is not None
        tops = (t.indices.to("cpu", non_blocking=queue).numpy(), t.values.to("cpu", non_blocking=queue).numpy())
        return (logits.argmax(-1).cpu().numpy() if argmax_rows is not None else None), tops

    def verify(self, logits: torch.Tensor, drafts: list, rows, k: int):
        """([the row's verdict]; its window rows' argmax int64[m], or None; the top-``k`` (ids, logits) [1, 1 + n, k]
        of its root and nodes, None when ``k`` is 0) from ``logits`` [1, q, V] (its root, its nodes, then window
        rows). ``rows``: ``loop.Rows`` (``length_of``, ``is_done``, ``prefix``, ``uniforms``, ``processors``)."""
        width = max(k, self.ban_width)  # the top-k read per verified row
        d = drafts[0]
        n, m = len(d), d.n_window_rows
        if self.argmax_verdicts and self.on_cpu and width:  # one kernel call: read, bans, walk
            arr = (logits.detach() if logits.requires_grad else logits).numpy()
            q = arr.shape[1]
            argmax = np.empty((1, q), np.int64)
            tops = np.empty((1, q, width), np.int64), np.empty((1, q, width), np.float32)
            decided, nodes, tokens = greedy_row(arr, 1 + n + m, width, d.tokens, d.parents, d.depth,
                                                rows.length_of(0), *(self.bans or _NO_BANS), argmax, *tops)
            window = argmax[0, n + 1 :] if m else None
            if decided:
                return [Verdict(nodes.tolist(), tokens.tolist())], window, cut_tops(tops, k)
        elif self.argmax_verdicts:
            argmax, tops = self.read_rows(logits, np.array([1 + n + m]), np.array([n + 1]), width)
            window = argmax[0, n + 1 :] if m else None  # (bans rewrite the verified rows only)
            if self.bans is None or apply_bans(argmax, *tops, np.array([n + 1]), row_lengths(rows, drafts),
                                               *self.bans):
                return [greedy_verdict(argmax[0], d)], window, cut_tops(tops, k)
        else:
            tops = self.read_rows(logits, None, np.array([n + 1]), width)[1]
            window = logits[0, n + 1 :].argmax(-1).cpu().numpy() if m else None
        from .sampled import processed_verdict  # processed scores decide, or the top-k could not

        return [processed_verdict(self, logits[0], d, rows, 0)], window, cut_tops(tops, k)


def cut_tops(tops, k: int):
    """The sources' top-``k`` of a wider top-k the bans needed (None when ``k`` is 0)."""
    if tops is None or not k or tops[0].shape[2] == k:
        return tops if k else None
    return tops[0][:, :, :k], tops[1][:, :, :k]


def row_lengths(rows, drafts) -> np.ndarray:
    """int64[b, 1 + w]: the sequence length each verified row continues (its root's, then each node's)."""
    width = max((len(d) for d in drafts), default=0)
    lengths = np.zeros((len(drafts), 1 + width), np.int64)
    for i, d in enumerate(drafts):
        lengths[i, 0] = rows.length_of(i)
        lengths[i, 1 : 1 + len(d)] = lengths[i, 0] + d.depth
    return lengths


# -- kernels ----------------------------------------------------------------------------------------------------


_BLOCK = 16  # logits per block of _one_top's first pass, whose block maxima bound the top k from below
RANKED_MAXIMA = 24  # at most this many block maxima are ranked by counting (:func:`_kth_largest`)
RANKED = 32  # at most this many candidates are ranked by counting (:func:`_one_top`), more are inserted


@njit(cache=True, nogil=True)
def _has_nan(row):
    """Whether ``row`` holds a NaN (branch-free: it vectorises)."""
    bad = False
    for j in range(row.shape[0]):
        bad |= row[j] != row[j]
    return bad


@njit(cache=True, nogil=True)
def _first_nan(row):
    """The index of ``row``'s first NaN (it must hold one): ``torch.argmax``'s answer then."""
    i = 0
    while row[i] == row[i]:
        i += 1
    return i


@njit(cache=True, nogil=True, fastmath={"nnan"})
def _block_maxima(row, out):
    """Each :data:`_BLOCK` logits' maximum of a NaN-free ``row`` into ``out`` float32[>= ceil(V / _BLOCK)] (a zero's
    sign may come out either way)."""
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
    """Insert value ``x`` of id ``j`` into the ``m`` kept of a top ``k`` (``ids`` / ``vals``, largest first, an equal
    earlier value ahead) when there is room or it beats the last; returns how many are kept."""
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
    """Offer ``row[a:b]``'s entries ``>= low`` to the top ``k`` (as :func:`_insert`); returns how many are kept."""
    thr = vals[k - 1] if m == k else -np.inf
    for j in range(a, b):
        x = row[j]
        if x >= low and (x > thr or (m < k and x == x)):
            m = _insert(x, j, k, ids, vals, m)
            thr = vals[k - 1] if m == k else -np.inf
    return m


@njit(cache=True, nogil=True)
def _top_scratch(v, k):
    """:func:`_one_top`'s scratch arguments (``maxima`` .. ``blocks``) for rows of ``v`` logits."""
    nb = (v + _BLOCK - 1) // _BLOCK
    return (np.empty(nb, np.float32), np.empty(k, np.int64), np.empty(k, np.float32), np.empty(v, np.float32),
            np.empty(v, np.int64), np.empty(nb, np.int64))


@njit(cache=True, nogil=True)
def _kth_largest(x, n, k, ids, vals):
    """The ``k``-th largest of ``x[:n]`` (``n >= k``, with multiplicity); ``ids`` / ``vals``: scratch of ``k``. Up to
    :data:`RANKED_MAXIMA` values are ranked without data branches, more through a top ``k``. Example:
    ``[3., 7., 7., 1.]``, k=2 -> 7.; k=3 -> 3."""
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
    """The argmax of ``row`` float32[V] (returned) and its ``k`` largest into ``ids`` int64[k] / ``vals`` float32[k],
    largest first (the rest: :func:`_top_scratch`'s). Example: ``[1., 5., 5., 2.]``, k=2 -> 1, ids ``[1, 2]``."""
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
    if k == 1:  # the blocks holding the maximum, offered in order
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
def _row_argmax(row, maxima):
    """``torch.argmax`` of ``row`` float32[V] (the first maximal index, or the first NaN's), through the block maxima
    (``maxima``: scratch)."""
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
def rows_top(logits, argmax_rows, top_rows, k, argmax, ids, vals):
    """:func:`_one_top` over ``logits`` float32[b, q, V]: for row ``i`` the argmax of its first ``argmax_rows[i]`` rows
    into ``argmax`` int64[b, q] and, of its first ``top_rows[i]`` (<= ``argmax_rows[i]``), the ``k`` largest into
    ``ids`` int64[b, q, k] / ``vals`` float32[b, q, k]; other entries stay unset. ``k`` = 0: argmax only."""
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


@njit(cache=True, nogil=True, inline="always")
def walk_tree(argmax, tokens, parents, n, nodes, out):
    """The module docstring's walk over the first ``n`` nodes of a parent-first tree (the first matching child), given
    its rows' argmax (row 0: the root, row ``1 + i``: node ``i``): accepted nodes into ``nodes``, emitted tokens into
    ``out``; returns how many nodes were accepted."""
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
            return a
        nodes[a] = child
        a += 1
        row = child + 1


@njit(cache=True, nogil=True)
def greedy_walk(argmax, tokens, parents):
    """(accepted nodes int64[a], emitted tokens int64[a + 1]) of a parent-first tree (:func:`walk_tree`)."""
    n = tokens.shape[0]
    nodes = np.empty(n, np.int64)
    out = np.empty(n + 1, np.int64)
    a = walk_tree(argmax, tokens, parents, n, nodes, out)
    return nodes[:a], out[: a + 1]


@njit(cache=True, nogil=True)
def apply_bans(argmax, ids, vals, counts, lengths, ban_ids, ban_offsets, ban_lo, ban_hi):
    """Every verified row's argmax -> its argmax under token bans (:func:`_ban_arrays`), in place: the first unbanned id
    of its top-k ``ids[i, j]`` / ``vals[i, j]``, row ``j < counts[i]`` of batch row ``i`` continuing ``lengths[i, j]``
    tokens. False when a row's top-k cannot decide (all banned or -inf, or a NaN row). Example: top-3
    ``[[[2, 7, 5]]]``, lengths ``[[6]]``, ``[2]`` banned while length < 8: argmax ``[[2]]`` -> ``[[7]]``."""
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
    """One row's greedy step in one call: :func:`rows_top`, :func:`apply_bans` (with rules), then :func:`greedy_walk`.
    Returns (decided, nodes, tokens); undecided (:func:`apply_bans` said False): empty arrays."""
    n = tokens.shape[0]
    top_rows = np.full(1, n + 1, np.int64)
    arg_rows = np.full(1, rows, np.int64)
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



