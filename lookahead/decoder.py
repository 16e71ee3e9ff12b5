"""`LookaheadDecoder`: the decode loop behind ``generate(..., custom_generate=LookaheadDecoder())``.

Each step: the draft policy hands over a finished draft (``policy.py``); it is packed after the
pending tokens (``tree.py``), ONE forward of the target model runs, the exact-acceptance core
verifies it (``verify.py``), the accepted tokens plus one are emitted against the stopping criteria,
only the accepted path's KV entries are kept (``kv_cache.py``), and the policy learns from the
verdict. Terms are defined in ``config.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import torch
from transformers import DynamicCache

from . import compat
from .cache import NgramTrie
from .config import LookaheadConfig
from .cost import DEFAULT_CALIBRATIONS, Calibrations, CostModel, measure_cost_curve
from .cpu_linear import covered_linears, measure_paths, routed
from .draft import Draft
from .kernels import row_top
from .kv_cache import (
    CacheNotRollbackable,
    GrowingLayer,
    cache_layers,
    check_rollbackable,
    grow_in_place,
    keep_entries,
    new_cache,
)
from .policy import DraftPolicy, Limits
from .stats import DecodeStats
from .tree import pack_step
from .tuning import BudgetTuning
from .verify import PositionUniforms, Verdict, greedy_verify_argmax, verify

# model kwargs that generate() prepares and that the decoder handles itself
_HANDLED_KWARGS = {"attention_mask", "position_ids", "use_cache", "logits_to_keep", *compat.CACHE_KWARGS}


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
      speculative decoding; priced like the config's ``self_draft`` passes (``selfspec.py``).
    - ``tokenizer``: the model's tokenizer, for ``stop_strings=`` in the plain
      ``generate(custom_generate=decoder, ...)`` spelling: ``generate`` does not pass its own
      ``tokenizer=`` on to a custom decoding callable (``lookahead.enable``'s spellings do).
    - ``heads``: trained draft heads for this model (``lookahead.heads.DraftHeads``), one more draft source
      over the model's final hidden state; batch size 1.

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
        self.policy = DraftPolicy(config, self.trie, self.memory, tuning, draft_model, heads)
        self.calibrations = calibrations if calibrations is not None else DEFAULT_CALIBRATIONS
        self.clock = clock
        self.tokenizer = tokenizer
        self.stats = DecodeStats()
        self._busy = threading.Lock()  # held by the running call

    def __getstate__(self):  # copy.deepcopy / pickle: a lock does not travel
        return {k: v for k, v in self.__dict__.items() if k != "_busy"}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._busy = threading.Lock()

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
        _check_supported(model, input_ids, generation_config, synced_gpus)
        if streamer is None:
            streamer = compat.streamer_of_calling_generate(self)
        if stop_strings:
            stopping_criteria = _with_stop_strings(stopping_criteria, stop_strings, tokenizer or self.tokenizer)
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(
                "this LookaheadDecoder is already decoding (in another thread); a decoder holds the state of one "
                "stream: use one LookaheadDecoder per concurrent generate() call (they may share one trie=)."
            )
        try:
            self.stats = DecodeStats()
            if input_ids.shape[0] > 1:
                if self.policy.wants_hidden:
                    raise ValueError("LookaheadDecoder(heads=...) decodes batch size 1 only; call generate once per "
                                     "prompt, or use a decoder without heads for batches.")
                from .batch import _BatchCall  # batch size > 1: one forward per step for every row

                call = _BatchCall(self, model, input_ids, logits_processor, stopping_criteria, generation_config,
                                  streamer, model_kwargs)
                return call.run()
            call = _Call(self, model, input_ids, logits_processor, stopping_criteria, generation_config,
                         streamer, model_kwargs)
            return call.run()
        finally:
            self._busy.release()

    def cost_curve(self, model, kv_window: int | None = None) -> CostModel:
        """The cost curve this decoder prices drafts with on ``model``: the configured one, else the
        one kept in ``calibrations`` (measured on first use)."""
        if self.config.cost_curve:
            return CostModel(self.config.cost_curve)
        cache_kwarg, keeps_logits = compat.cache_kwarg_name(model), compat.supports_logits_to_keep(model)
        kernels = (self.config.cpu_kernels and model.device.type == "cpu"
                   and model.dtype in (torch.float32, torch.bfloat16))

        def measure(sizes):  # timing only: a plain cache, which a small sliding window cannot break
            factory = (lambda: new_cache(model)) if kv_window is None else DynamicCache
            if kernels and covered_linears(model):  # both paths, per k: the curve of the faster one
                times = measure_paths(model, sizes, clock=self.clock, cache_factory=factory)
                return CostModel(times.curve_points, times.kernel_rows())
            return measure_cost_curve(model, factory, sizes, cache_kwarg, keeps_logits, clock=self.clock)

        return self.calibrations.get(model, self.policy.max_rows(), measure, "cpu-kernels" if kernels else "")


def _check_supported(model, input_ids, generation_config, synced_gpus) -> None:
    """Refuse, with a clear message, everything the decoder would not decode exactly as asked."""
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(
            "LookaheadDecoder supports decoder-only models; this is an encoder-decoder model. "
            "Use plain generate() for it."
        )
    if generation_config is not None:
        if generation_config.num_beams != 1:
            raise ValueError(
                f"LookaheadDecoder does not do beam search (num_beams={generation_config.num_beams}). "
                "Remove num_beams or use plain generate()."
            )
        if getattr(generation_config, "num_assistant_tokens", None) and getattr(
            generation_config, "prompt_lookup_num_tokens", None
        ):
            raise ValueError("LookaheadDecoder cannot be combined with prompt_lookup_num_tokens; pick one.")
    if input_ids.shape[0] > 1:
        from .batch import check_batch_supported

        check_batch_supported(generation_config)
    if synced_gpus:
        raise ValueError("LookaheadDecoder does not support synced_gpus (DeepSpeed ZeRO-3 / FSDP).")
    impl = getattr(generation_config, "cache_implementation", None) if generation_config is not None else None
    if impl not in (None, "dynamic"):
        raise CacheNotRollbackable(
            f"LookaheadDecoder needs a dynamic KV cache it can roll back; cache_implementation={impl!r} is not one. "
            "Remove cache_implementation or use plain generate()."
        )


def _check_cache_layers(cache, max_length: int) -> int | None:
    """Before any forward: refuse a cache whose layers the decoder cannot roll back exactly. Returns the
    smallest sliding window of its layers (every forward must stay below it), or None."""
    DynamicLayer, DynamicSlidingWindowLayer = compat.rollbackable_layer_types()
    window = None
    for layer in cache_layers(cache):
        if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer, GrowingLayer):
            raise CacheNotRollbackable(
                f"the model's cache layer {type(layer).__name__} cannot roll back rejected draft tokens "
                "(static, quantized, offloaded or recurrent state). LookaheadDecoder cannot decode this model "
                "exactly; use plain generate() for it."
            )
        if isinstance(layer, DynamicSlidingWindowLayer):
            if max_length > layer.sliding_window:
                raise CacheNotRollbackable(
                    f"the model attends over a sliding window of {layer.sliding_window} tokens and this call may "
                    f"reach {max_length}; LookaheadDecoder cannot roll back past the window. Use max_length <= "
                    f"{layer.sliding_window} or plain generate()."
                )
            window = layer.sliding_window if window is None else min(window, layer.sliding_window)
    return window




class _Call:
    """One ``generate`` call: its validated inputs, its state, and the decode loop (:meth:`run`)."""

    def __init__(self, decoder: LookaheadDecoder, model, input_ids, logits_processor, stopping_criteria,
                 generation_config, streamer, model_kwargs):
        gen = generation_config if generation_config is not None else model.generation_config
        _check_model_kwargs(model_kwargs, gen)
        self.model, self.streamer, self.clock = model, streamer, decoder.clock
        self.stats = decoder.stats
        self.policy = decoder.policy
        self.processors = compat.processors_as_function(logits_processor)
        max_length = gen.max_length
        stop_length, self.eos, self.other_stops = compat.host_stopping(stopping_criteria)
        self.max_length = stop_length if stop_length is not None else max_length
        self.cache_kwarg = compat.cache_kwarg_name(model)
        self.keeps_logits = compat.supports_logits_to_keep(model)
        self.forward_kwargs = {"use_cache": True}  # the same every step (compat.last_logits adds logits_to_keep)
        if decoder.memory is not None and decoder.memory.max_token() >= model.config.vocab_size:
            raise ValueError(
                f"the shared trie holds token id {decoder.memory.max_token()}, outside this model's vocabulary of "
                f"{model.config.vocab_size}: the store was built with another tokenizer. Use a store built with "
                "this model's tokenizer (NgramTrie.load(path, vocab_size=..., tokenizer_id=...) checks it when "
                "the store was saved with them)."
            )
        cache = compat.cache_of(model_kwargs)
        self.cache = new_cache(model) if cache is None else grow_in_place(cache)
        self.forward_kwargs[self.cache_kwarg] = self.cache
        kv_window = _check_cache_layers(self.cache, max_length)
        device = self.device = input_ids.device
        self.on_cpu = device.type == "cpu"
        self.argmax_by_max = self.on_cpu and getattr(model.config, "vocab_size", 0) >= 1024  # see read_rows
        self.dtype = model.dtype

        prompt = input_ids[0].cpu().numpy().astype(np.int64)  # int64[L], host copy
        prompt_pos, self.col_visible = _positions(model_kwargs.get("attention_mask"), len(prompt), max_length)

        self.keep_scores = bool(gen.return_dict_in_generate and gen.output_scores)
        self.keep_raw = bool(gen.return_dict_in_generate and gen.output_logits)
        self.return_dict = bool(gen.return_dict_in_generate)
        self.scores: list[torch.Tensor] = []
        self.raw: list[torch.Tensor] = []
        self.uniforms = PositionUniforms() if gen.do_sample else None  # seeded from torch's generator
        # greedy, no processors, no scores: the verdict needs only every row's argmax
        self.plain_greedy = self.processors is None and self.uniforms is None and not (self.keep_scores or self.keep_raw)

        self.past_len = self.cache.get_seq_length()
        self.length = input_ids.shape[1]  # tokens in the sequence
        if self.past_len >= self.length:
            raise ValueError(
                f"the cache already holds {self.past_len} tokens but input_ids has {self.length}: "
                "nothing is left to decode from"
            )
        # seq: long[1, max_length], the sequence so far in its first `length` columns (our own buffer)
        self.seq = torch.empty((1, max(max_length, self.length) + 1), dtype=torch.long, device=device)
        self.seq[:, : self.length] = input_ids
        self.seq_host = self.seq.numpy() if device.type == "cpu" else None  # the same memory, written from the host
        # host int64[p] each: the tokens not in the KV cache yet, and their positions
        self.pending, self.pending_pos = prompt[self.past_len :], prompt_pos[self.past_len :]
        self._last_token, self._last_pos = np.zeros(1, np.int64), np.zeros(1, np.int64)

        cost = None
        if decoder.config.adaptive:
            t = self.clock()
            cost = decoder.cost_curve(model, kv_window)
            self.stats.time_calibration = self.clock() - t
            self.stats.cost_curve = cost.points
        self.kernel_rows = cost.kernel_rows if cost is not None and decoder.config.cpu_kernels else frozenset()
        self.policy.start(prompt, Limits(max_length, kv_window), cost, model)
        self.hidden = None  # [1, rows, H]: the output embedding's input of the last forward, when a source wants it

    def run(self):
        """The decode loop, with the model's linear layers on the path the cost curve was measured on."""
        if not self.policy.wants_hidden:
            with routed(self.model, self.kernel_rows):
                return self.loop()
        head = self.model.get_output_embeddings()

        def keep_hidden(module, args):
            self.hidden = args[0]

        handle = head.register_forward_pre_hook(keep_hidden)
        try:
            with routed(self.model, self.kernel_rows):
                return self.loop()
        finally:
            handle.remove()

    def loop(self):
        """The decode loop: draft -> pack -> forward -> verify -> emit -> keep KV -> learn."""
        stats, clock, policy = self.stats, self.clock, self.policy
        done, checked = False, False
        while not done:
            t0 = clock()
            p = len(self.pending)
            draft = policy.draft(self.length, self.past_len + p, int(self.pending_pos[-1]))
            rows = draft.rows
            ids, pos, mask = self.pack(draft)
            t1 = clock()
            warm = p - 1 if p > 1 and policy.prompt_rows and policy.recycle_k else 0  # the prompt's rows, for the
            logits = self.forward(ids, pos, mask, rows + warm)  # [warm + 1 + n + m, V]   model's predictions
            if warm:
                policy.learn_prompt(self.pending[:warm], *self.read_rows(logits[:warm], policy.recycle_k, False)[1])
                logits = logits[warm:]
            if not checked:
                check_rollbackable(self.cache)
                checked = True
            t2 = clock()
            argmax, successors = self.read_rows(logits, policy.recycle_k, self.plain_greedy, len(draft))
            verdict, window_argmax = self.verify(logits, draft, argmax)
            t3 = clock()
            n_emit, done = self.emit(verdict)
            n_acc = min(len(verdict.nodes), n_emit)
            self.keep_kv(p, draft, verdict.nodes[:n_acc], verdict.tokens[n_emit - 1])
            hidden = None
            if self.hidden is not None:  # the row whose logits gave the last emitted token (rows: root, nodes, ...)
                hidden = self.hidden[0, self.hidden.shape[1] - (rows + 1) + (1 + verdict.nodes[n_acc - 1] if n_acc else 0)]
            policy.learn(draft, verdict.nodes, verdict.tokens[:n_emit], window_argmax,
                         1 + rows if p == 1 else 0, t3 - t1, successors, hidden)  # a step's time: forward + verify
            stats.record_step(draft, verdict.nodes[:n_acc], n_emit, t1 - t0, t2 - t1, t3 - t2, clock() - t3)
        return self.output()

    def pack(self, draft: Draft):
        """(input ids [1, q], position ids [1, q], 4D mask or None) of this step."""
        if not draft.rows and self.col_visible is None:  # plain causal step: the model's own mask and fast path
            return (torch.from_numpy(self.pending[None]).to(self.device),
                    torch.from_numpy(self.pending_pos[None]).to(self.device), None)
        col_visible = None if self.col_visible is None else self.col_visible[: self.length]
        return pack_step(self.pending, self.pending_pos, draft.tokens, draft.parents, col_visible, self.past_len,
                         self.dtype, draft.window, self.device, draft.depth)

    def forward(self, ids, pos, mask, rows: int) -> torch.Tensor:
        """One forward of the target model; the float logits of the last pending token and the draft rows."""
        self.stats.target_calls += 1
        return compat.last_logits(self.model, ids, pos, mask, self.forward_kwargs, self.keeps_logits, rows + 1)[0]

    def read_rows(self, logits: torch.Tensor, top: int, every_argmax: bool, n: int | None = None):
        """(every row's argmax, int64[r] on the host, when ``every_argmax``, else None; when ``top`` (k > 0),
        the first ``n + 1`` rows' (all rows' when ``n`` is None) top-k (ids int64[., k], logits
        float32[., k]) for the model-prediction source, else None).

        On a CPU both come from one pass over each row (``kernels.row_top``, about 4x faster than
        ``argmax`` plus ``topk``; its argmax is exactly ``torch.argmax``'s), and an argmax alone from
        ``max`` (its indices are ``argmax``'s, first maximal value first; on this project's 2-core CPU
        2.5x faster than ``argmax`` from a vocabulary of 4096 up, slower below 1024). On a GPU,
        ``argmax`` and ``topk`` run there and the top-k's host copy is queued before the argmax's
        (non-blocking), so both arrive in one synchronisation."""
        if not top:
            if not every_argmax:
                return None, None
            return (logits.max(-1).indices if self.argmax_by_max else logits.argmax(-1)).cpu().numpy(), None
        rows = logits.shape[0] if n is None else n + 1
        if self.on_cpu:
            arr = logits.detach().numpy()  # [r, V] float32, a view: read only
            if not every_argmax:
                arr = arr[:rows]
            ids, vals = np.empty((arr.shape[0], top), np.int64), np.empty((arr.shape[0], top), np.float32)
            argmax = row_top(arr, top, ids, vals)
            return (argmax if every_argmax else None), (ids[:rows], vals[:rows])
        t = logits[:rows].topk(min(top, logits.shape[-1]), -1)
        # non-blocking only when the argmax's blocking copy below waits for it: else no sync would follow
        queue = self.device.type == "cuda" and every_argmax
        successors = (t.indices.to("cpu", non_blocking=queue).numpy(), t.values.to("cpu", non_blocking=queue).numpy())
        return (logits.argmax(-1).cpu().numpy() if every_argmax else None), successors

    def verify(self, logits: torch.Tensor, draft: Draft, argmax: np.ndarray | None) -> tuple[Verdict, list[int] | None]:
        """(the verdict, the window rows' argmax or None). ``argmax``: every row's, when greedy and plain
        (then the verdict needs nothing else: :meth:`read_rows` made the one host round trip)."""
        n = len(draft)
        if self.plain_greedy:
            window_argmax = argmax[n + 1 :].tolist() if draft.window is not None else None
            if not n:
                return Verdict([], [int(argmax[0])]), window_argmax
            return greedy_verify_argmax(argmax, draft.tokens, draft.parents), window_argmax
        uniforms = self.uniforms.take(self.stats.new_tokens, n + 1) if self.uniforms is not None else None
        verdict = verify(logits[: n + 1], draft.tokens.tolist(), draft.parents.tolist(),
                         self.seq[:, : self.length], self.processors, do_sample=self.uniforms is not None,
                         keep_scores=self.keep_scores, keep_raw=self.keep_raw, uniforms=uniforms)
        window_argmax = logits[n + 1 :].argmax(-1).tolist() if draft.window is not None else None
        return verdict, window_argmax

    def emit(self, verdict: Verdict) -> tuple[int, bool]:
        """Append the verdict's tokens one by one until a stopping criterion holds: (emitted, done)."""
        tokens, start = verdict.tokens, self.length
        if self.seq_host is not None:
            if len(tokens) == 1:
                self.seq_host[0, start] = tokens[0]
            else:
                self.seq_host[0, start : start + len(tokens)] = tokens
        else:
            self.seq[0, start : start + len(tokens)] = torch.tensor(tokens, dtype=torch.long, device=self.device)
        n_emit, done = len(tokens), False
        for i, tok in enumerate(tokens):
            end = start + i + 1
            if end >= self.max_length or tok in self.eos or (
                    self.other_stops and self._other_stop(end, verdict.scores[i] if verdict.scores else None)):
                n_emit, done = i + 1, True
                break
        self.length = start + n_emit
        if verdict.scores is not None:
            self.scores.extend(verdict.scores[:n_emit])
        if verdict.raw is not None:
            self.raw.extend(verdict.raw[:n_emit])
        if self.streamer is not None:
            self.streamer.put(self.seq[0, start : self.length].cpu().clone())
        return n_emit, done

    def _other_stop(self, end: int, scores) -> bool:
        ids = self.seq[:, :end]
        return any(bool(criterion(ids, scores).all()) for criterion in self.other_stops)

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
        if not self.return_dict:
            return sequences
        return compat.decoder_only_output(sequences, tuple(self.scores) if self.keep_scores else None,
                                          tuple(self.raw) if self.keep_raw else None, self.cache)


