"""``SuffixIndex``: a suffix automaton over one request's context (the tokens appended by ``extend``; positions
0-based into the kept ``tokens``) that drafts long copies, finding the context's longest earlier-seen suffix in
amortised O(1) per appended token (Blumer et al. 1985; SAM-Decoding, Hu et al. 2024).

The *match* is the longest suffix of the context that also ends earlier (``match_length``; 0 if the last token is
new). Each distinct next token ``c`` is a *candidate*: ``L_c`` (<= the match length) is the longest suffix of the
context that occurred followed by ``c``, ``f_c`` the position of ``c`` after that suffix's *first* such occurrence.
``propose`` drafts up to ``max_branches`` candidates with ``L_c >= min_match``, by ``L_c`` desc then ``f_c`` asc,
each a chain ``c, ext[f_c + 1], ...`` from the root, ``ext`` being the context then the drafted path itself (a copy
that runs into the present repeats: ``a b a b`` -> ``a b a b ...``): the first up to ``max_depth`` deep, the others
up to ``branch_depth``, within ``max_nodes``; breadth-first (``parents[i] < i``, -1 under the root), each node's
match its ``L_c``.

After ``7 1 2 3 9 1 2 4 5 1 2``, ``1 2`` was followed by 3 (position 3) and by 4 (at 7), both ``L_c = 2``; 3 is
earlier, so its chain ``3 9 1 2 4 5 1 2 ...`` comes first:

>>> from lookahead.cache import SuffixIndex
>>> index = SuffixIndex(capacity=64)
>>> index.extend([7, 1, 2, 3, 9, 1, 2, 4, 5, 1, 2])
>>> index.match_length
2
>>> tokens, parents, match = index.propose(max_nodes=8, max_depth=6, max_branches=2, branch_depth=2)
>>> tokens.tolist(), parents.tolist(), match.tolist()
([3, 4, 9, 5, 1, 2, 4, 5], [-1, -1, 0, 1, 2, 4, 5, 6], [2, 2, 2, 2, 2, 2, 2, 2])

Each automaton state is a class of substrings with the same end positions, with ``LEN`` (longest string), suffix
``LINK`` and ``FIRST`` (first end position). The match is the newest state's suffix link; the candidates are the
transitions of the states on its suffix-link chain (longest first), ``f_c`` the ``FIRST`` of ``c``'s target.
Arrays for C = ``capacity``: ``states`` int32 ``(2C + 2, 5)`` (``LEN``, ``LINK``, ``FIRST``, ``HEAD``/``TAIL`` of
the transition list), ``edges`` int32 ``(3C + 4, 4)`` (``TOKEN``, ``TARGET``, ``NEXT``, ``OWNER``), ``table`` int32
hash from (state, token) to transition + 1 in its first ``info[I_TABLE]`` slots (doubling from :data:`MIN_TABLE`,
load <= 1/2), ``tokens`` int64[C], ``info`` int64 (``I_*``). Not thread-safe: one per request.
"""
from __future__ import annotations

import functools

import numpy as np
from numba import njit

from .primitives import INT32_MAX, bucket, int_array, int_at_least, pair_slot, place, table_size, token_error

# columns of ``states`` and ``edges``
LEN, LINK, FIRST, HEAD, TAIL = range(5)
TOKEN, TARGET, NEXT, OWNER = range(4)
# slots of ``info``
I_CAPACITY, I_N, I_STATES, I_EDGES, I_LAST, I_REBUILDS, I_DROPPED, I_TABLE = range(8)
INFO_SLOTS = 8
OK, ERR_TOKEN = 0, -1
_I64 = np.dtype(np.int64)
MIN_TABLE = 1024  # hash slots in use after a reset (4 KB), or the whole table when it is smaller


@njit(cache=True)
def reset(states, edges, table, info):
    """Empty context (root state only); clears the table's slots in use and shrinks them to :data:`MIN_TABLE`."""
    table[: info[I_TABLE]] = 0
    info[I_TABLE] = min(MIN_TABLE, table.shape[0])
    states[0, :] = -1
    states[0, LEN] = 0
    info[I_N:I_REBUILDS] = 0
    info[I_STATES] = 1


