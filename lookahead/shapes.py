"""Step shapes: what differs between one row, a batch and a static cache in the one step loop (``loop.py``).

A shape chooses a step's drafts (:meth:`draft`), packs them (:meth:`pack`), runs the forward (:meth:`forward`) and
keeps the accepted entries in the cache, rolling back the rest (:meth:`keep`):

- :class:`OneRow`: one row on a dynamic cache. A step whose draft is one chain is causal (the model's own mask and
  fast path); other steps write their mask block into a buffer kept across steps; the window's rows and trained
  heads run here; past a sliding window its layers keep every entry until the verdict.
- :class:`Padded`: several rows. Each row drafts with its own policy; the batch chooses one width (dummy nodes pad
  the others) by what it saves until its last row ends; a row that kept fewer entries holds masked *holes*, squeezed
  out once they pass ``hole_slack`` columns; finished rows leave the cache once the forwards they cost reach the
  copy's time; prompts of different lengths may be prefilled in groups.
- :class:`Bucketed`: one row on a static cache. Every step after the prompt's runs one of a few bucket sizes (dummy
  rows pad it), optionally compiled as transformers compiles plain static ``generate``; rollback moves the kept
  entries in the cache's buffers and moves its length back.
"""

from __future__ import annotations

import time
import weakref
from typing import NamedTuple

import numpy as np
import torch

from . import compat
from .budget import Prober, can_pay, choose_width, prefill_groups, token_values, top_nodes
from .cost import CostModel, calibrate_curve
from .drafting.draft import Draft
from .drafting.policy import Limits
from .kv import (
    PLAIN_LAYERS,
    CacheNotRollbackable,
    cache_layers,
    cache_length,
    keep_entries,
    keep_rows_entries,
    keep_static,
    kv_layers,
    new_cache,
    realign_index,
    static_layers,
)
from .checks import MEDIA_KWARG
from .loop import Rows
from .packing import StaticMask, StepMask, canonical, pack_batch, pack_step, step_inputs
from .sliding import SlidingWindow, full_length_layers

ROW_COST = CostModel(((1, 1.0), (2, 1.0)))
"""The curve a batch row's own budget prices with: every node with a chance is kept; the batch chooses the width."""


class Step(NamedTuple):
    """A packed step: input ids and positions long[b, q], its mask (None: causal), and ``rows``: a one-row step's
    rows past the pending tokens' last, plus one (its root)."""

    ids: torch.Tensor
    pos: torch.Tensor
    mask: object
    rows: int


