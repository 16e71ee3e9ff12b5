"""`LookaheadDecoder`: the object a user adds to ``generate(..., custom_generate=LookaheadDecoder())``.

A call checks the request, picks its step shape (``shapes.py``), runs the step loop (``loop.py``) and hands the
cache back as transformers made it. Nothing of the call stays on the model or the process, nor acts on another
thread's forward; per-model state (cost curves, corpora, compiled steps) is shared under locks.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
import weakref
from dataclasses import fields, replace

import torch
from transformers.cache_utils import StaticLayer

from . import compat
from ._tuning import DEFAULT, Tuning
from .cache import NgramTrie
from .checks import (
    STATIC_IMPLEMENTATIONS,
    check_no_assistant,
    check_supported,
    refusals,
    sharded,
    with_stop_strings,
)
from .config import LookaheadConfig
from .cost import DEFAULT_CALIBRATIONS, STEP_VARIANT, Calibrations, CostModel
from .drafting.policy import DraftPolicy
from .drafting.sources import ReadOnlyStore
from .kept import AUTO, find, kept_corpora, kept_heads
from .kv import settle
from .loop import Call
from .numba_kernels import kernels_ready
from .shapes import OneRow
from .stats import DecodeStats

DRAFTS = ("layer-skip", "early-exit", "low-rank")  # draft= names of the target's cheaper forwards (lookahead.passes)


class LookaheadDecoder:
    """Exact speculative decoding without a draft model, for ``model.generate``::

        decoder = LookaheadDecoder()
        out = model.generate(**inputs, max_new_tokens=256, custom_generate=decoder)
        print(decoder.stats.explain())

    Greedy output is token for token plain ``generate``'s; sampled output has exactly its distribution. Settings
    (``docs/settings.md``): ``max_draft_tokens``, ``window``, ``cost_curve`` (or ``config=``, see
    ``LookaheadConfig``); ``store`` (an ``NgramTrie`` shared across calls and threads); ``corpus`` (a
    ``DraftCorpus``, ``"auto"`` or None); ``heads`` (``lookahead.heads.DraftHeads``, ``"auto"``: the bundled ones
    where they fit and the curve is flat, or None); ``draft`` (one of :data:`DRAFTS`, a draft model with the
    target's tokenizer, or a function ``target -> model``); ``tokenizer`` (for ``stop_strings=``). Heads and drafts
    decode batch size 1.

    After a call: ``stats`` (:class:`~lookahead.stats.DecodeStats`); for a batch also ``row_stats`` and
    ``prefill_groups``. A decoder holds one stream's state: use one per concurrent call (they may share a store).
    """

    def __init__(self, config: LookaheadConfig | None = None, *, store: NgramTrie | None = None, corpus=AUTO,
                 heads=AUTO, draft=None, tokenizer=None, _tuning: Tuning | None = None, _clock=time.perf_counter,
                 _calibrations: Calibrations | None = None, **settings):
        names = {f.name for f in fields(LookaheadConfig)}
        unknown = sorted(set(settings) - names)
        if unknown:
            raise TypeError(f"LookaheadDecoder got unknown setting(s) {unknown}; the settings are "
                            f"{sorted(names | {'store', 'corpus', 'heads', 'draft', 'tokenizer', 'config'})}")
        config = LookaheadConfig(**settings) if config is None else replace(config, **settings)
        if not isinstance(config, LookaheadConfig):
            raise TypeError(f"config must be a LookaheadConfig, got {type(config).__name__}")
        self.config, self.tuning = config, _tuning if _tuning is not None else DEFAULT
        if not isinstance(self.tuning, Tuning):
            raise TypeError(f"_tuning must be a lookahead._tuning.Tuning, got {type(self.tuning).__name__}")
        if store is not None and not isinstance(store, NgramTrie):
            raise TypeError(f"store must be a lookahead.cache.NgramTrie shared across calls, got {type(store).__name__}")
        if draft is not None and not (draft in DRAFTS if isinstance(draft, str) else callable(draft)):
            raise ValueError(f"draft must be one of {DRAFTS}, a causal LM or a function target -> causal LM; got "
                             f"{draft!r}")
        if isinstance(draft, torch.nn.Module):
            from .passes import check_draft_model

            check_draft_model(draft)
        if heads is not None and heads != AUTO and not callable(getattr(heads, "make_source", None)):
            raise TypeError(f"heads must be lookahead.heads.DraftHeads, \"auto\" or None, got {heads!r}")
        if corpus is not None and not (isinstance(corpus, str) and corpus == AUTO) and not _is_corpus(corpus):
            raise TypeError(f"corpus must be a lookahead.corpus.DraftCorpus (DraftCorpus.load(DIR) or "
                            f"DraftCorpus.bundled()), \"auto\" or None, got {corpus!r}")
        self.store, self.draft, self.tokenizer = store, draft, tokenizer
        self.corpus_setting, self.heads_setting = corpus, heads  # as given: "auto", None or the object
        self.heads_given = None if heads == AUTO else heads
        self.heads = self.heads_given  # the heads the last call drafted with ("auto": found per model at each call)
        self._corpus_auto = isinstance(corpus, str) and (heads is None or heads == AUTO)
        self.corpus = corpus if corpus is not None and _is_corpus(corpus) else None  # the one the last call drafted from
        self.trie = NgramTrie(max_n=self.tuning.ngram_size, capacity=self.tuning.trie_capacity)  # the request's
        self.clock = _clock
        self.calibrations = _calibrations if _calibrations is not None else DEFAULT_CALIBRATIONS
        self._new_policies()
        self.stats = DecodeStats()
        self.row_stats: list[DecodeStats] = []
        self.prefill_groups: list[list[int]] | None = None
        self._busy = threading.Lock()
        self._tp_curves: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _bind_corpus(self) -> None:
        self._corpus_store = self.corpus.shared_store(self.tuning.corpus_ngram) if self.corpus is not None else None

    def _new_policies(self) -> None:
        self._bind_corpus()
        self.policy = DraftPolicy(self.config, self.trie, self.store, self.tuning, self.draft, self.heads,
                                  corpus=self._corpus_store)
        self.row_policies: list[DraftPolicy] = []

    def __getstate__(self):  # copy / pickle
        return {k: v for k, v in self.__dict__.items() if k not in ("_busy", "_tp_curves", "_corpus_store")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._busy = threading.Lock()
        self._tp_curves = weakref.WeakKeyDictionary()
        self._bind_corpus()
        for policy in (self.policy, *self.row_policies):
            policy.bind_corpus(self._corpus_store)

    def __repr__(self) -> str:
        return f"LookaheadDecoder({getattr(self, 'config', '...')})"

    def sibling(self) -> LookaheadDecoder:
        """A new decoder with this one's settings that shares its store, corpus, heads and draft: for another stream
        decoded at the same time (a decoder holds one stream's state)."""
        return LookaheadDecoder(self.config, store=self.store, corpus=self.corpus_setting, heads=self.heads_setting,
                                draft=self.draft, tokenizer=self.tokenizer, _tuning=self.tuning, _clock=self.clock,
                                _calibrations=self.calibrations)

    # The signature mirrors GenerationMixin._sample so that generate() passes what it prepared.
    def __call__(self, model, input_ids: torch.LongTensor, logits_processor=None, stopping_criteria=None,
                 generation_config=None, synced_gpus: bool = False, streamer=None,
                 stop_strings: str | list[str] | None = None, tokenizer=None, **model_kwargs):
        # what generate() takes but does not hand to a callable custom_generate, read from its frame
        given_streamer, assistant = compat.arguments_of_calling_generate(self, ("streamer", "assistant_model"))
        b = input_ids.shape[0]
        with refusals():  # before any decoding step: an implicit default (lookahead.enable) runs plain instead
            check_supported(model, b, generation_config, synced_gpus, self)
            check_no_assistant(assistant)
            if self.corpus is not None and not self._corpus_auto:  # one given, not one found for this model
                self.corpus.check_model(model)
            if self.heads_given is not None and not compat.splits_head(model):
                raise ValueError(f"LookaheadDecoder(heads=...) reads the input of the model's output layer; this "
                                 f"{type(model).__name__} computes its logits otherwise. Drop heads= for it.")
        _warn_if_row_dependent(model)
        streamer = streamer if streamer is not None else given_streamer
        if stop_strings:
            stopping_criteria = with_stop_strings(stopping_criteria, stop_strings, tokenizer or self.tokenizer)
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("this LookaheadDecoder is already decoding (in another thread); a decoder holds the "
                               "state of one stream: use one LookaheadDecoder per concurrent generate() call (they "
                               "may share one store=).")
        cache = compat.cache_of(model_kwargs)
        try:
            self.stats = DecodeStats()
            if not kernels_ready():  # compiling in the background: this call decodes as plain generate() does
                from .kernel_compiler import paused

                self.stats.plain_reason = "the Numba kernels were still compiling in the background"
                with paused():
                    out = compat.plain_sample(model, input_ids, logits_processor, stopping_criteria,
                                              generation_config, synced_gpus, streamer, model_kwargs)
                seq = out if isinstance(out, torch.Tensor) else out.sequences
                self.stats.new_tokens = self.stats.target_calls = int(seq.shape[1] - input_ids.shape[1])
                return out
            heads = self.heads_given
            if self.heads_setting == AUTO and self._heads_may_pay(model, b):
                heads = find(model, "heads", kept_heads, _load_heads)
            self._use(find(model, "corpus", kept_corpora, _load_corpus) if self._corpus_auto else self.corpus, heads)
            self.stats.corpus = repr(self.corpus) if self.corpus is not None else None
            shape, compiles = OneRow, False
            if b > 1:
                from .batch import Padded as shape
            elif _static(generation_config, model_kwargs):
                from .static import Bucketed as shape
                from .static import compile_settings

                compiles = compile_settings(model, generation_config or model.generation_config) is not None
            _warn_if_compiled(model, compiles)
            with refusals():  # the call's checks and set-up
                call = Call(self, model, input_ids, logits_processor, stopping_criteria, generation_config,
                            streamer, model_kwargs, shape)
            out = call.run()
            if call.learned is not None:
                from .learned import keep_learned

                keep_learned(self.calibrations, model, call.learned[0], call.learner, self.tuning.learn_keep_after,
                             call.learned[1])
            return out
        finally:
            if cache is not None and b == 1:
                settle(cache)
            self._busy.release()

    def _use(self, corpus, heads) -> None:
        """Draft from ``corpus`` and with ``heads`` (None: none) from now on; different ones make the policies anew."""
        if corpus is not self.corpus or heads is not self.heads:
            self.corpus, self.heads = corpus, heads
            self._new_policies()

    def _heads_may_pay(self, model, rows: int) -> bool:
        """Whether ``heads="auto"`` looks for heads: one row of an unsharded model that ``compat.splits_head``, off
        the CPU or on a given flat curve (on a CPU the heads' own work costs more than their drafts gain)."""
        given = self.config.cost_curve
        if given is None:
            flat = not _on_cpu(model)
        else:  # flat as the budget's widest steps take it: 64 rows cost little more than one
            curve = CostModel(given)
            flat = float(curve(64)) <= self.tuning.step_nodes_wide_cost * float(curve(1))
        return flat and rows == 1 and compat.splits_head(model) and not sharded(model)

    def policies_for(self, rows: int) -> list[DraftPolicy]:
        """A batch's per-row policies, kept across calls: each has its own trie and copy index; the model-prediction
        table, the store (read-only) and the corpus's store are shared."""
        config = replace(self.config, window=0, max_draft_tokens=self.config.step_nodes(self.tuning)[0])
        tuning = self.tuning
        memory = ReadOnlyStore(self.store) if self.store is not None else None
        model = self.policy.model
        while len(self.row_policies) < rows:
            trie = NgramTrie(max_n=tuning.ngram_size, capacity=min(tuning.trie_capacity, tuning.row_trie_capacity))
            self.row_policies.append(DraftPolicy(config, trie, memory, tuning,
                                                 successors=None if model is None else model.table,
                                                 corpus=self._corpus_store))
        return self.row_policies[:rows]

    def price(self, call) -> CostModel | None:
        """The cost curve ``call``'s budget prices with (None: no budget): the configured one, else the model's
        (kept on disk). On a CPU it may set ``call.runner`` to a shadow of the model (``shadow.py``)."""
        stats, model, tuning = self.stats, call.model, self.tuning
        t = self.clock()
        cpu = call.sync is None and _on_cpu(model)
        grouped = cpu and compat.grouped_applies(model)
        if grouped:
            from .shadow import shadow

            call.runner = shadow(model, grouped=True)
        base = call.runner
        if not tuning.adaptive:
            curve = None
        elif self.config.cost_curve:
            curve = CostModel(self.config.cost_curve)
        elif call.sync is not None:
            curve = self._sharded_curve(call)
        elif tuning.calibrate:
            from .calibrate import measure_curve

            curve = measure_curve(self, call, STEP_VARIANT + ("+grouped" if grouped else ""),
                                  tuning.linear_layout != "linear" and layouts_may_pay(model, tuning))
        else:
            curve = self._known_curve(call, STEP_VARIANT + ("+grouped" if grouped else ""))
        if tuning.linear_layout in ("transposed", "onednn") and call.runner is base and cpu \
                and layouts_may_pay(model, tuning):  # a forced layout, whatever the curve
            from .cpu.layouts import forced

            call.runner, stats.linear_layout = forced(model, tuning, grouped)
        stats.time_calibration = self.clock() - t
        if curve is not None:
            stats.cost_curve, stats.cost_steps, stats.cost_provisional = curve.points, curve.steps, curve.provisional
        return curve

    def _slope(self, model) -> float:
        return self.tuning.learn_slope_cpu if _on_cpu(model) else self.tuning.learn_slope_gpu

    def _known_curve(self, call, variant: str) -> CostModel:
        """The curve measured for the model (``warmup --calibrate``), with the CPU layouts it planned; else the one
        its calls' steps teach (:class:`LearnedCurve`); both kept on disk. No forward is timed apart from a step."""
        model, base = call.model, call.runner
        rows = self.policy.first_rows()
        persist = None if self.clock is time.perf_counter else False  # an injected clock is not this machine's
        curve = self.calibrations.get(model, rows, None, variant, persist=persist)
        layouts = self.tuning.linear_layout != "linear" and layouts_may_pay(model, self.tuning)
        if curve is not None:
            if layouts:
                from .cpu.layouts import plan_steps

                curve, call.runner, self.stats.linear_layout = plan_steps(model, curve, None, self.calibrations, rows,
                                                                          self.tuning, persist, base, variant)
            return curve
        if layouts and self.tuning.linear_layout == "auto":  # (a forced layout is set by price)
            from .cpu.layouts import default_plan

            call.runner, self.stats.linear_layout = default_plan(model, self.tuning, base is not model)
            variant += "+" + self.stats.linear_layout
        from .learned import learner

        found = learner(self.calibrations, model, variant, self._slope(model), persist)
        if not call.shape_class.static:
            call.learner, call.learned = found, (variant, persist)
        return found.curve()

    def _sharded_curve(self, call) -> CostModel:
        """Under tensor parallelism: a curve the calls' steps teach on rank 0's timings (every rank decides alike)."""
        from .learned import LearnedCurve

        learner = self._tp_curves.get(call.model)
        if learner is None:
            learner = self._tp_curves[call.model] = LearnedCurve(self._slope(call.model))
        call.learner = learner
        return learner.curve()


def _is_corpus(value) -> bool:
    if isinstance(value, str):
        return False
    from .corpus import DraftCorpus  # given one, the caller has imported it

    return isinstance(value, DraftCorpus)


def _load_corpus(folder: str):
    """The corpus kept in ``folder`` (``lookahead.corpus`` is imported only for a model it fits)."""
    from .corpus import load_kept

    return load_kept(folder)


def _load_heads(folder: str):
    """The heads saved in ``folder``, or None with a warning if damaged."""
    from .heads import DraftHeads

    try:
        return DraftHeads.load(folder)
    except Exception as err:  # noqa: BLE001 - a damaged file of any kind: skipped, said
        warnings.warn(f"skipping the draft heads in {folder}: {err}", stacklevel=3)
        return None


def _on_cpu(model) -> bool:
    """Whether ``model`` runs whole on a CPU (no ``device_map`` spread)."""
    device = getattr(model, "device", None)
    return device is not None and torch.device(device).type == "cpu" and not getattr(model, "hf_device_map", None)


def layouts_may_pay(model, tuning: Tuning) -> bool:
    """Whether ``lookahead.cpu``'s layouts are worth timing: on a CPU, with big full-precision weights or forced."""
    if not _on_cpu(model):
        return False
    if tuning.linear_layout != "auto":
        return True
    params = [p for p in model.parameters() if p.dim() == 2]
    return (model.dtype in (torch.float32, torch.float64)
            and sum(p.numel() for p in params) >= tuning.layout_min_weights)


def _static(generation_config, model_kwargs: dict) -> bool:
    """Whether the call decodes on a static cache (asked for, or a cache of static layers given)."""
    if getattr(generation_config, "cache_implementation", None) in STATIC_IMPLEMENTATIONS:
        return True
    layers = getattr(compat.cache_of(model_kwargs), "layers", None)
    return bool(layers) and all(isinstance(layer, StaticLayer) for layer in layers)


def _warn_if_compiled(model, compiles_itself: bool) -> None:
    """Say so where ``model.forward`` is ``torch.compile``d and the call does not compile its own steps."""
    if not compiles_itself and compat.forward_is_compiled(model):
        warnings.warn("lookahead: model.forward is compiled (torch.compile); the decoder runs the model's forward "
                      "eagerly instead: its steps change shape, and each new shape would compile again. For compiled "
                      "steps pass cache_implementation='static' on CUDA (or a generation_config.compile_config that "
                      "asks for every device): the decoder then compiles one graph per step size itself.",
                      UserWarning, stacklevel=4)


_ROW_DEPENDENT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def row_dependent_layers(model) -> tuple[str, ...]:
    """Class names of ``model``'s layers whose output for a row depends on other rows (dynamically quantized ones).
    Example: after ``quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)`` -> ``("Linear",)``."""
    try:
        return _ROW_DEPENDENT[model]
    except (KeyError, TypeError):
        pass
    dynamic = ("torch.ao.nn.quantized.dynamic", "torch.nn.quantized.dynamic")
    found = tuple(sorted({type(m).__name__ for m in model.modules() if type(m).__module__.startswith(dynamic)}))
    with contextlib.suppress(TypeError):
        _ROW_DEPENDENT[model] = found
    return found


def _warn_if_row_dependent(model) -> None:
    found = row_dependent_layers(model)
    if found:
        warnings.warn(f"lookahead: this model has dynamically quantized layers ({', '.join(found)}, from "
                      "torch.ao.quantization.quantize_dynamic), whose output for a row depends on the other rows of "
                      "the forward. The decoder verifies drafts in multi-row forwards, so its output can differ from "
                      "plain generate()'s (prompt lookup's can too). For identical output, decode the float model, or "
                      "quantize the weights only.", UserWarning, stacklevel=4)
