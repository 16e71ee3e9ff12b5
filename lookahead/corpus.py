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
import weakref

import numpy as np
import torch

from ._tuning import DEFAULT
from .cache import NgramTrie
from .user_cache import cache_dir, persist_enabled, read_json

log = logging.getLogger("lookahead")

FORMAT = "lookahead-draft-corpus"
VERSION = 1
DATA_FILE, HEADER_FILE = "corpus.npz", "corpus.json"
BUNDLED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "corpus-smollm2")
"""The corpus shipped for the bundled SmolLM2-135M-Instruct."""
HEADS = os.path.join(os.path.dirname(BUNDLED), "heads-smollm2")
"""The draft heads shipped for it (``lookahead.heads.BUNDLED``), found by :func:`heads_for`."""
AUTO = "auto"
"""``LookaheadDecoder(corpus=AUTO)`` (the default): the corpus kept for the call's model, if any."""
INSTALLED = "corpora"
"""The user cache's folder of installed corpora, one subfolder per model."""
SHAPE_FIELDS = ("model_type", "hidden_size", "vocab_size")
"""The fingerprint fields :func:`corpus_for` compares before it hashes a model's LM head."""
PROBE_ENTRIES = 64
"""LM-head weights the fingerprint keeps as numbers: the same weights in another precision match them."""