def _positions(attention_mask, length: int, max_length: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(positions int64[length] of the prompt's tokens, col_visible) from a 2D ``attention_mask`` or None.

    ``col_visible``: host bool[max(max_length, length) + 1], False at the prompt's padding and True
    for every later token; None when nothing is padding. Example: mask ``[[0, 1, 1]]`` -> positions
    ``[0, 0, 1]``, col_visible ``[F, T, T, T, ...]``.
    """
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError("attention_mask must be 2D [batch, sequence]")
    if attention_mask is None or bool((attention_mask == 1).all()):
        return np.arange(length), None
    visible = attention_mask[0].bool().cpu().numpy()
    col_visible = np.ones(max(max_length, length) + 1, dtype=bool)
    col_visible[:length] = visible
    return np.maximum(np.cumsum(visible) - 1, 0), col_visible


def _with_stop_strings(stopping_criteria, stop_strings, tokenizer):
    """``stopping_criteria`` plus transformers' ``StopStringCriteria`` for ``stop_strings`` (checked token
    by token like every criterion)."""
    from transformers import StoppingCriteriaList, StopStringCriteria

    if tokenizer is None:
        raise ValueError(
            "stop_strings need the model's tokenizer, and generate() does not pass tokenizer= on to a "
            "custom_generate callable. Give it to the decoder, LookaheadDecoder(tokenizer=tokenizer), or call "
            "lookahead.enable(model) and use assistant=/lookahead=True, which pass it on."
        )
    return StoppingCriteriaList([*(stopping_criteria or []), StopStringCriteria(tokenizer, stop_strings)])


def _check_model_kwargs(model_kwargs: dict, gen) -> None:
    """Refuse model inputs and outputs the decoder would not handle exactly as plain generate does."""
    wanted = sorted(k for k in ("output_attentions", "output_hidden_states")
                    if model_kwargs.get(k) or (gen.return_dict_in_generate and getattr(gen, k, False)))
    if wanted:
        raise ValueError(
            f"LookaheadDecoder does not return attentions or hidden states ({', '.join(wanted)}=True): "
            "the draft rows of each forward would make them differ from plain generate's. Use plain "
            "generate() for them."
        )
    unknown = {k for k, v in model_kwargs.items() if v is not None and k not in _HANDLED_KWARGS}
    if unknown:
        raise ValueError(
            f"LookaheadDecoder does not support these model inputs: {sorted(unknown)}. "
            "Use plain generate() for multimodal or other extra inputs."
        )
