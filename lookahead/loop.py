"""One ``generate`` call: its set-up, the step loop (written once), and the rows' emission.

Every step, for one row, a batch or a static cache: draft -> pack -> forward -> verify -> emit -> keep KV -> learn.
:class:`Call` sets up and runs the loop; :class:`Rows` holds each row's sequence, stop and draft policy. What
differs (drafting, packing, forward, keeping KV) is a *shape* (``shapes.py``). Terms (pending tokens, draft tree,
step): ``config.py``.
"""

from __future__ import annotations

import numpy as np
import torch

from . import compat
from .checks import (
    check_cache_layers,
    check_inputs,
    check_model_kwargs,
    check_store,
    media_of,
    sharded,
    vocabulary_size,
)
from .kv import check_rollbackable, grow_in_place, new_cache
from .stats import DecodeStats
from .verify import Verdict, Verifier


class Call:
    """One ``generate`` call, set up once, then :meth:`run`. ``shape``: its step shape's class."""

    def __init__(self, decoder, model, input_ids, logits_processor, stopping_criteria, generation_config, streamer,
                 model_kwargs: dict, shape):
        gen = self.gen = generation_config if generation_config is not None else model.generation_config
        b, length = input_ids.shape
        static = shape.static
        self.decoder, self.model, self.streamer, self.clock = decoder, model, streamer, decoder.clock
        self.tuning, self.stats = decoder.tuning, decoder.stats
        check_model_kwargs(model_kwargs, gen)
        self.vocab = vocabulary_size(model)
        check_inputs(input_ids, model_kwargs.get("attention_mask"), self.vocab)
        check_store(decoder.store, self.vocab)
        stop_length, self.eos, self.other_stops = compat.host_stopping(stopping_criteria)
        self.max_length = stop_length if stop_length is not None else gen.max_length
        self.pads = any(hasattr(c, "eos_token_id") for c in stopping_criteria or ())
        given = self.given_cache = compat.cache_of(model_kwargs)
        if b > 1 and given is not None and given.get_seq_length():
            raise ValueError(f"LookaheadDecoder with batch size > 1 starts from an empty cache; this one holds "
                             f"{given.get_seq_length()} tokens. Pass no cache, or use plain generate().")
        # a batch decodes into a cache of its own (its columns hold holes); one row fills the one it is handed
        cache = self.cache = new_cache(model) if given is None or b > 1 else grow_in_place(given)
        mask = model_kwargs.get("attention_mask")
        unpadded = mask is None or bool((mask == 1).all())
        window = None if static else check_cache_layers(cache)
        self.sliding = None
        if window is not None and gen.max_length > window:  # a call that reaches past a sliding window
            from .sliding import SlidingWindow

            self.sliding = SlidingWindow.of(model, cache)
        self.chains = not compat.takes_tree_masks(model)
        if self.chains and not (b == 1 and not static and unpadded):
            raise ValueError(
                f"this {model.config.model_type} model builds its attention from a 2D mask (ALiBi), so it cannot take "
                "a draft tree's 4D mask: LookaheadDecoder decodes it one unpadded row at a time on a dynamic cache, "
                "one chain of drafts per step. Use plain generate() for a batch, a padded row or a static cache.")
        self.kv_window = None if self.sliding is not None else window  # past it, entries stay until the verdict
        self.window = window
        self.cache_kwarg = compat.cache_kwarg_name(model)
        self.media = media_of(model_kwargs)
        if self.media is not None:  # images: one row's prompt forward here, then a continued cache
            from .media import check_media, prefill_media

            check_media(model, input_ids, model_kwargs, cache, static, self.sliding is not None)
            if b == 1:
                prefill_media(model, input_ids, model_kwargs, cache, self.cache_kwarg, self.stats)
                self.media = None
        self.past = int(cache.get_seq_length())
        if self.sliding is not None and not (b == 1 and unpadded and not static):
            self.sliding.check_widenable(cache)  # a batch's or a padded row's sliding layers will keep every column
        if self.past >= length:
            raise ValueError(f"the cache already holds {self.past} tokens but input_ids has {length}: nothing is "
                             "left to decode from (input_ids must be the whole sequence, the cached prefix included)")
        self.device, self.dtype = input_ids.device, model.dtype
        self.keeps_logits = compat.supports_logits_to_keep(model)
        self.forward_kwargs = {"use_cache": True, self.cache_kwarg: cache}
        self.processors = [compat.processors_as_function(p) for p in shape.processors(logits_processor, b)]  # per row
        self.sampling = bool(gen.do_sample)
        self.keep_scores = bool(gen.return_dict_in_generate and gen.output_scores)
        self.keep_raw = bool(gen.return_dict_in_generate and gen.output_logits)
        self.return_dict = bool(gen.return_dict_in_generate)
        verifier = Verifier
        if b > 1:
            from .verify.batch import BatchVerifier as verifier
        self.verifier = verifier(self.device, getattr(model.config, "vocab_size", 0), self.processors,
                                 compat.token_bans(logits_processor), self.sampling, self.keep_scores, self.keep_raw)
        self.sync = None
        if sharded(model):
            from .parallel import RankSync

            self.sync = RankSync.for_model(model)
        self.eager = model  # what runs a one-token step: the model, or its shadow where its forward is compiled
        if compat.forward_is_compiled(model):  # the model's own forward, eagerly: a step's shape changes every step
            from .shadow import shadow

            self.eager = shadow(model)
        self.runner = self.eager  # what runs a step's forward: the model, a shadow of it, or a compiled step
        self.wants_hidden = decoder.heads is not None
        self.cost = None
        self.learner = None  # a learned.LearnedCurve the steps teach (set by the decoder's price)
        self.learned = None  # (variant, persist) under which the decoder keeps it
        self.shape_class = shape
        self.shape = shape(self, input_ids, mask)

    def forward(self, ids, pos, mask, keep: int, cache=None, extra: dict | None = None, runner=None) -> torch.Tensor:
        """One forward into ``cache`` (default: the call's) with extra inputs ``extra``: float logits [b, keep, V] of
        its last ``keep`` rows; heads' hidden states go to ``self.hidden``."""
        kwargs = self.forward_kwargs if cache is None else {**self.forward_kwargs, self.cache_kwarg: cache}
        if extra:
            kwargs = {**kwargs, **extra}
        if self.sync is not None:  # the same forward on every rank, or a clear error before its collectives break
            self.sync.check(self.stats.target_calls, ids=ids, positions=pos, keep=keep, mask=_mask_shapes(mask),
                            cached=(cache if cache is not None else self.cache).get_seq_length())
        self.stats.target_calls += 1
        # one row of one token (a plain step) runs the model itself: plain generate's computation
        run = runner if runner is not None else (self.runner if cache is None and ids.numel() > 1 else self.eager)
        if self.wants_hidden and cache is None:  # (a compiled static step is a function: its model runs eagerly)
            module = run if isinstance(run, torch.nn.Module) else self.model
            logits, self.hidden = compat.forward_with_hidden(module, ids, pos, mask, kwargs, keep)
        else:
            logits = compat.last_logits(run, ids, pos, mask, kwargs, self.keeps_logits, keep)
        return logits if logits.device == self.device else logits.to(self.device)

    def shared_seconds(self, seconds: float) -> float:
        """``seconds`` as rank 0 measured it, so every rank decides alike."""
        return seconds if self.sync is None else self.sync.broadcast(float(seconds))

    def run(self):
        shape, rows, clock, verifier = self.shape, self.shape.rows, self.clock, self.verifier
        learn = self.learner is not None and rows.b == 1
        after = getattr(shape, "after_step", None)  # a batch's: finished rows leave, the next pending tokens
        stream = rows.stream if self.streamer is not None else None
        checked = False
        try:
            while rows.running():
                t0 = clock()
                p = rows.pending.shape[1]
                drafts, k = shape.draft()
                step = shape.pack(drafts)
                t1 = clock()
                logits = shape.forward(step, drafts, k)  # [b, q, V]
                if not checked:
                    check_rollbackable(self.cache)
                    checked = True
                t2 = clock()
                verdicts, window_argmax, tops = verifier.verify(logits, drafts, rows, k)
                t3 = clock()
                emitted = rows.emit(verdicts)
                accepted = [[] if v is None else v.nodes[: min(len(v.nodes), n)] for v, n in zip(verdicts, emitted)]
                shape.keep(p, drafts, accepted)
                rows.learn(drafts, verdicts, emitted, window_argmax, tops, step.rows if p == 1 else 0,
                           self.shared_seconds(t3 - t1) if learn else 0.0,
                           self._hidden(accepted, step) if self.wants_hidden else None)
                rows.record(drafts, accepted, emitted, t1 - t0, t2 - t1, t3 - t2, clock() - t3)
                if after is not None or stream is not None:
                    t4 = clock()
                    if after is not None:
                        after()
                    if stream is not None:
                        stream()
                    self.stats.time_bookkeeping += clock() - t4
        finally:
            shape.finish()
        if self.sync is not None:
            self.sync.finish(self.stats.target_calls)
        return rows.output()

    def _hidden(self, accepted: list[list[int]], step):
        """The accepted path's final hidden states [1 + a, H] (the root's row, then each accepted node's)."""
        if self.hidden is None:
            return None
        root = self.hidden.shape[1] - step.rows
        nodes = accepted[0]
        return self.hidden[0, root : root + 1] if not nodes else self.hidden[0, [root, *(root + 1 + j for j in nodes)]]


