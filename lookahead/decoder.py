"""`LookaheadDecoder`: the decoder behind ``generate(..., custom_generate=LookaheadDecoder())``, and its one-row loop.

Each step: the draft policy hands over a finished draft (``policy.py``); it is packed after the
pending tokens (``tree.py``), ONE forward of the target model runs, the exact-acceptance core
verifies it (``verify.py``), the accepted tokens plus one are emitted against the stopping criteria,
only the accepted path's KV entries are kept (``kv_cache.py``), and the policy learns from the
verdict. The pieces every loop shares are in ``call.py``; a batch of several rows runs ``batch.py``'s
loop. Terms are defined in ``config.py``.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch
from transformers import DynamicCache

from . import call, compat
from .batch import BatchCall, ReadOnlyStore
from .cache import NgramTrie
from .config import LookaheadConfig
from .cost import DEFAULT_CALIBRATIONS, Calibrations, CostModel, calibration_sizes, measure_cost_curve
from .draft import Draft
from .kv_cache import check_rollbackable, keep_entries, new_cache
from .policy import DraftPolicy, Limits
from .stats import DecodeStats
from .tree import StepMask, pack_step, step_inputs
from .tuning import BudgetTuning
from .verify import Verdict


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
    - ``calibrations``: where measured cost curves are kept (default: the process's
      ``cost.DEFAULT_CALIBRATIONS``, so each model is measured once per process).
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
                 tuning: BudgetTuning | None = None, tokenizer=None, draft_model=None, heads=None, **overrides):
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
        self.tuning = tuning or BudgetTuning()
        self.policy = DraftPolicy(config, self.trie, self.memory, self.tuning, draft_model, heads)
        self.row_policies: list[DraftPolicy] = []  # a batch's, one per row, created on first use (policies_for)
        self.calibrations = calibrations if calibrations is not None else DEFAULT_CALIBRATIONS
        self.clock = clock
        self.tokenizer = tokenizer
        self.stats = DecodeStats()
        self.row_stats: list[DecodeStats] = []
        self.prefill_groups: list[list[int]] | None = None
        self._tp_curves: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # under tensor parallelism
        self._busy = threading.Lock()  # held by the running call

    def __getstate__(self):  # copy.deepcopy / pickle: a lock and curves keyed by live models do not travel
        return {k: v for k, v in self.__dict__.items() if k not in ("_busy", "_tp_curves")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._busy = threading.Lock()
        self._tp_curves = weakref.WeakKeyDictionary()

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
        call.check_supported(model, input_ids.shape[0], generation_config, synced_gpus, self)
        if streamer is None:
            streamer = compat.streamer_of_calling_generate(self)
        if stop_strings:
            stopping_criteria = call.with_stop_strings(stopping_criteria, stop_strings, tokenizer or self.tokenizer)
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(
                "this LookaheadDecoder is already decoding (in another thread); a decoder holds the state of one "
                "stream: use one LookaheadDecoder per concurrent generate() call (they may share one trie=)."
            )
        try:
            self.stats = DecodeStats()
            loop = BatchCall if input_ids.shape[0] > 1 else SingleCall
            return loop(self, model, input_ids, logits_processor, stopping_criteria, generation_config, streamer,
                        model_kwargs).run()
        finally:
            self._busy.release()

    def cost_curve(self, model, kv_window: int | None = None, sync=None) -> CostModel:
        """The cost curve this decoder prices drafts with on ``model``: the configured one, else the
        one kept in ``calibrations`` (measured on first use). ``sync``: the ranks of a tensor-parallel model
        (``distributed.RankSync``), which all price with rank 0's curve."""
        if self.config.cost_curve:
            return CostModel(self.config.cost_curve)
        cache_kwarg, keeps_logits = compat.cache_kwarg_name(model), compat.supports_logits_to_keep(model)

        def measure(sizes):  # timing only: a plain cache, which a small sliding window cannot break
            factory = (lambda: new_cache(model)) if kv_window is None else DynamicCache
            return measure_cost_curve(model, factory, sizes, cache_kwarg, keeps_logits, clock=self.clock)

        rows = self.policy.max_rows()
        if sync is None or not sync.active:
            return self.calibrations.get(model, rows, measure)
        # tensor parallelism: every rank runs the same timed (sharded) forwards, reading rank 0's clock, and
        # prices with rank 0's curve; kept per model in this decoder, whose calls every rank makes alike
        known = self._tp_curves.get(model)
        sync.check("calibration", known=known is not None and known.max_k >= rows)
        if known is None or known.max_k < rows:
            factory = (lambda: new_cache(model)) if kv_window is None else DynamicCache
            measured = measure_cost_curve(model, factory, calibration_sizes(rows), cache_kwarg, keeps_logits,
                                          clock=sync.shared_clock(self.clock))
            known = self._tp_curves[model] = sync.broadcast(measured)
        return known

    def policies_for(self, rows: int) -> list[DraftPolicy]:
        """A batch's per-row draft policies (each with its own trie; a shared ``trie=`` store read-only, see
        ``batch.ReadOnlyStore``), created on first use and kept across calls."""
        config = replace(self.config, window_width=0, refine_cost=False, self_draft="none")
        memory = ReadOnlyStore(self.memory) if self.memory is not None else None
        while len(self.row_policies) < rows:
            trie = NgramTrie(max_n=config.ngram_size, capacity=config.trie_capacity)
            self.row_policies.append(DraftPolicy(config, trie, memory, self.tuning))
        return self.row_policies[:rows]


