"""Helpers of the stores and ``lookahead.drafting.recycle``: a pair hash (splitmix64 multipliers :data:`MIX1`,
:data:`MIX2`) and its probing ``place``, a best-first heap and ``bucket`` (Numba, inlined into their callers),
``table_size`` and the argument checks."""

from __future__ import annotations

import numpy as np
from numba import njit

MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
INT32_MAX = 2**31 - 1
_I64 = np.dtype(np.int64)


def int_array(values, field: str) -> np.ndarray:
    """``values`` as a 1-D C-contiguous writeable int64 array, copied unless it is one (Numba would compile a
    kernel specialisation for every other layout); ``field`` names the argument in errors."""
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
    if arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and int(arr.max()) > INT32_MAX:
        raise ValueError(f"{field}: token ids must be in [0, {INT32_MAX}], got {int(arr.max())}")
    return np.array(arr, dtype=np.int64, order="C")  # a copy


def table_size(n: int) -> int:
    """The smallest power of two >= ``2 * n``: a hash table holding ``n`` entries at load <= 1/2."""
    return 1 << (2 * n - 1).bit_length()


def int_at_least(value, lo: int, field: str, rule: str) -> int:
    """``value`` as an int, or ValueError("<field>: must be <rule>, got <value>") unless an integer >= ``lo``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{field}: must be {rule}, got {value!r}")
    return int(value)


def token_error(field: str, arr: np.ndarray) -> ValueError:
    return ValueError(
        f"{field}: token ids must be in [0, {INT32_MAX}] (int32), got min {int(arr.min())}, max {int(arr.max())}"
    )


@njit(cache=True, inline="always")
def pair_slot(a, b, mask):
    """Slot of ``(a, b)`` (both < 2**32) in a table of ``mask + 1`` (a power of two) entries: the splitmix64
    finaliser of ``(a << 32) | b``, masked."""
    x = (np.uint64(a) << np.uint64(32)) | np.uint64(b)
    x ^= x >> np.uint64(30)
    x *= MIX1
    x ^= x >> np.uint64(27)
    x *= MIX2
    x ^= x >> np.uint64(31)
    return np.int64(x & np.uint64(mask))


@njit(cache=True, inline="always")
def place(table, mask, a, b, value):
    """Store ``value`` in the first empty (0) slot of ``(a, b)``'s linear-probing sequence in ``table``."""
    i = pair_slot(a, b, mask)
    while table[i] != 0:
        i = (i + 1) & mask
    table[i] = value


@njit(cache=True, inline="always")
def _before(score, depth, tie, a, b):
    """Entry ``a`` pops before entry ``b``: higher score, then shallower, then higher tie."""
    if score[a] != score[b]:
        return score[a] > score[b]
    if depth[a] != depth[b]:
        return depth[a] < depth[b]
    return tie[a] > tie[b]


@njit(cache=True, inline="always")
def heap_push(heap, n, e, score, depth, tie):
    """Push entry ``e`` onto ``heap[:n]`` (keys ``score``, ``depth``, ``tie`` indexed by entry); returns ``n + 1``."""
    i = n
    while i > 0:  # sift up
        p = (i - 1) >> 1
        if _before(score, depth, tie, e, heap[p]):
            heap[i] = heap[p]
            i = p
        else:
            break
    heap[i] = e
    return n + 1


@njit(cache=True, inline="always")
def heap_pop(heap, n, score, depth, tie):
    """(the entry that pops first from ``heap[:n]``, ``n - 1``); ``n`` must be > 0."""
    top = heap[0]
    n -= 1
    last = heap[n]
    i = 0
    while True:  # sift down
        j = 2 * i + 1
        if j >= n:
            break
        if j + 1 < n and _before(score, depth, tie, heap[j + 1], heap[j]):
            j += 1
        if _before(score, depth, tie, heap[j], last):
            heap[i] = heap[j]
            i = j
        else:
            break
    heap[i] = last
    return top, n


@njit(cache=True, inline="always")
def bucket(x, edges):
    """1 + how many of ``edges`` (increasing) ``x`` reaches: edges ``[4, 16]``: 3 -> 1, 4 -> 2, 20 -> 3."""
    b = 1
    for e in range(edges.shape[0]):
        b += edges[e] <= x
    return b