@njit(cache=True, inline="always")
def _lookup(edges, table, state, token, mask):
    """Transition index of ``state`` on ``token``, or -1 (``mask`` = ``info[I_TABLE] - 1``)."""
    i = pair_slot(state, token, mask)
    while True:
        v = table[i]
        if v == 0:
            return -1
        e = v - 1
        if edges[e, TOKEN] == token and edges[e, OWNER] == state:
            return e
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def _add_edge(states, edges, table, state, token, target, info):
    e = info[I_EDGES]
    info[I_EDGES] = e + 1
    edges[e, TOKEN] = token
    edges[e, TARGET] = target
    edges[e, NEXT] = -1
    edges[e, OWNER] = state
    if states[state, TAIL] == -1:
        states[state, HEAD] = e
    else:
        edges[states[state, TAIL], NEXT] = e
    states[state, TAIL] = e
    if 2 * (e + 1) > info[I_TABLE] and info[I_TABLE] < table.shape[0]:
        _grow(edges, table, info, e)
    place(table, info[I_TABLE] - 1, state, token, e + 1)


@njit(cache=True)
def _grow(edges, table, info, n):
    """Double the slots in use and re-place the first ``n`` transitions in them."""
    size = 2 * info[I_TABLE]
    info[I_TABLE] = size
    table[:size] = 0
    for e in range(n):
        place(table, size - 1, edges[e, OWNER], edges[e, TOKEN], e + 1)


@njit(cache=True)
def _append(states, edges, table, info, tokens, c):
    """One step of the online construction: the context gains token ``c`` (room is the caller's)."""
    n = info[I_N]
    tokens[n] = c
    info[I_N] = n + 1
    last = info[I_LAST]
    cur = info[I_STATES]
    info[I_STATES] = cur + 1
    states[cur, LEN] = states[last, LEN] + 1
    states[cur, FIRST] = n
    states[cur, HEAD] = -1
    states[cur, TAIL] = -1
    p = last
    e = -1
    while p != -1:
        e = _lookup(edges, table, p, c, info[I_TABLE] - 1)
        if e >= 0:
            break
        _add_edge(states, edges, table, p, c, cur, info)
        p = states[p, LINK]
    if p == -1:
        states[cur, LINK] = 0
    else:
        q = edges[e, TARGET]
        if states[p, LEN] + 1 == states[q, LEN]:
            states[cur, LINK] = q
        else:
            clone = info[I_STATES]
            info[I_STATES] = clone + 1
            states[clone, LEN] = states[p, LEN] + 1
            states[clone, LINK] = states[q, LINK]
            states[clone, FIRST] = states[q, FIRST]
            states[clone, HEAD] = -1
            states[clone, TAIL] = -1
            x = states[q, HEAD]
            while x != -1:
                _add_edge(states, edges, table, clone, edges[x, TOKEN], edges[x, TARGET], info)
                x = edges[x, NEXT]
            while p != -1:
                e = _lookup(edges, table, p, c, info[I_TABLE] - 1)
                if e < 0 or edges[e, TARGET] != q:
                    break
                edges[e, TARGET] = clone
                p = states[p, LINK]
            states[q, LINK] = clone
            states[cur, LINK] = clone
    info[I_LAST] = cur


@njit(cache=True)
def extend(states, edges, table, info, tokens, new):
    """Append ``new`` (int64[k]), rebuilding when full; returns ``OK``, or ``ERR_TOKEN`` (nothing appended) for a
    token outside [0, 2**31 - 1]."""
    for j in range(new.shape[0]):
        if new[j] < 0 or new[j] > INT32_MAX:
            return ERR_TOKEN
    cap = info[I_CAPACITY]
    for j in range(new.shape[0]):
        if info[I_N] == cap:
            keep = cap // 2
            drop = cap - keep
            for i in range(keep):
                tokens[i] = tokens[drop + i]
            reset(states, edges, table, info)
            for i in range(keep):
                _append(states, edges, table, info, tokens, tokens[i])
            info[I_REBUILDS] += 1
            info[I_DROPPED] += drop
        _append(states, edges, table, info, tokens, new[j])
    return OK


