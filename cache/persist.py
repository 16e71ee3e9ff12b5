"""Saving, loading and pickling an :class:`~cache.NgramTrie`: its methods of those names call the functions
here, which read and swap the trie's arrays under its lock. ``save`` writes the n-grams, counts, last-used
steps and step counter (not the streams) to a versioned, checksummed file, atomically: a loaded trie proposes
and evicts as the saved one would.

File layout (all integers little-endian)::

    offset 0   magic        8 bytes  b"\\x89NGTRIE\\n"
    offset 8   version      uint32   FORMAT_VERSION (a reader refuses a newer one)
    offset 12  header_len   uint32   bytes of the JSON header
    offset 16  header_crc   uint32   zlib.crc32 of the JSON header
    offset 20  header       UTF-8 JSON, then zero padding to a multiple of 8 bytes
               payload      the arrays named in the header, back to back, raw

The header holds ``max_n``, ``capacity``, ``n_nodes``, ``step``, ``n_evictions``, ``vocab_size`` and
``tokenizer_id`` (either may be null), ``arrays`` as ``[name, dtype, length]``, ``payload_bytes`` and
``payload_crc32``. The payload is :func:`export`'s breadth-first n-grams: ``count``, ``last_used`` (``<u4``
when all fit, else ``<i8``), ``token``, ``parent`` (``<i4``, parent's row or -1); no in-memory layout, no pickle.
The version field is trusted only once the header's checksum matches and its ``format_version`` agrees: a flipped
bit in either reads as "corrupt"; only an intact header of a higher version asks for an upgrade.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import struct
import threading
import zlib

import numpy as np
from numba import njit

from . import kernels as K
from .primitives import INT32_MAX, int_at_least

MAGIC = b"\x89NGTRIE\n"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sIII")  # magic, version, header_len, header_crc
_MAX_HEADER = 1 << 20
_MAGIC_SLACK = 4  # magic bytes at most this many bits off are a damaged store's
# (name, allowed dtypes, in-memory dtype), in payload order: 8-byte arrays first
_ARRAYS = (
    ("count", ("<u4", "<i8"), np.int64),
    ("last_used", ("<u4", "<i8"), np.int64),
    ("token", ("<i4",), np.int32),
    ("parent", ("<i4",), np.int32),
)
# ``build`` status codes (returned with the offending row), and what each says
BUILD_OK, BAD_PARENT, BAD_TOKEN, BAD_COUNT, BAD_LAST_USED = range(5)
BAD_DEPTH, BAD_ORDER, DUPLICATE, TOO_MANY = range(5, 9)
BUILD_ERRORS = ("", "parent index not before the row", "token id out of range", "count < 1",
                "last_used outside [1, step]", "n-gram longer than max_n",
                "siblings not sorted by (count, last_used) descending", "duplicate n-gram",
                "more n-grams than the capacity")


class TrieFileError(ValueError):
    """The file is not a usable n-gram store: not one at all, truncated, corrupt, or of a newer format."""


class TrieMismatchError(TrieFileError):
    """The file is a valid store, but for another vocabulary (or holding a token id outside it), tokenizer or
    ``max_n``, or too big."""


def tokenizer_identity(tokenizer) -> str:
    """``"<name>|vocab=<size>|sha256=<16 hex digits>"`` naming a tokenizer's vocabulary, to store with a trie.

    ``name``: the last component of ``name_or_path``; the hash covers every ``(token, id)`` of ``get_vocab()``
    (added tokens included), so tokenizers with the same mapping match. Any object with ``get_vocab()`` works.
    """
    vocab = tokenizer.get_vocab()
    digest = hashlib.sha256()
    for token, idx in sorted(vocab.items(), key=lambda kv: (kv[1], kv[0])):
        digest.update(f"{idx}\t{token}\n".encode("utf-8", "surrogatepass"))
    name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    name = os.path.basename(name.rstrip("/\\")) or name
    return f"{name}|vocab={len(vocab)}|sha256={digest.hexdigest()[:16]}"


def check_match(path, header, arrays, vocab_size, tokenizer_id, max_n, capacity) -> None:
    """Raise :class:`TrieMismatchError` unless the file fits the vocabulary, tokenizer, ``max_n`` and ``capacity``."""
    why = None
    if vocab_size is not None:
        vocab_size = int_at_least(vocab_size, 1, "vocab_size", "a positive integer")
    if vocab_size is not None and header["vocab_size"] not in (None, vocab_size):
        why = (f"the store was saved for a vocabulary of {header['vocab_size']} tokens, not {vocab_size}: it belongs "
               "to another tokenizer")
    elif vocab_size is not None and header["n_nodes"] and int(arrays["token"].max()) >= vocab_size:
        why = f"the store holds token id {int(arrays['token'].max())}, outside a vocabulary of {vocab_size}"
    elif tokenizer_id is not None and header.get("tokenizer_id") not in (None, tokenizer_id):
        why = f"the store was saved for tokenizer {header['tokenizer_id']!r}, not {tokenizer_id!r}"
    elif header["max_n"] != max_n:
        why = f"the store has max_n={header['max_n']}, this trie max_n={max_n}"
    elif header["n_nodes"] > capacity:
        why = f"the store holds {header['n_nodes']} n-grams, more than the capacity {capacity}"
    if why:
        raise TrieMismatchError(f"{path}: {why}")


def ngrams(trie) -> dict[tuple[int, ...], tuple[int, int]]:
    _warm_up()
    with trie._lock:
        arrays = _export(trie)
    paths: list[tuple[int, ...]] = []
    for token, parent in zip(arrays["token"].tolist(), arrays["parent"].tolist()):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return dict(zip(paths, zip(arrays["count"].tolist(), arrays["last_used"].tolist())))


def save(trie, path, vocab_size: int | None, tokenizer_id: str | None) -> None:
    if vocab_size is not None:
        vocab_size = int_at_least(vocab_size, 1, "vocab_size", "a positive integer")
    if tokenizer_id is not None and not isinstance(tokenizer_id, str):
        raise TypeError(f"tokenizer_id: expected a str, got {type(tokenizer_id).__name__}")
    _warm_up()
    with trie._lock:
        arrays = _export(trie)
        meta = dict(max_n=trie.max_n, capacity=trie.capacity, n_nodes=len(trie), step=trie.step,
                    n_evictions=trie.n_evictions, vocab_size=vocab_size, tokenizer_id=tokenizer_id)
    if vocab_size is not None and meta["n_nodes"] and int(arrays["token"].max()) >= vocab_size:
        raise ValueError(f"vocab_size={vocab_size}, but the trie holds token id {int(arrays['token'].max())}")
    write_file(path, meta, arrays)


def load(cls, path, vocab_size: int | None, tokenizer_id: str | None, capacity: int | None):
    header, arrays = read_file(path)
    cap = header["capacity"] if capacity is None else capacity
    check_match(path, header, arrays, vocab_size, tokenizer_id, header["max_n"], cap)
    trie = cls(max_n=header["max_n"], capacity=cap)
    _install(trie, path, header, arrays)
    return trie


def load_into(trie, path, vocab_size: int | None, tokenizer_id: str | None) -> None:
    header, arrays = read_file(path)
    check_match(path, header, arrays, vocab_size, tokenizer_id, trie.max_n, trie.capacity)
    _install(trie, path, header, arrays)


def _install(trie, path, header, arrays) -> None:
    """Build the file's n-grams into new arrays (checking every row), then swap them in."""
    nodes, stats, table, state = K.empty_arrays(trie.max_n, trie.capacity)
    status, row = build(nodes, stats, table, state, step=header["step"], n_evictions=header["n_evictions"],
                        **arrays)
    if status != BUILD_OK:
        raise TrieFileError(f"{path}: corrupt: row {row}: {BUILD_ERRORS[status]}")
    with trie._lock:
        trie._nodes, trie._stats, trie._table, trie._state = nodes, stats, table, state
        trie._use(len(table))  # built with the whole table
        trie._epoch += 1


