"""``python -m lookahead warmup`` (:func:`run`): every Numba kernel compiled into Numba's on-disk cache, the bundled
model's converted weights kept, with ``--calibrate`` its cost curve. ``python -m lookahead.tools.warmup``: the
background compiler a call starts (:func:`compile_in_background`)."""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import time

from ..numba_kernels import compile_inline, kernels, kernels_compiled, missed_kernels

DTYPES = ("float32", "bfloat16", "float16", "float64")
PROMPT = [3, 10, 11, 12, 13, 14] * 5 + [3, 10, 11]  # repeats: the n-gram sources draft at once


def ensure_kernels() -> None:
    """Compile every kernel now, announced, when Numba's cache lacks any of them."""
    if kernels_compiled() is not False:
        return
    from .console import phase

    with phase("compiling the Numba kernels once (`python -m lookahead warmup` does it ahead)"):
        compile_kernels(progress=True)


def cache_counts() -> tuple[int, int]:
    """(signatures compiled, signatures loaded from Numba's on-disk cache) in this process so far."""
    found = [d for _, d in kernels()]
    return (sum(sum(d.stats.cache_misses.values()) for d in found),
            sum(sum(d.stats.cache_hits.values()) for d in found))


def tiny_model(dtype: str):
    """A tiny random Llama (2 layers, vocabulary 64) in ``dtype``: no download."""
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
    """(name, decoder settings, generate settings, rows) of every way :func:`compile_kernels` decodes: every kernel
    compiles for the argument types real calls pass (``store=True``: a fresh shared n-gram store)."""
    from .._tuning import Tuning

    greedy, sampled = {"do_sample": False}, {"do_sample": True, "temperature": 0.7, "top_p": 0.9}
    bans = {"do_sample": False, "eos_token_id": 0, "min_new_tokens": 8, "suppress_tokens": [5]}
    static = {"cache_implementation": "static"}
    window = {"window": 4, "_tuning": Tuning(window_ngram=3, window_candidates=2)}
    return [
        ("greedy", {}, greedy, 1),
        ("sampled", {}, sampled, 1),
        ("window", window, greedy, 1),
        ("window, sampled", window, sampled, 1),
        ("shared n-gram store", {"store": True}, greedy, 1),
        ("draft pass", {"draft": "early-exit", "_tuning": Tuning(self_draft_size=0.5)}, greedy, 1),
        ("batch", {}, greedy, 2),
        ("batch, sampled", {}, sampled, 2),
        ("token bans", {}, bans, 1),
        ("batch, token bans", {}, bans, 2),
        ("static cache", {}, {**greedy, **static}, 1),
        ("static cache, window", window, {**sampled, **static}, 1),
    ]


def decode(model, settings: dict, generate: dict, rows: int) -> None:
    """One short ``generate`` on ``rows`` rows (the second left-padded) on a flat cost curve."""
    import torch

    from ..cache import NgramTrie
    from ..decoder import LookaheadDecoder

    if settings.get("store"):
        settings = {**settings, "store": NgramTrie(max_n=6, capacity=4096)}
    decoder = LookaheadDecoder(cost_curve="flat", **settings)
    ids = torch.tensor([PROMPT] * rows)
    mask = torch.ones_like(ids)
    if rows > 1:
        ids[1, :3], mask[1, :3] = 0, 0
    torch.manual_seed(0)
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, custom_generate=decoder,
                       **{"max_new_tokens": 12, "eos_token_id": None, **generate})


def exercise_other_paths() -> None:
    """The kernels the decodes do not reach (eviction, saving, loading, listing, clearing, heads' trees)."""
    import numpy as np

    from ..cache import NgramTrie, SuffixIndex
    from ..drafting.recycle import SuccessorTable
    from ..drafting.trees import best_chain, tree_depth_rank

    trie = NgramTrie(max_n=4, capacity=64)
    trie.insert(np.random.default_rng(0).integers(0, 50, 400))  # far more than fits: evicts
    trie.propose([1, 2, 3], max_nodes=8, max_depth=4, with_match=True)
    trie.ngrams()
    with tempfile.TemporaryDirectory() as folder:
        trie.save(os.path.join(folder, "trie.bin"))
        NgramTrie.load(os.path.join(folder, "trie.bin"))
    index = SuffixIndex(8)
    index.extend(np.array([1, 2, 1, 2, 3, 1, 2, 1, 2, 3] * 3, np.int64))  # grows past its capacity
    index.propose(4, 4, 2, 2)
    table = SuccessorTable(2, rows=64)
    table.update(np.array([-1]), np.array([3]), np.array([[4, 5]]), np.zeros((1, 2), np.float32))
    table.clear()
    tree_depth_rank(np.array([-1, -1, 0, 0, 1]))
    best_chain(np.array([-1, 0, -1], np.int64), np.ones(3))


