"""Step shapes: what differs between one row, a batch and a static cache in the step loop (``loop.py``). A shape
drafts (``draft``), packs (``pack``), runs the forward (``forward``) and keeps the accepted entries (``keep``).
:class:`OneRow`: one row on a dynamic cache; ``batch.Padded``: several rows; ``static.Bucketed``: a static cache."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .drafting.draft import Draft
from .drafting.policy import Limits
from .kv import keep_entries
from .loop import Rows
from .packing import StepMask, step_inputs


class Step(NamedTuple):
    """A packed step: ids and positions long[b, q], mask (None: causal), ``rows``: a one-row step's rows from the
    last pending token (its root) on."""

    ids: torch.Tensor
    pos: torch.Tensor
    mask: object
    rows: int


class OneRow:
    """One row on a dynamic cache. A one-chain draft steps causally; other steps write their mask block into a
    buffer kept across steps. Past a sliding window its layers keep every entry until the verdict."""

    static = False

    @staticmethod
    def processors(processors, b: int) -> list:
        """Per row, the logits processors it is verified with: one row, the call's own."""
        return [processors]

    def __init__(self, call, input_ids, mask):
        self.call = call
        policy = call.decoder.policy
        self.cache, self.past = call.cache, call.past
        self.col_visible = _prompt_columns(mask, input_ids.shape[1], call.gen.max_length)
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
        self._flat = self._pending[0][0], self._pending[1][0]  # their one row, as the packing takes it
        self.on_cpu = call.device.type == "cpu"

    def prepare(self) -> None:
        """The call's cost curve (a static cache prices its buckets instead)."""
        self.call.cost = self.call.decoder.price(self.call)

    def limits(self) -> Limits:
        return Limits(self.call.max_length, self.call.kv_window, chains=self.call.chains)

    def draft(self):
        rows = self.rows
        policy = rows.policies[0]
        d = policy.draft(int(rows.length[0]), self.past + rows.pending.shape[1], int(rows.pending_pos[0, -1]))
        return [self.fit(d)], policy.recycle_k

    def fit(self, draft: Draft) -> Draft:
        return draft

    def pack(self, drafts) -> Step:
        """A chain (no branch, no window) steps causally with the model's own mask, except on a CPU after one pending
        token: the buffer's additive mask (SDPA would convert a boolean one per layer). ``call.chains``: always."""
        call, d = self.call, drafts[0]
        rows = self.rows
        if rows.pending is self._pending[0]:  # after the prompt's step: the one pending token's kept views
            pending, pending_pos = self._flat
        else:
            pending, pending_pos = rows.pending[0], rows.pending_pos[0]
        p = len(pending)
        if (self.col_visible is None and d.window is None and d.is_chain
                and (call.chains or not self.on_cpu or p > 1 or not len(d))):
            ids, pos = step_inputs(pending, pending_pos, d.tokens, d.depth, None, call.device)
            return Step(ids, pos, None, 1 + d.rows)
        if p == 1:  # after the prompt's step the mask buffer writes only this step's block
            if self.step_mask is None:
                most = rows.policies[0].max_rows() + 1
                self.step_mask = StepMask(most, call.gen.max_length + most + 1, call.dtype, call.device,
                                          self.col_visible)
            ids, pos, mask = self.step_mask.step(self.past, pending, pending_pos, d.tokens, d.depth, d.parents,
                                                 d.window)
        else:  # the prompt's step
            from .whole_step import pack_step

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
        """(logits [1, step.rows, V], rows learnt from the prompt). At the prompt's step the model-prediction source
        also learns the prompt's rows where they are nearly free (``prompt_rows``)."""
        rows, call = self.rows, self.call
        policy = rows.policies[0]
        p = rows.pending.shape[1]
        warm = p - 1 if p > 1 and policy.prompt_rows and k else 0
        logits = self.run(step, step.rows + warm)
        if warm:
            _, (top_ids, top_vals) = call.verifier.read_rows(logits[:, :warm], None, np.array([warm]), k)
            policy.learn_prompt(rows.pending[0, :warm], top_ids[0], top_vals[0])
            logits = logits[:, warm:]
        return logits

    def run(self, step: Step, keep: int) -> torch.Tensor:
        return self.call.forward(step.ids, step.pos, step.mask, keep)

    def keep(self, p: int, drafts, accepted) -> None:
        """Keep the pending tokens' and the accepted nodes' entries; the last emitted token becomes pending."""
        d, nodes = drafts[0], accepted[0]
        if d.rows:  # else every entry of the step stays
            keep_entries(self.cache, p + d.rows, list(range(p)) + [p + j for j in nodes])
        if self.recording:
            self.call.sliding.restrict(self.recording)
        self.advance(p, nodes)

    def advance(self, p: int, nodes: list[int]) -> None:
        rows = self.rows
        self.past += p + len(nodes)
        last_pos = int(rows.pending_pos[0, -1]) + len(nodes) + 1
        rows.pending, rows.pending_pos = self._pending
        rows.pending[0, 0], rows.pending_pos[0, 0] = rows.last[0], last_pos
        if rows.pending_vis.shape[1] != 1:
            rows.pending_vis = np.ones((1, 1), dtype=bool)

    def finish(self) -> None:
        if self.recording:
            self.call.sliding.finish(self.recording)


def _prompt_columns(attention_mask, length: int, max_length: int) -> np.ndarray | None:
    """bool[max(max_length, length) + 1], False at the prompt's padding; None without padding."""
    if attention_mask is None or bool((attention_mask == 1).all()):
        return None
    col_visible = np.ones(max(max_length, length) + 1, dtype=bool)
    col_visible[:length] = attention_mask[0].bool().cpu().numpy()
    return col_visible
