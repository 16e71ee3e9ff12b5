"""Static KV caches and fixed-shape, compiled steps: the decoder on the path plain static ``generate`` takes.

``generate(..., cache_implementation="static", custom_generate=decoder)`` (or a ``StaticCache`` passed as the
cache) hands the decoder a cache of preallocated buffers, ``[batch, heads, max_cache_len, head_dim]`` per
layer, that a forward writes in place at the cache's length (``StaticLayer.cumulative_length``) and
attends over in full. :class:`StaticCall` is the one-row decode loop (``decoder.SingleCall``'s) over it:

- **Fixed shapes.** Every step after the prompt's runs a forward of one of a few *bucket* sizes
  (:data:`BUCKETS`): the pending token and the draft rows, padded with dummy rows (each sees the pending
  token and itself; their outputs are never read). Its mask (:class:`StaticMask`) covers all
  ``max_cache_len`` columns, in one preallocated buffer of which a step writes only its own block.
- **Rollback in place.** After the verdict the accepted path's entries move to the front of the step's
  columns, one index per layer (:func:`keep_static`), and the cache's length moves back over the rest
  (``StaticLayer.crop``): nothing is reallocated; the next step overwrites the stale columns.
- **Compiled like transformers compiles.** With a ``compile_config`` in the generation config (on any device
  where it asks for all devices, ``CompileConfig(..., )`` with ``_compile_all_devices``), or on CUDA/XPU with
  a static cache and no ``disable_compile``, as plain ``generate`` does (:func:`compile_settings`), each
  bucket's forward runs compiled with the same options: one graph per bucket, compiled on
  its first use (CUDA graphs with ``mode="reduce-overhead"``, transformers' default on CUDA), in a compiled
  function of its own (:func:`compiled_step`). The prompt's forward, of its own length, runs eagerly, as in
  plain ``generate``.
- **Priced on its own path.** The budget prices a step with the forward time of its bucket, measured on the
  call's cache and runner (compiled or not) at the bucket sizes (:func:`bucketed_curve`: a step function, so
  a step with 9 rows costs what 16 do), kept per model, device, dtype, cache length and runner in the
  decoder's calibrations; each bucket's first (compiling) run is timed apart (``stats.time_compile``).
- **A full cache.** Every step fits in the cache (its bucket is at most the room left); a cache too short for
  the call (``max_cache_len < max_length - 1``, the columns plain static ``generate`` needs) is refused up front.

- **Sliding-window layers.** A static sliding layer keeps its window's columns in a ring, whose rejected entries
  could not be dropped. Before the first forward :func:`full_length_layers` gives each one the cache's length (a
  :class:`FullLengthSlidingLayer`, which remembers its window), and every step passes those layers their own mask,
  the full one with each row's keys outside its window (or chunk) hidden (``sliding.SlidingWindow.static_masks``).
  The same attention as plain static ``generate``'s, with more memory for those layers.

Batch size 1; batches with a static cache are refused (``call.check_supported``).
"""

from __future__ import annotations

import time
import weakref

import numpy as np
import torch
from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

from . import call, compat
from . import kernels as K
from .cost import CostModel, calibrate_curve
from .draft import Draft
from .kv_cache import CacheNotRollbackable, cache_layers, move_kept
from .policy import Limits
from .single import SingleCall
from .sliding import SlidingWindow
from .tree import MASK_BITS, pack_step, step_inputs

_RUN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per model, the (runner, cache length, bucket) shapes a forward has run with in this process: a compiled one's
graph is then in torch's cache, and its next run is no warm-up."""

BUCKETS = (1, 8, 16, 32, 64, 128, 256)
"""Query rows a step's forward may have after the prompt's (the smallest that holds the step's rows): a few
shapes, so a compiled forward has one graph each; the ones above the policy's most rows are not used."""