def compile_kernels(progress: bool = False) -> dict:
    """Compile (or load from Numba's cache) every kernel: ``{"seconds", "compiled", "loaded", "kernels", "missed",
    "failed"}`` (``failed``: a run that raised -> its error)."""
    from tqdm.auto import tqdm

    compile_inline()  # the decoders below compile what they need here, not in the background
    t = time.perf_counter()
    runs = [(f"{name} ({dtype})", dtype, s, g, r) for dtype in DTYPES for name, s, g, r in workloads()]
    models, failed = {}, {}
    exercise_other_paths()
    for label, dtype, settings, generate, rows in tqdm(runs, desc="kernels", unit="run", leave=False,
                                                       file=sys.stderr, disable=None if progress else True):
        try:
            decode(models.setdefault(dtype, tiny_model(dtype)), settings, generate, rows)
        except Exception as err:  # one way of decoding refused: the others still compile
            failed[label] = f"{type(err).__name__}: {err}"
    compiled, loaded = cache_counts()
    return {"seconds": time.perf_counter() - t, "compiled": compiled, "loaded": loaded, "kernels": len(kernels()),
            "missed": missed_kernels(), "failed": failed}


def run(weights: bool = True, calibrate_dtypes: tuple[str, ...] = ()) -> int:
    """``python -m lookahead warmup``, each phase announced on stderr and timed; the exit status."""
    say, start = functools.partial(print, file=sys.stderr, flush=True), time.perf_counter()
    say("compiling the Numba kernels" + (" (already compiled: checking)" if kernels_compiled() else
                                         " (once per install and CPU)") + " ...")
    k = compile_kernels(progress=True)
    say(f"kernels: {k['kernels']} ready ({k['compiled']} compiled now, {k['loaded']} loaded from Numba's cache) "
        f"in {k['seconds']:.1f} s")
    for label, err in k["failed"].items():
        say(f"kernels: warm-up run {label!r} FAILED: {err}")
    if k["missed"]:
        say("kernels no warm-up run reached (they compile on first use): " + ", ".join(k["missed"]))
    if weights or calibrate_dtypes:
        import torch

        from .._tuning import Tuning
        from ..decoder import LookaheadDecoder
        from .models import BUNDLED_NAME, load_smollm2, smollm2_location

        try:
            smollm2_location()
        except RuntimeError as err:
            say(f"weights: skipped ({err})")
            calibrate_dtypes = ()
        else:
            say(f"keeping the converted weights of {BUNDLED_NAME} ...")
            t = time.perf_counter()
            model, _ = load_smollm2(progress=True)
            say(f"weights: ready in {time.perf_counter() - t:.1f} s")
        for dtype in calibrate_dtypes:  # one short call measures and keeps (or reads back) the cost curve
            threads = torch.get_num_threads()
            say(f"calibrating {dtype} at {threads} torch thread{'' if threads == 1 else 's'} ...")
            t, decoder = time.perf_counter(), LookaheadDecoder(_tuning=Tuning(calibrate=True))
            model.to(getattr(torch, dtype))
            with torch.inference_mode():
                model.generate(torch.tensor([PROMPT]), max_new_tokens=2, custom_generate=decoder)
            say(f"calibration ({dtype}): {time.perf_counter() - t:.1f} s" + (
                " (provisional: the machine was busy; not kept)" if decoder.stats.cost_provisional else ""))
    say(f"warm-up done in {time.perf_counter() - start:.1f} s")
    return 1 if k["failed"] else 0


def compile_in_background() -> None:
    """Take the lock (a stale one taken over), lower the priority, compile every kernel, unlock; return at once
    while another live process holds the lock."""
    import contextlib

    from ..kernel_compiler import lock_held, lock_path

    path = lock_path()
    if lock_held():
        return
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except OSError:
        return  # another process compiles
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        with contextlib.suppress(OSError, AttributeError):
            os.nice(19)
        compile_kernels()
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)


if __name__ == "__main__":
    compile_in_background()
