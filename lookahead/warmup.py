"""``python -m lookahead warmup``: what a first run would otherwise pay for, done once ahead of it.

1. **Kernels.** Every Numba kernel of the package is ``njit(cache=True)``: compiled once (10-40 s in all on
   a CPU), its machine code kept in Numba's on-disk cache (beside the sources, or in ``NUMBA_CACHE_DIR``)
   and loaded by later processes in milliseconds. :func:`compile_kernels` runs the decoder on tiny random
   models built from a config (no download) in every way a call can go (greedy and sampled, the lookahead
   window, a shared n-gram store with eviction, saving and loading, a batch, a self-drafting pass, token
   bans, a static cache), in
   float32, bfloat16, float16 and float64, so each kernel is compiled for the argument types real calls
   pass; :func:`missed_kernels` then names any kernel of the package that none of this reached.
2. **Weights.** The bundled SmolLM2's GGUF weights are converted and kept in the user's cache
   (:func:`lookahead.models.load_smollm2`).
3. **Calibration** (``--calibrate``): the bundled model's cost curve for the default decoder is measured
   and kept (:class:`lookahead.cost.Calibrations`) for the current torch thread count.

Each phase prints one line when it starts and its time when it ends. Kernels compiled here are never
compiled inside a user's ``generate``; a phase already done costs about a second.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from .numba_kernels import kernel_modules, kernels, kernels_compiled, mark_checked, missed_kernels  # noqa: F401 (re-exported)

FLAT = ((1, 0.010), (2, 0.010), (256, 0.0102))  # every draft looks worth verifying: every kernel runs
DTYPES = ("float32", "bfloat16", "float16", "float64")
PROMPT = [3, 10, 11, 12, 13, 14] * 5 + [3, 10, 11]  # repeats: the n-gram sources draft at once


def ensure_kernels(progress: bool = True) -> None:
    """Compile every kernel now, announced (INFO on ``"lookahead"``), when Numba's cache lacks any of them, so
    that a ``generate`` after it compiles nothing; nothing when they are all compiled (or it cannot tell)."""
    if kernels_compiled() is not False:
        return
    from .console import phase

    with phase("compiling the Numba kernels once (about 30-60 s; `python -m lookahead warmup` does it "
               "ahead)"):
        compile_kernels(progress=progress)


def cache_counts(modules=None) -> tuple[int, int]:
    """(signatures compiled, signatures loaded from Numba's on-disk cache) in this process so far."""
    compiled = loaded = 0
    for _, d in kernels(modules):
        compiled += sum(d.stats.cache_misses.values())
        loaded += sum(d.stats.cache_hits.values())
    return compiled, loaded


def tiny_model(dtype: str):
    """A tiny random Llama (2 layers, vocabulary 64) in ``dtype``, built from a config: no download."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval().to(getattr(torch, dtype))
    model.generation_config.pad_token_id = 0
    return model


def workloads() -> list[tuple[str, dict, dict, int]]:
    """(name, decoder settings, generate settings, rows) of every way :func:`compile_kernels` decodes."""
    greedy, sampled = {"do_sample": False}, {"do_sample": True, "temperature": 0.7, "top_p": 0.9}
    bans = {"do_sample": False, "eos_token_id": 0, "min_new_tokens": 8, "suppress_tokens": [5]}
    return [
        ("greedy", {}, greedy, 1),
        ("sampled", {}, sampled, 1),
        ("window", {"window_width": 4, "window_ngram": 3, "window_candidates": 2}, greedy, 1),
        ("window, sampled", {"window_width": 4, "window_ngram": 3, "window_candidates": 2}, sampled, 1),
        ("shared n-gram store", {"memory": True}, greedy, 1),
        ("self-drafting pass", {"self_draft": "early-exit", "self_draft_size": 0.5}, greedy, 1),
        ("batch", {}, greedy, 2),
        ("batch, sampled", {}, sampled, 2),
        ("token bans", {}, bans, 1),
        ("batch, token bans", {}, bans, 2),
        ("static cache", {}, {**greedy, "cache_implementation": "static"}, 1),
        ("static cache, window", {"window_width": 4, "window_ngram": 3, "window_candidates": 2},
         {**sampled, "cache_implementation": "static"}, 1),
    ]


def decode(model, settings: dict, generate: dict, rows: int) -> None:
    """One short ``generate`` with a decoder of ``settings`` (``memory``: a shared n-gram store) on
    ``rows`` rows."""
    import torch

    from .cache import NgramTrie
    from .decoder import LookaheadDecoder

    settings = dict(settings)
    trie = NgramTrie(max_n=6, capacity=4096) if settings.pop("memory", False) else None
    decoder = LookaheadDecoder(cost_curve=FLAT, trie=trie, **settings)
    ids = torch.tensor([PROMPT] * rows)
    mask = torch.ones_like(ids)
    if rows > 1:  # left padding, as a batch has it
        ids[1, :3], mask[1, :3] = 0, 0
    torch.manual_seed(0)
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, custom_generate=decoder,
                       **{"max_new_tokens": 12, "eos_token_id": None, **generate})


def exercise_store() -> None:
    """The stores' own paths a decode does not take: eviction, saving, loading, listing; a model-prediction
    table cleared after use (a kept decoder's next call on another model)."""
    import numpy as np

    from .cache import NgramTrie, SuffixIndex
    from .recycle import SuccessorTable

    trie = NgramTrie(max_n=4, capacity=64)
    trie.insert(np.random.default_rng(0).integers(0, 50, 400))  # far more than fits: evicts
    trie.propose([1, 2, 3], max_nodes=8, max_depth=4, with_match=True)
    trie.ngrams()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trie.bin")
        trie.save(path)
        NgramTrie.load(path)
    index = SuffixIndex(8)
    index.extend(np.array([1, 2, 1, 2, 3, 1, 2, 1, 2, 3] * 3, np.int64))  # grows past its capacity
    index.propose(4, 4, 2, 2)
    table = SuccessorTable(2, rows=64)
    table.update(np.array([-1]), np.array([3]), np.array([[4, 5]]), np.zeros((1, 2), np.float32))
    table.clear()


def exercise_trees() -> None:
    """The tree helpers a decode reaches only on some paths (a draft built from bare parents, the heads'
    reach, a model that takes no tree mask): depth and rank of a small parent-first tree, its best chain."""
    import numpy as np

    from .kernels import best_chain
    from .tree import tree_depth_rank

    tree_depth_rank(np.array([-1, -1, 0, 0, 1], dtype=np.int64))
    best_chain(np.array([-1, 0, -1], dtype=np.int64), np.ones(3))  # a model that takes no tree mask


def compile_kernels(progress: bool = False) -> dict:
    """Compile (or load from Numba's cache) every kernel of the package; returns ``{"seconds", "compiled",
    "loaded", "kernels", "missed"}``. ``progress``: a progress bar over the workloads when stderr is a
    terminal."""
    from tqdm.auto import tqdm

    mark_checked()  # this announces its own compiling: no first-call notice from the decoders it runs
    t = time.perf_counter()
    steps = [(f"{name} ({dtype})", dtype, s, g, r) for dtype in DTYPES for name, s, g, r in workloads()]
    models = {}
    exercise_store()
    exercise_trees()
    bar = tqdm(steps, desc="kernels", unit="run", leave=False, file=sys.stderr,
               disable=None if progress else True)  # None: drawn on a terminal only, never into a log
    for label, dtype, settings, generate, rows in bar:
        model = models.setdefault(dtype, tiny_model(dtype))
        try:
            decode(model, settings, generate, rows)
        except Exception as err:  # a way of decoding this version refuses: the others still compile
            raise RuntimeError(f"warm-up run {label!r} failed: {type(err).__name__}: {err}") from err
    compiled, loaded = cache_counts()
    return {"seconds": time.perf_counter() - t, "compiled": compiled, "loaded": loaded,
            "kernels": len(kernels()), "missed": missed_kernels()}


def convert_weights(progress: bool = False) -> tuple:
    """The bundled model, loaded once so that its converted weights are kept: ``(model, tokenizer)``."""
    from .models import load_smollm2

    return load_smollm2(progress=progress)


def calibrate(model, dtype: str) -> object:
    """The default decoder's cost curve for ``model`` in ``dtype``, measured and kept (or read back if
    kept)."""
    import torch

    from .decoder import LookaheadDecoder

    model = model.to(getattr(torch, dtype))
    with torch.inference_mode():
        return LookaheadDecoder().cost_curve(model)


def run(weights: bool = True, calibrate_dtypes: tuple[str, ...] = (), progress: bool = True,
        out=None) -> int:
    """``python -m lookahead warmup``: the phases above, each announced on ``out`` (stderr) when it starts and
    timed when it ends; returns the exit status (0; 1 when a phase failed)."""
    out = out or sys.stderr
    start = time.perf_counter()

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    ready = kernels_compiled()
    say("compiling the Numba kernels" + (" (already compiled: checking)" if ready else
                                         " (once per install and CPU: about 30-60 s)") + " ...")
    try:
        k = compile_kernels(progress=progress)
    except RuntimeError as err:
        say(f"kernels: FAILED: {err}")
        return 1
    say(f"kernels: {k['kernels']} ready ({k['compiled']} compiled now, {k['loaded']} loaded from Numba's "
        f"cache) in {k['seconds']:.1f} s")
    if k["missed"]:
        say("kernels no warm-up run reached (they compile on first use): " + ", ".join(k["missed"]))
    model = None
    if weights or calibrate_dtypes:
        from .models import BUNDLED_NAME, smollm2_location

        try:
            smollm2_location()
        except RuntimeError as err:
            say(f"weights: skipped ({err})")
        else:
            say(f"keeping the converted weights of {BUNDLED_NAME} ...")
            t = time.perf_counter()
            model, _ = convert_weights(progress=progress)
            say(f"weights: ready in {time.perf_counter() - t:.1f} s")
    for dtype in calibrate_dtypes if model is not None else ():
        import torch

        threads = torch.get_num_threads()
        say(f"calibrating {dtype} at {threads} torch thread{'' if threads == 1 else 's'} ...")
        t = time.perf_counter()
        curve = calibrate(model, dtype)
        say(f"calibration ({dtype}): {time.perf_counter() - t:.1f} s"
            + (" (provisional: the machine was busy; not kept)" if curve.provisional else ""))
    say(f"warm-up done in {time.perf_counter() - start:.1f} s")
    return 0
