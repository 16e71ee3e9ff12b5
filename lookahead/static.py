"""One row on a static cache: :class:`Bucketed`, the step shape ``loop.Call`` runs for it.

The prompt's step runs eagerly at its own length; every later step runs one of a few *bucket* sizes (dummy rows pad
it), optionally compiled as transformers compiles plain static ``generate`` (one graph per bucket); rollback moves the
kept entries inside the cache's buffers and moves its length back (:func:`keep_static`). A static sliding layer is
given the cache's whole length for the call (:func:`full_length_layers`).
"""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np
import torch
from numba import njit
from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

from . import compat
from .cost import CostModel
from .drafting.draft import Draft
from .drafting.policy import Limits
from .kv import CacheNotRollbackable, cache_layers, move_kept
from .packing import MASK_BITS, fill_step_block, step_inputs
from .shapes import OneRow, Step
from .sliding import SlidingWindow
from .whole_step import pack_step


class StaticMask:
    """The masks of a static-cache call's steps, in one buffer ``[1, 1, rows, max_cache_len]`` of the model's dtype
    written in place (:func:`fill_static_block`); a step gets the view of its bucket's rows, or ValueError when it
    does not fit.

    Example: ``StaticMask(64, 512, torch.float32, "cpu")(past=100, pending=1, parents=array([-1, 0]), q=8)`` ->
    a [1, 1, 8, 512] view whose rows p, a, b see the 100 cached columns and ``p``, ``p a``, ``p a b``; the five
    dummy rows see the cached columns, ``p`` and themselves; columns from 108 on are hidden everywhere.
    """

    def __init__(self, rows: int, columns: int, dtype: torch.dtype, device, col_visible: np.ndarray | None = None):
        self.device = torch.device(device)
        self.col_visible = np.zeros(0, dtype=bool) if col_visible is None else np.asarray(col_visible, dtype=bool)
        self.bits = MASK_BITS[torch.finfo(dtype).bits // 8]
        self.neg = int(torch.tensor(torch.finfo(dtype).min, dtype=dtype).view(self.bits).item())
        self.buffer = torch.full((1, 1, rows, columns), torch.finfo(dtype).min, dtype=dtype, device=self.device)
        self._host = self.buffer[0, 0].view(self.bits).numpy() if self.device.type == "cpu" else None
        if self._host is None:  # on an accelerator: the same buffer on the host, copied over per step (its rows)
            self._host = np.full((rows, columns), self.neg, dtype=np.dtype(f"int{torch.finfo(dtype).bits}"))
        self.clean = self.dirty = self.rows_used = 0

    def __call__(self, past: int, pending: int, parents: np.ndarray, window_visible: np.ndarray | None,
                 q: int) -> torch.Tensor:
        window = np.zeros((0, 0), dtype=bool) if window_visible is None else window_visible
        if q > self._host.shape[0] or past + q > self._host.shape[1]:
            raise ValueError(f"a step of {q} rows after {past} cached columns does not fit the static cache's "
                             f"{self._host.shape[1]} columns")
        fill_static_block(self._host, past, pending, parents, window, self.col_visible, self.neg, self.clean,
                            self.dirty, self.rows_used, q)
        self.clean, self.dirty, self.rows_used = past, max(self.dirty, past + q), max(self.rows_used, q)
        if self.device.type != "cpu":
            self.buffer[0, 0, :q].view(self.bits).copy_(torch.from_numpy(self._host[:q]), non_blocking=False)
        return self.buffer[:, :, :q]


def canonical(t: torch.Tensor) -> torch.Tensor:
    """``t`` with the strides a new tensor of its shape has (a compiled graph guards on strides, even those of a
    dimension of size 1, which ``contiguous()`` leaves as they are)."""
    if t.stride() == torch.empty(t.shape, device="meta").stride():
        return t
    return t.clone(memory_format=torch.contiguous_format)


@njit(cache=True)
def fill_static_block(mask, past, p, parents, window_visible, col_visible, neg, clean_from, dirty_to, rows_used,
                      q):
    """One step's additive mask in ``mask`` [rows, max_cache_len] (all ``neg`` when new; earlier steps wrote columns
    ``clean_from .. dirty_to`` of its first ``rows_used`` rows): the step's ``q`` rows see the cached columns (but
    padding) and their block as ``packing.fill_step_block`` writes it, dummy rows the pending tokens and themselves;
    every later column is hidden."""
    for r in range(rows_used, q):  # rows never used: their cached columns
        for c in range(past):
            mask[r, c] = neg if (len(col_visible) and not col_visible[c]) else 0
    for r in range(rows_used):  # the last steps' columns past the cached ones: hidden again
        for c in range(past, min(dirty_to, mask.shape[1])):
            mask[r, c] = neg
    fill_step_block(mask, past, p, parents, window_visible, col_visible, neg, clean_from, rows_used)
    for r in range(p + len(parents) + window_visible.shape[0], q):  # dummy rows: the pending tokens and themselves
        for j in range(p):
            mask[r, past + j] = 0
        mask[r, past + r] = 0


class FullLengthSlidingLayer(StaticLayer):
    """A static sliding-window layer given its cache's whole length (:func:`full_length_layers`): a plain
    ``StaticLayer`` that keeps its ``sliding_window``, so that every later call on the cache masks it so."""

    def __init__(self, max_cache_len: int, sliding_window: int, replaces=None, **kwargs):
        super().__init__(max_cache_len=max_cache_len, **kwargs)
        self.sliding_window, self.replaces = sliding_window, replaces


def keep_static(cache, past: int, keep: list[int], q: int) -> None:
    """After a step of ``q`` rows written at columns ``past .. past + q - 1`` of a static cache: move the kept step
    columns ``keep`` (increasing) to the front of them (``kv.move_kept``) and the cache's length back over the rest.
    Example: past 10, q 8, keep ``[0, 2, 5]``: columns 12, 15 go to 11, 12 and the cache holds 13 columns."""
    layers = cache_layers(cache)
    move_kept(layers, [past] * len(layers), keep)
    compat.crop_cache(cache, q - len(keep))


def full_length_layers(model, cache, length: int) -> SlidingWindow | None:
    """Before any forward: replace a static cache's sliding-window layers (rings, which cannot drop rejected entries)
    by :class:`FullLengthSlidingLayer`s of the cache's length (its full layers', else ``length``), holding a ring's
    tokens at their own columns (``compat.adopt_ring``). Returns the :class:`SlidingWindow` that masks them, or None
    without such layers; ``kv.settle`` puts the layers back."""
    layers = cache_layers(cache)
    config = compat.text_config(model)  # the window of its sliding layers, or the chunk of its chunked ones
    window = getattr(config, "sliding_window", None) or getattr(config, "attention_chunk_size", None)
    swapped = [(i, layer) for i, layer in enumerate(layers) if type(layer) is StaticSlidingWindowLayer]
    if not swapped or window is None:
        return None
    full = [layer.max_cache_len for layer in layers if type(layer) is not StaticSlidingWindowLayer]
    columns = max(full) if full else length
    for i, layer in swapped:
        cache.layers[i] = FullLengthSlidingLayer(max_cache_len=columns, sliding_window=int(window), replaces=layer)
        if layer.is_initialized and layer.cumulative_length_int:
            compat.adopt_ring(cache.layers[i], layer)
    types = getattr(config, "layer_types", None)
    return SlidingWindow(int(window), None if types is None else tuple(types))


_RUN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per model, the (runner, cache length, bucket) shapes a forward has run with in this process (compiled, if so)."""
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per model, its compiled step per compile options (:func:`compiled_step`)."""
_LOCK = threading.Lock()


class Bucketed(OneRow):
    """One row on a static cache: a later step runs the smallest bucket that holds its rows and fits the cache's
    room (a draft that does not fit is cut: window rows first, then its deepest nodes)."""

    static = True

    def prepare(self) -> None:
        call = self.call
        call.sliding = full_length_layers(call.model, self.cache, call.gen.max_length)
        if call.sliding is not None and self.col_visible is not None:
            raise CacheNotRollbackable("a static cache with sliding-window layers decodes an unpadded row only (its "
                                       "columns are the row's positions); drop the padding, or use plain generate().")
        layers = cache_layers(self.cache)  # sliding-window or offloaded static layers' columns are not the sequence's
        if not layers or any(type(layer) not in (StaticLayer, FullLengthSlidingLayer) for layer in layers):
            raise CacheNotRollbackable(
                f"LookaheadDecoder rolls back a static cache whose layers are all StaticLayer; this one has "
                f"{sorted({type(layer).__name__ for layer in layers})} (sliding-window, hybrid or "
                "offloaded static layers). Drop cache_implementation, or use plain generate().")
        if call.sync is not None:
            raise ValueError("LookaheadDecoder with a static cache does not run under tensor parallelism; drop "
                             "cache_implementation='static' (the dynamic cache is synchronised across ranks).")
        self.columns = int(min(layer.max_cache_len for layer in layers))
        needed = call.max_length - 1  # the columns plain static generate fills: every token but the last
        if self.columns < needed:
            raise ValueError(f"the static cache holds {self.columns} tokens and this call needs {needed} "
                             f"(max_length - 1 = {call.max_length} - 1): pass a StaticCache with max_cache_len >= "
                             f"{needed}, or let generate() make it (cache_implementation='static').")
        decoder = call.decoder
        self.buckets = buckets_for(decoder.policy.first_rows(), decoder.tuning.buckets)
        compile_config = compile_settings(call.model, call.gen)
        self.compiled = compile_config is not None
        self.runner = compiled_step(call.model, compile_config) if self.compiled else call.eager
        self.runner_key = repr(compile_config.to_dict()) if self.compiled else "eager"
        with _LOCK:
            self.ran: set = _RUN.setdefault(call.model, set())
        call.stats.time_compile = 0.0
        self.bucket = 1
        if decoder.tuning.adaptive:
            t = call.clock()
            curve = CostModel(decoder.config.cost_curve) if decoder.config.cost_curve else self.calibrate()
            call.stats.time_calibration = call.clock() - t - call.stats.time_compile
            call.cost = bucketed_curve(curve, self.buckets)
            call.stats.cost_curve = curve.points
            call.stats.cost_steps, call.stats.cost_provisional = curve.steps, curve.provisional
        self.static_mask = StaticMask(self.buckets[-1], self.columns, call.dtype, call.device, self.col_visible)

    def limits(self) -> Limits:
        """Every step fits in the cache (its length acts as a window) and in the largest bucket."""
        return Limits(self.call.max_length, self.columns + 1, self.buckets[-1])

    def calibrate(self) -> CostModel:
        """Every bucket's forward time on this call's cache and runner (kept per model, device, dtype, cache length
        and runner); each bucket's first (compiling) run is timed apart."""
        call = self.call
        clock, device, past = call.clock, call.device, self.past
        sizes = tuple(b for b in self.buckets if b <= self.columns - past) or (1,)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

        def measure(_) -> CostModel:
            from .calibrate import calibrate_curve

            ids = torch.randint(0, call.vocab, (1, max(sizes)), generator=torch.Generator().manual_seed(0)).to(device)
            mask = StaticMask(self.buckets[-1], self.columns, call.dtype, device)  # the decoding mask's strides

            def run(k: int) -> None:  # a chain of k - 1 nodes after one pending token
                m = mask(past, 1, np.arange(-1, k - 2), None, k)
                pos = canonical(torch.arange(past, past + k, device=device)[None])
                compat.last_logits(self.runner, canonical(ids[:, :k]), pos, self.masks(m, pos, past),
                                   call.forward_kwargs, call.keeps_logits, k)
                compat.crop_cache(self.cache, k)

            def time_one(k: int) -> float:
                sync()
                t = clock()
                run(k)
                sync()
                return clock() - t

            with torch.no_grad():
                for k in sizes:  # the first run of each bucket compiles it: not a timing
                    self._warm(k, lambda k=k: run(k))
                return calibrate_curve(time_one, sizes, clock=clock)

        variant = f"static/{'compiled' if self.compiled else 'eager'}/{self.columns}"
        return call.decoder.calibrations.get(call.model, max(sizes), measure, variant,
                                             persist=None if clock is time.perf_counter else False)

    def _warm(self, k: int, fn) -> bool:
        """Run ``fn``, bucket ``k``'s first forward in this process, timing it apart; False when it ran before."""
        key = (self.runner_key, self.columns, k)
        if key in self.ran:
            return False
        t = self.call.clock()
        fn()
        if self.compiled:
            self.call.stats.time_compile += self.call.clock() - t
        self.ran.add(key)
        return True

    def fit(self, draft: Draft) -> Draft:
        if self.rows.pending.shape[1] > 1:
            return draft
        q = bucket_of(1 + draft.rows, self.buckets, self.columns - self.past)
        if 1 + draft.rows > q:
            draft = draft.without_window()
            if 1 + len(draft) > q:
                draft = draft.shallowest(q - 1)
        return draft

    def pack(self, drafts) -> Step:
        """The prompt's step at its own length, with a mask over every column of the cache; later steps at the
        bucket's shape, dummy rows after the draft."""
        call, d, rows = self.call, drafts[0], self.rows
        pending, pending_pos = rows.pending[0], rows.pending_pos[0]
        if len(pending) > 1:
            self.bucket = 0
            if not d.rows and self.col_visible is None:  # plain: the model's own (static-aware) causal mask
                return Step(*step_inputs(pending, pending_pos, d.tokens, d.depth, None, call.device), None, 1)
            columns = None if self.col_visible is None else self.col_visible[: int(rows.length[0])]
            ids, pos, mask = pack_step(pending, pending_pos, d.tokens, d.parents, columns, self.past, call.dtype,
                                       d.window, call.device, d.depth)
            full = torch.nn.functional.pad(mask, (0, self.columns - mask.shape[-1]), value=torch.finfo(call.dtype).min)
            return Step(ids, pos, self.masks(full, pos), 1 + d.rows)
        q = bucket_of(1 + d.rows, self.buckets, self.columns - self.past)
        ids, pos = step_inputs(pending, pending_pos, d.tokens, d.depth, d.window, call.device)
        if q > ids.shape[1]:  # dummy rows: token 0 one past the pending position
            pos = torch.cat([pos, pos[:, :1].expand(1, q - ids.shape[1]) + 1], 1)
            ids = torch.nn.functional.pad(ids, (0, q - ids.shape[1]))
        ids, pos = canonical(ids), canonical(pos)  # the strides a bucket's graph was compiled for
        mask = self.static_mask(self.past, 1, d.parents, None if d.window is None else d.window.visible, q)
        self.bucket = q
        return Step(ids, pos, self.masks(mask, pos), 1 + d.rows)

    def masks(self, mask: torch.Tensor, pos: torch.Tensor, past: int | None = None):
        """A step's masks from its full one [1, 1, q, columns]: itself, or with the sliding layers' beside it."""
        if self.call.sliding is None:
            return mask
        return self.call.sliding.static_masks(mask, pos, self.past if past is None else past)

    def run(self, step: Step, keep: int) -> torch.Tensor:
        """The prompt's forward eagerly; a bucket's through the runner (its first run compiles it)."""
        call = self.call
        if not self.bucket:
            return call.forward(step.ids, step.pos, step.mask, keep, runner=call.eager)
        q, out = self.bucket, []
        if not self._warm(q, lambda: out.append(call.forward(step.ids, step.pos, step.mask, q, runner=self.runner))):
            out.append(call.forward(step.ids, step.pos, step.mask, q, runner=self.runner))
        if call.wants_hidden:
            call.hidden = call.hidden[:, :keep]
        return out[0][:, :keep]

    def keep(self, p: int, drafts, accepted) -> None:
        """Keep the pending tokens' and accepted nodes' entries inside the buffers; the rest (dummies too) go back."""
        d, nodes = drafts[0], accepted[0]
        keep_static(self.cache, self.past, list(range(p)) + [p + j for j in nodes], self.bucket or (p + d.rows))
        self.advance(p, nodes)


def buckets_for(max_rows: int, buckets) -> tuple[int, ...]:
    """The buckets up to the first that holds ``max_rows`` rows. Example: 20 -> ``(1, 8, 16, 32)``."""
    buckets = tuple(buckets)
    return buckets[: next((i for i, b in enumerate(buckets) if b >= max_rows), len(buckets) - 1) + 1]


def bucket_of(rows: int, buckets: tuple[int, ...], room: int) -> int:
    """The smallest bucket that holds ``rows`` and fits ``room`` columns, else the largest that fits (none: 1).
    Example: ``bucket_of(9, (1, 8, 16), 100)`` -> 16; with room 12 -> 8."""
    fitting = [b for b in buckets if b <= room]
    return next((b for b in fitting if b >= rows), fitting[-1] if fitting else 1)


def bucketed_curve(curve: CostModel, buckets: tuple[int, ...]) -> CostModel:
    """``curve`` read at ``buckets`` as steps: ``t(k)`` is the time of the smallest bucket >= k. Example: points
    ``(1, 10), (8, 12), (16, 15)`` -> ``t(2 .. 8) = 12``, ``t(9 .. 16) = 15``."""
    return CostModel([(b, float(curve(b))) for b in buckets], curve.provisional, steps=True)


def compile_settings(model, gen):
    """The ``CompileConfig`` a static-cache call compiles its steps with, or None (eager), as plain ``generate``
    decides it: never with ``disable_compile``; the generation config's where it applies (CUDA/XPU, or any device
    when it asks for all); transformers' default on CUDA/XPU; eager elsewhere and for a model offloaded to the CPU
    or disk."""
    from transformers import CompileConfig

    if getattr(gen, "disable_compile", False):
        return None
    devices = set((getattr(model, "hf_device_map", None) or {}).values())
    if "disk" in devices or ("cpu" in devices and len(devices) > 1):
        return None
    config = getattr(gen, "compile_config", None)
    accelerated = model.device.type in ("cuda", "xpu")
    if config is not None and (accelerated or compat.compiles_on_all_devices(config)):
        return config
    return CompileConfig() if accelerated else None


def compiled_step(model, compile_config):
    """``model``'s forward compiled with ``compile_config``'s options, once per model and options: a function of its
    own, whose graphs (one per bucket) count against their own recompilation limit, not plain ``generate``'s."""
    options = compile_config.to_dict()
    with _LOCK:  # concurrent first calls of a model compile once
        per_model = _COMPILED.setdefault(model, {})
        key = repr(sorted(options.items(), key=lambda kv: kv[0]))
        if key not in per_model:
            def step(**kwargs):
                return model(**kwargs)

            per_model[key] = torch.compile(step, **options)
        return per_model[key]
