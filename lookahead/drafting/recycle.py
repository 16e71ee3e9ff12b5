"""The model's own predictions as drafts (Token Recycling, Luo et al. 2024): a successor table filled from every
verified row, the rejected draft rows included, with the top-k the decoder takes beside its argmax (no extra forward).

:class:`SuccessorTable` keeps the latest row's ``k`` likeliest successors (ids, and *shares*: the softmax of its
top-k logits among themselves) under two keys: the input token, and the pair (previous token, input token). Slots:
``rows`` for tokens at ``token & (rows - 1)``, ``rows`` for pairs at a hash; a slot keeps its key (a token's id + 1,
or the pair's hash; 0: empty), and a later row of another key in the same slot replaces it.

A draft grows best-first from the last token: a node's successors are the row of (its parent's token, its token),
else of its token alone; a successor of share ``s`` scores its parent's score times ``calibration * s``, and the
``max_nodes`` best nodes at most ``max_depth`` deep are drafted. Example: the table knows ``5 -> [6 (share 0.9),
7 (0.1)]`` and ``6 -> [8 (1.0)]``; after ``5``, three nodes: ``6`` (score 0.9c), ``8`` below it (0.9c^2), ``7``
(0.1c): tokens ``[6, 8, 7]``, parents ``[-1, 0, -1]``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._tuning import DEFAULT
from ..cache.primitives import MIX1, MIX2, bucket, heap_pop, heap_push


@njit(cache=True, inline="always")
def _pair_key(prev, token):
    """A 63-bit key of the pair (prev, token); never a token id (those are below 2**31)."""
    x = (np.uint64(prev) ^ (np.uint64(token) * MIX2)) * MIX1
    x ^= x >> np.uint64(29)
    return np.int64(x >> np.uint64(1)) | np.int64(1 << 40)


@njit(cache=True, inline="always")
def _context_slot(key, rows):
    return rows + np.int64(np.uint64(key) & np.uint64(rows - 1))


@njit(cache=True, inline="always")
def _row(keys, rows, prev, token):
    """The slot holding successors of (prev, token), else of token, else -1."""
    if prev >= 0:
        key = _pair_key(prev, token)
        s = _context_slot(key, rows)
        if keys[s] == key:
            return s
    s = token & (rows - 1)
    return s if keys[s] == token + 1 else -1


@njit(cache=True)
def _update(keys, ids, share, rows, prevs, inputs, top_ids, top_logits):
    k = min(ids.shape[1], top_ids.shape[1])
    weight = np.empty(k)  # exp(logit - top) of a row's successors
    for i in range(inputs.shape[0]):
        t = inputs[i]
        if t < 0 or top_ids[i, 0] < 0:  # a row not known (the replay knows only the accepted path's)
            continue
        top = top_logits[i, 0]
        total = 0.0
        for r in range(k):
            weight[r] = np.exp(top_logits[i, r] - top)
            total += weight[r]
        for which in range(2):
            if which == 0:
                s = t & (rows - 1)
                keys[s] = t + 1
            else:
                if prevs[i] < 0:
                    continue
                key = _pair_key(prevs[i], t)
                s = _context_slot(key, rows)
                keys[s] = key
            for r in range(k):
                ids[s, r] = top_ids[i, r]
                share[s, r] = weight[r] / total
            for r in range(k, ids.shape[1]):
                ids[s, r] = -1


@njit(cache=True)
def _learn_step(keys, ids, share, rows, prev, last, tokens, parents, path, top_ids, top_logits):
    """Row 0's input is ``last`` (after ``prev``), row ``1 + j`` node ``j``'s (after its parent's token, or
    ``last``); the accepted rows ``path`` are learned again last, so they win a key several rows share."""
    n = tokens.shape[0]
    inputs = np.empty(1 + n, np.int64)
    prevs = np.empty(1 + n, np.int64)
    inputs[0], prevs[0] = last, prev
    for j in range(n):
        inputs[1 + j] = tokens[j]
        prevs[1 + j] = tokens[parents[j]] if parents[j] >= 0 else last
    _update(keys, ids, share, rows, prevs, inputs, top_ids, top_logits)
    if n:
        _update(keys, ids, share, rows, prevs[path], inputs[path], top_ids[path], top_logits[path])


@njit(cache=True)
def _propose(keys, ids, share, rows, prev, last, max_depth, calibration, edges, out):
    """Best-first tree into ``out[0, :m]`` tokens, ``out[1, :m]`` parents, ``out[2, :m]`` shares (x 1000,
    rounded), each replaced by 1 + how many of ``edges`` (increasing) it reaches unless ``edges`` is None; returns m
    (at most ``out.shape[1]``)."""
    max_nodes = out.shape[1]
    k = ids.shape[1]
    size = 2 * max_nodes + 2
    # entry e: a candidate successor: row slot, rank, its parent's output index, input token, depth
    e_row = np.empty(size, np.int64)
    e_rank = np.empty(size, np.int64)
    e_par = np.empty(size, np.int64)
    e_in = np.empty(size, np.int64)
    e_depth = np.empty(size, np.int64)
    e_base = np.empty(size, np.float64)  # the parent's score
    e_score = np.empty(size, np.float64)
    e_tie = np.empty(size, np.int64)  # minus the entry's index: the heap pops earlier entries first among equals
    heap = np.empty(size, np.int64)
    m = 0
    root = _row(keys, rows, prev, last)
    if root < 0 or max_nodes <= 0 or max_depth <= 0 or ids[root, 0] < 0:
        return 0
    e_row[0], e_rank[0], e_par[0], e_in[0], e_depth[0], e_base[0] = root, 0, -1, last, 1, 1.0
    e_score[0] = calibration * share[root, 0]
    e_tie[0] = 0
    heap[0] = 0
    n_ent, n_heap = 1, 1
    while n_heap > 0 and m < max_nodes:
        top, n_heap = heap_pop(heap, n_heap, e_score, e_depth, e_tie)
        row, rank = e_row[top], e_rank[top]
        tok = ids[row, rank]
        out[0, m] = tok
        out[1, m] = e_par[top]
        out[2, m] = np.int64(share[row, rank] * 1000.0 + 0.5)
        me = m
        m += 1
        for which in range(2):  # the next sibling, then the first child
            if which == 0:
                if rank + 1 >= k or ids[row, rank + 1] < 0:
                    continue
                nr, nk, npar, nin, nd, nb = row, rank + 1, e_par[top], e_in[top], e_depth[top], e_base[top]
            else:
                if e_depth[top] >= max_depth:
                    continue
                nr = _row(keys, rows, e_in[top], tok)
                if nr < 0 or ids[nr, 0] < 0:
                    continue
                nk, npar, nin, nd, nb = 0, me, tok, e_depth[top] + 1, e_score[top]
            x = n_ent
            n_ent += 1
            e_row[x], e_rank[x], e_par[x], e_in[x], e_depth[x], e_base[x] = nr, nk, npar, nin, nd, nb
            e_score[x] = nb * calibration * share[nr, nk]
            e_tie[x] = -x  # equal scores and depths: the earlier entry first
            n_heap = heap_push(heap, n_heap, x, e_score, e_depth, e_tie)
    if edges is not None:
        for j in range(m):
            out[2, j] = bucket(out[2, j] / 1000.0, edges)
    return m


@njit(cache=True)
def _clear_keys(keys):
    """Zero the nonzero entries of ``keys`` int64[slots] (any stride) in place."""
    for s in range(keys.shape[0]):
        if keys[s]:
            keys[s] = 0


class SuccessorTable:
    """Per input token and per (previous token, input token), the top-``k`` successors of the latest verified row
    with that input (see the module docstring). ``rows``: a power of two."""

    def __init__(self, k: int, rows: int = 1 << 16, calibration: float = DEFAULT.recycle_calibration):
        if k < 1 or rows < 2 or rows & (rows - 1):
            raise ValueError(f"SuccessorTable needs k >= 1 and rows a power of two, got k={k}, rows={rows}")
        self.k, self.rows, self.calibration = k, rows, calibration
        # keys int64[2 rows], ids int32[2 rows, k], shares float32[2 rows, k]: strided views of one zeroed buffer,
        # a slot's key, ids and shares side by side (8 + 8 k bytes), so a new table writes nothing and a slot's first
        # use touches one page, not three
        width = 8 + 8 * k
        buf = np.zeros(2 * rows * width, np.uint8)
        self.keys = np.ndarray((2 * rows,), np.int64, buf, 0, (width,))
        self.ids = np.ndarray((2 * rows, k), np.int32, buf, 8, (width, 4))
        self.share = np.ndarray((2 * rows, k), np.float32, buf, 8 + 4 * k, (width, 4))
        self.written = False  # whether a row was learned since the table was made or cleared

    def clear(self) -> None:
        """Empty every slot: a table unwritten since made or cleared is left untouched; else the keys in use are
        zeroed in place (a copy of the strided keys would read every slot's page)."""
        if self.written:
            _clear_keys(self.keys)
            self.written = False

    def update(self, prevs: np.ndarray, inputs: np.ndarray, top_ids: np.ndarray, top_logits: np.ndarray) -> None:
        """Row ``i``: input ``inputs[i]`` after ``prevs[i]`` (-1: none), its top-k successor ids ``top_ids[i]``
        (likeliest first; -1 in column 0: unknown, skipped) and logits; a later row of a key replaces an earlier."""
        self.written = True
        _update(self.keys, self.ids, self.share, self.rows, np.ascontiguousarray(prevs, dtype=np.int64),
                np.ascontiguousarray(inputs, dtype=np.int64), np.ascontiguousarray(top_ids, dtype=np.int64),
                np.ascontiguousarray(top_logits, dtype=np.float32))

    def learn_step(self, prev: int, last: int, tokens: np.ndarray, parents: np.ndarray, path: np.ndarray,
                   top_ids: np.ndarray, top_logits: np.ndarray) -> None:
        """One verified step in one call: row 0 (input ``last`` after ``prev``), then the rows of draft nodes
        ``tokens`` int64[n] / ``parents`` int64[n]; ``path`` int64[a]: the accepted rows (0 and 1 + node)."""
        self.written = True
        _learn_step(self.keys, self.ids, self.share, self.rows, int(prev), int(last), tokens, parents, path,
                    np.ascontiguousarray(top_ids, dtype=np.int64), np.ascontiguousarray(top_logits, dtype=np.float32))

    def propose(self, prev: int, last: int, max_nodes: int, max_depth: int, edges: np.ndarray | None = None):
        """(tokens int64[m], parents int64[m], shares float[m]): the best-first tree after ``prev, last``;
        with ``edges`` (float64, increasing) each share is bucketed in the same kernel call, ``1 +
        edges.searchsorted(share, side="right")`` (int64[m])."""
        out = np.empty((3, max(max_nodes, 0)), np.int64)
        m = _propose(self.keys, self.ids, self.share, self.rows, int(prev), int(last), int(max_depth),
                     float(self.calibration), edges, out)
        return out[0, :m], out[1, :m], (out[2, :m] if edges is not None else out[2, :m] / 1000.0)

    # pickling: only the slots in use
    def __getstate__(self) -> dict:
        used = np.flatnonzero(self.keys)
        return {"k": self.k, "rows": self.rows, "calibration": self.calibration, "used": used, "token_keys": "id+1",
                "keys": self.keys[used], "ids": self.ids[used], "share": self.share[used]}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["k"], state["rows"], state["calibration"])
        used, keys = state["used"], np.array(state["keys"], np.int64)
        if state.get("token_keys") != "id+1":  # an older pickle: a token's key was its id (-1: empty)
            keys[used < self.rows] += 1
        self.keys[used], self.ids[used], self.share[used] = keys, state["ids"], state["share"]
        self.written = bool(len(used))

