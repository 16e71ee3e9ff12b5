"""``NgramTrie``: owns the trie's arrays, validates inputs and serialises access; the algorithms are in
:mod:`lookahead.cache.kernels`, the terms and threading rules in the package docstring, saving, loading and
pickling in :mod:`lookahead.cache.persist` (imported only by them)."""

from __future__ import annotations

import dataclasses
import functools
import operator
import threading

import numpy as np

from . import kernels as K
from .primitives import int_array, int_at_least, table_size, token_error

_I64 = np.dtype(np.int64)
_I32 = np.dtype(np.int32)
MIN_TABLE = 1024
"""Hash-table slots in use after a reset; the table in use grows as nodes are made (``NgramTrie._fit``)."""


@functools.cache
def _warm_up() -> None:
    """Compile (or load from Numba's on-disk cache) every kernel, once per process."""
    t = NgramTrie.__new__(NgramTrie)
    t._setup(2, 16)
    toks = np.array([1, 2, 1, 3, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14], np.int64)
    t.insert(toks)  # enough distinct tokens to run an eviction
    t.propose(toks, 4, 2)
    t.insert_rows(toks[:4].reshape(2, 2))
    # stream switching (a thread compiling these would hold the trie's lock)
    tail = np.empty(2, np.int64)
    K.reopen(t._nodes, t._tview, t._state, tail[: K.open_tail(t._nodes, t._state, tail)])
    K.rehash(t._nodes, t._table, t._state)


