"""Saving and loading the n-gram store (``NgramTrie.save`` / ``load`` / ``load_into``, ``cache/persist.py``).

Round trips are exact (same n-grams, counts, steps, proposals, and the same evictions afterwards);
every bad file raises a clear ``TrieFileError`` / ``TrieMismatchError`` and leaves the trie as it was;
a failed save leaves the previous file in place.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import struct
import zlib

import numpy as np
import pytest
import torch
from test_trie import _check_invariants, _written  # pytest puts tests/ on sys.path

from lookahead import LookaheadDecoder
from lookahead._tuning import DEFAULT, Tuning
from lookahead.cache import (
    FORMAT_VERSION,
    NgramTrie,
    TrieFileError,
    TrieMismatchError,
    persist,
    tokenizer_identity,
)


def _filled(max_n=3, capacity=200, seed=0, requests=12, vocab=9):
    rng = np.random.default_rng(seed)
    trie = NgramTrie(max_n=max_n, capacity=capacity)
    for _ in range(requests):
        trie.reset_stream()
        trie.insert(rng.integers(0, vocab, int(rng.integers(5, 60))))
    return trie


def _snapshot(trie):
    return trie.ngrams(), trie.step, trie.n_evictions, len(trie)


@pytest.mark.parametrize("capacity", [36, 200, 5000])  # 36 = 4 * max_n**2: evicting all the time
def test_round_trip_is_exact_and_evolves_identically(tmp_path, capacity):
    trie = _filled(capacity=capacity)
    path = tmp_path / "store.ngt"
    trie.save(path, vocab_size=9, tokenizer_id="tok")
    loaded = NgramTrie.load(path, vocab_size=9, tokenizer_id="tok")
    assert (loaded.max_n, loaded.capacity) == (trie.max_n, trie.capacity)
    assert _snapshot(loaded) == _snapshot(trie)
    _check_invariants(loaded)
    rng = np.random.default_rng(1)
    trie.reset_stream()  # a loaded trie starts a new stream
    for _ in range(15):
        ctx = rng.integers(0, 9, 3)
        a, b = trie.propose(ctx, 10, 4), loaded.propose(ctx, 10, 4)
        assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
        chunk = rng.integers(0, 9, 40)
        trie.insert(chunk)
        loaded.insert(chunk)
    assert _snapshot(loaded) == _snapshot(trie)  # same counts, steps and evictions
    _check_invariants(loaded)


def test_empty_trie_round_trip(tmp_path):
    NgramTrie(max_n=2, capacity=16).save(tmp_path / "empty")
    loaded = NgramTrie.load(tmp_path / "empty")
    assert len(loaded) == 0 and loaded.step == 0
    loaded.insert([1, 2, 1, 2])
    assert loaded.propose([1], 4, 2)[0].tolist() == [2]


def test_load_into_other_capacity_and_refuses_what_does_not_fit(tmp_path):
    trie = _filled(capacity=400)
    trie.save(tmp_path / "s")
    big = NgramTrie(max_n=3, capacity=4096)
    big.load_into(tmp_path / "s")
    assert big.ngrams() == trie.ngrams() and big.capacity == 4096
    _check_invariants(big)
    assert NgramTrie.load(tmp_path / "s", capacity=1000).ngrams() == trie.ngrams()
    small = _filled(capacity=36, seed=5)
    before = _snapshot(small)
    with pytest.raises(TrieMismatchError, match="more than the capacity 36"):
        small.load_into(tmp_path / "s")
    assert _snapshot(small) == before
    with pytest.raises(TrieMismatchError, match="max_n=3, this trie max_n=4"):
        NgramTrie(max_n=4, capacity=4096).load_into(tmp_path / "s")


def test_vocabulary_and_tokenizer_mismatches_refused_and_store_untouched(tmp_path):
    path = tmp_path / "s"
    _filled().save(path, vocab_size=9, tokenizer_id="tok-a")
    target = _filled(seed=3)
    before = _snapshot(target)
    with pytest.raises(TrieMismatchError, match="vocabulary of 9 tokens, not 50"):
        target.load_into(path, vocab_size=50)
    with pytest.raises(TrieMismatchError, match="tokenizer 'tok-a', not 'tok-b'"):
        target.load_into(path, tokenizer_id="tok-b")
    with pytest.raises(TrieMismatchError, match="vocabulary"):
        NgramTrie.load(path, vocab_size=50)
    assert _snapshot(target) == before
    # a file saved without a vocabulary size: still checked against the ids it holds
    _filled().save(tmp_path / "novocab")
    with pytest.raises(TrieMismatchError, match="token id 8, outside a vocabulary of 5"):
        target.load_into(tmp_path / "novocab", vocab_size=5)
    assert _snapshot(target) == before
    target.load_into(path, vocab_size=9, tokenizer_id="tok-a")  # matching: fine
    with pytest.raises(ValueError, match="vocab_size=4, but the trie holds token id 8"):
        target.save(tmp_path / "bad", vocab_size=4)
    assert not (tmp_path / "bad").exists()


def _all_cuts(size):
    return sorted({0, 1, 7, 8, 12, 19, 20, 21, 40, size // 2, size - 9, size - 1})


def test_truncated_files_refused_and_store_untouched(tmp_path):
    path = tmp_path / "s"
    _filled().save(path)
    data = path.read_bytes()
    target = _filled(seed=4)
    before = _snapshot(target)
    for cut in _all_cuts(len(data)):
        (tmp_path / "cut").write_bytes(data[:cut])
        with pytest.raises(TrieFileError) as err:
            target.load_into(tmp_path / "cut")
        assert "truncated" in str(err.value) or (cut < 8 and "not an n-gram store" in str(err.value)), (cut, err.value)
        assert _snapshot(target) == before
    (tmp_path / "long").write_bytes(data + b"\0")
    with pytest.raises(TrieFileError, match="unexpected bytes after the payload"):
        target.load_into(tmp_path / "long")


def test_corrupt_bytes_refused(tmp_path):
    path = tmp_path / "s"
    _filled().save(path)
    data = bytearray(path.read_bytes())
    hlen = struct.unpack_from("<I", data, 12)[0]
    target = _filled(seed=4)
    before = _snapshot(target)
    for pos, why in ((len(data) - 3, "payload checksum"), (20 + 5, "header checksum"), (0, "bad magic")):
        bad = bytearray(data)
        bad[pos] ^= 0x40
        (tmp_path / "bad").write_bytes(bad)
        with pytest.raises(TrieFileError, match=why):
            target.load_into(tmp_path / "bad")
    assert hlen > 0 and _snapshot(target) == before
    (tmp_path / "text").write_text("hello, not a store at all\n" * 3)
    with pytest.raises(TrieFileError, match="not an n-gram store"):
        NgramTrie.load(tmp_path / "text")


def _with_version(data: bytes, version: int) -> bytes:
    """The file as a writer of format ``version`` would write it: intact header (checksum recomputed)
    with the new ``format_version``, and the same version in the prefix."""
    hlen = struct.unpack_from("<I", data, 12)[0]
    header = json.loads(data[20 : 20 + hlen])
    header["format_version"] = version
    hbytes = json.dumps(header, sort_keys=True).encode()
    hbytes += b" " * (-(20 + len(hbytes)) % 8)
    prefix = struct.pack("<8sIII", data[:8], version, len(hbytes), zlib.crc32(hbytes))
    return prefix + hbytes + data[20 + hlen :]


def test_newer_format_version_refused(tmp_path):
    path = tmp_path / "s"
    _filled().save(path)
    data = path.read_bytes()
    assert struct.unpack_from("<I", data, 8)[0] == FORMAT_VERSION
    assert _with_version(data, FORMAT_VERSION) == data  # the helper writes what save writes
    (tmp_path / "new").write_bytes(_with_version(data, FORMAT_VERSION + 1))
    with pytest.raises(TrieFileError, match=f"version {FORMAT_VERSION + 1}, newer than .* upgrade"):
        NgramTrie.load(tmp_path / "new")
    (tmp_path / "far").write_bytes(_with_version(data, 65537))
    with pytest.raises(TrieFileError, match="version 65537, newer than .* upgrade"):
        NgramTrie.load(tmp_path / "far")


def test_every_bit_flip_in_the_header_is_reported_as_damage_not_as_a_newer_format(tmp_path):
    """Issue 18: one flipped bit of the version field used to read as "format version 65537, newer
    than this reader's 1: upgrade". Every bit of the 20-byte prefix (magic, version, header length,
    header checksum) and of the JSON header is flipped in turn: each is refused as a damaged file,
    naming it, and the store loading it is untouched."""
    path = tmp_path / "s"
    _filled().save(path, vocab_size=9, tokenizer_id="tok")
    data = path.read_bytes()
    header_end = 20 + struct.unpack_from("<I", data, 12)[0]
    target = _filled(seed=4)
    before = _snapshot(target)
    bad_path = tmp_path / "bad"
    for bit in range(8 * header_end):
        bad = bytearray(data)
        bad[bit // 8] ^= 1 << (bit % 8)
        bad_path.write_bytes(bad)
        with pytest.raises(TrieFileError) as err:
            target.load_into(bad_path)
        message = str(err.value)
        assert message.startswith(f"{bad_path}: corrupt") and "damaged" in message, (bit, message)
        assert "newer" not in message and "upgrade" not in message, (bit, message)
    assert _snapshot(target) == before
    # the diagnosis names the damaged field
    for offset, why in ((1, "bad magic bytes, 1 bit off"), (8, "version field says format 0"),
                        (10, "version field says format 65537"), (12, "header length field says"),
                        (16, "header checksum mismatch"), (30, "header checksum mismatch")):
        bad = bytearray(data)
        bad[offset] ^= 1
        bad_path.write_bytes(bad)
        with pytest.raises(TrieFileError, match=why):
            NgramTrie.load(bad_path)


def _export(trie):
    n = len(trie)
    arrays = {"token": np.empty(n, np.int32), "parent": np.empty(n, np.int32),
              "count": np.empty(n, np.int64), "last_used": np.empty(n, np.int64)}
    assert persist.export(trie._nodes, trie._stats, arrays["token"], arrays["parent"], arrays["count"],
                          arrays["last_used"]) == n
    meta = dict(max_n=trie.max_n, capacity=trie.capacity, n_nodes=n, step=trie.step, n_evictions=0,
                vocab_size=None, tokenizer_id=None)
    return meta, arrays


@pytest.mark.parametrize(
    "edit, why",
    [
        (lambda a: a["parent"].__setitem__(0, 5), "parent index"),
        (lambda a: a["count"].__setitem__(3, 0), "count < 1"),
        (lambda a: a["last_used"].__setitem__(2, 10**6), "last_used"),
        (lambda a: a["token"].__setitem__(1, a["token"][0]), "duplicate|not sorted"),
        (lambda a: a["count"].__setitem__(1, a["count"][0] + 5), "not sorted"),
        (lambda a: a["token"].__setitem__(4, -3), "token id"),
    ],
)
def test_well_checksummed_but_inconsistent_rows_refused(tmp_path, edit, why):
    """A file whose checksums match but whose rows could corrupt the trie (a bug, or a crafted file)."""
    meta, arrays = _export(_filled())
    edit(arrays)
    persist.write_file(tmp_path / "s", meta, arrays)
    target = _filled(seed=2)
    before = _snapshot(target)
    with pytest.raises(TrieFileError, match=f"corrupt: row \\d+: .*({why})"):
        target.load_into(tmp_path / "s")
    assert _snapshot(target) == before


def test_deep_rows_refused(tmp_path):
    meta, arrays = _export(_filled(max_n=3))
    meta["max_n"] = 2  # the rows hold 3-grams
    meta["capacity"] = max(meta["capacity"], 16)
    persist.write_file(tmp_path / "s", meta, arrays)
    with pytest.raises(TrieFileError, match="longer than max_n"):
        NgramTrie.load(tmp_path / "s")


def test_wide_values_use_int64_columns(tmp_path):
    meta, arrays = _export(_filled())
    arrays["last_used"] += 2**33
    meta["step"] += 2**33
    persist.write_file(tmp_path / "s", meta, arrays)
    header, _ = persist.read_file(tmp_path / "s")
    assert [a[1] for a in header["arrays"]] == ["<u4", "<i8", "<i4", "<i4"]
    loaded = NgramTrie.load(tmp_path / "s")
    assert loaded.step == meta["step"]
    _check_invariants(loaded)


def test_failed_save_keeps_the_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "s"
    old = _filled(seed=1)
    old.save(path)
    old_bytes = path.read_bytes()

    class Crash(BaseException):  # like a KeyboardInterrupt in the middle of the write
        pass

    def crash(fd):
        raise Crash

    monkeypatch.setattr(persist.os, "fsync", crash)
    with pytest.raises(Crash):
        _filled(seed=2, requests=40).save(path)
    monkeypatch.undo()
    assert path.read_bytes() == old_bytes
    assert os.listdir(tmp_path) == ["s"]
    assert NgramTrie.load(path).ngrams() == old.ngrams()
    # a stale temporary file of a crashed process does not matter
    (tmp_path / "s.tmp-1-1").write_bytes(b"half")
    _filled(seed=2).save(path)
    assert NgramTrie.load(path).ngrams() == _filled(seed=2).ngrams()


def test_pickle_and_deepcopy_copy_the_contents():
    trie = _filled()
    for other in (copy.deepcopy(trie), pickle.loads(pickle.dumps(trie))):
        assert _snapshot(other) == _snapshot(trie)
        other.insert([1, 2, 3])
        trie_copy_step = trie.step
        assert other.step == trie_copy_step + 3
        _check_invariants(other)


def _arrays(trie):
    return trie._nodes, trie._stats, trie._table, trie._state


@pytest.mark.parametrize("capacity", [36, 200, 5000])  # 36: evicting all the time
def test_pickle_keeps_only_the_used_pool_and_copies_exactly(capacity):
    """Issue 13: pickling wrote the whole preallocated pool. Now the used rows and hash entries travel
    and the full capacity is rebuilt: the copy's arrays are the original's as the kernels read them, so it proposes,
    continues the open stream, and evicts exactly as the original does."""
    trie = _filled(capacity=capacity)
    trie.insert([1, 2, 3])  # an open stream: the copy's first insert continues it, as the original's does
    data = pickle.dumps(trie)
    assert len(data) < 2000 + 100 * (trie.capacity if trie.n_evictions else len(trie))  # not 72 * capacity
    rng = np.random.default_rng(3)
    for other in (copy.deepcopy(trie), pickle.loads(data)):
        assert other.capacity == trie.capacity and other._nodes.shape == trie._nodes.shape
        for mine, theirs in zip(_written(trie) + _arrays(trie)[2:], _written(other) + _arrays(other)[2:]):
            np.testing.assert_array_equal(mine, theirs)  # as the kernels read them: see test_trie._written
        assert _snapshot(other) == _snapshot(trie)
        _check_invariants(other)
    twin = pickle.loads(data)
    for _ in range(20):
        ctx = rng.integers(0, 9, 3)
        a, b = trie.propose(ctx, 10, 4, with_match=True), twin.propose(ctx, 10, 4, with_match=True)
        assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist() and a[2] == b[2]
        chunk = rng.integers(0, 9, 25)
        trie.insert(chunk)
        twin.insert(chunk)
        assert _snapshot(twin) == _snapshot(trie)  # same n-grams, counts, steps, evictions
    for mine, theirs in zip(_written(trie) + _arrays(trie)[2:], _written(twin) + _arrays(twin)[2:]):
        np.testing.assert_array_equal(mine, theirs)


def test_pickled_empty_stores_and_decoders_are_small():
    """A bare decoder pickled to 16.8 MB, 33.6 MB with a shared store (capacity 2**18 each)."""
    assert len(pickle.dumps(NgramTrie(max_n=12, capacity=1 << 18))) < 10_000
    assert len(pickle.dumps(LookaheadDecoder())) < 200_000
    assert len(pickle.dumps(LookaheadDecoder(store=NgramTrie(max_n=12, capacity=1 << 18)))) < 200_000
    twin = copy.deepcopy(LookaheadDecoder())
    assert twin.trie.capacity == LookaheadDecoder().tuning.trie_capacity == DEFAULT.trie_capacity
    assert len(twin.trie) == 0
    twin.trie.insert([5, 6, 5, 6, 5])
    assert twin.trie.propose([5], 4, 4)[0].tolist() == [6, 5, 6, 5]


def test_full_pool_round_trips():
    """Every slot used (the high-water mark is the capacity): nothing dropped, still exact."""
    trie = NgramTrie(max_n=2, capacity=16)
    trie.insert(np.arange(40) % 13)
    other = pickle.loads(pickle.dumps(trie))
    for mine, theirs in zip(_arrays(trie), _arrays(other)):
        np.testing.assert_array_equal(mine, theirs)


class _Tok:
    def __init__(self, vocab, name="some/dir/tok"):
        self._vocab, self.name_or_path = vocab, name

    def get_vocab(self):
        return dict(self._vocab)


def test_tokenizer_identity():
    vocab = {"a": 0, "b": 1, "<eos>": 2}
    ident = tokenizer_identity(_Tok(vocab))
    assert ident.startswith("tok|vocab=3|sha256=")
    assert tokenizer_identity(_Tok(vocab, name="/elsewhere/tok/")) == ident  # folder moved
    assert tokenizer_identity(_Tok({"a": 1, "b": 0, "<eos>": 2})) != ident  # ids swapped
    assert tokenizer_identity(_Tok({**vocab, "c": 3})) != ident


def test_decoder_with_a_reloaded_store_drafts_as_before(tiny_models, tmp_path):
    """Outputs persist across a restart: a decoder given the reloaded store behaves like one given the
    store it was saved from."""
    model = tiny_models("llama")
    memory = NgramTrie(max_n=6, capacity=4096)
    first = LookaheadDecoder(store=memory, _tuning=Tuning(adaptive=False))
    prompt = torch.tensor([[3, 41, 7, 88, 19, 64, 2, 53, 30, 77, 9]])
    kw = dict(max_new_tokens=40, eos_token_id=None)
    plain = model.generate(prompt, do_sample=False, **kw)
    model.generate(prompt, custom_generate=first, **kw)
    memory.save(tmp_path / "m", vocab_size=model.config.vocab_size)
    kept = LookaheadDecoder(store=memory, _tuning=Tuning(adaptive=False))
    restarted = LookaheadDecoder(store=NgramTrie.load(tmp_path / "m", vocab_size=model.config.vocab_size),
                                 _tuning=Tuning(adaptive=False))
    a = model.generate(prompt, custom_generate=kept, **kw)
    b = model.generate(prompt, custom_generate=restarted, **kw)
    assert a.tolist() == b.tolist() == plain.tolist()
    assert restarted.stats.accepted_by_origin["memory"] > 0
    assert restarted.stats.target_calls == kept.stats.target_calls < first.stats.target_calls


def test_header_records_what_was_given(tmp_path):
    _filled().save(tmp_path / "s", vocab_size=9, tokenizer_id="tok")
    header, arrays = persist.read_file(tmp_path / "s")
    assert header["format_version"] == FORMAT_VERSION and header["vocab_size"] == 9
    assert header["tokenizer_id"] == "tok" and header["max_n"] == 3 and header["capacity"] == 200
    assert header["payload_crc32"] == zlib.crc32((tmp_path / "s").read_bytes()[-header["payload_bytes"]:])
    assert len(arrays["token"]) == header["n_nodes"]