class OneRow:
    """One row on a dynamic cache (see the module docstring)."""

    static = False

    def __init__(self, call, input_ids, mask):
        self.call = call
        policy = call.decoder.policy
        self.cache, self.past = call.cache, call.past
        _, self.col_visible = _prompt_columns(mask, input_ids.shape[1], call.gen.max_length)
        self.widened = call.sliding is not None and self.col_visible is not None
        if self.widened:  # past a sliding window with padding: its layers keep every column, masked by position
            call.sliding.widen(self.cache)
            self.col_pos = np.maximum(np.cumsum(self.col_visible) - 1, 0)
        self.prepare()
        self.rows = Rows(call, input_ids, mask, [policy], self.limits())
        call.stats.step_nodes = policy.step_nodes
        self.recording = call.sliding.start(self.cache) if call.sliding is not None and not self.widened else []
        self.step_mask: StepMask | None = None
        self._pending = np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64)  # reused every step

    def prepare(self) -> None:
        """The call's cost curve (a static cache prices its buckets instead)."""
        self.call.cost = self.call.decoder.price(self.call)

    def limits(self) -> Limits:
        call = self.call
        return Limits(call.max_length, call.kv_window, chains=call.chains)

    def draft(self):
        rows = self.rows
        policy = rows.policies[0]
        p = rows.pending.shape[1]
        d = policy.draft(int(rows.length[0]), self.past + p, int(rows.pending_pos[0, -1]))
        return [self.fit(d)], policy.recycle_k

    def fit(self, draft: Draft) -> Draft:
        return draft

    def pack(self, drafts) -> Step:
        """A chain after the pending tokens (no branch, no window) steps causally: the model's own mask and fast
        path. On a CPU a chain after one pending token takes the buffer's additive mask instead (the model would build
        a boolean one that SDPA converts in every layer). A model that takes no 4D mask always steps causally."""
        call, d = self.call, drafts[0]
        pending, pending_pos = self.rows.pending[0], self.rows.pending_pos[0]
        p = len(pending)
        if (self.col_visible is None and d.window is None and d.is_chain
                and (call.chains or call.device.type != "cpu" or p > 1 or not len(d))):
            ids, pos = step_inputs(pending, pending_pos, d.tokens, d.depth, None, call.device)
            return Step(ids, pos, None, 1 + d.rows)
        if p == 1:  # after the prompt's step the mask buffer writes only this step's block
            if self.step_mask is None:
                rows = self.rows.policies[0].max_rows() + 1
                self.step_mask = StepMask(rows, call.gen.max_length + rows + 1, call.dtype, call.device,
                                          self.col_visible)
            ids, pos, mask = self.step_mask.step(self.past, pending, pending_pos, d.tokens, d.depth, d.parents,
                                                 d.window)
        else:
            length = int(self.rows.length[0])
            columns = None if self.col_visible is None else self.col_visible[:length]
            ids, pos, mask = pack_step(pending, pending_pos, d.tokens, d.parents, columns, self.past, call.dtype,
                                       d.window, call.device, d.depth)
        if call.sliding is not None:  # the sliding layers' own mask beside it
            if self.widened:
                cached = torch.from_numpy(self.col_pos[None, : self.past]).to(call.device)
                mask = call.sliding.batch_masks(mask, pos, cached)
            else:
                mask = call.sliding.masks(mask, pos, self.past)
        return Step(ids, pos, mask, 1 + d.rows)

    def forward(self, step: Step, drafts, k: int):
        """The step's logits [1, 1 + rows, V]. At the prompt's step the model-prediction source learns the prompt's
        own rows too, where the cost curve makes them nearly free (``prompt_rows``)."""
        rows, call = self.rows, self.call
        policy = rows.policies[0]
        p = rows.pending.shape[1]
        warm = p - 1 if p > 1 and policy.prompt_rows and k else 0
        logits = self.run(step, step.rows + warm)
        if warm:
            _, (top_ids, top_vals) = call.verifier.read_rows(logits[:, :warm], None, np.array([warm]), k)
            policy.learn_prompt(rows.pending[0, :warm], top_ids[0], top_vals[0])
            logits = logits[:, warm:]
        return logits, warm

    def run(self, step: Step, keep: int) -> torch.Tensor:
        return self.call.forward(step.ids, step.pos, step.mask, keep)

    def keep(self, p: int, drafts, accepted) -> None:
        """Keep the pending tokens' and the accepted nodes' entries; the last emitted token becomes pending."""
        d, nodes = drafts[0], accepted[0]
        if d.rows:  # else every entry of the step stays
            keep_entries(self.cache, p + d.rows, list(range(p)) + [p + j for j in nodes])
        if self.recording:
            SlidingWindow.restrict(self.recording)
        self.advance(p, nodes)

    def advance(self, p: int, nodes: list[int]) -> None:
        rows = self.rows
        self.past += p + len(nodes)
        last_pos = int(rows.pending_pos[0, -1]) + len(nodes) + 1
        rows.pending, rows.pending_pos = self._pending
        rows.pending[0, 0], rows.pending_pos[0, 0] = rows.last[0], last_pos
        if rows.pending_vis.shape[1] != 1:
            rows.pending_vis = np.ones((1, 1), dtype=bool)

    def after_step(self) -> None:
        pass

    def finish(self) -> None:
        if self.recording:
            SlidingWindow.finish(self.recording)