def static_layers(cache) -> bool:
    """Whether ``cache`` is a static one the decoder can roll back: every layer a plain ``StaticLayer`` or one
    :func:`full_length_layers` made (sliding-window or offloaded static layers are not: their columns are not the
    sequence's)."""
    layers = cache_layers(cache)
    return bool(layers) and all(type(layer) in (StaticLayer, FullLengthSlidingLayer) for layer in layers)


class FullLengthSlidingLayer(StaticLayer):
    """A static sliding-window layer given its cache's whole length (:func:`full_length_layers`): a plain
    ``StaticLayer`` that keeps its ``sliding_window``, so that every later call on the cache masks it so."""

    def __init__(self, max_cache_len: int, sliding_window: int, **kwargs):
        super().__init__(max_cache_len=max_cache_len, **kwargs)
        self.sliding_window = sliding_window


def full_length_layers(model, cache, length: int) -> SlidingWindow | None:
    """Before any forward: ``cache``'s static sliding-window layers (which keep a window's columns in a ring, so a
    step's entries cannot be dropped past it) replaced, in place, by :class:`FullLengthSlidingLayer`s: plain static
    layers of the cache's length (its full layers', else ``length``) that remember their window. Returns how the
    sliding layers' masks are made (the window and the model's layer types) for a cache that has such layers (given
    now, or by an earlier call), else None; also None when a sliding layer was written already (then the static
    check refuses it). A sliding layer so holds every column, as a full one does: more memory than plain static
    ``generate``'s (the cache's length in place of the window, per sliding layer), the same attention."""
    layers = cache_layers(cache)
    windows = {layer.sliding_window for layer in layers if type(layer) is FullLengthSlidingLayer}
    if any(type(layer) is StaticSlidingWindowLayer for layer in layers):
        config = compat.text_config(model)  # the window of its sliding layers, or the chunk of its chunked ones
        window = getattr(config, "sliding_window", None) or getattr(config, "attention_chunk_size", None)
        if any(layer.is_initialized for layer in layers) or window is None:
            return None
        full = [layer.max_cache_len for layer in layers if type(layer) is not StaticSlidingWindowLayer]
        columns = max(full) if full else length
        window = int(window)
        cache.layers[:] = [FullLengthSlidingLayer(max_cache_len=columns, sliding_window=window)
                           if type(layer) is StaticSlidingWindowLayer else layer for layer in layers]
        windows.add(window)
    if not windows:
        return None
    if len(windows) > 1:
        raise CacheNotRollbackable(f"the static cache's sliding layers have windows {sorted(windows)}; "
                                   "LookaheadDecoder decodes one window only. Use plain generate() for this model.")
    types = getattr(compat.text_config(model), "layer_types", None)
    return SlidingWindow(windows.pop(), None if types is None else tuple(types))


def static_cache(cache) -> bool:
    """Whether ``cache`` is a static one this loop takes: every layer a ``StaticLayer``, a static sliding-window layer
    (:func:`full_length_layers` gives those the cache's length; one written already is refused) or one it made."""
    layers = cache_layers(cache)
    return bool(layers) and all(type(layer) in (StaticLayer, StaticSlidingWindowLayer, FullLengthSlidingLayer)
                                for layer in layers)


def cache_length(cache) -> int:
    """``max_cache_len`` of a static cache (every layer's)."""
    return int(min(layer.max_cache_len for layer in cache_layers(cache)))


def buckets_for(max_rows: int, buckets=BUCKETS) -> tuple[int, ...]:
    """The buckets up to the first that holds ``max_rows`` rows. Example: ``buckets_for(20)`` -> ``(1, 8, 16, 32)``."""
    out = []
    for b in buckets:
        out.append(b)
        if b >= max_rows:
            break
    return tuple(out)


