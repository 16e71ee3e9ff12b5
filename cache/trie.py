"""``NgramTrie``: the class that owns the trie's arrays and validates inputs.

The algorithms are the Numba kernels in :mod:`cache.kernels`; the terms are explained in the
package docstring (:mod:`cache`).
"""

from __future__ import annotations

import operator

import numpy as np

from . import kernels as K

_I64 = np.dtype(np.int64)
_I32 = np.dtype(np.int32)
_WARMED = False


def _warm_up() -> None:
    """Compile (or load from Numba's on-disk cache) every kernel, once per process."""
    global _WARMED
    if _WARMED:
        return
    t = NgramTrie.__new__(NgramTrie)
    t._setup(2, 16)
    toks = np.array([1, 2, 1, 3, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14], np.int64)
    t.insert(toks)  # enough distinct tokens to run an eviction
    t.propose(toks, 4, 2)
    t.ngrams()
    K.kth_smallest(np.array([3, 1, 2], np.int64), 3, 1)
    _WARMED = True


def _int_array(values, field: str) -> np.ndarray:
    """``values`` as a 1-D C-contiguous writeable int64 array (no copy when it already is one).

    Anything else is copied: Numba would compile (seconds) a new kernel specialisation for each
    other layout or a read-only array.
    """
    if type(values) is np.ndarray and values.dtype is _I64 and values.ndim == 1:
        flags = values.flags
        if flags.c_contiguous and flags.writeable:
            return values
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{field}: expected a 1-D sequence of token ids, got shape {arr.shape}")
    if arr.size == 0:
        return np.empty(0, np.int64)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{field}: expected integer token ids, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and int(arr.max()) > K.INT32_MAX:
        raise ValueError(f"{field}: token ids must be in [0, {K.INT32_MAX}], got {int(arr.max())}")
    return np.array(arr, dtype=np.int64, order="C")  # a copy


def _token_error(field: str, arr: np.ndarray) -> ValueError:
    return ValueError(
        f"{field}: token ids must be in [0, {K.INT32_MAX}] (int32), got min {int(arr.min())}, max {int(arr.max())}"
    )


class NgramTrie:
    """Bounded n-gram trie over token-id streams, with best-first draft-tree proposals.

    ``max_n``: the longest n-gram recorded (>= 2). ``capacity``: the most nodes kept (root not
    counted), >= ``4 * max_n**2``; least-recently-used n-grams are evicted beyond it. All memory
    is allocated here: 64 to 72 bytes per node of capacity.
    """

    def __init__(self, max_n: int = 8, capacity: int = 1 << 20):
        if isinstance(max_n, bool) or not isinstance(max_n, (int, np.integer)) or max_n < 2:
            raise ValueError(f"max_n: must be an integer >= 2, got {max_n!r}")
        max_n = int(max_n)
        min_cap = 4 * max_n * max_n
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < min_cap:
            raise ValueError(f"capacity: must be an integer >= 4 * max_n**2 = {min_cap}, got {capacity!r}")
        if capacity > K.INT32_MAX - 1:
            raise ValueError(f"capacity: must be < 2**31 - 1 (int32 node ids), got {capacity!r}")
        _warm_up()
        self._setup(max_n, int(capacity))

    def _setup(self, max_n: int, capacity: int) -> None:
        self._max_n = max_n
        self._capacity = capacity
        self._nodes = np.empty((capacity + 1, K.NODE_COLUMNS), np.int32)
        self._stats = np.empty((capacity + 1, K.STAT_COLUMNS), np.int64)
        self._table = np.empty(K.table_size(capacity), np.int32)
        self._state = np.zeros(K.S_OPEN + max_n, np.int64)
        self._state[K.S_MAX_N] = max_n
        self._state[K.S_CAPACITY] = capacity
        K.reset(self._nodes, self._stats, self._table, self._state)

    # -- read-only facts -----------------------------------------------------------------------
    @property
    def max_n(self) -> int:
        return self._max_n

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def step(self) -> int:
        """Tokens inserted so far (the step the last token got)."""
        return int(self._state[K.S_STEP])

    @property
    def n_evictions(self) -> int:
        """How many eviction passes have run."""
        return int(self._state[K.S_N_EVICTIONS])

    def __len__(self) -> int:
        return int(self._state[K.S_N_LIVE])

    def __repr__(self) -> str:
        return f"NgramTrie(max_n={self._max_n}, capacity={self._capacity}, nodes={len(self)}, step={self.step})"

    # -- updates -----------------------------------------------------------------------------
    def insert(self, tokens) -> None:
        """Append ``tokens`` (1-D ints in [0, 2**31 - 1]) to the current stream and record their n-grams."""
        arr = _int_array(tokens, "tokens")
        status = K.insert(self._nodes, self._stats, self._table, self._state, arr)
        if status:
            if status == K.ERR_TOKEN:
                raise _token_error("tokens", arr)
            raise RuntimeError("NgramTrie: eviction could not free max_n slots (invariant broken)")

    def reset_stream(self) -> None:
        """The next insert starts a new stream: no n-gram spans the boundary. Content is kept."""
        self._state[K.S_N_OPEN] = 0

    def clear(self) -> None:
        """Empty trie, new stream, step 0."""
        K.reset(self._nodes, self._stats, self._table, self._state)

    # -- queries -------------------------------------------------------------------------------
    def propose(self, context, max_nodes: int, max_depth: int, max_match: int | None = None):
        """Draft tree continuing ``context``: ``(tokens int64[k], parents int32[k])``, k <= max_nodes.

        ``parents[i]`` is -1 for a child of the matched node, else an index < i. Read-only.
        """
        max_n = self._max_n
        if max_match is None:
            mm = max_n - 1
        else:
            mm = min(max(operator.index(max_match), 1), max_n - 1)
        max_nodes = operator.index(max_nodes)
        max_depth = operator.index(max_depth)
        if max_nodes < 0:
            raise ValueError(f"max_nodes: must be >= 0, got {max_nodes}")
        if max_depth < 0:
            raise ValueError(f"max_depth: must be >= 0, got {max_depth}")
        if (type(context) is not np.ndarray or context.dtype is not _I64) and len(context) > mm:
            context = context[-mm:]  # convert only what is read (an int64 array is passed whole)
        ctx = _int_array(context, "context")
        # max_nodes is clipped to the live nodes only when large (reading len(self) costs ~0.2 us)
        m = max_nodes if max_nodes <= 4096 else min(max_nodes, len(self))
        tokens = np.empty(m, _I64)
        parents = np.empty(m, _I32)
        k = K.propose(self._nodes, self._stats, self._table, self._state, ctx, min(max_depth, max_n), mm,
                      tokens, parents)
        if k < 0:
            raise _token_error("context", ctx[-mm:])
        return tokens[:k], parents[:k]

    def ngrams(self) -> dict[tuple[int, ...], tuple[int, int]]:
        """``{path: (count, last_used)}`` for every live node (tests and debugging; not fast)."""
        rows = K.live_nodes(self._nodes, self._stats).tolist()
        by_slot = {r[0]: r for r in rows}
        paths: dict[int, tuple[int, ...]] = {0: ()}

        def path(v: int) -> tuple[int, ...]:
            chain = []
            while v not in paths:
                chain.append(v)
                v = by_slot[v][2]
            p = paths[v]
            for u in reversed(chain):
                p = p + (by_slot[u][1],)
                paths[u] = p
            return p

        return {path(r[0]): (r[3], r[4]) for r in rows}