def _prompt_columns(attention_mask, length: int, max_length: int):
    """(positions, col_visible): ``col_visible`` bool[max(max_length, length) + 1] False at the prompt's padding,
    or None when nothing is padding."""
    if attention_mask is None or bool((attention_mask == 1).all()):
        return np.arange(length), None
    visible = attention_mask[0].bool().cpu().numpy()
    col_visible = np.ones(max(max_length, length) + 1, dtype=bool)
    col_visible[:length] = visible
    return np.maximum(np.cumsum(visible) - 1, 0), col_visible


# -- one row on a static cache ------------------------------------------------------------------------------------


_RUN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per model, the (runner, cache length, bucket) shapes a forward has run with in this process: a compiled one's
graph is in torch's cache, and its next run is no warm-up."""
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per model, its compiled step per compile options (:func:`compiled_step`)."""


class Bucketed(OneRow):
    """One row on a static cache (see the module docstring): the prompt's step runs eagerly at its own length, every
    later step at the smallest bucket that holds its rows and fits the cache's room (a draft that does not fit is
    cut: window rows first, then its deepest nodes)."""

    static = True

    def prepare(self) -> None:
        call = self.call
        call.sliding = full_length_layers(call.model, self.cache, call.gen.max_length)
        if call.sliding is not None and self.col_visible is not None:
            raise CacheNotRollbackable("a static cache with sliding-window layers decodes an unpadded row only (its "
                                       "columns are the row's positions); drop the padding, or use plain generate().")
        if not static_layers(self.cache):
            raise CacheNotRollbackable(
                f"LookaheadDecoder rolls back a static cache whose layers are all StaticLayer; this one has "
                f"{sorted({type(layer).__name__ for layer in cache_layers(self.cache)})} (sliding-window, hybrid or "
                "offloaded static layers). Drop cache_implementation, or use plain generate().")
        if call.sync is not None:
            raise ValueError("LookaheadDecoder with a static cache does not run under tensor parallelism; drop "
                             "cache_implementation='static' (the dynamic cache is synchronised across ranks).")
        self.columns = cache_length(self.cache)
        needed = call.max_length - 1  # the columns plain static generate fills: every token but the last
        if self.columns < needed:
            raise ValueError(f"the static cache holds {self.columns} tokens and this call needs {needed} "
                             f"(max_length - 1 = {call.max_length} - 1): pass a StaticCache with max_cache_len >= "
                             f"{needed}, or let generate() make it (cache_implementation='static').")
        decoder = call.decoder
        self.buckets = buckets_for(decoder.policy.max_rows(), decoder.tuning.buckets)
        compile_config = compile_settings(call.model, call.gen)
        self.compiled = compile_config is not None
        self.step_runner = None if compile_config is None else compiled_step(call.model, compile_config)
        self.runner_key = repr(compile_config.to_dict()) if compile_config is not None else "eager"
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
        room = self.columns - self.past
        sizes = tuple(b for b in self.buckets if b <= room) or (1,)
        variant = f"static/{'compiled' if self.compiled else 'eager'}/{self.columns}"
        persist = None if call.clock is time.perf_counter else False
        return call.decoder.calibrations.get(call.model, max(sizes), lambda _: self._time_buckets(sizes), variant,
                                             persist=persist)

    def _time_buckets(self, sizes: tuple[int, ...]) -> CostModel:
        call = self.call
        clock, device, past = call.clock, call.device, self.past
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, call.vocab, (1, max(sizes)), generator=gen).to(device)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        mask = StaticMask(self.buckets[-1], self.columns, call.dtype, device)  # the decoding mask's strides

        def run(k: int) -> None:  # a chain of k - 1 nodes after one pending token
            m = mask(past, 1, np.arange(-1, k - 2), None, k)
            pos = canonical(torch.arange(past, past + k, device=device)[None])
            compat.last_logits(self._runner(), canonical(ids[:, :k]), pos, self.masks(m, pos, past),
                               call.forward_kwargs, call.keeps_logits, k)
            for layer in cache_layers(self.cache):
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

    def _runner(self):
        return self.step_runner if self.step_runner is not None else self.call.model

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
                return Step(torch.from_numpy(pending[None]).to(call.device),
                            torch.from_numpy(pending_pos[None]).to(call.device), None, 1)
            columns = None if self.col_visible is None else self.col_visible[: int(rows.length[0])]
            ids, pos, mask = pack_step(pending, pending_pos, d.tokens, d.parents, columns, self.past, call.dtype,
                                       d.window, call.device, d.depth)
            full = torch.full((*mask.shape[:3], self.columns), torch.finfo(call.dtype).min, dtype=call.dtype,
                              device=call.device)
            full[..., : mask.shape[-1]] = mask
            return Step(ids, pos, self.masks(full, pos), 1 + d.rows)
        q = bucket_of(1 + d.rows, self.buckets, self.columns - self.past)
        ids, pos = step_inputs(pending, pending_pos, d.tokens, d.depth, d.window, call.device)
        if q > ids.shape[1]:  # dummy rows: token 0 one past the pending position
            extra = q - ids.shape[1]
            ids = torch.cat([ids, torch.zeros((1, extra), dtype=ids.dtype, device=ids.device)], 1)
            pos = torch.cat([pos, pos[:, :1].expand(1, extra) + 1], 1)
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
            return call.forward(step.ids, step.pos, step.mask, keep, runner=call.model)
        q, out = self.bucket, []
        if not self._warm(q, lambda: out.append(call.forward(step.ids, step.pos, step.mask, q, runner=self._runner()))):
            out.append(call.forward(step.ids, step.pos, step.mask, q, runner=self._runner()))
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
    out = []
    for b in buckets:
        out.append(b)
        if b >= max_rows:
            break
    return tuple(out)


def bucket_of(rows: int, buckets: tuple[int, ...], room: int) -> int:
    """The smallest bucket that holds ``rows`` and fits ``room`` columns, else the largest that fits. Example:
    ``bucket_of(9, (1, 8, 16), 100)`` -> 16; with room 12 -> 8."""
    fitting = [b for b in buckets if b <= room]
    for b in fitting:
        if b >= rows:
            return b
    return fitting[-1] if fitting else 1


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
    config = getattr(gen, "compile_config", None)
    device_map = getattr(model, "hf_device_map", None)
    if device_map is not None:
        devices = set(device_map.values())
        if "disk" in devices or ("cpu" in devices and len(devices) > 1):
            return None
    accelerated = model.device.type in ("cuda", "xpu")
    if config is not None and (accelerated or compat.compiles_on_all_devices(config)):
        return config
    return CompileConfig() if accelerated else None


def compiled_step(model, compile_config):
    """``model``'s forward compiled with ``compile_config``'s options, once per model and options: a function of its
    own, whose graphs (one per bucket) count against their own recompilation limit, not plain ``generate``'s."""
    options = compile_config.to_dict()
    per_model = _COMPILED.setdefault(model, {})
    key = repr(sorted(options.items(), key=lambda kv: kv[0]))
    if key not in per_model:
        def step(**kwargs):
            return model(**kwargs)

        per_model[key] = torch.compile(step, **options)
    return per_model[key]