def bucket_of(rows: int, buckets: tuple[int, ...], room: int) -> int:
    """The smallest bucket that holds ``rows`` query rows and fits in ``room`` cache columns, else the largest
    that fits (the step's draft is then cut to it). Example: ``bucket_of(9, (1, 8, 16), 100)`` -> 16; with room 12
    -> 8."""
    fitting = [b for b in buckets if b <= room]
    for b in fitting:
        if b >= rows:
            return b
    return fitting[-1] if fitting else 1


def bucketed_curve(curve: CostModel, buckets: tuple[int, ...]) -> CostModel:
    """``curve`` read at ``buckets`` as steps (``CostModel(steps=True)``): ``t(k)`` is the time of the smallest
    bucket >= k (a step with ``k`` rows runs that bucket's forward).

    Example: points ``(1, 10), (8, 12), (16, 15)`` ms over buckets (1, 8, 16) -> ``t(1) = 10``, ``t(2 .. 8) = 12``,
    ``t(9 .. 16) = 15``; beyond the last bucket the last segment's slope continues (3 ms per 8 rows)."""
    return CostModel([(b, float(curve(b))) for b in buckets], curve.provisional, steps=True)


def compile_settings(model, gen):
    """The ``CompileConfig`` a static-cache call compiles its steps with, or None (eager), as plain ``generate``
    decides it for a static cache (its ``_valid_auto_compile_criteria``): never with ``disable_compile``; with
    the generation config's ``compile_config`` where it applies (CUDA/XPU, or any device when it asks for all);
    transformers' default one on CUDA/XPU; eager elsewhere, and on a model offloaded to the CPU or disk."""
    from transformers import CompileConfig

    if getattr(gen, "disable_compile", False):
        return None
    config = getattr(gen, "compile_config", None)
    device_map = getattr(model, "hf_device_map", None)
    if device_map is not None:
        devices = set(device_map.values())
        if "disk" in devices or ("cpu" in devices and len(devices) > 1):
            return None
    accelerated = model.device.type in ("cuda", "xpu")
    if config is not None and (accelerated or getattr(config, "_compile_all_devices", False)):
        return config
    return CompileConfig() if accelerated else None


_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per model, its compiled step per compile options (:func:`compiled_step`)."""


def compiled_step(model, compile_config):
    """``model``'s forward compiled with ``compile_config``'s options (``torch.compile(...,
    **compile_config.to_dict())``, as ``model.get_compiled_call`` compiles plain ``generate``'s step), made once per
    model and options. It is a function of its own, not the model's own compiled call: its graphs (one per
    bucket) count against their own recompilation limit, not against the one plain ``generate``'s graphs share."""
    options = compile_config.to_dict()
    per_model = _COMPILED.setdefault(model, {})
    key = repr(sorted(options.items(), key=lambda kv: kv[0]))
    if key not in per_model:
        def step(**kwargs):
            return model(**kwargs)

        per_model[key] = torch.compile(step, **options)
    return per_model[key]


def keep_static(cache, past: int, keep: list[int], q: int) -> None:
    """After a step of ``q`` rows written at columns ``past .. past + q - 1`` of a static cache: move the kept
    step columns ``keep`` (increasing) to the front of them (``kv_cache.move_kept``), and move the cache's length
    back over the rest (the next step overwrites them). Example: past 10, q 8, keep ``[0, 2, 5]``: columns 12, 15
    go to 11, 12 and the cache holds 13 columns."""
    layers = cache_layers(cache)
    move_kept(layers, [past] * len(layers), keep)
    if q > len(keep):
        for layer in layers:
            layer.crop(-(q - len(keep)))


def _canonical(t: torch.Tensor) -> torch.Tensor:
    """``t`` with the strides a new tensor of its shape has (a compiled graph guards on strides, even those of a
    dimension of size 1, which ``contiguous()`` leaves as they are)."""
    return t if t.stride() == torch.empty(t.shape, device="meta").stride() else t.clone(memory_format=torch.contiguous_format)