@njit(cache=True)
def propose(states, edges, info, tokens, max_depth, max_branches, branch_depth, min_match, max_states, out):
    """Draft tree into ``out[0, :k]`` (tokens), ``out[1, :k]`` (parents), ``out[2, :k]`` (match), ``out[3, :k]``
    (depth, 1 under the root); returns ``k <= out.shape[1]``. Candidates come from the first ``max_states`` states
    of the match's suffix-link chain. Read-only."""
    n = info[I_N]
    max_nodes = out.shape[1]
    if n == 0 or max_nodes <= 0 or max_depth <= 0 or max_branches <= 0 or max_states <= 0:
        return 0
    q = states[info[I_LAST], LINK]
    if q <= 0 or states[q, LEN] < max(min_match, 1):
        return 0
    # candidates: (L, first end, token), by L desc then first end asc; a token once only
    cand = np.empty((3, max_branches), np.int64)
    cand_len, cand_first, cand_tok = cand[0], cand[1], cand[2]
    nc = 0
    s = q
    visited = 0
    while s > 0 and states[s, LEN] >= min_match and nc < max_branches and visited < max_states:
        visited += 1
        length = states[s, LEN]
        base = nc  # tokens before base came from longer suffixes
        x = states[s, HEAD]
        while x != -1 and nc < max_branches:  # a state's transitions are listed by their first end, ascending
            c = edges[x, TOKEN]
            seen = False
            for i in range(base):
                if cand_tok[i] == c:
                    seen = True
                    break
            if not seen:
                cand_len[nc] = length
                cand_first[nc] = states[edges[x, TARGET], FIRST]
                cand_tok[nc] = c
                nc += 1
            x = edges[x, NEXT]
        s = states[s, LINK]
    side = min(branch_depth, max_depth)
    # breadth-first, depth by depth, chain by chain; a chain's token at depth m is ext[f + m]
    last = np.full(nc, -1, np.int64)
    lens = np.empty(nc, np.int64)
    total = 0
    deepest = 0
    for b in range(nc):
        lens[b] = max(min(max_depth if b == 0 else side, max_nodes - total), 0)
        total += lens[b]
        deepest = max(deepest, lens[b])
    k = 0
    for d in range(deepest):
        for b in range(nc):
            if d < lens[b]:
                if d == 0:
                    tok = cand_tok[b]
                else:
                    j = cand_first[b] + d
                    if j < n:
                        tok = tokens[j]
                    else:  # the chain's own token at depth j - n: walk up from its deepest node
                        back = d - 1 - (j - n)
                        v = last[b]
                        for _ in range(back):
                            v = out[1, v]
                        tok = out[0, v]
                out[0, k] = tok
                out[1, k] = last[b]
                out[2, k] = cand_len[b]
                out[3, k] = d + 1
                last[b] = k
                k += 1
    return k


@njit(cache=True)
def propose_buckets(states, edges, info, tokens, max_depth, max_branches, branch_depth, min_match, max_states,
                    bucket_edges, out):
    """:func:`propose`, each match replaced by its bucket (:meth:`SuffixIndex.propose_buckets`). Returns ``k``."""
    k = propose(states, edges, info, tokens, max_depth, max_branches, branch_depth, min_match, max_states, out)
    for j in range(k):
        out[2, j] = bucket(out[2, j] + out[3, j] - 1, bucket_edges)
    return k