class SingleCall:
    """One ``generate`` call of one row: its state and the decode loop (:meth:`run`)."""

    def __init__(self, decoder: LookaheadDecoder, model, input_ids, logits_processor, stopping_criteria,
                 generation_config, streamer, model_kwargs):
        self.setup = setup = call.prepare(decoder, model, input_ids, logits_processor, stopping_criteria,
                                          generation_config, model_kwargs)
        self.model, self.streamer, self.clock = model, streamer, decoder.clock
        self.stats, self.policy = decoder.stats, decoder.policy
        self.processors = setup.processors[0]
        self.cache, self.device, self.max_length = setup.cache, setup.device, setup.max_length

        prompt = input_ids[0].cpu().numpy().astype(np.int64)  # int64[L], host copy
        prompt_pos, self.col_visible = call.prompt_positions(model_kwargs.get("attention_mask"), len(prompt),
                                                             setup.gen.max_length)
        self.scores: list[torch.Tensor] = []
        self.raw: list[torch.Tensor] = []
        self.uniforms = call.uniforms(setup, 1)[0]  # seeded from torch's generator (rank 0's under TP)
        self.past_len = setup.cache.get_seq_length()
        self.length = input_ids.shape[1]  # tokens in the sequence
        # seq: long[1, max_length + 1], the sequence so far in its first `length` columns (our own buffer)
        self.seq = torch.empty((1, max(setup.gen.max_length, self.length) + 1), dtype=torch.long, device=self.device)
        self.seq[:, : self.length] = input_ids
        self.seq_host = self.seq.numpy() if setup.on_cpu else None  # the same memory, written from the host
        # host int64[p] each: the tokens not in the KV cache yet, and their positions
        self.pending, self.pending_pos = prompt[self.past_len :], prompt_pos[self.past_len :]
        self._last_token, self._last_pos = np.zeros(1, np.int64), np.zeros(1, np.int64)
        self.limit = np.array([self.max_length], np.int64)
        self.step_mask: StepMask | None = None  # the masks of the steps after the prompt's, made on first use
        self.refine = decoder.config.refine_cost and setup.cost is not None
        self.policy.start(prompt, Limits(self.max_length, setup.kv_window), setup.cost, model)
        self.hidden = None  # [1, rows, H]: the output embedding's input of the last forward, when a source wants it

    def run(self):
        """The decode loop; with a source that learns from hidden states, a hook keeps the LM head's input."""
        handle = None
        if self.policy.wants_hidden:
            def keep_hidden(module, args):
                self.hidden = args[0]

            handle = self.model.get_output_embeddings().register_forward_pre_hook(keep_hidden)
        try:
            return self.loop()
        finally:
            self.policy.catch_up()  # the sources that learn lazily (a shared store) have learned the whole output
            if handle is not None:
                handle.remove()

    def loop(self):
        """The decode loop: draft -> pack -> forward -> verify -> emit -> keep KV -> learn."""
        stats, clock, policy, setup = self.stats, self.clock, self.policy, self.setup
        done, checked = False, False
        while not done:
            t0 = clock()
            p = len(self.pending)
            draft = policy.draft(self.length, self.past_len + p, int(self.pending_pos[-1]))
            rows, n = draft.rows, len(draft)
            ids, pos, mask = self.pack(draft)
            t1 = clock()
            k = policy.recycle_k
            warm = p - 1 if p > 1 and policy.prompt_rows and k else 0  # the prompt's rows, for the model's predictions
            logits = call.forward(setup, stats, ids, pos, mask, rows + 1 + warm)[0]  # [warm + 1 + n + m, V]
            if warm:
                _, (top_ids, top_vals) = call.read_rows(setup, logits[None, :warm], None, np.array([warm]), k)
                policy.learn_prompt(self.pending[:warm], top_ids[0], top_vals[0])
                logits = logits[warm:]
            if not checked:
                check_rollbackable(self.cache)
                checked = True
            t2 = clock()
            argmax, tops = call.read_rows(setup, logits[None], np.array([rows + 1]) if setup.argmax_verdicts else None,
                                          np.array([n + 1]), call.top_width(setup, k))
            verdict, window_argmax = self.verify(logits, draft, argmax, tops)
            t3 = clock()
            n_emit, done = self.emit(verdict)
            n_acc = min(len(verdict.nodes), n_emit)
            self.keep_kv(p, draft, verdict.nodes[:n_acc], verdict.tokens[n_emit - 1])
            hidden = None
            if self.hidden is not None:  # the row whose logits gave the last emitted token (rows: root, nodes, ...)
                hidden = self.hidden[0, self.hidden.shape[1] - (rows + 1) + (1 + verdict.nodes[n_acc - 1] if n_acc else 0)]
            successors = None if not k else (tops[0][0, : n + 1, :k], tops[1][0, : n + 1, :k])
            seconds = call.shared_seconds(setup, t3 - t1) if self.refine else 0.0  # a step: forward + verify
            policy.learn(draft, verdict.nodes, verdict.tokens[:n_emit], window_argmax,
                         1 + rows if p == 1 else 0, seconds, successors, hidden)
            stats.record_step(draft, verdict.nodes[:n_acc], n_emit, t1 - t0, t2 - t1, t3 - t2, clock() - t3)
        call.finish(setup, stats)
        return self.output()

    def pack(self, draft: Draft):
        """(input ids [1, q], position ids [1, q], 4D mask or None) of this step."""
        if not draft.rows and self.col_visible is None:  # plain causal step: the model's own mask and fast path
            return (torch.from_numpy(self.pending[None]).to(self.device),
                    torch.from_numpy(self.pending_pos[None]).to(self.device), None)
        if len(self.pending) == 1:  # a step after the prompt's: the mask buffer writes only this step's block
            if self.step_mask is None:
                rows = self.policy.max_rows() + 1
                self.step_mask = StepMask(rows, self.setup.gen.max_length + rows + 1, self.setup.dtype, self.device,
                                          self.col_visible)
            window = draft.window
            mask = self.step_mask(self.past_len, 1, draft.parents, None if window is None else window.visible)
            return (*step_inputs(self.pending, self.pending_pos, draft.tokens, draft.depth, window, self.device), mask)
        col_visible = None if self.col_visible is None else self.col_visible[: self.length]
        return pack_step(self.pending, self.pending_pos, draft.tokens, draft.parents, col_visible, self.past_len,
                         self.setup.dtype, draft.window, self.device, draft.depth)

    def verify(self, logits: torch.Tensor, draft: Draft, argmax: np.ndarray | None, tops) -> tuple[Verdict, list | None]:
        """(the verdict, the window rows' argmax or None). ``argmax`` int64[1, q]: every row's, when the verdict
        needs nothing else (``CallSetup.argmax_verdicts``: :func:`call.read_rows` made the one host round trip);
        with token bans, turned into the processed argmax from the rows' top-k (``tops``) first."""
        n = len(draft)
        setup = self.setup
        if setup.argmax_verdicts:
            window_argmax = argmax[0, n + 1 :].tolist() if draft.window is not None else None
            if setup.bans is None or setup.bans.apply(argmax, tops, np.array([n + 1]),
                                                     self.length + np.concatenate([[0], draft.depth])[None]):
                return call.greedy_verdicts(argmax, [draft])[0], window_argmax
        uniforms = self.uniforms.take(self.stats.new_tokens, n + 1) if self.uniforms is not None else None
        verdict = call.processed_verdict(setup, logits, draft, self.seq[:, : self.length], self.processors, uniforms)
        window_argmax = logits[n + 1 :].argmax(-1).tolist() if draft.window is not None else None
        return verdict, window_argmax

    def emit(self, verdict: Verdict) -> tuple[int, bool]:
        """Append the verdict's tokens until a stopping criterion holds: (emitted, done)."""
        tokens, start = verdict.tokens, self.length
        if self.seq_host is not None:
            self.seq_host[0, start : start + len(tokens)] = tokens
        else:
            self.seq[0, start : start + len(tokens)] = torch.tensor(tokens, dtype=torch.long, device=self.device)
        stop, _ = call.first_stops(self.setup, [tokens], np.array([start]), self.limit)
        n_emit = len(tokens) if stop[0] < 0 else int(stop[0]) + 1
        if self.setup.other_stops:  # criteria on tensors, token by token up to the host's stop
            for i in range(n_emit):
                if call.other_stop(self.setup, self.seq[:, : start + i + 1], verdict.scores[i] if verdict.scores else None):
                    n_emit = i + 1
                    stop[0] = i
                    break
        self.length = start + n_emit
        if verdict.scores is not None:
            self.scores.extend(verdict.scores[:n_emit])
        if verdict.raw is not None:
            self.raw.extend(verdict.raw[:n_emit])
        if self.streamer is not None:
            self.streamer.put(self.seq[0, start : self.length].cpu().clone())
        return n_emit, bool(stop[0] >= 0)

    def keep_kv(self, p: int, draft: Draft, accepted: list[int], last_token: int) -> None:
        """Keep the pending tokens' and the accepted nodes' KV entries; the last emitted token becomes pending."""
        if draft.rows:  # else every entry of the step stays
            keep_entries(self.cache, p + draft.rows, list(range(p)) + [p + j for j in accepted])
        self.past_len += p + len(accepted)
        last_pos = int(self.pending_pos[-1]) + len(accepted) + 1
        self.pending, self.pending_pos = self._last_token, self._last_pos  # int64[1] each, reused every step
        self.pending[0], self.pending_pos[0] = last_token, last_pos

    def output(self):
        if self.streamer is not None:
            self.streamer.end()
        sequences = self.seq[:, : self.length].clone()
        if not self.setup.return_dict:
            return sequences
        return compat.decoder_only_output(sequences, tuple(self.scores) if self.setup.keep_scores else None,
                                          tuple(self.raw) if self.setup.keep_raw else None, self.cache)
