"""What is kept for a model: the bundled and installed draft corpora, and the bundled draft heads.

Each is bound to the model it was made for by a :func:`fingerprint` in its header. :func:`find` picks the one
that fits a call's model by its :data:`SHAPE_FIELDS` first, so a model nothing was made for is never hashed, and
loads it only then (``lookahead.corpus`` and ``lookahead.heads`` stay unimported for it).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import weakref

import numpy as np
import torch

from .user_cache import cache_dir, persist_enabled, read_json

log = logging.getLogger("lookahead")

AUTO = "auto"
"""``LookaheadDecoder(corpus=AUTO, heads=AUTO)`` (the defaults): what is kept for the call's model, if anything."""
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
BUNDLED = os.path.join(DATA, "corpus-smollm2")
"""The corpus shipped for the bundled SmolLM2-135M-Instruct."""
HEADS = os.path.join(DATA, "heads-smollm2")
"""The draft heads shipped for it; ``default.txt`` names the kind a default call uses."""
INSTALLED = "corpora"
"""The user cache's folder of installed corpora, one subfolder per model (``corpus.install_folder``)."""
CORPUS_FORMAT, CORPUS_HEADER = "lookahead-draft-corpus", "corpus.json"
SHAPE_FIELDS = ("model_type", "hidden_size", "vocab_size")
PROBE_ENTRIES = 64
"""LM-head weights a fingerprint keeps as numbers: the same weights in another precision match them."""

_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (weight key, fingerprint)
_FOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {"corpus"/"heads": (weight key, it)}
_FOUND_LOCK = threading.Lock()


def weight_key(weight: torch.Tensor) -> tuple:
    """(data pointer, version counter, shape, dtype): changes when a weight is replaced or changed in place."""
    try:
        version = weight._version
    except RuntimeError:  # an inference tensor (made under torch.inference_mode) has no version counter
        version = -1
    return weight.data_ptr(), version, tuple(weight.shape), str(weight.dtype)


def fingerprint(model) -> dict:
    """What binds learned data (heads, a corpus) to a model: ``architecture``, :data:`SHAPE_FIELDS`,
    ``lm_head_sha256`` (of the LM head in bfloat16, so precisions agree) and ``lm_head_probe`` (:data:`PROBE_ENTRIES`
    weights at fixed positions, matched within rounding). Cached per model until its LM head changes."""
    weight = model.get_output_embeddings().weight
    key = weight_key(weight)
    kept = _FINGERPRINTS.get(model)
    if kept is not None and kept[0] == key:
        return kept[1]
    w = weight.detach()
    vocab, hidden = w.shape
    digest = hashlib.sha256(w.to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()).hexdigest()
    rng = np.random.default_rng(0)
    rows, cols = rng.integers(0, vocab, PROBE_ENTRIES), rng.integers(0, hidden, PROBE_ENTRIES)
    probe = w[torch.from_numpy(rows).to(w.device), torch.from_numpy(cols).to(w.device)].float().cpu()
    found = {"architecture": type(model).__name__, "model_type": getattr(model.config, "model_type", None),
             "hidden_size": int(hidden), "vocab_size": int(vocab), "lm_head_sha256": digest,
             "lm_head_probe": [round(float(x), 7) for x in probe]}
    _FINGERPRINTS[model] = (key, found)
    return found


def fingerprint_mismatch(saved: dict, model) -> str | None:
    """Why data made for the model ``saved`` describes does not fit ``model`` (None: it fits)."""
    now = fingerprint(model)
    for name in SHAPE_FIELDS:
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
        header = read_json(os.path.join(folder, CORPUS_HEADER))
        if header is not None and header.get("format") == CORPUS_FORMAT and isinstance(header.get("target"), dict):
            kept.append((folder, header["target"]))
    return kept


def kept_heads() -> list[tuple[str, dict]]:
    """(folder, header's fingerprint) of the bundled heads of the kind ``default.txt`` names, if readable."""
    try:
        with open(os.path.join(HEADS, "default.txt"), encoding="utf-8") as f:
            folder = os.path.join(HEADS, f.read().strip())
    except OSError:
        return []
    header = read_json(os.path.join(folder, "heads.json"))
    target = header.get("target") if isinstance(header, dict) else None
    return [(folder, target)] if isinstance(target, dict) else []


def find(model, what: str, kept, load):
    """The first of ``kept()`` ((folder, fingerprint) pairs) whose :data:`SHAPE_FIELDS`, then fingerprint, fit
    ``model``, loaded by ``load(folder)`` (None: skipped), or None; cached per model and ``what`` until the model's
    LM head changes. Example: the bundled SmolLM2 and :func:`kept_corpora` -> the bundled corpus; a tiny random
    Llama -> None, without hashing it."""
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
            if all(target.get(k) == v for k, v in shape.items()) and fingerprint_mismatch(target, model) is None:
                found = load(folder)
                if found is not None:
                    break
        _FOUND[model][what] = (key, found)
        return found


def forget() -> None:
    """Make :func:`find` look again (after changing ``corpora/`` by hand or ``LOOKAHEAD_CACHE``)."""
    with _FOUND_LOCK:
        _FOUND.clear()