class SuffixIndex:
    """The suffix automaton of one request's context. ``capacity``: the most tokens held (>= 4); past it the index
    is rebuilt over the last ``capacity // 2`` (``rebuilds`` counts them). All memory is allocated here."""

    def __init__(self, capacity: int = 1 << 16):
        capacity = int_at_least(capacity, 4, "capacity", "an integer >= 4")
        if capacity > (1 << 28):
            raise ValueError(f"capacity: must be <= 2**28 (int32 transitions), got {capacity!r}")
        _warm_up()
        self._allocate(capacity)

    def _allocate(self, cap: int) -> None:
        # tokens, states and edges are written before they are read, so left unwritten
        self._tokens = np.empty(cap, np.int64)
        self._states = np.empty((2 * cap + 2, 5), np.int32)
        self._edges = np.empty((3 * cap + 4, 4), np.int32)
        self._table = np.zeros(table_size(3 * cap + 4), np.int32)
        self._info = np.zeros(INFO_SLOTS, np.int64)
        self._info[I_CAPACITY] = cap
        reset(self._states, self._edges, self._table, self._info)

    # pickling / copy.deepcopy: the kept context travels and the automaton is rebuilt from it
    def __getstate__(self) -> dict:
        return {"capacity": self.capacity, "tokens": self.tokens, "rebuilds": self.rebuilds, "dropped": self.dropped}

    def __setstate__(self, state: dict) -> None:
        _warm_up()
        self._allocate(int(state["capacity"]))
        self.extend(state["tokens"])
        self._info[I_REBUILDS] = state["rebuilds"]
        self._info[I_DROPPED] = state["dropped"]

    capacity = property(lambda self: int(self._info[I_CAPACITY]))
    rebuilds = property(lambda self: int(self._info[I_REBUILDS]))
    dropped = property(lambda self: int(self._info[I_DROPPED]), doc="Tokens dropped by rebuilds: the kept start.")
    tokens = property(lambda self: self._tokens[: len(self)].copy(), doc="The kept context (a copy).")

    def __len__(self) -> int:
        return int(self._info[I_N])

    def _match(self, column: int, none: int) -> int:
        q = int(self._states[self._info[I_LAST], LINK])
        return int(self._states[q, column]) if q > 0 else none

    match_length = property(lambda self: self._match(LEN, 0),
                            doc="Length of the longest suffix of the context that also ends earlier (0: none).")
    match_end = property(lambda self: self._match(FIRST, -1),
                         doc="End position of the match's first occurrence (-1 when there is no match).")

    def __repr__(self) -> str:
        return f"SuffixIndex(capacity={self.capacity}, tokens={len(self)}, match={self.match_length})"

    def clear(self) -> None:
        """Forget the context (the arrays are kept)."""
        reset(self._states, self._edges, self._table, self._info)
        self._info[I_REBUILDS] = 0
        self._info[I_DROPPED] = 0

    def extend(self, tokens) -> None:
        """Append ``tokens`` (ids in [0, 2**31 - 1]) to the context."""
        arr = tokens
        if type(arr) is not np.ndarray or arr.dtype is not _I64 or arr.ndim != 1 or not arr.flags.c_contiguous:
            arr = int_array(tokens, "tokens")
        if extend(self._states, self._edges, self._table, self._info, self._tokens, arr) != OK:
            raise token_error("tokens", arr)

    def propose(self, max_nodes: int, max_depth: int, max_branches: int = 1, branch_depth: int = 8,
                min_match: int = 1, max_states: int = 16, with_depth: bool = False) -> tuple[np.ndarray, ...]:
        """``(tokens, parents, match)``, int64[k]: the draft tree (module docstring); empty when the match is shorter
        than ``min_match``. ``max_states`` bounds the suffix-link states searched for candidates. ``with_depth``
        adds each node's depth (1 under the root)."""
        out = np.empty((4, max(max_nodes, 0)), np.int64)
        k = propose(self._states, self._edges, self._info, self._tokens, max_depth, max_branches, branch_depth,
                    min_match, max_states, out)
        return tuple(out[: 4 if with_depth else 3, :k])

    def propose_buckets(self, max_nodes: int, max_depth: int, max_branches: int, branch_depth: int,
                        bucket_edges: np.ndarray, min_match: int = 1,
                        max_states: int = 16) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`propose`'s (tokens, parents) and each node's ``bucket(match + depth - 1, bucket_edges)``
        (int64 edges, increasing): with edges ``[4, 16]`` a node of match 2 at depth 3 follows 4 tokens: bucket 2."""
        if max_nodes <= 0:
            return _EMPTY, _EMPTY, _EMPTY
        out = np.empty((4, max_nodes), np.int64)
        k = propose_buckets(self._states, self._edges, self._info, self._tokens, max_depth, max_branches,
                            branch_depth, min_match, max_states, bucket_edges, out)
        return out[0, :k], out[1, :k], out[2, :k]


_EMPTY = np.zeros(0, np.int64)
_EMPTY.flags.writeable = False


@functools.cache
def _warm_up() -> None:
    """Compile (or load from Numba's cache) the kernels once per process."""
    index = SuffixIndex.__new__(SuffixIndex)
    index._allocate(8)
    index.extend(np.array([1, 2, 1, 2, 3, 1, 2, 1, 2, 3], np.int64))  # runs a rebuild too
    index.propose(4, 4, 2, 2)
    edges = np.array([4, 16])
    edges.flags.writeable = False  # as a draft source keeps its bucket edges
    index.propose_buckets(4, 4, 2, 2, edges)
