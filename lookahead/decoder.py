"""`LookaheadDecoder`: the decoder behind ``generate(..., custom_generate=LookaheadDecoder())``.

A call runs one of three decode loops over the pieces of ``call.py``: one row (``single.SingleCall``), a
batch of several (``batch.BatchCall``), or one row on a static cache with fixed-shape, optionally compiled
steps (``static.StaticCall``). Terms are defined in ``config.py``.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from dataclasses import replace

import torch
from transformers import DynamicCache

from . import call, compat
from .batch import BatchCall, ReadOnlyStore
from .cache import NgramTrie
from .config import LookaheadConfig
from .corpus import AUTO, DraftCorpus, corpus_for
from .cost import (
    DEFAULT_CALIBRATIONS,
    Calibrations,
    CostModel,
    calibrate_curve,
    calibration_sizes,
    step_variant,
)
from .distributed import RankSync
from .kv_cache import new_cache
from .linear_layout import (
    AUTO_DTYPES,
    MAX_ROWS,
    ONEDNN,
    ONEDNN_VARIANT,
    TRANSPOSED,
    WHOLE_PLANS,
    LinearPlan,
    StepLinears,
    linear_modules,
    onednn_fits,
    plan_layouts,
    weights,
)
from .linear_layout import FORCED as FORCED_LAYOUTS
from .linear_layout import MIN_WEIGHTS as LAYOUT_MIN_WEIGHTS
from .linear_layout import VARIANT as LAYOUT_VARIANT
from .numba_kernels import warn_if_uncompiled
from .policy import DraftPolicy
from .single import SingleCall
from .static import StaticCall, compile_settings, static_cache
from .stats import DecodeStats
from .tuning import BudgetTuning

ROW_TRIE_CAPACITY = 1 << 16
"""Nodes of a batch row's own trie at most (3.7 MB allocated each, of which only the rows its nodes use are ever
touched): one request's n-grams, about 12 per token; a row's policy lives as long as the decoder, so a batch of 64 rows
holds 64 of them."""


COMPILED_FORWARD_NOTE = (
    "lookahead: model.forward is compiled (torch.compile), and the decoder runs it as the code it was compiled from. "
    "A step's number of rows and its mask change from step to step, so the compiled forward would be compiled again "
    "for each new shape, for minutes, up to torch's recompilation limit; plain generate() keeps its compiled graphs. "
    "For compiled steps, pass cache_implementation='static' on CUDA (or a generation_config.compile_config that asks "
    "for every device): the decoder then compiles one graph per step size itself."
)


def _eager_steps(model, compiles_itself: bool):
    """The context a call's forwards run in: where ``model.forward`` is ``torch.compile``d and the call does not
    compile its own steps (``compiles_itself``: a static cache's steps on CUDA, ``static.compile_settings``), torch's
    ``force_eager`` stance, with :data:`COMPILED_FORWARD_NOTE` said once (a warning); else nothing.

    Why: the decoder's steps take a new shape or mask type at almost every step. On SmolLM2 on a CPU, a forward the
    user compiled cost the first decoder call 21-62 s on a dynamic cache and 126 s on a static one (calibration
    included), and the calls after it ran 0.79-0.81 s against 0.71-0.73 s eagerly
    (``benchmarks/results/compiled-forward.md``)."""
    if compiles_itself or not compat.forward_is_compiled(model):
        return contextlib.nullcontext()
    stance = compat.eager_stance()
    if stance is None:  # torch < 2.6: the compiled forward runs as before
        return contextlib.nullcontext()
    warnings.warn(COMPILED_FORWARD_NOTE, UserWarning, stacklevel=4)  # the user's generate()
    return stance


_ROW_DEPENDENT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Per model, the class names of its row-dependent layers (:func:`row_dependent_layers`), found once."""


def row_dependent_layers(model) -> tuple[str, ...]:
    """The class names of ``model``'s layers whose output for one row depends on the other rows of the forward:
    dynamically quantized linear layers (``torch.ao.quantization.quantize_dynamic``), which quantize a forward's
    activations with one scale taken from all of its rows. A forward that verifies drafts then computes the
    accepted rows a little differently from plain ``generate``'s one-row forward. Empty for other models.

    Example: ``quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)`` -> ``("Linear",)`` (the class of
    ``torch.ao.nn.quantized.dynamic``)."""
    try:
        return _ROW_DEPENDENT[model]
    except (KeyError, TypeError):
        pass
    dynamic = ("torch.ao.nn.quantized.dynamic", "torch.nn.quantized.dynamic")  # the modules' packages, old and new
    found = tuple(sorted({type(m).__name__ for m in model.modules() if type(m).__module__.startswith(dynamic)}))
    with contextlib.suppress(TypeError):
        _ROW_DEPENDENT[model] = found
    return found


def _warn_if_row_dependent(model) -> None:
    """Say (a warning, once per call site) that a model with :func:`row_dependent_layers` can decode differently."""
    found = row_dependent_layers(model)
    if found:
        warnings.warn(f"lookahead: this model has dynamically quantized layers ({', '.join(found)}, from "
                      "torch.ao.quantization.quantize_dynamic), whose output for a row depends on the other rows of "
                      "the forward. The decoder verifies drafts in multi-row forwards, so its output can differ from "
                      "plain generate()'s (prompt lookup's can too). For identical output, decode the float model, or "
                      "quantize the weights only.", UserWarning, stacklevel=4)


class LookaheadDecoder:
    """Exact speculative decoding without a draft model, for ``model.generate``.

    Usage::

        from lookahead import LookaheadDecoder
        decoder = LookaheadDecoder()
        out = model.generate(**inputs, max_new_tokens=256, custom_generate=decoder)
        print(decoder.stats)   # target calls, tokens per call, accepted lengths, time per phase

    The output is token for token what ``model.generate(**inputs, do_sample=False, ...)`` returns.

    - ``config`` / ``**overrides``: a :class:`LookaheadConfig`, or its fields as keywords.
    - ``trie``: an ``NgramTrie`` shared across calls (the outputs of earlier requests).
    - ``calibrations``: where measured cost curves are kept (default: ``cost.DEFAULT_CALIBRATIONS``, which also
      keeps them on disk per model, device, dtype, thread count and CPU: a model is measured once per machine).
    - ``clock``: the time source of the statistics, the calibration and (with ``refine_cost``) the
      budget; tests pass a fake one.
    - ``tuning``: the budget's constants (``tuning.BudgetTuning``).
    - ``draft_model``: a causal LM with the model's tokenizer (or a function ``target -> draft model``, built
      on the first call) that drafts a greedy chain each step from its own KV cache, as in two-model
      speculative decoding; priced like the config's ``self_draft`` passes (``selfspec.py``); batch size 1.
    - ``tokenizer``: the model's tokenizer, for ``stop_strings=`` in the plain
      ``generate(custom_generate=decoder, ...)`` spelling: ``generate`` does not pass its own
      ``tokenizer=`` on to a custom decoding callable (``lookahead.enable``'s spellings do).
    - ``heads``: trained draft heads for this model (``lookahead.heads.DraftHeads``), one more draft source
      over the model's final hidden state; batch size 1.
    - ``corpus``: the model's own writing (``lookahead.corpus.DraftCorpus``, e.g. ``DraftCorpus.bundled()`` for
      the bundled SmolLM2, or one from ``python -m lookahead build-corpus``), drafted from a read-only store
      (origin ``"corpus"``) beside ``trie=``; refused before the first forward for a model that did not write it.
      ``"auto"`` (the default): the corpus kept for the call's model if there is one (``corpus.corpus_for``: the
      bundled one for the bundled SmolLM2, or one ``build-corpus`` installed), none beside ``heads`` (with the
      heads a corpus added nothing, ``benchmarks/results/corpus.md``); None: no corpus. ``corpus_setting`` keeps
      what was given; ``corpus`` is the one the last call drafted from (None: none).

    After a call: ``stats`` (:class:`~lookahead.stats.DecodeStats`, the whole call), and for a batch
    ``row_stats`` (one per row) and ``prefill_groups`` (the rows' groups when the prompt's forward ran in
    groups of similar length, else None).

    Threads: a decoder is the state of one decoding stream. A second call while one is running (from
    another thread) raises ``RuntimeError``; use one decoder per concurrent stream. Decoders in
    different threads may share one ``trie=`` store: it is locked, and each thread's outputs form
    their own stream in it (see :mod:`lookahead.cache`).
    """

    def __init__(self, config: LookaheadConfig | None = None, *, trie: NgramTrie | None = None,
                 calibrations: Calibrations | None = None, clock: Callable[[], float] = time.perf_counter,
                 tuning: BudgetTuning | None = None, tokenizer=None, draft_model=None, heads=None, corpus=AUTO,
                 **overrides):
        if config is None:
            config = LookaheadConfig(**overrides)
        elif overrides:
            config = replace(config, **overrides)
        if not isinstance(config, LookaheadConfig):
            raise TypeError(f"config must be a LookaheadConfig, got {type(config).__name__}")
        self.config = config
        if trie is not None and not isinstance(trie, NgramTrie):
            raise TypeError(f"trie must be a lookahead.cache.NgramTrie shared across calls, got {type(trie).__name__}")
        self.trie = NgramTrie(max_n=config.ngram_size, capacity=config.trie_capacity)  # this request's
        self.memory = trie  # shared across calls: output n-grams of earlier requests
        if draft_model is not None and not callable(draft_model):
            raise ValueError(f"draft_model must be a causal LM or a function target -> causal LM; got "
                             f"{type(draft_model).__name__}")
        if isinstance(draft_model, torch.nn.Module):
            from .selfspec import check_draft_model

            check_draft_model(draft_model)
        self.draft_model = draft_model  # proposes greedy chains from its own cache (selfspec.DraftPassSource)
        self.heads = heads  # trained draft heads (heads.DraftHeads): a source over the model's hidden state
        if corpus is not None and not isinstance(corpus, DraftCorpus) and not (isinstance(corpus, str)
                                                                               and corpus == AUTO):
            raise TypeError(f"corpus must be a lookahead.corpus.DraftCorpus (DraftCorpus.load(DIR) or "
                            f"DraftCorpus.bundled()), \"auto\" or None, got {corpus!r}")
        self.corpus_setting = corpus  # as given: "auto", None or a DraftCorpus
        self._corpus_auto = isinstance(corpus, str) and heads is None  # found per model at each call
        # the model's own writing: a read-only store shared by every user of the corpus
        self.corpus = corpus if isinstance(corpus, DraftCorpus) else None
        self._corpus_store = self.corpus.shared_store() if self.corpus is not None else None
        self.tuning = tuning or BudgetTuning()
        self.policy = DraftPolicy(config, self.trie, self.memory, self.tuning, draft_model, heads,
                                  corpus=self._corpus_store)
        self.row_policies: list[DraftPolicy] = []  # a batch's, one per row, created on first use (policies_for)
        self.calibrations = calibrations if calibrations is not None else DEFAULT_CALIBRATIONS
        self.clock = clock
        self.tokenizer = tokenizer
        self.stats = DecodeStats()
        self.row_stats: list[DecodeStats] = []
        self.prefill_groups: list[list[int]] | None = None
        self._tp_curves: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # under tensor parallelism
        self._busy = threading.Lock()  # held by the running call
        self._linear_plan = LinearPlan()  # the running call's layout of its steps' linear layers (linear_layout.py)

    def __getstate__(self):  # copy.deepcopy / pickle: a lock and curves keyed by live models do not travel, nor the
        # corpus's store (nor the policies' corpus sources': CorpusSource.transient): the corpus gives it again (a
        # deep copy shares the corpus, and so its built store)
        return {k: v for k, v in self.__dict__.items() if k not in ("_busy", "_tp_curves", "_corpus_store")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._busy = threading.Lock()
        self._tp_curves = weakref.WeakKeyDictionary()
        self._corpus_store = self.corpus.shared_store() if self.corpus is not None else None
        for policy in (self.policy, *self.row_policies):  # a pickle left their corpus source's store behind
            policy.bind_corpus(self._corpus_store)

    def __repr__(self) -> str:
        return f"LookaheadDecoder({self.config})"

    # The signature mirrors GenerationMixin._sample so that generate() passes what it prepared.
    def __call__(
        self,
        model,
        input_ids: torch.LongTensor,
        logits_processor=None,
        stopping_criteria=None,
        generation_config=None,
        synced_gpus: bool = False,
        streamer=None,
        stop_strings: str | list[str] | None = None,
        tokenizer=None,
        **model_kwargs,
    ):
        # what generate() takes but does not hand to a callable custom_generate, read from its frame
        given_streamer, assistant = compat.arguments_of_calling_generate(self, ("streamer", "assistant_model"))
        with call.refusals():  # before any decoding step: an implicit default (lookahead.enable) runs plain instead
            call.check_supported(model, input_ids.shape[0], generation_config, synced_gpus, self)
            call.check_no_assistant(assistant)
            if self.corpus is not None and not self._corpus_auto:  # one given, not one found for this model
                self.corpus.check_model(model)
        _warn_if_row_dependent(model)
        warn_if_uncompiled()
        if streamer is None:
            streamer = given_streamer
        if stop_strings:
            stopping_criteria = call.with_stop_strings(stopping_criteria, stop_strings, tokenizer or self.tokenizer)
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(
                "this LookaheadDecoder is already decoding (in another thread); a decoder holds the state of one "
                "stream: use one LookaheadDecoder per concurrent generate() call (they may share one trie=)."
            )
        try:
            self.stats = DecodeStats()
            if self._corpus_auto:
                self._use_corpus(corpus_for(model))
            self.stats.corpus = repr(self.corpus) if self.corpus is not None else None
            if input_ids.shape[0] > 1:
                loop = BatchCall
            elif _static(generation_config, model_kwargs):
                loop = StaticCall
            else:
                loop = SingleCall
            # the linear layers' layout (linear_layout.py): "auto" is chosen by cost_curve while the loop is set up;
            # off for a static cache's compiled forward (whose set-up prices its steps without cost_curve)
            modules = [] if loop is StaticCall else self._layout_modules(model)
            self._linear_plan = self._forced_plan(modules)
            with _eager_steps(model, loop is StaticCall and compile_settings(model, generation_config) is not None):
                with call.refusals():  # the call's checks and set-up
                    runner = loop(self, model, input_ids, logits_processor, stopping_criteria, generation_config,
                                  streamer, model_kwargs)
                plan = self._linear_plan
                self.stats.transposed_rows = plan.most_rows(TRANSPOSED)
                self.stats.linear_layout = plan.describe()
                with StepLinears(modules, plan) if plan else contextlib.nullcontext():
                    return runner.run()
        finally:
            self._busy.release()

    def _use_corpus(self, corpus: DraftCorpus | None) -> None:
        """Draft from ``corpus`` (None: none) from this call on: with another corpus than the last call's, the draft
        policy is made again (what it learnt was learnt beside the other one) and a batch's row policies with it."""
        if corpus is self.corpus:
            return
        self.corpus = corpus
        self._corpus_store = corpus.shared_store() if corpus is not None else None
        self.policy = DraftPolicy(self.config, self.trie, self.memory, self.tuning, self.draft_model, self.heads,
                                  corpus=self._corpus_store)
        self.row_policies = []

    def cost_curve(self, model, kv_window: int | None = None, sync=None) -> CostModel:
        """The cost curve this decoder prices drafts with on ``model``: the configured one, else the
        one kept in ``calibrations`` (measured on first use). ``sync``: the ranks of a tensor-parallel model
        (``distributed.RankSync``), which all price with rank 0's curve."""
        if self.config.cost_curve:  # a given curve: nothing measured ("auto" keeps nn.Linear)
            return CostModel(self.config.cost_curve)
        cache_kwarg, keeps_logits = compat.cache_kwarg_name(model), compat.supports_logits_to_keep(model)

        factory = (lambda: new_cache(model)) if kv_window is None else DynamicCache  # a small window cannot break
        shared = []  # [(clock, rows, time_one)]: the linear and transposed calibrations share one prefilled timer

        def measure(sizes, clock=self.clock):  # whole steps: mask, forward, row reads, KV keep (call.step_timer)
            rows = max(sizes)
            if not shared or shared[0][0] is not clock or shared[0][1] < rows:  # its context's prefill, once
                shared[:] = [(clock, rows, call.step_timer(model, factory, cache_kwarg, keeps_logits,
                                                           self.config.recycle_k, clock, max_rows=rows,
                                                           masks=compat.takes_tree_masks(model)))]
            return calibrate_curve(shared[0][2], sizes, clock=clock)

        rows = self.policy.max_rows()  # before the call starts: an "auto" window's rows are not measured
        variant = step_variant(model)
        if sync is None or not sync.active:
            # a curve timed on an injected clock is not this machine's: not persisted, not read from disk
            persist = None if self.clock is time.perf_counter else False
            linear = self.calibrations.get(model, rows, measure, variant, persist=persist)
            modules = self._layout_modules(model)
            if not modules:
                return linear
            layout = self.config.linear_layout

            def timed_in(kind: int):  # a step curve with every step the layout may compute in it
                def measure_in(sizes, clock=self.clock):
                    with StepLinears(modules, WHOLE_PLANS[kind]):
                        return measure(sizes, clock)
                return measure_in

            transposed = onednn = None
            if layout in ("auto", "transposed"):
                transposed = self.calibrations.get(model, MAX_ROWS, timed_in(TRANSPOSED), variant + LAYOUT_VARIANT,
                                                   persist=persist)
            if layout == "onednn" or (layout == "auto" and onednn_fits(modules)):
                onednn = self.calibrations.get(model, rows, timed_in(ONEDNN), variant + ONEDNN_VARIANT,
                                               persist=persist)
            force = FORCED_LAYOUTS.get(layout)
            plan, curve = plan_layouts(linear, transposed, onednn, force=force)
            if force is None:  # a forced layout keeps its plan (_forced_plan), priced by its own curve
                self._linear_plan = plan
            return curve
        # tensor parallelism: every rank runs the same timed (sharded) forwards, reading rank 0's clock, and
        # prices with rank 0's curve; kept per model in this decoder, whose calls every rank makes alike
        known = self._tp_curves.get(model)
        sync.check("calibration", known=known is not None and known.covers >= rows)
        if known is None or known.covers < rows:
            measured = measure(calibration_sizes(rows), clock=sync.shared_clock(self.clock))
            known = self._tp_curves[model] = sync.broadcast(measured)
        return known

    def _forced_plan(self, modules: list) -> LinearPlan:
        """The layout a call's steps take before any calibration: ``linear_layout`` ``"transposed"`` (2 to
        :data:`~lookahead.linear_layout.MAX_ROWS` rows) or ``"onednn"`` (every step of 2 or more rows, checked to
        be possible here), else ``nn.Linear`` until an ``"auto"`` calibration chooses (:meth:`cost_curve`)."""
        kind = FORCED_LAYOUTS.get(self.config.linear_layout)
        if not modules or kind is None:
            return LinearPlan()
        if kind == ONEDNN and not onednn_fits(modules):
            dtypes = sorted({str(m.weight.dtype) for m in modules})
            raise ValueError(
                f"LookaheadConfig.linear_layout='onednn' cannot run here: it needs torch.float32 linear weights "
                f"(this model's: {', '.join(dtypes)}) and a torch built with oneDNN (torch.backends.mkldnn."
                f"is_available(): {torch.backends.mkldnn.is_available()}); use 'auto', 'linear' or 'transposed'")
        return WHOLE_PLANS[kind]

    def _layout_modules(self, model) -> list:
        """The linear layers this decoder's steps may compute in another layout than ``nn.Linear``
        (``LookaheadConfig.linear_layout``, ``linear_layout.py``): none for ``"linear"`` or a model sharded over
        tensor-parallel ranks, and under ``"auto"`` none for a model too small to be worth more calibrations or
        whose weights are bf16 or fp16 (``linear_layout.AUTO_DTYPES``)."""
        if self.config.linear_layout == "linear" or RankSync.for_model(model).active:
            return []
        device = getattr(model, "device", None)
        if device is not None and torch.device(device).type != "cpu":  # on a GPU: none, without walking the modules
            return []
        modules = linear_modules(model)
        if self.config.linear_layout == "auto" and (weights(modules) < LAYOUT_MIN_WEIGHTS
                                                    or any(m.weight.dtype not in AUTO_DTYPES for m in modules)):
            return []
        return modules

    def policies_for(self, rows: int) -> list[DraftPolicy]:
        """A batch's per-row draft policies, created on first use and kept across calls: each with its own trie
        (of at most :data:`ROW_TRIE_CAPACITY` nodes: one request's n-grams; past it the least recently used
        make room) and copy index, the decoder's one model-prediction table, a shared ``trie=`` store read-only
        (``batch.ReadOnlyStore``), the corpus's store (read-only already)."""
        config = replace(self.config, window_width=0, refine_cost=False, self_draft="none",
                         step_nodes=self.config.step_nodes_range[0])
        memory = ReadOnlyStore(self.memory) if self.memory is not None else None
        model = self.policy.model
        while len(self.row_policies) < rows:
            trie = NgramTrie(max_n=config.ngram_size, capacity=min(config.trie_capacity, ROW_TRIE_CAPACITY))
            self.row_policies.append(DraftPolicy(config, trie, memory, self.tuning,
                                                 successors=None if model is None else model.table,
                                                 corpus=self._corpus_store))
        return self.row_policies[:rows]


def _static(generation_config, model_kwargs: dict) -> bool:
    """Whether the call decodes on a static cache (``cache_implementation="static"``, or an older name of it, or a
    ``StaticCache`` given)."""
    if getattr(generation_config, "cache_implementation", None) in call.STATIC_IMPLEMENTATIONS:
        return True
    return static_cache(compat.cache_of(model_kwargs)) if compat.cache_of(model_kwargs) is not None else False