class NgramTrie:
    """Bounded n-gram trie over token-id streams, with best-first draft-tree proposals.

    ``max_n``: the longest n-gram recorded (>= 2). ``capacity``: the most nodes kept (root not counted),
    >= ``4 * max_n**2``; least recently used n-grams are evicted beyond it. All memory (64 to 72 bytes per node of
    ``capacity``) is allocated here.
    """

    def __init__(self, max_n: int = 8, capacity: int = 1 << 20):
        max_n = int_at_least(max_n, 2, "max_n", "an integer >= 2")
        min_cap = 4 * max_n * max_n
        capacity = int_at_least(capacity, min_cap, "capacity", f"an integer >= 4 * max_n**2 = {min_cap}")
        if capacity > K.INT32_MAX - 1:
            raise ValueError(f"capacity: must be < 2**31 - 1 (int32 node ids), got {capacity!r}")
        _warm_up()
        self._setup(max_n, capacity)

    def _setup(self, max_n: int, capacity: int) -> None:
        self._max_n = max_n
        self._capacity = capacity
        self._nodes, self._stats, self._table, self._state = K.empty_arrays(max_n, capacity)
        self._use(min(MIN_TABLE, len(self._table)))
        self._init_threading()

    # The kernels get ``_tview``, the first ``_used`` slots of ``_table``: a small trie probes a cache-sized table.
    def _use(self, slots: int) -> None:
        self._used = slots
        self._tview = self._table[:slots]
        self._whole = slots == len(self._table)

    def _fit(self, new_nodes: int) -> None:
        """Grow the table in use to hold ``new_nodes`` more at load <= 1/2, or to all of it where an insert of
        that many could evict (eviction borrows it whole). Caller holds the lock."""
        if self._whole:
            return
        need = int(self._state[K.S_N_LIVE]) + new_nodes
        if need + self._max_n >= self._capacity:
            size = len(self._table)
        elif 2 * need <= self._used:
            return
        else:
            size = min(table_size(need), len(self._table))
        self._use(size)
        K.rehash(self._nodes, self._tview, self._state)

    def _init_threading(self) -> None:
        self._lock = threading.RLock()  # every read or write of the arrays holds it
        self._local = threading.local()  # .stream: this thread's _Stream
        self._loaded: _Stream | None = None  # the stream whose open path is in _state (None: unowned)
        self._epoch = 0  # bumped by clear/load: every stream starts anew

    def __getstate__(self) -> dict:  # pickling / copy.deepcopy
        return _persist().pickled(self)

    def __setstate__(self, state: dict) -> None:
        _warm_up()
        _persist().unpickle(self, state)

    max_n = property(lambda self: self._max_n)
    capacity = property(lambda self: self._capacity)
    step = property(lambda self: int(self._state[K.S_STEP]), doc="Tokens inserted so far.")
    n_evictions = property(lambda self: int(self._state[K.S_N_EVICTIONS]), doc="How many eviction passes have run.")

    def __len__(self) -> int:
        return int(self._state[K.S_N_LIVE])

    def max_token(self) -> int:
        """The largest token id held, -1 when empty."""
        with self._lock:
            return int(self._nodes[: self._state[K.S_HIGH] + 1, K.TOKEN].max())

    def __repr__(self) -> str:
        return f"NgramTrie(max_n={self._max_n}, capacity={self._capacity}, nodes={len(self)}, step={self.step})"

    # -- updates -----------------------------------------------------------------------------
    def insert(self, tokens) -> None:
        """Append ``tokens`` (1-D ints in [0, 2**31 - 1]) to the calling thread's stream, recording their n-grams."""
        self._inserted(K.insert, int_array(tokens, "tokens"), "tokens")

    def insert_rows(self, rows) -> None:
        """Each row of ``rows`` (2-D ints in [0, 2**31 - 1]) as ``reset_stream(); insert(row)``, in one kernel call:
        ``insert_rows([[1, 2], [2, 3]])`` records (1, 2) and (2, 3) but not (2, 2)."""
        arr = np.asarray(rows)
        if arr.ndim != 2:
            raise ValueError(f"rows: expected a 2-D array of token ids, got shape {arr.shape}")
        if arr.dtype.kind not in "iu" and arr.size:
            raise ValueError(f"rows: expected integer token ids, got dtype {arr.dtype}")
        if arr.size:
            self._inserted(K.insert_rows, np.ascontiguousarray(arr, dtype=np.int64), "rows")

    def _inserted(self, kernel, arr: np.ndarray, field: str) -> None:
        """Run ``K.insert`` or ``K.insert_rows`` on the calling thread's stream; a bad status raised."""
        with self._lock:
            stream = getattr(self._local, "stream", None)
            if stream is None or stream is not self._loaded:
                self._switch_to(stream)
            self._fit(arr.size * self._max_n)  # each token makes at most max_n nodes
            status = kernel(self._nodes, self._stats, self._tview, self._state, arr)
        if status:
            if status == K.ERR_TOKEN:
                raise token_error(field, arr)
            raise RuntimeError("NgramTrie: eviction could not free max_n slots (invariant broken)")

    def reset_stream(self) -> None:
        """The calling thread's next insert starts a new stream (no n-gram spans the boundary); content is kept."""
        with self._lock:
            stream = getattr(self._local, "stream", None)
            if stream is self._loaded:  # ours is in the state (or the state is unowned and ours is new)
                self._state[K.S_N_OPEN] = 0
            elif stream is not None:  # ours is parked
                stream.tail = None
            # else: this thread has no stream yet; its first insert starts a new one

    def clear(self) -> None:
        """Empty trie, step 0; every thread's next insert starts a new stream."""
        with self._lock:
            K.reset(self._nodes, self._stats, self._tview, self._state)  # all entries lie in the slots in use
            self._use(min(MIN_TABLE, len(self._table)))
            self._epoch += 1

    def _switch_to(self, stream: _Stream | None) -> None:
        """Load ``stream`` (the calling thread's; created when None) into ``_state``, parking the previous owner's
        open path as its tail tokens. Caller holds the lock."""
        if stream is None:
            stream = self._local.stream = _Stream()
            if self._loaded is None:  # a fresh (or unpickled) trie: the first inserting thread adopts it
                stream.epoch = self._epoch
                self._loaded = stream
                return
        parked = self._loaded
        if parked is not None:
            out = np.empty(self._max_n, np.int64)
            k = K.open_tail(self._nodes, self._state, out)
            parked.tail = out[:k] if k else None
            parked.epoch = self._epoch
        if stream.tail is not None and stream.epoch == self._epoch:
            K.reopen(self._nodes, self._tview, self._state, stream.tail)
        else:
            self._state[K.S_N_OPEN] = 0
        stream.tail = None
        stream.epoch = self._epoch
        self._loaded = stream

    # -- queries -------------------------------------------------------------------------------
    def propose(self, context, max_nodes: int, max_depth: int, max_match: int | None = None, *,
                with_match: bool = False):
        """Draft tree continuing ``context`` (package docstring): ``(tokens int64[k], parents int32[k])``, k <=
        max_nodes; ``with_match=True`` adds the match length (0 when the tree is empty). Read-only."""
        max_n = self._max_n
        mm = max_n - 1 if max_match is None else min(max(operator.index(max_match), 1), max_n - 1)
        max_nodes = operator.index(max_nodes)
        max_depth = operator.index(max_depth)
        if max_nodes < 0:
            raise ValueError(f"max_nodes: must be >= 0, got {max_nodes}")
        if max_depth < 0:
            raise ValueError(f"max_depth: must be >= 0, got {max_depth}")
        if (type(context) is not np.ndarray or context.dtype is not _I64) and len(context) > mm:
            context = context[-mm:]  # convert only what is read (an int64 array is passed whole)
        ctx = int_array(context, "context")
        m = max_nodes if max_nodes <= 4096 else min(max_nodes, len(self))
        tokens = np.empty(m, _I64)
        parents = np.empty(m, _I32)
        match = np.zeros(1, _I64)
        with self._lock:
            k = K.propose(self._nodes, self._stats, self._tview, self._state, ctx, min(max_depth, max_n), mm,
                          tokens, parents, match)
        if k < 0:
            raise token_error("context", ctx[-mm:])
        if with_match:
            return tokens[:k], parents[:k], int(match[0]) if k else 0
        return tokens[:k], parents[:k]

    def ngrams(self) -> dict[tuple[int, ...], tuple[int, int]]:
        """``{path: (count, last_used)}`` for every live node (tests and debugging; not fast)."""
        return _persist().ngrams(self)

    def save(self, path, vocab_size: int | None = None, tokenizer_id: str | None = None) -> None:
        """Write the trie to ``path`` atomically, with ``vocab_size`` and ``tokenizer_id`` (e.g.
        :func:`cache.tokenizer_identity`) for :meth:`load` to check. Streams are not saved."""
        _persist().save(self, path, vocab_size, tokenizer_id)

    @classmethod
    def load(cls, path, vocab_size: int | None = None, tokenizer_id: str | None = None,
             capacity: int | None = None) -> NgramTrie:
        """A new trie from the file at ``path``, with its ``max_n`` and (unless given) ``capacity``. Raises as
        :meth:`load_into` does."""
        return _persist().load(cls, path, vocab_size, tokenizer_id, capacity)

    def load_into(self, path, vocab_size: int | None = None, tokenizer_id: str | None = None) -> None:
        """Replace the contents with the file at ``path`` (same ``max_n``; its n-grams must fit the capacity).
        Raises :class:`cache.TrieFileError` (a ``ValueError``) or its subclass :class:`cache.TrieMismatchError`;
        on any error the trie is unchanged."""
        _persist().load_into(self, path, vocab_size, tokenizer_id)


def _persist():
    """:mod:`lookahead.cache.persist`, imported on first use: a default call never saves, loads or pickles."""
    from . import persist

    return persist


@dataclasses.dataclass(slots=True)
class _Stream:
    """A thread's parked stream: its last tokens (``tail``, None for a new stream) and their trie epoch."""

    tail: np.ndarray | None = None
    epoch: int = -1