def _export(trie) -> dict[str, np.ndarray]:
    """:func:`export` of every live node, as :func:`read_file` returns them. Caller holds the trie's lock."""
    n = len(trie)
    arrays = {name: np.empty(n, dtype) for name, _, dtype in _ARRAYS}
    got = export(trie._nodes, trie._stats, **arrays)
    if got != n:
        raise RuntimeError(f"NgramTrie: exported {got} nodes of {n} (invariant broken)")
    return arrays


@functools.cache
def _warm_up() -> None:
    """Compile (or load from Numba's cache) :func:`export` once per process, before a trie's lock is held."""
    export(*K.empty_arrays(2, 16)[:2], **{name: np.empty(0, dtype) for name, _, dtype in _ARRAYS})


def pickled(trie) -> dict:
    """``NgramTrie.__getstate__`` (pickling, ``copy.deepcopy``): the scalars, the node rows up to ``S_HIGH``
    and the table's non-empty entries travel, the lock and the streams do not; the copy proposes, inserts and
    evicts exactly as the original would."""
    with trie._lock:
        used = int(trie._state[K.S_HIGH]) + 1
        entries = np.flatnonzero(trie._table)
        return dict(_max_n=trie.max_n, _capacity=trie.capacity, _used=trie._used, _state=trie._state.copy(),
                    _pool_rows=used, _nodes_used=trie._nodes[:used].copy(), _stats_used=trie._stats[:used].copy(),
                    _table_entries=entries, _table_values=trie._table[entries])


