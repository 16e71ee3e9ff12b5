"""The one-row decode loop: ``generate(..., custom_generate=LookaheadDecoder())`` on one prompt.

Each step: the draft policy hands over a finished draft (``policy.py``); it is packed after the
pending tokens (``tree.py``), ONE forward of the target model runs, the exact-acceptance core
verifies it (``verify.py``), the accepted tokens plus one are emitted against the stopping criteria,
only the accepted path's KV entries are kept (``kv_cache.py``), and the policy learns from the
verdict. The pieces are ``call.py``'s; ``static.StaticCall`` overrides the packing, the forward and the
KV keeping for a static cache. Terms are defined in ``config.py``.
"""

from __future__ import annotations

import numpy as np
import torch

from . import call, compat
from .draft import Draft
from .kv_cache import check_rollbackable, keep_entries
from .policy import Limits
from .sliding import SlidingWindow
from .tree import StepMask, pack_step, step_inputs
from .verify import Verdict


class SingleCall:
    """One ``generate`` call of one row: its state and the decode loop (:meth:`run`)."""

    def __init__(self, decoder, model, input_ids, logits_processor, stopping_criteria,
                 generation_config, streamer, model_kwargs):
        self.setup = setup = self.prepare(decoder, model, input_ids, logits_processor, stopping_criteria,
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
        self.past_len = int(setup.cache.get_seq_length())
        self.length = input_ids.shape[1]  # tokens in the sequence
        # seq: long[1, max_length + 1], the sequence so far in its first `length` columns (our own buffer)
        self.seq = torch.empty((1, max(setup.gen.max_length, self.length) + 1), dtype=torch.long, device=self.device)
        self.seq[:, : self.length] = input_ids
        self.seq_host = self.seq.numpy() if setup.on_cpu else None  # the same memory, written from the host
        # host int64[p] each: the tokens not in the KV cache yet, and their positions
        self.pending, self.pending_pos = prompt[self.past_len :], prompt_pos[self.past_len :]
        self._last_token, self._last_pos = np.zeros(1, np.int64), np.zeros(1, np.int64)
        self.step_mask: StepMask | None = None  # the masks of the steps after the prompt's, made on first use
        # past a sliding window with padding: its layers keep every column, masked by position (as a batch's)
        self.widened = setup.sliding is not None and self.col_visible is not None
        self.recording: list = []  # the sliding layers recording a step's entries past the window (run)
        if self.widened:
            setup.sliding.widen(self.cache)
            self.col_pos = np.maximum(np.cumsum(self.col_visible) - 1, 0)  # int64[columns]: each column's position
        self.refine = decoder.config.refine_cost and setup.cost is not None
        self.policy.start(prompt, self.limits(), setup.cost, model)
        self.stats.step_nodes = self.policy.step_nodes
        self.hidden = None  # [1, rows, H]: the output embedding's input of the last forward, when a source wants it

    @staticmethod
    def prepare(decoder, model, input_ids, logits_processor, stopping_criteria, generation_config,
                model_kwargs) -> call.CallSetup:
        """The call's checks and set-up (``call.prepare``); a static-cache call's own set-up overrides it."""
        return call.prepare(decoder, model, input_ids, logits_processor, stopping_criteria, generation_config,
                            model_kwargs)

    def limits(self) -> Limits:
        """What bounds every step's draft: the call's length, and a sliding window's room."""
        return Limits(self.max_length, self.setup.kv_window, chains=self.setup.chains)

    def run(self):
        """The decode loop; with a source that learns from hidden states, a hook keeps the LM head's input."""
        handle = None
        if self.policy.wants_hidden:
            def keep_hidden(module, args):
                self.hidden = args[0]

            # first among the head's pre-hooks: it sees the rows the model hands the head (linear_layout's hooks
            # hand nn.Linear none)
            handle = self.model.get_output_embeddings().register_forward_pre_hook(keep_hidden, prepend=True)
        if self.setup.sliding is not None and not self.widened:  # past a window: its layers keep every entry
            self.recording = self.setup.sliding.start(self.cache)  # until the step's verdict
        try:
            return self.loop()
        finally:
            self.policy.finish()  # the lazy sources (a shared store) learn the whole output; estimates are kept
            if handle is not None:
                handle.remove()
            if self.recording:
                SlidingWindow.finish(self.recording)

    def loop(self):
        """The decode loop: draft -> pack -> forward -> verify -> emit -> keep KV -> learn."""
        stats, clock, policy, setup = self.stats, self.clock, self.policy, self.setup
        done, checked = False, False
        while not done:
            t0 = clock()
            p = len(self.pending)
            draft = self.fit(policy.draft(self.length, self.past_len + p, int(self.pending_pos[-1])))
            rows, n = draft.rows, len(draft)
            ids, pos, mask = self.pack(draft)
            if mask is not None and setup.sliding is not None:  # the sliding layers' own mask beside it
                mask = self.sliding_masks(mask, pos)
            t1 = clock()
            k = policy.recycle_k
            warm = p - 1 if p > 1 and policy.prompt_rows and k else 0  # the prompt's rows, for the model's predictions
            logits = self.forward(ids, pos, mask, rows + 1 + warm)  # [warm + 1 + n + m, V]
            if warm:
                _, (top_ids, top_vals) = call.read_rows(setup, logits[None, :warm], None, np.array([warm]), k)
                policy.learn_prompt(self.pending[:warm], top_ids[0], top_vals[0])
                logits = logits[warm:]
            if not checked:
                check_rollbackable(self.cache)
                checked = True
            t2 = clock()
            verdict, window_argmax, tops = self.verify(logits, draft, k)
            t3 = clock()
            n_emit, done = self.emit(verdict)
            n_acc = min(len(verdict.nodes), n_emit)
            self.keep_kv(p, draft, verdict.nodes[:n_acc], verdict.tokens[n_emit - 1])
            hidden = None
            if self.hidden is not None:  # the accepted path's rows (rows: root, nodes, ...): [1 + n_acc, H]
                root = self.hidden.shape[1] - (rows + 1)
                hidden = self.hidden[0, root : root + 1] if not n_acc else self.hidden[0, [root, *(root + 1 + j for j in verdict.nodes[:n_acc])]]
            successors = None if not k else (tops[0][0, : n + 1, :k], tops[1][0, : n + 1, :k])
            seconds = call.shared_seconds(setup, t3 - t1) if self.refine else 0.0  # a step: forward + verify
            policy.learn(draft, verdict.nodes, verdict.tokens[:n_emit], window_argmax,
                         1 + rows if p == 1 else 0, seconds, successors, hidden)
            stats.record_step(draft, verdict.nodes[:n_acc], n_emit, t1 - t0, t2 - t1, t3 - t2, clock() - t3)
        call.finish(setup, stats)
        return self.output()

    def fit(self, draft: Draft) -> Draft:
        """The draft this step verifies (a static cache's loop may cut it to the step shapes it has room for)."""
        return draft

    def pack(self, draft: Draft):
        """(input ids [1, q], position ids [1, q], 4D mask or None) of this step. A step whose draft is one chain
        after the pending tokens (no branch, no window) is causal: the model's own mask and attention fast path,
        the very forward prompt lookup verifies its chains with. On a CPU, a chain after one pending token takes a
        4D mask from the step's buffer instead: transformers builds a boolean mask for rows after cached ones, which
        SDPA converts in every layer (SmolLM2: 60 operations a step), and the buffer's additive one needs none; the
        logits are the same bit for bit (a 3- or 8-row chain after 500 tokens: 0.91-1.02 of the step's time in eight
        measurements on a busy VM; ``benchmarks/results/host-step/chain_mask.py``). A model that takes no 4D mask
        (``CallSetup.chains``) always steps causally."""
        setup = self.setup
        if (self.col_visible is None and draft.window is None and _is_chain(draft.depth)
                and (setup.chains or not setup.on_cpu or len(self.pending) > 1 or not len(draft))):
            return step_inputs(self.pending, self.pending_pos, draft.tokens, draft.depth, None, self.device) + (None,)
        if len(self.pending) == 1:  # a step after the prompt's: the mask buffer writes only this step's block
            if self.step_mask is None:
                rows = self.policy.max_rows() + 1
                self.step_mask = StepMask(rows, self.setup.gen.max_length + rows + 1, self.setup.dtype, self.device,
                                          self.col_visible)
            return self.step_mask.step(self.past_len, self.pending, self.pending_pos, draft.tokens, draft.depth,
                                       draft.parents, draft.window)
        col_visible = None if self.col_visible is None else self.col_visible[: self.length]
        return pack_step(self.pending, self.pending_pos, draft.tokens, draft.parents, col_visible, self.past_len,
                         self.setup.dtype, draft.window, self.device, draft.depth)

    def sliding_masks(self, mask: torch.Tensor, pos: torch.Tensor):
        """A step's masks past a sliding window (``sliding.py``), from its full one ``mask`` [1, 1, q, past + q] and its
        rows' positions ``pos`` long[1, q]: the sliding layers' over the keys they return; with padding, over every
        column, by position."""
        if not self.widened:
            return self.setup.sliding.masks(mask, pos, self.past_len)
        cached = torch.from_numpy(self.col_pos[None, : self.past_len]).to(self.device)
        return self.setup.sliding.batch_masks(mask, pos, cached)

    def forward(self, ids, pos, mask, keep: int) -> torch.Tensor:
        """One forward; the float logits [keep, V] of its last ``keep`` query rows."""
        return call.forward(self.setup, self.stats, ids, pos, mask, keep)[0]

    def verify(self, logits: torch.Tensor, draft: Draft, k: int) -> tuple[Verdict, np.ndarray | None, tuple | None]:
        """(the verdict, the window rows' argmax int64[m] or None, the top-``k`` (ids, logits) of the root's and
        nodes' rows or None when ``k`` is 0) from the step's ``logits`` [1 + n + m, V].

        Greedy (``CallSetup.argmax_verdicts``) on a CPU with rows to read top-k from: one kernel call
        (:func:`call.greedy_row`); else the rows are read (:func:`call.read_rows`: one host round trip) and with
        token bans every row's argmax becomes the processed argmax from its top-k. Scores the bans cannot settle,
        sampling and other processors take the processed verdict."""
        n, rows = len(draft), draft.rows
        setup = self.setup
        width = call.top_width(setup, k)
        if setup.argmax_verdicts and setup.on_cpu and width:
            verdict, argmax, tops = call.greedy_row(setup, logits, draft, rows + 1, self.length, width)
            window_argmax = argmax[0, n + 1 :] if draft.window is not None else None  # bans rewrite verified rows only
            return (verdict if verdict is not None else self.processed(logits, draft)), window_argmax, tops
        argmax, tops = call.read_rows(setup, logits[None], np.array([rows + 1]) if setup.argmax_verdicts else None,
                                      np.array([n + 1]), width)
        if setup.argmax_verdicts:
            window_argmax = argmax[0, n + 1 :] if draft.window is not None else None  # bans rewrite verified rows only
            if setup.bans is None or setup.bans.apply(argmax, tops, np.array([n + 1]), self.row_lengths(draft)):
                return call.greedy_verdicts(argmax, [draft])[0], window_argmax, tops
            return self.processed(logits, draft), window_argmax, tops
        window_argmax = logits[n + 1 :].argmax(-1).cpu().numpy() if draft.window is not None else None
        return self.processed(logits, draft), window_argmax, tops

    def processed(self, logits: torch.Tensor, draft: Draft) -> Verdict:
        """The verdict from the step's processed scores (processors, sampling, kept scores)."""
        n = len(draft)
        uniforms = self.uniforms.take(self.stats.new_tokens, n + 1) if self.uniforms is not None else None
        return call.processed_verdict(self.setup, logits, draft, self.seq[:, : self.length], self.processors, uniforms)

    def row_lengths(self, draft: Draft) -> np.ndarray:
        """int64[1, 1 + n]: the sequence length each verified row's logits follow (its root's, then each node's)."""
        if not len(draft.tokens):  # a plain step
            return np.array([[self.length]])
        out = np.empty((1, 1 + len(draft.tokens)), np.int64)
        out[0, 0] = 0
        out[0, 1:] = draft.depth
        out += self.length
        return out

    def emit(self, verdict: Verdict) -> tuple[int, bool]:
        """Append the verdict's tokens until a stopping criterion holds: (emitted, done)."""
        tokens, start = verdict.tokens, self.length
        if self.seq_host is not None:
            self.seq_host[0, start : start + len(tokens)] = tokens
        else:
            self.seq[0, start : start + len(tokens)] = torch.tensor(tokens, dtype=torch.long, device=self.device)
        stop, _ = call.first_stop(self.setup, tokens, start, self.max_length)
        n_emit = len(tokens) if stop < 0 else stop + 1
        if self.setup.other_stops:  # criteria on tensors, token by token up to the host's stop
            for i in range(n_emit):
                if call.other_stop(self.setup, self.seq[:, : start + i + 1], verdict.scores[i] if verdict.scores else None):
                    n_emit = i + 1
                    stop = i
                    break
        self.length = start + n_emit
        if verdict.scores is not None:
            self.scores.extend(verdict.scores[:n_emit])
        if verdict.raw is not None:
            self.raw.extend(verdict.raw[:n_emit])
        if self.streamer is not None:
            self.streamer.put(self.seq[0, start : self.length].cpu().clone())
        return n_emit, stop >= 0

    def keep_kv(self, p: int, draft: Draft, accepted: list[int], last_token: int) -> None:
        """Keep the pending tokens' and the accepted nodes' KV entries; the last emitted token becomes pending."""
        if draft.rows:  # else every entry of the step stays
            keep_entries(self.cache, p + draft.rows, list(range(p)) + [p + j for j in accepted])
        if self.recording:
            SlidingWindow.restrict(self.recording)
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


def _is_chain(depth: np.ndarray) -> bool:
    """Whether a parent-first tree whose nodes have depths ``depth`` is one chain (node ``i``'s parent is
    ``i - 1``): then its mask is causal. Its last node is ``n`` deep only then (a path of ``n`` nodes holds them all).
    Example: depths ``[1, 2, 3]`` -> True, ``[1, 1]`` -> False, ``[]`` -> True."""
    n = len(depth)
    return n < 2 or int(depth[-1]) == n
