"""`LookaheadDecoder`: the decode loop behind ``generate(..., custom_generate=LookaheadDecoder())``.

Each step: propose a draft tree from the n-gram trie, pack it after the pending tokens, run ONE
forward of the target model, verify exactly, emit the accepted tokens plus one, keep only the
accepted path's KV entries, teach the trie the new tokens. See ``tree.py``, ``verify.py`` and
``kv_cache.py`` for the pieces and ``config.py`` for the terms.
"""

from __future__ import annotations

import inspect
import sys
import threading
import time

import torch
from transformers import DynamicCache

from cache import NgramTrie

from .budget import Budget, CostModel, calibrate
from .config import LookaheadConfig
from .kv_cache import CacheNotRollbackable, cache_layers, check_rollbackable, keep_entries
from .proposer import ORIGINS, WINDOW, Proposer
from .stats import DecodeStats
from .tree import pack_step
from .verify import PositionUniforms, verify

# model kwargs that generate() prepares and that the decoder handles itself
_HANDLED_KWARGS = {"attention_mask", "position_ids", "use_cache", "logits_to_keep", "cache", "past_key_values"}


class LookaheadDecoder:
    """Exact speculative decoding without a draft model, for ``model.generate``.

    Usage::

        from lookahead import LookaheadDecoder
        decoder = LookaheadDecoder()
        out = model.generate(**inputs, max_new_tokens=256, custom_generate=decoder)
        print(decoder.stats)   # target calls, tokens per call, accepted lengths, time per phase

    The output is token for token what ``model.generate(**inputs, do_sample=False, ...)`` returns.

    Threads: a decoder is the state of one decoding stream. A second call while one is running (from
    another thread) raises ``RuntimeError``; use one decoder per concurrent stream. Decoders in
    different threads may share one ``trie=`` store: it is locked, and each thread's outputs form
    their own stream in it (see :mod:`cache`).
    """

    def __init__(self, config: LookaheadConfig | None = None, *, trie: NgramTrie | None = None, **overrides):
        if config is None:
            config = LookaheadConfig(**overrides)
        elif overrides:
            from dataclasses import replace

            config = replace(config, **overrides)
        if not isinstance(config, LookaheadConfig):
            raise TypeError(f"config must be a LookaheadConfig, got {type(config).__name__}")
        self.config = config
        if trie is not None and not isinstance(trie, NgramTrie):
            raise TypeError(f"trie must be a cache.NgramTrie shared across calls, got {type(trie).__name__}")
        self.trie = NgramTrie(max_n=config.ngram_size, capacity=config.trie_capacity)  # this request's
        self.memory = trie  # shared across calls: output n-grams of earlier requests
        self.proposer = Proposer(config, self.trie, self.memory)
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
        **model_kwargs,
    ):
        _check_supported(model, input_ids, generation_config, synced_gpus)
        if streamer is None:
            streamer = _streamer_of_calling_generate(self)
        if not self._busy.acquire(blocking=False):
            raise RuntimeError(
                "this LookaheadDecoder is already decoding (in another thread); a decoder holds the state of one "
                "stream: use one LookaheadDecoder per concurrent generate() call (they may share one trie=)."
            )
        try:
            return _decode(self, model, input_ids, logits_processor, stopping_criteria, generation_config,
                           streamer, model_kwargs)
        finally:
            self._busy.release()


def _streamer_of_calling_generate(decoder):
    """The ``streamer=`` of the ``generate(custom_generate=decoder, streamer=...)`` call running us, or None.

    ``generate`` puts the prompt into its streamer but does not hand the streamer to a callable
    ``custom_generate``, and has no public route for it: without this, the streamer would get the prompt
    and then nothing (a ``TextIteratorStreamer`` would wait forever). So look, read-only, at the calling
    ``generate`` frame's ``streamer``. Only a frame whose ``custom_generate`` is this very decoder counts;
    ``lookahead.enable``'s wrapper passes the streamer explicitly and does not rely on this.
    ``tests/test_integration.py`` pins it against the installed transformers.
    """
    frame = sys._getframe(2)  # 0: here, 1: __call__, 2: generate (when called by it)
    try:
        for _ in range(3):
            if frame is None:
                return None
            if frame.f_code.co_name == "generate" and frame.f_locals.get("custom_generate") is decoder:
                return frame.f_locals.get("streamer")
            frame = frame.f_back
        return None
    finally:
        del frame


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
    if input_ids.shape[0] != 1:
        raise ValueError(
            f"LookaheadDecoder decodes one sequence at a time (batch size 1); got batch size {input_ids.shape[0]}"
            " (after num_return_sequences). Call generate once per prompt."
        )
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
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    window = None
    for layer in cache_layers(cache):
        if type(layer) not in (DynamicLayer, DynamicSlidingWindowLayer):
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


