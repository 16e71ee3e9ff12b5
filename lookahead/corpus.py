"""A model's own writing as a draft store: :class:`DraftCorpus`.

A corpus is token streams the model wrote itself (``python -m lookahead build-corpus``; ``train-heads`` writes one
too). ``LookaheadDecoder(corpus=...)`` drafts from a read-only n-gram store of it, built once per process, so a
process's first answer can already draft the phrases this model tends to write. It changes speed, never the output.
Example: streams ``[5, 6, 7]`` and ``[5, 6, 9]`` give the store each stream's n-grams (none spanning both), so after
``... 5, 6`` it drafts ``7`` and ``9`` side by side.

A corpus is bound to its model by its :func:`fingerprint`. ``corpus="auto"`` (the default) finds the one kept for
the call's model (:func:`corpus_for`): the bundled one, or one installed in the user cache (``DraftCorpus.install``).

Files: ``DIR/corpus.npz`` (``tokens``: the streams back to back, uint16 or int32; ``lengths``: int64 per stream) and
``DIR/corpus.json`` (format, version, target fingerprint, description, the arrays' sha256).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading

import numpy as np

from . import kept
from ._tuning import DEFAULT
from .cache import NgramTrie
from .kept import BUNDLED, CORPUS_FORMAT, CORPUS_HEADER, INSTALLED, SHAPE_FIELDS, check_model, fingerprint
from .user_cache import cache_dir, persist_enabled

log = logging.getLogger("lookahead")

VERSION = 1
DATA_FILE = "corpus.npz"


def store_capacity(tokens: int, max_n: int = DEFAULT.corpus_ngram) -> int:
    """Nodes for a store of ``tokens`` tokens' n-grams without evicting: ``tokens * (max_n - 1)`` (an upper bound)
    rounded up to a power of two, at least 2**16. Example: ``store_capacity(100_000)`` -> 1048576."""
    need = max(1 << 16, max(int(tokens), 1) * (max_n - 1))
    return 1 << (need - 1).bit_length()


class DraftCorpus:
    """Token streams of one model's own writing: ``tokens`` int[T] (back to back), ``lengths`` int[S] (sum T),
    ``target`` (the model's :func:`fingerprint`, or None: unbound), ``described`` (free-form, JSON-safe)."""

    def __init__(self, tokens, lengths, target: dict | None = None, described: dict | None = None):
        tokens = np.asarray(tokens)
        lengths = np.asarray(lengths)
        if tokens.ndim != 1 or (tokens.size and (not np.issubdtype(tokens.dtype, np.integer) or tokens.min() < 0)):
            raise ValueError(f"tokens: expected a 1-D array of non-negative token ids, got shape {tokens.shape} "
                             f"dtype {tokens.dtype}")
        if lengths.ndim != 1 or (lengths.size and (not np.issubdtype(lengths.dtype, np.integer)
                                                   or lengths.min() < 0)):
            raise ValueError(f"lengths: expected a 1-D array of non-negative stream lengths, got {lengths!r}")
        if int(lengths.sum()) != tokens.size:
            raise ValueError(f"lengths: they sum to {int(lengths.sum())}, but tokens holds {tokens.size}")
        if target is not None and not isinstance(target, dict):
            raise ValueError(f"target: expected a fingerprint dict (fingerprint) or None, got {target!r}")
        self.tokens = tokens.astype(np.int64)  # int64[T]
        self.lengths = lengths.astype(np.int64)  # int64[S]
        self.target = target
        self.described = dict(described or {})
        self._stores: dict[int, NgramTrie] = {}  # max_n -> the built store every decoder reads
        self._lock = threading.Lock()

    @classmethod
    def from_streams(cls, streams, model=None, described: dict | None = None) -> DraftCorpus:
        """A corpus of ``streams`` (token id sequences), bound to ``model`` when given."""
        arrays = [np.asarray(s, dtype=np.int64).reshape(-1) for s in streams]
        tokens = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
        return cls(tokens, [len(a) for a in arrays], None if model is None else fingerprint(model), described)

    def __len__(self) -> int:
        """Tokens in all streams."""
        return int(self.tokens.size)

    @property
    def streams(self) -> int:
        return int(self.lengths.size)

    def __repr__(self) -> str:
        arch = (self.target or {}).get("architecture")
        return f"DraftCorpus({self.streams} streams, {len(self)} tokens, target={arch})"

    def __deepcopy__(self, memo) -> DraftCorpus:
        """The corpus itself (immutable): a copied decoder shares its built store."""
        return self

    def __getstate__(self) -> dict:  # copy / pickle: built stores and the lock do not travel
        return {k: v for k, v in self.__dict__.items() if k not in ("_stores", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._stores, self._lock = {}, threading.Lock()

    def check_model(self, model) -> None:
        """Raise ValueError unless this corpus was written by ``model`` (its fingerprint)."""
        if self.target is not None:
            check_model(self.target, model, "this draft corpus was written by", "build-corpus")

    def insert_into(self, trie: NgramTrie) -> None:
        """Add every stream's n-grams to ``trie`` (none spans two streams)."""
        if not isinstance(trie, NgramTrie):
            raise TypeError(f"trie: expected a lookahead.cache.NgramTrie, got {type(trie).__name__}")
        at = 0
        for n in self.lengths:
            trie.reset_stream()
            if n:
                trie.insert(self.tokens[at: at + n])
            at += int(n)
        trie.reset_stream()

    def shared_store(self, max_n: int = DEFAULT.corpus_ngram) -> NgramTrie:
        """The corpus's ``NgramTrie`` decoders draft from, built once and shared read-only (to extend one, make
        your own and :meth:`insert_into` it)."""
        with self._lock:
            built = self._stores.get(int(max_n))
            if built is None:
                built = NgramTrie(max_n=max_n, capacity=store_capacity(len(self), max_n))
                self.insert_into(built)
                self._stores[int(max_n)] = built
            return built

    def save(self, folder: str) -> None:
        """Write ``folder/corpus.npz`` and ``folder/corpus.json``, each through a temporary name and a rename."""
        os.makedirs(folder, exist_ok=True)
        small = not self.tokens.size or int(self.tokens.max()) < (1 << 16)
        tokens = self.tokens.astype(np.uint16 if small else np.int32)
        tmp = os.path.join(folder, DATA_FILE + ".tmp.npz")
        np.savez_compressed(tmp, tokens=tokens, lengths=self.lengths)
        os.replace(tmp, os.path.join(folder, DATA_FILE))
        header = {"format": CORPUS_FORMAT, "version": VERSION, "target": self.target, "described": self.described,
                  "streams": self.streams, "tokens": len(self), "sha256": _digest(self.tokens, self.lengths)}
        tmp = os.path.join(folder, CORPUS_HEADER + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(header, f, indent=1)
        os.replace(tmp, os.path.join(folder, CORPUS_HEADER))

    def install(self) -> str:
        """Save this corpus where :func:`corpus_for` finds it for its model, replacing any; returns the folder."""
        if self.target is None:
            raise ValueError("only a corpus bound to a model can be installed: make it with from_streams(..., model) "
                             "or load it with the model it was written by")
        if not persist_enabled():
            raise ValueError("the user cache is turned off (LOOKAHEAD_PERSIST); pass the corpus to "
                             "LookaheadDecoder(corpus=DraftCorpus.load(DIR)) instead")
        folder = install_folder(self.target)
        self.save(folder)
        forget()
        return folder

    @classmethod
    def load(cls, folder: str, model=None) -> DraftCorpus:
        """The corpus saved in ``folder``; with ``model``, refused (ValueError) unless that model wrote it."""
        head_path, data_path = os.path.join(folder, CORPUS_HEADER), os.path.join(folder, DATA_FILE)
        for path in (head_path, data_path):
            if not os.path.exists(path):
                raise FileNotFoundError(f"no draft corpus in {folder!r}: {os.path.basename(path)} is missing "
                                        "(write one with `python -m lookahead build-corpus --out DIR`)")
        with open(head_path, encoding="utf-8") as f:
            header = json.load(f)
        if header.get("format") != CORPUS_FORMAT:
            raise ValueError(f"{head_path}: format {header.get('format')!r}, expected {CORPUS_FORMAT!r}")
        if not isinstance(header.get("version"), int) or header["version"] > VERSION:
            raise ValueError(f"{head_path}: version {header.get('version')!r}; this lookahead reads up to {VERSION} "
                             "(upgrade lookahead)")
        with np.load(data_path) as data:
            tokens, lengths = data["tokens"].astype(np.int64), data["lengths"].astype(np.int64)
        if header.get("sha256") != _digest(tokens, lengths):
            raise ValueError(f"{data_path}: its contents do not match {CORPUS_HEADER} (damaged or replaced)")
        corpus = cls(tokens, lengths, header.get("target"), header.get("described"))
        if model is not None:
            corpus.check_model(model)
        return corpus

    @classmethod
    def bundled(cls) -> DraftCorpus:
        """The corpus shipped for the bundled SmolLM2 (one object per process, so its store is built once)."""
        global _BUNDLED
        with _BUNDLED_LOCK:
            if _BUNDLED is None:
                _BUNDLED = cls.load(BUNDLED)
            return _BUNDLED


_BUNDLED: DraftCorpus | None = None
_BUNDLED_LOCK = threading.Lock()
_LOADED: dict[str, DraftCorpus] = {}  # installed folder -> its corpus, one object per process (its store built once)


def corpus_for(model) -> DraftCorpus | None:
    """The kept corpus (``kept.kept_corpora``: the bundled one, then those installed) that fits ``model``, or None
    (``kept.find``). Example: the bundled SmolLM2 -> ``DraftCorpus.bundled()``; a tiny random Llama -> None."""
    return kept.find(model, "corpus", kept.kept_corpora, load_kept)


def install_folder(target: dict) -> str:
    """``<user cache>/corpora/<16 hex digits of the fingerprint's hash>``: where the corpus for ``target`` is
    installed."""
    key = {k: target.get(k) for k in ("architecture", *SHAPE_FIELDS, "lm_head_sha256")}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(cache_dir(), INSTALLED, digest)


def forget() -> None:
    """Make :func:`corpus_for` look again (after changing ``corpora/`` by hand or ``LOOKAHEAD_CACHE``)."""
    kept.forget()
    _LOADED.clear()


def load_kept(folder: str) -> DraftCorpus | None:
    """The corpus kept in ``folder`` (one object per folder and process), or None with a warning if damaged."""
    if folder == BUNDLED:
        return DraftCorpus.bundled()
    corpus = _LOADED.get(folder)
    if corpus is None:
        try:
            corpus = DraftCorpus.load(folder)
        except Exception as err:  # noqa: BLE001 - a damaged file of any kind (a cut zip too): skipped, said
            log.warning("skipping the draft corpus in %s: %s", folder, err)
            return None
        _LOADED[folder] = corpus
    return corpus


def _digest(tokens: np.ndarray, lengths: np.ndarray) -> str:
    h = hashlib.sha256(np.ascontiguousarray(tokens, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(lengths, dtype="<i8").tobytes())
    return h.hexdigest()