# -- a batch ------------------------------------------------------------------------------------------------------


class Padded:
    """Several rows on a dynamic cache (see the module docstring); ``T``: the cache's columns, ``vis`` bool[b, ...]:
    which of them each active row sees (its padding and holes hidden)."""

    static = False

    def __init__(self, call, input_ids, mask):
        self.call = call
        decoder, tuning = call.decoder, call.tuning
        self.cache = call.cache
        b, length = input_ids.shape
        call.cost = decoder.price(call)
        call.row_cost = ROW_COST if call.cost is not None else None
        self.margin, self.prober = tuning.margin, Prober(tuning.probe_every)
        self.max_nodes = decoder.config.step_nodes(tuning)[0]  # a batch's rows never widen
        call.stats.step_nodes = self.max_nodes
        self._can_pay: dict[tuple[int, int], bool] = {}
        self._dead_cost = 0.0  # forward seconds finished rows have cost since the last drop
        self._copy_seconds_per_byte = tuning.copy_seconds_per_byte
        if call.sliding is not None:  # past a sliding window: those layers keep every column, masked by the window
            call.sliding.widen(self.cache)
        self.rows = Rows(call, input_ids, mask, decoder.policies_for(b), Limits(call.max_length, call.kv_window))
        decoder.prefill_groups = None
        self.T = 0
        cap = max(call.max_length, length) + 1
        self.vis = np.zeros((b, cap + tuning.hole_slack + 2 * (self.max_nodes + 1) + length), dtype=bool)
        self.groups = None
        self.width = 0
        self.done_before = np.zeros(b, dtype=bool)

    # -- drafts ----------------------------------------------------------------------------------------------------

    def draft(self):
        rows, call = self.rows, self.call
        live = [rows.policies[r] for r in rows.active]
        self.done_before = rows.done[rows.active].copy()
        self.groups = self.prefill_plan()
        if self.groups is not None:  # the prompt, in groups of rows of similar length; no drafts this step
            return [Draft.empty()] * len(live), max(p.recycle_k for p in live)
        drafts, k = self.row_drafts()
        if call.media is not None:  # the prompt's step, with its images' features: no drafts beside them
            drafts = [Draft.empty()] * len(drafts)
        self.width = self.fit_kv_window(max((len(d) for d in drafts), default=0), drafts)
        return drafts, k

    def row_drafts(self):
        """(each row's draft, cut to the step's width; the top-k the rows' model sources want)."""
        rows, call = self.rows, self.call
        b, p = len(rows.active), rows.pending.shape[1]
        if call.cost is not None and not self.batch_can_pay(b, p):
            return [Draft.empty()] * b, 0
        drafts = [Draft.empty() if rows.done[r] else
                  rows.policies[r].draft(int(rows.length[r]), self.T + p, int(rows.pending_pos[i, -1])).without_window()
                  for i, r in enumerate(rows.active)]
        k = max((rows.policies[r].recycle_k for r in rows.active if not rows.done[r]), default=0)
        if call.cost is None or not any(len(d) for d in drafts):
            return drafts, k
        probs = [rows.policies[r].budget.probabilities_of(d) for r, d in zip(rows.active, drafts)]
        live = [r for r in rows.active if not rows.done[r]]
        gains = [np.concatenate([[0.0], np.cumsum(np.sort(pr)[::-1])]) for r, pr in zip(rows.active, probs)
                 if not rows.done[r]]
        widest = max(len(d) for d in drafts)
        paces = np.array([max(1.0, rows.stats[r].new_tokens / max(rows.stats[r].target_calls, 1)) for r in live])
        remaining = np.array([rows.limit[r] - rows.length[r] for r in live], dtype=np.float64)
        values = token_values(remaining, paces, float(call.cost(len(live))), float(call.cost(1)))
        width = choose_width(gains, values, self.step_costs(b, p, widest), self.margin)
        if self.prober.due(bool(width)):
            width = 1
        return [d.keep(top_nodes(pr, width)) if len(d) > width else d for d, pr in zip(drafts, probs)], k

    def prefill_plan(self):
        """At the prompt's step: the rows' prefill groups, or None for one padded forward."""
        call = self.call
        if (self.T or call.cost is None or not call.tuning.grouped_prefill or call.media is not None
                or call.kv_window is not None or call.sliding is not None):
            return None
        layers = cache_layers(self.cache)
        if not layers or not all(type(layer) in PLAIN_LAYERS and not getattr(layer, "is_initialized", False)
                                 for layer in layers):
            return None
        return prefill_groups(self.rows.pending_vis.sum(1), call.cost, call.tuning.prefill_margin)

    def batch_can_pay(self, b: int, p: int) -> bool:
        key = (b, p)
        if key not in self._can_pay:
            self._can_pay[key] = can_pay(self.step_costs(b, p, self.max_nodes), self.margin)
        return self._can_pay[key]

    def step_costs(self, b: int, p: int, widest: int) -> np.ndarray:
        """float[widest + 1]: a step of ``b`` rows, ``p`` pending tokens each and width ``w``, as the width's rule
        compares it: ``t(b * (1 + w))``; with the prompt pending, a plain step's ``t(b)`` plus what the drafts add to
        the prompt's forward, ``t(b * (p + w)) - t(b * p)``. Example: ``t(k) = 1 + k / 100``, b 4, p 100: ``w = 1``
        costs ``t(4) + 0.04 = 1.08``."""
        w = np.arange(widest + 1)
        cost = self.call.cost
        if p == 1:
            return cost(b * (1 + w))
        return cost(b) + cost(b * (p + w)) - cost(b * p)

    def fit_kv_window(self, width: int, drafts: list[Draft]) -> int:
        """Below a sliding-window cache's window, where rollback still works: re-align, then narrow the step."""
        kv_window, p = self.call.kv_window, self.rows.pending.shape[1]
        if kv_window is None or self.T + p + width <= kv_window - 1:
            return width
        self.compact(None, force=True)
        spare = kv_window - 1 - self.T - p
        if spare < 0:
            raise RuntimeError("the batch no longer fits the model's sliding window")
        if width > spare:
            for i, d in enumerate(drafts):
                if len(d) > spare:
                    drafts[i] = d.shallowest(spare)
            width = spare
        return width

    # -- the forward ---------------------------------------------------------------------------------------------

    def pack(self, drafts) -> Step:
        rows, call = self.rows, self.call
        if self.groups is not None:
            return Step(None, None, None, 0)
        b = len(rows.active)
        col_visible = np.concatenate([self.vis[:b, : self.T], rows.pending_vis], axis=1)
        ids, pos, mask = pack_batch(rows.pending, rows.pending_pos, col_visible, drafts, self.width, call.dtype,
                                    call.device)
        if call.sliding is not None:  # the sliding layers' masks, by each row's positions
            cached = np.cumsum(self.vis[:b, : self.T], axis=1) - 1
            mask = call.sliding.batch_masks(mask, pos, torch.from_numpy(cached).to(call.device))
        return Step(ids, pos, mask, 0)

    def forward(self, step: Step, drafts, k: int):
        call = self.call
        if self.groups is not None:
            return self.prefill(self.groups), 0
        media = None if call.media is None else {MEDIA_KWARG: call.media}
        call.media = None
        return call.forward(step.ids, step.pos, step.mask, self.width + 1, extra=media), 0

    def prefill(self, groups: list[np.ndarray]) -> torch.Tensor:
        """The prompt's forward in groups of rows, each padded only to its longest row, into caches of their own
        whose entries are then placed, left-padded, into the batch's cache (the padding columns hold zeros, masked).
        The float logits [b, 1, V] of every row's last prompt token."""
        rows, call = self.rows, self.call
        b, length = rows.pending.shape
        logits, full = None, None
        for g in groups:
            width = int(rows.pending_vis[g].sum(1).max())
            ids, pos, mask = pack_batch(rows.pending[g][:, -width:], rows.pending_pos[g][:, -width:],
                                        rows.pending_vis[g][:, -width:], [Draft.empty()] * len(g), 0, call.dtype,
                                        call.device)
            cache = new_cache(call.model)
            group_logits = call.forward(ids, pos, mask, 1, cache)  # [g, 1, V]
            index = torch.from_numpy(g).to(call.device)
            if logits is None:
                logits = group_logits.new_empty((b, 1, group_logits.shape[-1]))
            logits[index] = group_logits
            layers = cache_layers(cache)
            if full is None:  # per layer: keys and values [b, heads, length, head_dim], zeros where padded
                full = [(layer.keys.new_zeros((b, layer.keys.shape[1], length, layer.keys.shape[3])),
                         layer.values.new_zeros((b, layer.values.shape[1], length, layer.values.shape[3])))
                        for layer in layers]
            for (keys, values), layer in zip(full, layers):
                keys[index, :, length - width :] = layer.keys
                values[index, :, length - width :] = layer.values
            del cache, group_logits
        for i in range(len(full)):  # update copies each layer into the cache: drop ours as it goes
            keys, values = full[i]
            full[i] = None
            self.cache.update(keys, values, i)
            del keys, values
        call.decoder.prefill_groups = [g.tolist() for g in groups]
        return logits

    # -- the cache -------------------------------------------------------------------------------------------------

    def keep(self, p: int, drafts, accepted) -> None:
        """Per row, keep its pending tokens' and accepted nodes' entries at the front of the step's columns."""
        rows = self.rows
        width = self.width if self.groups is None else 0
        prefix = list(range(p))
        keeps = [prefix + [p + j for j in nodes] if nodes else prefix for nodes in accepted]
        start = self.T
        most = keep_rows_entries(self.cache, p + width, keeps)
        vis = self.vis
        vis[: len(keeps), start : start + most] = False
        for i, k in enumerate(keeps):
            if not self.done_before[i]:
                vis[i, start : start + p] = rows.pending_vis[i]
                vis[i, start + p : start + len(k)] = True
        self.T = start + most
        self.accepted = accepted

    def after_step(self) -> None:
        """Finished rows stop drafting at once; their cache rows are dropped (a copy of the whole cache) once the
        forwards they cost since, on the cost curve, reach that copy's estimated time (ski rental: at most twice the
        better of dropping at once and never). Then every row's last token becomes pending."""
        rows, call = self.rows, self.call
        rows.next_pending(self.accepted, self.done_before)
        done = rows.done[rows.active]
        self.vis[: len(done)][done] = False  # nothing of a finished row is attended to any more
        live = [i for i, gone in enumerate(done) if not gone]
        b = len(rows.active)
        if len(live) == b:
            self.compact(None)
            return
        width = self.width if self.groups is None else 0
        if call.cost is not None and live:
            self._dead_cost += float(call.cost(b * (1 + width)) - call.cost(len(live) * (1 + width)))
            if self._dead_cost < self._cache_bytes() * self._copy_seconds_per_byte:
                self.compact(None)
                return
        t = call.clock()
        size = self._cache_bytes()
        self.compact(live)
        if size:
            seconds = call.shared_seconds(max(call.clock() - t, 0.0))
            self._copy_seconds_per_byte = 0.5 * self._copy_seconds_per_byte + 0.5 * seconds / size
        self._dead_cost = 0.0

    def _cache_bytes(self) -> int:
        return sum(2 * layer.keys.numel() * layer.keys.element_size() for layer in kv_layers(self.cache))

    def compact(self, keep: list[int] | None, force: bool = False) -> None:
        """Drop the cache rows not in ``keep`` (active indices; None: all stay), then squeeze the holes out (every
        row right-aligned) when they exceed ``hole_slack`` columns, or ``force``."""
        rows = self.rows
        if keep is not None:
            rows.drop(keep)
            self.vis[: len(keep)] = self.vis[keep]
            if not keep:
                return
            self.cache.batch_select_indices(torch.tensor(keep, dtype=torch.long, device=self.call.device))
        b, T = len(rows.active), self.T
        vis = self.vis[:b, :T]
        if not force and T - int(vis.sum(1).max()) <= self.call.tuning.hole_slack:
            return
        idx, new_vis = realign_index(vis)
        width = idx.shape[1]
        index = torch.from_numpy(idx).to(self.call.device)
        for layer in kv_layers(self.cache):
            for name in ("keys", "values"):
                t = getattr(layer, name)
                t[:, :, :width] = t.gather(2, index[:, None, :, None].expand(t.shape[0], t.shape[1], width, t.shape[3]))
        if T > width:
            self.cache.crop(-(T - width))
        self.vis[:b, :T] = False
        self.vis[:b, :width] = new_vis
        self.T = width

    def finish(self) -> None:
        pass