def _cache_kwarg_name(model) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _decode(decoder, model, input_ids, logits_processor, stopping_criteria, generation_config, streamer,
            model_kwargs):
    stats = decoder.stats = DecodeStats()
    gen = generation_config if generation_config is not None else model.generation_config
    unknown = {k for k, v in model_kwargs.items() if v is not None and k not in _HANDLED_KWARGS}
    wanted = sorted(k for k in ("output_attentions", "output_hidden_states")
                    if model_kwargs.get(k) or (gen.return_dict_in_generate and getattr(gen, k, False)))
    if wanted:
        raise ValueError(
            f"LookaheadDecoder does not return attentions or hidden states ({', '.join(wanted)}=True): "
            "the draft rows of each forward would make them differ from plain generate's. Use plain "
            "generate() for them."
        )
    if unknown:
        raise ValueError(
            f"LookaheadDecoder does not support these model inputs: {sorted(unknown)}. "
            "Use plain generate() for multimodal or other extra inputs."
        )
    cache_name = _cache_kwarg_name(model)
    keeps_logits = model._supports_logits_to_keep() if hasattr(model, "_supports_logits_to_keep") else False
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    if cache is None:
        cache = DynamicCache(config=model.config)
    device = input_ids.device
    attn = model_kwargs.get("attention_mask")
    if attn is not None and attn.dim() != 2:
        raise ValueError("attention_mask must be 2D [batch, sequence]")
    has_padding = attn is not None and not bool((attn == 1).all())
    # col_visible: bool[total_len] for every token so far; None when nothing is padding
    col_visible = attn[0].bool() if has_padding else None
    if has_padding:
        prompt_pos = (attn[0].long().cumsum(-1) - 1).clamp_min(0)[None]
    else:
        prompt_pos = torch.arange(input_ids.shape[1], device=device)[None]

    output_scores = gen.return_dict_in_generate and gen.output_scores
    output_logits = gen.return_dict_in_generate and gen.output_logits
    all_scores: list[torch.Tensor] = []
    all_raw: list[torch.Tensor] = []
    max_length = gen.max_length
    kv_window = _check_cache_layers(cache, max_length)
    do_sample = bool(gen.do_sample)
    uniforms = PositionUniforms() if do_sample else None  # seeded from torch's generator
    dtype = model.dtype

    cfg = decoder.config
    proposer = decoder.proposer
    proposer.start(input_ids[0].tolist())
    budget = None
    if cfg.adaptive:
        cost = CostModel(cfg.cost_curve) if cfg.cost_curve else calibrate(
            model, lambda: DynamicCache(config=model.config) if kv_window is None else DynamicCache(), cache_name,
            keeps_logits, max_rows=proposer.max_rows()
        )  # (timing only: a plain cache, which a small sliding window cannot break)
        budget = Budget(cost)  # per call, fresh estimates: see Budget
        stats.cost_curve = cost.points

    past_len = cache.get_seq_length()
    if past_len >= input_ids.shape[1]:
        raise ValueError(
            f"the cache already holds {past_len} tokens but input_ids has {input_ids.shape[1]}: "
            "nothing is left to decode from"
        )
    pending = input_ids[:, past_len:]  # [1, p]
    pending_pos = prompt_pos[:, past_len:]  # [1, p]
    last_pos = int(pending_pos[0, -1])  # host copy of the last pending position: no device sync per step
    sequences = input_ids
    checked_cache = False
    done = False

    while not done:
        # -- propose -------------------------------------------------------------------------
        t0 = time.perf_counter()
        room = max_length - sequences.shape[1] - 1  # draft tokens that can still be emitted before the bonus
        draft = proposer.propose(room)
        if budget is not None:
            keep, use_window = budget.plan(draft)
            if len(keep) < len(draft.tokens):
                draft.keep(keep)
            if not use_window:
                draft.window = None
        if draft.window is not None and last_pos + int(draft.window[1].max()) > max_length - 2:
            draft.window = None  # no row beyond the last position plain generate would feed the model
        if kv_window is not None:  # stay below the sliding window, where rollback still works
            spare = kv_window - 1 - past_len - pending.shape[1]
            if len(draft.tokens) + draft.n_window_rows > spare:
                draft.window = None
                if len(draft.tokens) > spare:
                    draft.keep(list(range(max(spare, 0))))
        stats.budgets.append((len(draft.tokens), draft.n_window_rows))
        n, m = len(draft.tokens), draft.n_window_rows
        p = pending.shape[1]
        if n or m or col_visible is not None:
            ids, pos, mask = pack_step(pending, pending_pos, draft.tokens, draft.parents, col_visible, past_len,
                                       dtype, draft.window)
        else:  # a plain causal step: the model's own causal mask is the right one, and its fast path
            ids, pos, mask = pending, pending_pos, None
        t1 = time.perf_counter()

        # -- forward ---------------------------------------------------------------------------
        out = model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True, **{cache_name: cache},
                    **({"logits_to_keep": n + m + 1} if keeps_logits else {}))
        stats.target_calls += 1
        if not checked_cache:
            check_rollbackable(cache)
            checked_cache = True
        # [1+n+m, V]: the last pending token, the tree nodes, the window rows
        logits = out.logits[0, -(n + m + 1) :].float()
        del out
        window_argmax = logits[n + 1 :].argmax(-1).cpu().numpy() if m else None
        t2 = time.perf_counter()

        # -- verify ----------------------------------------------------------------------------
        verdict = verify(
            logits[: n + 1], draft.tokens.tolist(), draft.parents.tolist(), sequences, logits_processor,
            do_sample=do_sample, keep_scores=output_scores, keep_raw=output_logits,
            uniforms=uniforms.take(stats.new_tokens, n + 1) if do_sample else None,
        )
        t3 = time.perf_counter()

        # -- emit, token by token against the stopping criteria --------------------------------
        emitted = verdict.tokens
        new = torch.tensor(emitted, dtype=torch.long, device=device)[None]  # [1, k]
        base_len = sequences.shape[1]
        candidate = torch.cat([sequences, new], dim=1)
        n_emit = len(emitted)
        for i in range(len(emitted)):
            step_scores = verdict.scores[i] if verdict.scores is not None else None
            if bool(stopping_criteria(candidate[:, : base_len + i + 1], step_scores).all()):
                n_emit = i + 1
                done = True
                break
        sequences = candidate[:, : base_len + n_emit]
        emitted = emitted[:n_emit]
        if verdict.scores is not None:
            all_scores.extend(verdict.scores[:n_emit])
        if verdict.raw is not None:
            all_raw.extend(verdict.raw[:n_emit])
        n_acc = min(len(verdict.nodes), n_emit)
        stats.accepted_per_step.append(n_acc)
        for o in draft.origin.tolist():
            stats.drafted_by_origin[ORIGINS[o]] += 1
        for j in verdict.nodes[:n_acc]:
            stats.accepted_by_origin[ORIGINS[draft.origin[j]]] += 1
        if budget is not None:
            budget.record(draft, verdict.nodes, sum(1 for j in verdict.nodes if draft.origin[j] == WINDOW),
                          # the step's forward time, verification included (it waits for a GPU forward)
                          1 + n + m if p == 1 else 0, t3 - t1)
        stats.new_tokens += n_emit

        # -- bookkeeping: KV cache, positions, padding, trie -------------------------------------
        # keep the pending tokens and the accepted nodes; the last emitted token becomes pending
        keep = list(range(p)) + [p + j for j in verdict.nodes[:n_acc]]
        keep_entries(cache, p + n + m, keep)  # the window's entries are never kept
        past_len += len(keep)
        pending = sequences[:, -1:]
        pending_pos = pending_pos[:, -1:] + n_acc + 1
        last_pos += n_acc + 1
        if col_visible is not None:
            col_visible = torch.cat([col_visible, col_visible.new_ones(n_emit)])
        proposer.learn(emitted, window_argmax)
        if streamer is not None:
            streamer.put(new[0, :n_emit].cpu())
        stats.time_propose += t1 - t0
        stats.time_forward += t2 - t1
        stats.time_verify += t3 - t2
        stats.time_bookkeeping += time.perf_counter() - t3

    if streamer is not None:
        streamer.end()
    if not gen.return_dict_in_generate:
        return sequences
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    fields = GenerateDecoderOnlyOutput.__dataclass_fields__
    extra = {"cache": cache} if "cache" in fields else {"past_key_values": cache}
    return GenerateDecoderOnlyOutput(
        sequences=sequences,
        scores=tuple(all_scores) if output_scores else None,
        logits=tuple(all_raw) if output_logits else None,
        **extra,
    )