class Rows:
    """The call's row (``batch.BatchRows``: several). Per row: ``seq`` long[b, max_length + 1]; ``length`` (left
    padding included); ``limit`` (the latest length it stops at); ``stops`` (the length where a criterion first held,
    or None); ``done`` (drafts and emits no more); its policy, stats and sampling uniforms. ``active``: the rows in
    the cache, in its batch order; the per-step methods take indices into it."""

    def __init__(self, call: Call, input_ids: torch.Tensor, attention_mask, policies, limits):
        self.call = call
        b, length = input_ids.shape
        self.b, self.prompt_length = b, length
        device = call.device
        pad = compat.pad_token_id(call.gen)
        if call.pads and pad is None and b > 1:
            raise ValueError("If `eos_token_id` is defined, make sure that `pad_token_id` is defined.")
        self.fill = pad if pad is not None else 0
        cap = max(call.gen.max_length, length) + 1
        self.seq = torch.full((b, cap), self.fill, dtype=torch.long, device=device)
        self.seq[:, :length] = input_ids
        self.seq_host = self.seq.numpy() if device.type == "cpu" else None
        ids = input_ids.cpu().numpy().astype(np.int64)
        visible = (np.ones((b, length), dtype=bool) if attention_mask is None
                   else attention_mask.bool().cpu().numpy())
        positions = np.maximum(np.cumsum(visible, 1) - 1, 0)
        past = call.past
        self.pending, self.pending_pos, self.pending_vis = ids[:, past:], positions[:, past:], visible[:, past:]
        self.length = np.full(b, length, dtype=np.int64)
        self.limit = np.full(b, call.max_length, dtype=np.int64)
        self.stops: list[int | None] = [None] * b
        self.done = np.zeros(b, dtype=bool)
        self.last = np.zeros(b, dtype=np.int64)  # each row's last emitted token
        self.active = list(range(b))
        self.policies = policies
        self.stats = [call.stats] if b == 1 else [DecodeStats() for _ in range(b)]
        self.uniform = [None] * b
        if call.sampling:
            from .verify.sampled import PositionUniforms

            self.uniform = [PositionUniforms(s) for s in (call.sync.seeds(b) if call.sync else [None] * b)]
        self.scores: list[torch.Tensor] = []
        self.raw: list[torch.Tensor] = []
        self.streamed = length
        for r, policy in enumerate(policies):
            policy.start(ids[r][visible[r]], limits, call.cost if b == 1 else call.row_cost, call.model,
                         call.learner if b == 1 else None)

    # -- what the verifier reads, by active index ------------------------------------------------------------------

    def length_of(self, i: int) -> int:
        return int(self.length[self.active[i]])

    def is_done(self, i: int) -> bool:
        return bool(self.done[self.active[i]])

    def prefix(self, i: int) -> torch.Tensor:
        r = self.active[i]
        return self.seq[r : r + 1, : self.length[r]]

    def uniforms(self, i: int, n: int) -> list[float]:
        r = self.active[i]
        return self.uniform[r].take(self.stats[r].new_tokens, n)

    def processors(self, i: int):
        return self.call.processors[self.active[i]]

    def running(self) -> bool:
        return not self.done[0]

    def criteria_stop(self, r: int, start: int, verdict: Verdict, n: int) -> int:
        """The first of row ``r``'s first ``n`` new tokens (from column ``start``) at which a criterion on tensors
        holds, token by token, else -1."""
        for t in range(n):
            scores = verdict.scores[t] if verdict.scores else None
            if any(bool(c(self.seq[r : r + 1, : start + t + 1], scores).all()) for c in self.call.other_stops):
                return t
        return -1

    def emit(self, verdicts: list[Verdict | None]) -> list[int]:
        """Append each row's verdict tokens up to the first that stops it (the length limit, an EOS id, another
        criterion), which also finishes it; returns how many each emitted (0: a finished row)."""
        verdict = verdicts[0]
        call, tokens = self.call, verdict.tokens
        start, n, limit, eos = int(self.length[0]), len(tokens), int(self.limit[0]), call.eos
        if self.seq_host is not None:
            self.seq_host[0, start : start + n] = tokens
        else:
            self.seq[0, start : start + n] = torch.tensor(tokens, dtype=torch.long, device=call.device)
        stop = -1
        for i, t in enumerate(tokens):
            if start + i + 1 >= limit or t in eos:
                stop = i
                break
        if call.other_stops:
            by_criteria = self.criteria_stop(0, start, verdict, stop + 1 if stop >= 0 else n)
            stop = by_criteria if by_criteria >= 0 else stop
        n_emit = n if stop < 0 else stop + 1
        self.length[0] = start + n_emit
        self.last[0] = tokens[n_emit - 1]
        if stop >= 0:
            self.stops[0] = start + n_emit
            self.done[0] = True
        if verdict.scores is not None:
            self.scores.extend(verdict.scores[:n_emit])
        if verdict.raw is not None:
            self.raw.extend(verdict.raw[:n_emit])
        return [n_emit]

    def learn(self, drafts, verdicts, emitted, window_argmax, tops, rows: int, seconds: float, hidden) -> None:
        """Each row's policy learns its step (the model-prediction source from ``tops``, its rows' top-k)."""
        d, v = drafts[0], verdicts[0]
        successors = None if tops is None else (tops[0][0, : len(d) + 1], tops[1][0, : len(d) + 1])
        self.policies[0].learn(d, v.nodes, v.tokens[: emitted[0]], window_argmax, rows, seconds, successors, hidden)

    def record(self, drafts, accepted, emitted, t_draft, t_forward, t_verify, t_keep) -> None:
        self.stats[0].record_step(drafts[0], accepted[0], emitted[0], t_draft, t_forward, t_verify, t_keep)

    def final_length(self) -> int:
        return int(self.length[0])

    def stream(self, final: int | None = None) -> None:
        """Hand the streamer the new tokens up to ``final`` (default: all)."""
        final = int(self.length[0]) if final is None else final
        if self.call.streamer is not None and final > self.streamed:
            self.call.streamer.put(self.seq[0, self.streamed : final].cpu().clone())
            self.streamed = final

    def hand_over(self, final: int) -> None:
        """The rows' statistics to the decoder."""
        self.call.decoder.row_stats = [self.call.stats]

    def output(self):
        call = self.call
        final = self.final_length()
        self.stream(final)
        if call.streamer is not None:
            call.streamer.end()
        for policy in self.policies:
            policy.catch_up()
        self.hand_over(final)
        sequences = self.seq[:, :final].clone()
        if not call.return_dict:
            return sequences
        return compat.decoder_only_output(sequences, tuple(self.scores) if call.keep_scores else None,
                                          tuple(self.raw) if call.keep_raw else None,
                                          call.given_cache if self.b == 1 else None)


def _mask_shapes(mask):
    """A step's mask shape (per layer type for a dict): what tensor-parallel ranks compare."""
    if mask is None:
        return None
    if isinstance(mask, dict):
        return {kind: tuple(m.shape) for kind, m in sorted(mask.items())}
    return tuple(mask.shape)