def _probe_positions(vocab: int, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    """Fixed (row, column) positions of the LM-head weights a fingerprint keeps."""
    rng = np.random.default_rng(0)
    return rng.integers(0, vocab, PROBE_ENTRIES), rng.integers(0, hidden, PROBE_ENTRIES)


_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (weight key, fingerprint)


def weight_key(weight: torch.Tensor) -> tuple:
    """(data pointer, version counter, shape, dtype): changes when a weight is replaced or changed in place."""
    try:
        version = weight._version
    except RuntimeError:  # an inference tensor (made under torch.inference_mode) has no version counter
        version = -1
    return weight.data_ptr(), version, tuple(weight.shape), str(weight.dtype)


def fingerprint(model) -> dict:
    """What binds learned data (heads, a corpus) to a model: ``architecture``, ``model_type``, ``hidden_size``,
    ``vocab_size``, ``lm_head_sha256`` (of the LM head in bfloat16, so precisions agree) and ``lm_head_probe``
    (:data:`PROBE_ENTRIES` weights, matched within rounding). Cached per model until its LM head changes."""
    weight = model.get_output_embeddings().weight
    key = weight_key(weight)
    kept = _FINGERPRINTS.get(model)
    if kept is not None and kept[0] == key:
        return kept[1]
    w = weight.detach()
    vocab, hidden = w.shape
    bf16 = w.to("cpu", torch.bfloat16).contiguous()
    digest = hashlib.sha256(bf16.view(torch.int16).numpy().tobytes()).hexdigest()
    rows, cols = _probe_positions(vocab, hidden)
    probe = w[torch.from_numpy(rows).to(w.device), torch.from_numpy(cols).to(w.device)].float().cpu()
    found = {"architecture": type(model).__name__, "model_type": getattr(model.config, "model_type", None),
             "hidden_size": int(hidden), "vocab_size": int(vocab), "lm_head_sha256": digest,
             "lm_head_probe": [round(float(x), 7) for x in probe]}
    _FINGERPRINTS[model] = (key, found)
    return found


def fingerprint_mismatch(saved: dict, model) -> str | None:
    """Why data made for the model ``saved`` describes does not fit ``model`` (None: it fits)."""
    now = fingerprint(model)
    for name in ("model_type", "hidden_size", "vocab_size"):
        if saved.get(name) != now[name]:
            return f"{name} is {now[name]!r}, the data was made for {saved.get(name)!r}"
    if saved.get("lm_head_sha256") == now["lm_head_sha256"]:
        return None
    old, new = np.asarray(saved.get("lm_head_probe", []), float), np.asarray(now["lm_head_probe"], float)
    if old.shape == new.shape and np.allclose(old, new, rtol=1e-2, atol=1e-3):
        return None  # the same weights in another precision (float16, bfloat16)
    return "its LM-head weights differ from those of the model the data was made for"


def check_model(saved: dict, model, what: str = "these draft heads were trained for",
                command: str = "train-heads") -> None:
    """Raise ValueError unless data made for ``saved`` (a :func:`fingerprint`) fits ``model``."""
    why = fingerprint_mismatch(saved, model)
    if why is not None:
        raise ValueError(
            f"{what} another model ({saved.get('architecture')}, {saved.get('model_type')}, hidden "
            f"{saved.get('hidden_size')}, vocabulary {saved.get('vocab_size')}): for this {type(model).__name__}, "
            f"{why}. Make one for this model with `python -m lookahead {command} --model PATH --out DIR` and load it."
        )


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
        header = {"format": FORMAT, "version": VERSION, "target": self.target, "described": self.described,
                  "streams": self.streams, "tokens": len(self), "sha256": _digest(self.tokens, self.lengths)}
        tmp = os.path.join(folder, HEADER_FILE + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(header, f, indent=1)
        os.replace(tmp, os.path.join(folder, HEADER_FILE))

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
        head_path, data_path = os.path.join(folder, HEADER_FILE), os.path.join(folder, DATA_FILE)
        for path in (head_path, data_path):
            if not os.path.exists(path):
                raise FileNotFoundError(f"no draft corpus in {folder!r}: {os.path.basename(path)} is missing "
                                        "(write one with `python -m lookahead build-corpus --out DIR`)")
        with open(head_path, encoding="utf-8") as f:
            header = json.load(f)
        if header.get("format") != FORMAT:
            raise ValueError(f"{head_path}: format {header.get('format')!r}, expected {FORMAT!r}")
        if not isinstance(header.get("version"), int) or header["version"] > VERSION:
            raise ValueError(f"{head_path}: version {header.get('version')!r}; this lookahead reads up to {VERSION} "
                             "(upgrade lookahead)")
        with np.load(data_path) as data:
            tokens, lengths = data["tokens"].astype(np.int64), data["lengths"].astype(np.int64)
        if header.get("sha256") != _digest(tokens, lengths):
            raise ValueError(f"{data_path}: its contents do not match {HEADER_FILE} (damaged or replaced)")
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
_FOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {"corpus"/"heads": (LM-head key, it)}
_FOUND_LOCK = threading.Lock()


def install_folder(target: dict, root: str | None = None) -> str:
    """``<root>/<16 hex digits of the fingerprint's hash>``: where the corpus for ``target`` is installed."""
    key = {k: target.get(k) for k in ("architecture", *SHAPE_FIELDS, "lm_head_sha256")}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(root or os.path.join(cache_dir(), INSTALLED), digest)


def kept_corpora() -> list[tuple[str, dict]]:
    """(folder, header's fingerprint) of the bundled corpus, then of those installed (if the cache is on)."""
    folders = [BUNDLED]
    root = os.path.join(cache_dir(), INSTALLED)
    if persist_enabled() and os.path.isdir(root):
        try:
            folders += sorted(os.path.join(root, name) for name in os.listdir(root))
        except OSError as err:  # unreadable: as if nothing were installed
            log.warning("cannot read the installed draft corpora in %s: %s", root, err)
    kept = []
    for folder in folders:
        header = read_json(os.path.join(folder, HEADER_FILE))
        if header is not None and header.get("format") == FORMAT and isinstance(header.get("target"), dict):
            kept.append((folder, header["target"]))
    return kept


def corpus_for(model) -> DraftCorpus | None:
    """The first kept corpus (:func:`kept_corpora`) whose :data:`SHAPE_FIELDS`, then fingerprint, match ``model``, or
    None. Cached per model until its LM head changes; one that fails to load is skipped with a warning.
    Example: the bundled SmolLM2 -> ``DraftCorpus.bundled()``; a tiny random Llama -> None, without hashing it."""
    return _found(model, "corpus", kept_corpora, _load_kept)


def heads_for(model, load):
    """The bundled draft heads (the kind their folder's ``default.txt`` names), loaded by ``load(folder)`` (None:
    skipped), if they were trained for ``model``, else None: found and cached as :func:`corpus_for` finds a corpus,
    so a model they cannot fit never loads them. Example: the bundled SmolLM2 -> its heads; a tiny Llama -> None."""
    def kept() -> list[tuple[str, dict]]:
        try:
            with open(os.path.join(HEADS, "default.txt"), encoding="utf-8") as f:
                folder = os.path.join(HEADS, f.read().strip())
        except OSError:
            return []
        header = read_json(os.path.join(folder, "heads.json"))
        target = header.get("target") if isinstance(header, dict) else None
        return [(folder, target)] if isinstance(target, dict) else []

    return _found(model, "heads", kept, load)


def _found(model, what: str, kept, load):
    """The first of ``kept()`` ((folder, target fingerprint) pairs) that fits ``model``, loaded by ``load(folder)``
    (None: skipped), or None; cached per model and ``what`` until the model's LM head changes."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(out, "weight", None)  # a tensor; not one for every layer (quantize_dynamic's: a method)
    if len(getattr(weight, "shape", ())) != 2 or not hasattr(weight, "data_ptr"):
        return None
    key = weight_key(weight)
    with _FOUND_LOCK:
        cached = _FOUND.setdefault(model, {}).get(what)
        if cached is not None and cached[0] == key:
            return cached[1]
        shape = {"model_type": getattr(model.config, "model_type", None), "hidden_size": int(weight.shape[1]),
                 "vocab_size": int(weight.shape[0])}
        found = None
        for folder, target in kept():
            if any(target.get(k) != v for k, v in shape.items()):
                continue
            if fingerprint_mismatch(target, model) is not None:
                continue
            found = load(folder)
            if found is not None:
                break
        _FOUND[model][what] = (key, found)
        return found


def forget() -> None:
    """Make :func:`corpus_for` look again (after changing ``corpora/`` by hand or ``LOOKAHEAD_CACHE``)."""
    with _FOUND_LOCK:
        _FOUND.clear()
        _LOADED.clear()


def _load_kept(folder: str) -> DraftCorpus | None:
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