def unpickle(trie, state: dict) -> None:
    """``NgramTrie.__setstate__`` of what :func:`pickled` returned."""
    state = dict(state)
    used, scalars = state.pop("_pool_rows"), state["_state"]
    nodes, stats, table, _ = K.empty_arrays(int(scalars[K.S_MAX_N]), int(scalars[K.S_CAPACITY]))
    nodes[:used] = state.pop("_nodes_used")
    stats[:used] = state.pop("_stats_used")
    table[state.pop("_table_entries")] = state.pop("_table_values")
    slots = state.pop("_used")
    trie.__dict__.update(state, _nodes=nodes, _stats=stats, _table=table)
    trie._use(slots)
    trie._init_threading()


def write_file(path, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """Write ``meta`` (header fields) and ``arrays`` (the export) to ``path`` atomically."""
    path = os.fspath(path)
    payload = []
    specs = []
    crc = 0
    for name, allowed, _ in _ARRAYS:
        arr = arrays[name]
        dt = allowed[0]
        if len(allowed) > 1 and arr.size and (int(arr.max()) > 2**32 - 1 or int(arr.min()) < 0):
            dt = allowed[1]
        data = np.ascontiguousarray(arr, dtype=np.dtype(dt))
        crc = zlib.crc32(memoryview(data).cast("B"), crc)
        payload.append(data)
        specs.append([name, dt, int(arr.shape[0])])
    header = dict(meta, format="lookahead n-gram trie", format_version=FORMAT_VERSION, arrays=specs,
                  payload_bytes=sum(d.nbytes for d in payload), payload_crc32=crc)
    hbytes = json.dumps(header, sort_keys=True).encode()
    hbytes += b" " * (-(_PREFIX.size + len(hbytes)) % 8)  # pad (JSON ignores trailing spaces)
    prefix = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(hbytes), zlib.crc32(hbytes))
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(tmp, "wb") as f:
            f.write(prefix)
            f.write(hbytes)
            for data in payload:
                f.write(memoryview(data).cast("B"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    # make the rename durable, where directories can be opened
    with contextlib.suppress(OSError):
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def read_file(path) -> tuple[dict, dict[str, np.ndarray]]:
    """``(header, arrays)`` of a store file after checking format, size and checksums; ``arrays`` are fresh
    ``int64`` (count, last_used) and ``int32`` (token, parent). Raises :class:`TrieFileError`."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = bytearray(size)
        got = f.readinto(data)
    if got != size:
        raise TrieFileError(f"{path}: read {got} of {size} bytes (the file changed while being read?)")

    def bad(why: str) -> TrieFileError:
        return TrieFileError(f"{path}: {why}")

    if size < _PREFIX.size:
        if MAGIC.startswith(bytes(data[:8])) and size:
            raise bad(f"truncated: {size} bytes, shorter than the {_PREFIX.size}-byte prefix")
        raise bad("not an n-gram store file (too short)")
    magic, version, hlen, hcrc = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        off = (int.from_bytes(magic, "little") ^ int.from_bytes(MAGIC, "little")).bit_count()
        if off <= _MAGIC_SLACK:
            raise bad(f"corrupt: bad magic bytes, {off} bit{'s' * (off > 1)} off a store's: "
                      "the file is damaged")
        if _header_extent(data, hcrc) is not None:
            raise bad("corrupt: bad magic bytes, but the rest reads as an n-gram store: the file is damaged")
        raise bad("not an n-gram store file (bad magic bytes)")
    if hlen > _MAX_HEADER:
        raise bad(f"corrupt: header length {hlen} is implausible: the file is damaged")
    start = _PREFIX.size + hlen
    if size < start or zlib.crc32(memoryview(data)[_PREFIX.size : start]) != hcrc:
        found = _header_extent(data, hcrc)
        if found is not None and found != hlen:
            raise bad(f"corrupt: the header length field says {hlen} bytes, but the header (checksum "
                      f"intact) is {found}: the file is damaged")
        if size < start:
            raise bad(f"truncated: {size} bytes, the header alone needs {start}")
        raise bad("corrupt: header checksum mismatch: the file is damaged")
    hbytes = bytes(data[_PREFIX.size : start])
    try:
        header = json.loads(hbytes.decode())
    except (UnicodeDecodeError, ValueError):
        raise bad("corrupt: header is not valid JSON") from None
    if not isinstance(header, dict):
        raise bad("corrupt: header is not an object")
    if header.get("format_version") != version:
        raise bad(f"corrupt: the version field says format {version}, the header (checksum intact) "
                  f"{header.get('format_version')!r}: the file is damaged")
    if version > FORMAT_VERSION:
        raise bad(f"written in store format version {version}, newer than this reader's {FORMAT_VERSION}: "
                  "upgrade the lookahead package to load it")
    if version < 1:
        raise bad(f"unknown store format version {version}")
    header = _check_header(header, bad)
    expected = start + header["payload_bytes"]
    if size < expected:
        raise bad(f"truncated: {size} bytes, expected {expected}")
    if size > expected:
        raise bad(f"corrupt: {size - expected} unexpected bytes after the payload")
    if zlib.crc32(memoryview(data)[start:]) != header["payload_crc32"]:
        raise bad("corrupt: payload checksum mismatch")
    arrays = {}
    offset = 0
    for (name, _, dtype), (_, dt, length) in zip(_ARRAYS, header["arrays"]):
        raw = np.frombuffer(data, dtype=np.dtype(dt), count=length, offset=start + offset)
        arrays[name] = raw.astype(dtype)  # a copy: aligned, native, writeable
        offset += raw.nbytes
    return header, arrays


def _header_extent(data: bytearray, crc: int) -> int | None:
    """Padded length of the JSON object at offset 20 if its checksum is ``crc``, else None: the header found
    without trusting the length field (the writer's JSON is ASCII, so Latin-1 maps bytes one to one)."""
    text = bytes(data[_PREFIX.size : _PREFIX.size + _MAX_HEADER + 8]).decode("latin-1")
    try:
        _, end = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return None
    end += -(_PREFIX.size + end) % 8
    if end > len(text) or zlib.crc32(text[:end].encode("latin-1")) != crc:
        return None
    return end


def _check_header(h: dict, bad) -> dict:
    """``h`` after checking its fields' types and ranges and the array specs against ``n_nodes``."""
    for name, lo in (("max_n", 2), ("capacity", 1), ("n_nodes", 0), ("step", 0), ("n_evictions", 0),
                     ("payload_bytes", 0), ("payload_crc32", 0), ("vocab_size", 1)):  # only vocab_size may be null
        v = h.get(name)
        if (v is not None or name != "vocab_size") and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
            raise bad(f"corrupt: header field {name!r} = {v!r}")
    if h["capacity"] > INT32_MAX - 1 or h["capacity"] < 4 * h["max_n"] ** 2 or h["n_nodes"] > h["capacity"]:
        raise bad(f"corrupt: n_nodes {h['n_nodes']} / capacity {h['capacity']}")
    if h.get("tokenizer_id") is not None and not isinstance(h["tokenizer_id"], str):
        raise bad("corrupt: header field 'tokenizer_id' is not a string")
    specs = h.get("arrays")
    if not isinstance(specs, list) or len(specs) != len(_ARRAYS):
        raise bad("corrupt: header field 'arrays'")
    total = 0
    for (name, allowed, _), spec in zip(_ARRAYS, specs):
        if (not isinstance(spec, list) or len(spec) != 3 or spec[0] != name or spec[1] not in allowed
                or spec[2] != h["n_nodes"]):
            raise bad(f"corrupt: array spec {spec!r} (expected {name!r}, one of {allowed}, length n_nodes)")
        total += np.dtype(spec[1]).itemsize * spec[2]
    if total != h["payload_bytes"]:
        raise bad(f"corrupt: payload_bytes {h['payload_bytes']} != {total} from the array specs")
    return h


@njit(cache=True)
def export(nodes, stats, token, parent, count, last_used):
    """Every live node, breadth-first with siblings in list order, into the outputs (length = live nodes);
    ``parent[i] < i`` is the parent's output index, -1 under the root. Returns the number written, -1 when the
    outputs are too short. Read-only."""
    n_out = token.shape[0]
    slots = np.empty(n_out, np.int64)
    n = 0
    h = -1
    v = 0
    while True:
        c = nodes[v, K.FIRST_CHILD]
        while c != 0:
            if n >= n_out:
                return -1
            slots[n] = c
            token[n] = nodes[c, K.TOKEN]
            parent[n] = h
            count[n] = stats[c, K.COUNT]
            last_used[n] = stats[c, K.LAST_USED]
            n += 1
            c = nodes[c, K.NEXT_SIBLING]
        h += 1
        if h >= n:
            return n
        v = slots[h]


@njit(cache=True)
def build(nodes, stats, table, state, token, parent, count, last_used, step, n_evictions):
    """Fill a just-``reset`` trie with what ``export`` wrote (node ``i`` to slot ``i + 1``); returns
    ``(status, row)``, every row checked (``BUILD_ERRORS``; a bad row leaves the arrays half-built). Starts a
    new stream."""
    n = token.shape[0]
    max_n = state[K.S_MAX_N]
    cap = state[K.S_CAPACITY]
    if n > cap:
        return TOO_MANY, n
    K.reach(nodes, stats, state, n)  # the slots and group ids the nodes take
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
        depth[v] = depth[p] + 1
        if depth[v] > max_n:
            return BAD_DEPTH, i
        h, x = K.probe(nodes, table, table.shape[0] - 1, p, t)
        if x != 0:
            return DUPLICATE, i
        table[h] = v
        last = nodes[p, K.LAST_CHILD]
        if last != 0 and (stats[last, K.COUNT] < c
                          or (stats[last, K.COUNT] == c and stats[last, K.LAST_USED] < lu)):
            return BAD_ORDER, i
        K.init_node(nodes, stats, v, t, p, c, lu)
        nodes[v, K.PREV_SIBLING] = last
        nodes[v, K.NEXT_SIBLING] = 0
        nodes[p, K.LAST_CHILD] = v
        stats[p, K.CHILD_SUM] += c
        if last == 0:
            nodes[p, K.FIRST_CHILD] = v
        else:
            nodes[last, K.NEXT_SIBLING] = v
        if last != 0 and stats[last, K.COUNT] == c:
            nodes[v, K.GROUP] = nodes[last, K.GROUP]
        else:
            nodes[g_next, K.GROUP_HEAD] = v
            nodes[v, K.GROUP] = g_next
            g_next += 1
    # free slots n + 1 .. cap and group ids g_next .. cap are chained as a new trie's
    state[K.S_N_LIVE] = n
    state[K.S_FREE_HEAD] = n + 1 if n < cap else 0
    state[K.S_GROUP_FREE] = g_next if g_next <= cap else 0
    state[K.S_STEP] = step  # (S_HIGH: set by the reach above)
    state[K.S_N_OPEN] = 0
    state[K.S_N_EVICTIONS] = n_evictions
    return BUILD_OK, n