class StaticMask:
    """The masks of a static-cache call's steps, over all ``max_cache_len`` columns, in one buffer ``[1, 1, rows,
    max_cache_len]`` of the model's dtype, written in place (``kernels.fill_static_block``): a step writes its
    block, restores the columns the last steps touched, and returns the view of its bucket's rows.

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

    def __call__(self, past: int, pending: int, parents: np.ndarray, window_visible: np.ndarray | None = None,
                 q: int | None = None) -> torch.Tensor:
        window = np.zeros((0, 0), dtype=bool) if window_visible is None else window_visible
        real = pending + len(parents) + window.shape[0]
        q = real if q is None else q
        if q > self._host.shape[0] or past + q > self._host.shape[1]:
            raise ValueError(f"a step of {q} rows after {past} cached columns does not fit the static cache's "
                             f"{self._host.shape[1]} columns")
        K.fill_static_block(self._host, past, pending, parents, window, self.col_visible, self.neg, self.clean,
                            self.dirty, self.rows_used, q)
        self.clean, self.dirty, self.rows_used = past, max(self.dirty, past + q), max(self.rows_used, q)
        if self.device.type != "cpu":
            rows = self.buffer[0, 0, :q].view(self.bits)
            rows.copy_(torch.from_numpy(self._host[:q]), non_blocking=False)
        return self.buffer[:, :, :q]


class StaticCall(SingleCall):
    """One ``generate`` call of one row on a static cache (see the module docstring): ``SingleCall``'s loop with
    bucketed, optionally compiled steps and rollback inside the cache's buffers."""

    def __init__(self, decoder, model, input_ids, logits_processor, stopping_criteria, generation_config,
                 streamer, model_kwargs):
        self.decoder = decoder
        super().__init__(decoder, model, input_ids, logits_processor, stopping_criteria, generation_config,
                         streamer, model_kwargs)
        rows = self.buckets[-1]
        self.static_mask = StaticMask(rows, self.columns, self.setup.dtype, self.device, self.col_visible)
        self.bucket = 1  # the last step's forward rows

    def prepare(self, decoder, model, input_ids, logits_processor, stopping_criteria, generation_config,
                model_kwargs) -> call.CallSetup:
        setup = call.prepare(decoder, model, input_ids, logits_processor, stopping_criteria, generation_config,
                             model_kwargs, static=True)
        self.sliding = full_length_layers(model, setup.cache, setup.gen.max_length)
        mask = model_kwargs.get("attention_mask")
        if self.sliding is not None and mask is not None and not bool((mask == 1).all()):
            raise CacheNotRollbackable("a static cache with sliding-window layers decodes an unpadded row only (its "
                                       "columns are the row's positions); drop the padding, or use plain generate().")
        if not static_layers(setup.cache):
            raise CacheNotRollbackable(
                f"LookaheadDecoder rolls back a static cache whose layers are all StaticLayer; this one has "
                f"{sorted({type(layer).__name__ for layer in cache_layers(setup.cache)})} (sliding-window, hybrid or "
                "offloaded static layers). Drop cache_implementation, or use plain generate()."
            )
        if setup.sync.active:
            raise ValueError("LookaheadDecoder with a static cache does not run under tensor parallelism; drop "
                             "cache_implementation='static' (the dynamic cache is synchronised across ranks).")
        self.columns = cache_length(setup.cache)
        needed = setup.max_length - 1  # the columns plain static generate fills: every token but the last
        if self.columns < needed:
            raise ValueError(f"the static cache holds {self.columns} tokens and this call needs {needed} "
                             f"(max_length - 1 = {setup.max_length} - 1): pass a StaticCache with max_cache_len >= "
                             f"{needed}, or let generate() make it (cache_implementation='static').")
        self.buckets = buckets_for(decoder.policy.max_rows())
        compile_config = compile_settings(model, setup.gen)
        setup.runner = None if compile_config is None else compiled_step(model, compile_config)
        self.compiled = compile_config is not None
        self.runner_key = repr(compile_config.to_dict()) if compile_config is not None else "eager"
        self.compiled_buckets: set = _RUN.setdefault(model, set())
        decoder.stats.time_compile = 0.0
        if decoder.config.adaptive:
            t = decoder.clock()
            curve = CostModel(decoder.config.cost_curve) if decoder.config.cost_curve else self.calibrate(setup)
            decoder.stats.time_calibration = decoder.clock() - t - decoder.stats.time_compile
            setup.cost = bucketed_curve(curve, self.buckets)
            decoder.stats.cost_curve = curve.points
            decoder.stats.cost_steps, decoder.stats.cost_provisional = curve.steps, curve.provisional
        return setup

    def limits(self) -> Limits:
        """Every step fits in the cache: the policy treats its length as a window (drafts shrink near its end), and
        in the largest bucket (``step_nodes="auto"`` does not widen past it)."""
        return Limits(self.max_length, self.columns + 1, self.buckets[-1])

    # -- pricing ---------------------------------------------------------------------------------------------

    def calibrate(self, setup: call.CallSetup) -> CostModel:
        """The forward time of every bucket on this call's cache and runner (kept per model, device, dtype, cache
        length and runner in the decoder's calibrations); each bucket's first run, which compiles it, is timed
        apart."""
        past = int(setup.cache.get_seq_length())
        room = self.columns - past
        sizes = tuple(b for b in self.buckets if b <= room) or (1,)
        variant = f"static/{'compiled' if self.compiled else 'eager'}/{self.columns}"
        persist = None if self.decoder.clock is time.perf_counter else False  # an injected clock: not this machine's
        return self.decoder.calibrations.get(setup.model, max(sizes), lambda _: self._time_buckets(setup, sizes),
                                             variant, persist=persist)

    def _time_buckets(self, setup: call.CallSetup, sizes: tuple[int, ...]) -> CostModel:
        clock, device = self.decoder.clock, setup.device
        past = int(setup.cache.get_seq_length())
        vocab = call.vocabulary_size(setup.model)
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (1, max(sizes)), generator=gen).to(device)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        mask = StaticMask(self.buckets[-1], self.columns, setup.dtype, device)  # the decoding mask's strides

        def run(k: int) -> None:  # a chain of k - 1 nodes after one pending token
            m = mask(past, 1, np.arange(-1, k - 2), None, k)
            pos = _canonical(torch.arange(past, past + k, device=device)[None])
            self._forward(setup, _canonical(ids[:, :k]), pos, self.masks(m, pos, past), k)
            for layer in cache_layers(setup.cache):
                layer.crop(-k)

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

    def _warm(self, k: int, fn) -> bool:
        """Run ``fn``, bucket ``k``'s first forward in this process, timing it apart (a compiled bucket's first
        run compiles it); False when the bucket has run before (``fn`` not run)."""
        key = (self.runner_key, self.columns, k)
        if key in self.compiled_buckets:
            return False
        t = self.decoder.clock()
        fn()
        if self.compiled:
            self.decoder.stats.time_compile += self.decoder.clock() - t
        self.compiled_buckets.add(key)
        return True

    @staticmethod
    def _forward(setup: call.CallSetup, ids, pos, mask, keep: int) -> torch.Tensor:
        runner = setup.runner if setup.runner is not None else setup.model
        kwargs = {**setup.forward_kwargs, "logits_to_keep": keep} if setup.keeps_logits else setup.forward_kwargs
        return runner(input_ids=ids, position_ids=pos, attention_mask=mask, **kwargs).logits[:, -keep:].float()

    # -- one step ----------------------------------------------------------------------------------------------

    def fit(self, draft: Draft) -> Draft:
        """A step after the prompt's runs the smallest bucket that holds its rows and fits the cache's room; where
        no bucket that holds them fits, the draft is cut (window rows first, then its deepest nodes) to the largest
        that does."""
        if len(self.pending) > 1:
            return draft
        q = bucket_of(1 + draft.rows, self.buckets, self.columns - self.past_len)
        if 1 + draft.rows > q:
            draft = draft.without_window()
            if 1 + len(draft) > q:
                draft = draft.shallowest(q - 1)
        return draft

    def pack(self, draft: Draft):
        """The prompt's step: its own shape (eager); later steps: the bucket's shape, dummy rows after the draft."""
        p = len(self.pending)
        if p > 1:  # the prompt's step, of its own length: a mask over every column of the cache
            self.bucket = 0
            if not draft.rows and self.col_visible is None:  # plain: the model's own (static-aware) causal mask
                return (torch.from_numpy(self.pending[None]).to(self.device),
                        torch.from_numpy(self.pending_pos[None]).to(self.device), None)
            ids, pos, mask = pack_step(self.pending, self.pending_pos, draft.tokens, draft.parents,
                                       None if self.col_visible is None else self.col_visible[: self.length],
                                       self.past_len, self.setup.dtype, draft.window, self.device, draft.depth)
            full = torch.full((*mask.shape[:3], self.columns), torch.finfo(self.setup.dtype).min,
                              dtype=self.setup.dtype, device=self.device)
            full[..., : mask.shape[-1]] = mask
            return ids, pos, self.masks(full, pos)
        q = bucket_of(1 + draft.rows, self.buckets, self.columns - self.past_len)
        window = draft.window
        ids, pos = step_inputs(self.pending, self.pending_pos, draft.tokens, draft.depth, window, self.device)
        if q > ids.shape[1]:  # dummy rows: token 0 one past the pending position
            extra = q - ids.shape[1]
            ids = torch.cat([ids, torch.zeros((1, extra), dtype=ids.dtype, device=ids.device)], 1)
            pos = torch.cat([pos, pos[:, :1].expand(1, extra) + 1], 1)
        ids, pos = _canonical(ids), _canonical(pos)  # the strides a bucket's graph was compiled for
        mask = self.static_mask(self.past_len, 1, draft.parents, None if window is None else window.visible, q)
        self.bucket = q
        return ids, pos, self.masks(mask, pos)

    def masks(self, mask: torch.Tensor, pos: torch.Tensor, past: int | None = None):
        """A step's attention masks from its full one [1, 1, q, columns] (its rows at positions ``pos`` written after
        ``past`` cached columns; None: the call's): itself, or with the sliding layers' beside it
        (:meth:`SlidingWindow.static_masks`)."""
        if self.sliding is None:
            return mask
        return self.sliding.static_masks(mask, pos, self.past_len if past is None else past)

    def forward(self, ids, pos, mask, keep: int) -> torch.Tensor:
        """The prompt's forward eagerly; a bucket's through the runner (its first run compiles it)."""
        setup = self.setup
        if not self.bucket:
            saved, setup.runner = setup.runner, None
            try:
                return call.forward(setup, self.stats, ids, pos, mask, keep)[0]
            finally:
                setup.runner = saved
        q, logits = self.bucket, []
        if self._warm(q, lambda: logits.append(call.forward(setup, self.stats, ids, pos, mask, q)[0])):
            return logits[0][:keep]
        return call.forward(setup, self.stats, ids, pos, mask, q)[0][:keep]

    def keep_kv(self, p: int, draft: Draft, accepted: list[int], last_token: int) -> None:
        """Keep the pending tokens' and the accepted nodes' entries inside the cache's buffers; the rest of the
        step's columns (dummy rows included) are given back."""
        q = self.bucket or (p + draft.rows)
        keep_static(self.cache, self.past_len, list(range(p)) + [p + j for j in accepted], q)
        self.past_len += p + len(accepted)
        last_pos = int(self.pending_pos[-1]) + len(accepted) + 1
        self.pending, self.pending_pos = self._last_token, self._last_pos
        self.pending[0], self.pending_pos[0] = last_token, last_pos
