"""A batch (several rows) in the one step loop: :class:`Padded`, the step shape ``loop.Call`` runs for it, and
:class:`BatchRows`, its rows.

Each row drafts with its own policy; the batch chooses one *width* for all rows (dummy nodes pad the others) by what
it saves until its last row ends (:func:`choose_width`, :func:`token_values`); a row that kept fewer entries holds
masked *holes* (:func:`keep_rows_entries`), squeezed out once they pass ``hole_slack`` columns
(:func:`realign_index`); finished rows leave the cache once the forwards they cost reach the copy's time; prompts of
different lengths may be prefilled in groups (:func:`prefill_groups`).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from numba import njit

from ._tuning import DEFAULT
from .budget import Prober, can_pay
from .checks import MEDIA_KWARG
from .compat import crop_cache
from .cost import CostModel
from .drafting.draft import Draft
from .drafting.policy import Limits
from .kv import PLAIN_LAYERS, cache_layers, keep_entries, kv_layers, new_cache
from .loop import Rows
from .shapes import Step
from .verify import Verdict
from .whole_step import fill_step_mask


def prefill_groups(lengths: np.ndarray, cost, margin: float = DEFAULT.prefill_margin) -> list[np.ndarray] | None:
    """The rows of a left-padded prompt batch in groups, each prefilled padded only to its own longest row, when the
    cost curve ``t`` puts the groups' forwards below one padded forward by ``margin``; else None. A group of ``g`` rows
    whose longest has ``l`` tokens costs ``t(g * l)``; the best split into runs of the rows sorted by length is found
    by dynamic programming. Example: lengths [10, 200, 12, 190], ``t(k) = 0.1 + 0.001 k``: one padded forward 0.9 s;
    groups [0, 2] and [3, 1] cost 0.624 s -> ``[array([0, 2]), array([3, 1])]``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if n < 2 or lengths.min() < 1 or lengths.min() == lengths.max():
        return None
    order = np.argsort(lengths, kind="stable")
    sl = lengths[order]
    best, cut = np.zeros(n + 1), np.zeros(n + 1, dtype=np.int64)
    for j in range(1, n + 1):  # best[j]: rows order[:j] in groups; the last group is order[i:j]
        i = np.arange(j)
        total = best[:j] + cost((j - i) * sl[j - 1])
        cut[j] = int(np.argmin(total))
        best[j] = total[cut[j]]
    if best[n] * margin >= float(cost(n * sl[-1])):
        return None
    groups, j = [], n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def choose_width(gains: list[np.ndarray], values: np.ndarray, cost: np.ndarray, margin: float = DEFAULT.margin) -> int:
    """Draft nodes per row (the step's padded width ``w``) that save the batch the most time until its last row
    ends: maximises ``sum_i values[i] * gains[i][min(w, n_i)] - (cost[w] - cost[0])``; a ``w > 0`` must save
    ``margin`` times its extra cost. Ties: the smaller width.

    Example: gains ``[0, .9, 1.7]`` and ``[0]``, values ``[0.02, 0.1]``, cost ``[1.0, 1.02, 1.2]`` -> 0; with
    values ``[0.1, 0.1]`` -> 1."""
    width = len(cost) - 1
    saved = np.zeros(width + 1)
    for g, value in zip(gains, values):
        g = np.asarray(g, dtype=np.float64)[: width + 1] * value
        saved[: len(g)] += g
        saved[len(g):] += g[-1]
    extra = np.asarray(cost, dtype=np.float64) - float(cost[0])
    best = int(np.argmax(saved - extra))
    return 0 if best and saved[best] < margin * extra[best] else best


def token_values(remaining: np.ndarray, paces: np.ndarray, step: float, single: float) -> np.ndarray:
    """Seconds one more accepted token of each live row saves before the batch ends: the row expected to end last
    (most ``remaining / paces``) saves a 1-row step, ``single``; any other row its share of the steps it is in,
    ``(step - single) / (b - 1)``. Example: remaining [100, 40], paces [1, 2], step 0.12, single 0.1: [0.1, 0.02]."""
    b = len(remaining)
    values = np.full(b, max(step - single, 0.0) / (b - 1) if b > 1 else single)
    values[int(np.argmax(remaining / paces))] = single
    return values


def top_nodes(probs: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` likeliest nodes, sorted (closed under parents). Example: ``[.9, .2, .8]``, 2 -> ``[0, 2]``."""
    return np.sort(np.argsort(-np.asarray(probs), kind="stable")[:k])


def pack_batch(pending: np.ndarray, pending_pos: np.ndarray, col_visible: np.ndarray, drafts: list[Draft],
               width: int, dtype: torch.dtype, device):
    """(input ids long[b, q], position ids long[b, q], mask [b, 1, q, T + q]) of a batched step; a dummy node is
    token 0 one past the last pending position, a child of the root nothing else sees."""
    b, p = pending.shape
    q = p + width
    ids = np.zeros((b, q), dtype=np.int64)
    pos = np.repeat(pending_pos[:, -1:] + 1, q, axis=1)
    parents = np.full((b, width), -1, dtype=np.int64)
    ids[:, :p] = pending
    pos[:, :p] = pending_pos
    for i, d in enumerate(drafts):
        n = len(d)
        parents[i, :n] = d.parents
        ids[i, p : p + n] = d.tokens
        pos[i, p : p + n] = pending_pos[i, -1] + d.depth
    mask = np.empty((b, q, col_visible.shape[1] + width), dtype=np.float64 if dtype == torch.float64 else np.float32)
    fill_batch_masks(mask, p, parents, col_visible, float(torch.finfo(dtype).min))
    return (torch.from_numpy(ids).to(device), torch.from_numpy(pos).to(device),
            torch.from_numpy(mask[:, None]).to(device, dtype))


@njit(cache=True)
def fill_batch_masks(mask, p, parents, col_visible, neg):
    """:func:`fill_step_mask` for every row: ``mask`` float[b, q, T + q], ``parents`` int64[b, w], ``col_visible``
    bool[b, T + p]."""
    empty = np.zeros((0, 0), np.bool_)
    for i in range(mask.shape[0]):
        fill_step_mask(mask[i], p, parents[i], empty, col_visible[i], neg)


def keep_rows_entries(cache, n_new: int, keeps: list[list[int]]) -> int:
    """``kv.keep_entries`` per row: row ``i``'s step columns ``keeps[i]`` at the front of the step's region, cropped
    to the longest row's; returns that width. A shorter row has *holes* there (its last kept column repeated). Example:
    ``keeps [[0, 2, 3], [0]]``: row 0 keeps columns 0, 2, 3, row 1 column 0 and two holes; the region keeps 3."""
    most = max(len(k) for k in keeps)
    if len(keeps) == 1:
        keep_entries(cache, n_new, keeps[0])
        return most
    if any(k != list(range(most)) for k in keeps):  # not one plain prefix for every row: gather
        gather_columns(cache, np.array([k + k[-1:] * (most - len(k)) for k in keeps], dtype=np.int64), n_new)
    crop_cache(cache, n_new - most)
    return most


def gather_columns(cache, idx: np.ndarray, region: int) -> None:
    """In every layer, row ``i``'s columns ``idx[i]`` (int64[b, w]) of the last ``region`` to their front, in place."""
    index, width = None, idx.shape[1]
    for layer in kv_layers(cache):
        for t in (layer.keys, layer.values):
            first = t.shape[-2] - region
            if index is None or index.device != t.device:
                index = torch.from_numpy(idx).to(t.device)[:, None, :, None]
            columns = index.expand(t.shape[0], t.shape[1], width, t.shape[3])
            t[:, :, first : first + width] = t[:, :, first:].gather(2, columns)


def realign_index(visible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(idx int64[b, T'], visible bool[b, T']): every row's visible columns right-aligned, T' = the most any row has.

    Example: visible ``[[F, T, F, T], [T, T, T, F]]`` -> T' = 3, idx ``[[1, 1, 3], [0, 1, 2]]``, visible
    ``[[F, T, T], [T, T, T]]`` (row 0's first column is a hole pointing at a column of its own).
    """
    width = max(int(visible.sum(1).max()), 1)
    idx = np.zeros((visible.shape[0], width), dtype=np.int64)
    new_visible = np.zeros((visible.shape[0], width), dtype=bool)
    for i, row in enumerate(visible):
        cols = np.flatnonzero(row)
        if len(cols):
            idx[i] = np.concatenate([np.full(width - len(cols), cols[0]), cols])
            new_visible[i, width - len(cols):] = True
    return idx, new_visible


def row_processors(processors, r: int, b: int) -> list:
    """Row ``r``'s logits processors (of ``b`` rows), called with that row alone: row-wise processors as they are;
    the per-row state of the ones ``generate`` builds with one (the repetition penalty's prompt lengths, the
    encoder repetition penalty's prompt) sliced to the row, in copies. Processors bound to the whole batch raise.

    Example: ``RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=tensor([2, 0]))``, row 1 -> a copy whose
    ``prompt_ignore_length`` is ``tensor([0])``."""
    from transformers.generation import logits_process as lp

    bound = tuple(getattr(lp, name) for name in (
        "PrefixConstrainedLogitsProcessor", "UnbatchedClassifierFreeGuidanceLogitsProcessor",
        "ClassifierFreeGuidanceLogitsProcessor", "SynthIDTextWatermarkLogitsProcessor",
        "EncoderNoRepeatNGramLogitsProcessor") if hasattr(lp, name))
    sliced = {"RepetitionPenaltyLogitsProcessor": "prompt_ignore_length",
              "EncoderRepetitionPenaltyLogitsProcessor": "encoder_input_ids"}
    out = []
    for proc in processors or ():
        if isinstance(proc, bound):
            raise ValueError(f"LookaheadDecoder with batch size > 1 does not support {type(proc).__name__} (it "
                             "depends on the whole batch); use batch size 1 or plain generate().")
        attr = sliced.get(type(proc).__name__)
        state = getattr(proc, attr, None) if attr else None
        if isinstance(state, torch.Tensor) and state.dim() >= 1 and state.shape[0] > 1 and b % state.shape[0] == 0:
            i = r // (b // state.shape[0])  # a prompt's row, when generate expanded it (num_return_sequences)
            proc = copy.copy(proc)
            setattr(proc, attr, state[i : i + 1])
        out.append(proc)
    return out


class BatchRows(Rows):
    """:class:`loop.Rows` of a batch, with plain ``generate``'s batch semantics: every row runs until all have stopped;
    a stopped row's later tokens are ``pad_token_id`` with an EOS criterion, else its real continuation."""

    def running(self) -> bool:
        return not all(self.done[r] for r in self.active)

    def emit(self, verdicts: list[Verdict | None]) -> list[int]:
        call = self.call
        emitted = [0] * len(verdicts)
        others = [r for r in self.active if self.stops[r] is None]
        for i, verdict in enumerate(verdicts):
            if verdict is None:
                continue
            r = self.active[i]
            tokens, start, limit = verdict.tokens, int(self.length[r]), int(self.limit[r])
            n = len(tokens)
            if self.seq_host is not None:
                self.seq_host[r, start : start + n] = tokens
            else:
                self.seq[r, start : start + n] = torch.tensor(tokens, dtype=torch.long, device=call.device)
            n_emit = min(n, limit - start) if limit > start else n  # a stopped row runs on to its length limit
            if self.stops[r] is None:  # the first token at the length limit, an EOS id or another criterion
                stop = next((t for t, token in enumerate(tokens) if start + t + 1 >= limit or token in call.eos), -1)
                if call.other_stops:  # the criteria on tensors, up to the host's stop
                    first = self.criteria_stop(r, start, verdict, stop + 1 if stop >= 0 else n)
                    stop = first if first >= 0 else stop
                if stop >= 0:  # it ends here at its limit, with an EOS criterion or as the last row, else runs on
                    self.stops[r] = start + stop + 1
                    if call.pads or others == [r] or start + stop + 1 >= limit:
                        n_emit = stop + 1
            if n_emit < n:  # past a row's end the buffer holds the padding again
                self.seq[r, start + n_emit : start + n] = self.fill
            self.length[r] = start + n_emit
            self.last[r] = tokens[n_emit - 1]
            if verdict.scores is not None:
                self.scores.extend(verdict.scores[:n_emit])
            if verdict.raw is not None:
                self.raw.extend(verdict.raw[:n_emit])
            emitted[i] = n_emit
        self.finish_rows()
        return emitted

    def finish_rows(self) -> None:
        """Mark rows done: stopped (with an EOS criterion), else at the length the last row stopped at."""
        active = self.active
        if self.call.pads:
            self.done[[r for r in active if self.stops[r] is not None]] = True
            return
        self.done[active] |= self.length[active] >= self.call.max_length
        if all(s is not None for s in self.stops):
            final = max(self.stops)
            self.limit[active] = final
            self.done[active] |= self.length[active] >= final

    def learn(self, drafts, verdicts, emitted, window_argmax, tops, rows: int, seconds: float, hidden) -> None:
        for i, (d, v, n_emit) in enumerate(zip(drafts, verdicts, emitted)):
            if v is not None:
                successors = None if tops is None else (tops[0][i, : len(d) + 1], tops[1][i, : len(d) + 1])
                self.policies[self.active[i]].learn(d, v.nodes, v.tokens[:n_emit], window_argmax, rows, seconds,
                                                    successors, hidden)

    def record(self, drafts, accepted, emitted, t_draft, t_forward, t_verify, t_keep) -> None:
        for i, (d, nodes, n_emit) in enumerate(zip(drafts, accepted, emitted)):
            if n_emit:
                st = self.stats[self.active[i]]
                st.target_calls += 1
                st.record_step(d, nodes, n_emit, 0.0, 0.0, 0.0, 0.0)
        call = self.call.stats
        call.time_propose += t_draft
        call.time_forward += t_forward
        call.time_verify += t_verify
        call.time_bookkeeping += t_keep

    def next_pending(self, accepted: list[list[int]], done: np.ndarray) -> None:
        """Each active row's last emitted token becomes its pending token (a finished row's: padding); ``done``: the
        active rows finished before the step (their position stays)."""
        ids = self.last[self.active][:, None].copy()
        ids[self.done[self.active]] = self.fill
        pos = self.pending_pos[:, -1:] + np.array([len(a) + 1 for a in accepted], dtype=np.int64)[:, None]
        pos[done] = self.pending_pos[done, -1:]
        self.pending, self.pending_pos = ids, pos
        self.pending_vis = np.ones((len(self.active), 1), dtype=bool)

    def drop(self, keep: list[int]) -> None:
        """Only the active rows at indices ``keep`` stay in the cache."""
        self.active = [self.active[i] for i in keep]
        self.pending, self.pending_pos, self.pending_vis = self.pending[keep], self.pending_pos[keep], \
            self.pending_vis[keep]

    def final_length(self) -> int:
        if self.call.pads:
            return int(self.length.max())
        return max(s if s is not None else int(n) for s, n in zip(self.stops, self.length))

    def stream(self, final: int | None = None) -> None:
        """Hand the streamer the columns up to ``final`` (default: all that every live row has), one ``[b]`` tensor
        each."""
        streamer = self.call.streamer
        if streamer is None:
            return
        if final is None:
            live = [int(self.length[r]) for r in self.active if not self.done[r]]
            final = min(live) if live else self.final_length()
        for c in range(self.streamed, final):
            streamer.put(self.seq[:, c].cpu().clone())
        self.streamed = max(self.streamed, final)

    def hand_over(self, final: int) -> None:
        """Each row's output into the store, a stream of its own; the rows' statistics, and their sums in the call's."""
        call = self.call
        memory = call.decoder.store
        if memory is not None:
            for r in range(self.b):
                end = self.stops[r] if self.stops[r] is not None else int(self.length[r])
                memory.reset_stream()
                memory.insert(self.seq[r, self.prompt_length : min(end, final)].cpu().numpy())
                memory.reset_stream()
        call.decoder.row_stats = list(self.stats)
        stats = call.stats
        for st in self.stats:
            stats.budgets += st.budgets
            stats.accepted_per_step += st.accepted_per_step
            stats.new_tokens += st.new_tokens
            stats.drafted_by_origin.update(st.drafted_by_origin)
            stats.accepted_by_origin.update(st.accepted_by_origin)


ROW_COST = CostModel(((1, 1.0), (2, 1.0)))
"""The curve a batch row's own budget prices with: every node with a chance is kept; the batch chooses the width."""


class Padded:
    """Several rows on a dynamic cache; ``T``: the cache's columns, ``vis`` bool[b, ...]: which of them each active row
    sees."""

    static = False

    @staticmethod
    def processors(processors, b: int) -> list:
        return [row_processors(processors, r, b) for r in range(b)]

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
        self.rows = BatchRows(call, input_ids, mask, decoder.policies_for(b), Limits(call.max_length, call.kv_window))
        decoder.prefill_groups = None
        self.T, self.width, self.groups = 0, 0, None
        cap = max(call.max_length, length) + 1 + tuning.hole_slack + 2 * (self.max_nodes + 1) + length
        self.vis = np.zeros((b, cap), dtype=bool)
        self.done_before = np.zeros(b, dtype=bool)

    def draft(self):
        rows, call = self.rows, self.call
        live = [rows.policies[r] for r in rows.active]
        self.done_before = rows.done[rows.active].copy()
        self.groups = self.prefill_plan()
        if self.groups is not None:  # the prompt, in groups of rows of similar length; no drafts this step
            self.width = 0
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
        live = [(r, pr) for r, pr in zip(rows.active, probs) if not rows.done[r]]
        gains = [np.concatenate([[0.0], np.cumsum(np.sort(pr)[::-1])]) for _, pr in live]
        paces = np.array([max(1.0, rows.stats[r].new_tokens / max(rows.stats[r].target_calls, 1)) for r, _ in live])
        remaining = np.array([rows.limit[r] - rows.length[r] for r, _ in live], dtype=np.float64)
        values = token_values(remaining, paces, float(call.cost(len(live))), float(call.cost(1)))
        width = choose_width(gains, values, self.step_costs(b, p, max(len(d) for d in drafts)), self.margin)
        if self.prober.due(bool(width)):
            width = 1
        return [d.keep(top_nodes(pr, width)) if len(d) > width else d for d, pr in zip(drafts, probs)], k

    def prefill_plan(self):
        """At the prompt's step: the rows' prefill groups, or None for one padded forward."""
        call, layers = self.call, cache_layers(self.cache)
        if (self.T or call.cost is None or not call.tuning.grouped_prefill or call.media is not None
                or call.kv_window is not None or call.sliding is not None or not layers
                or any(type(layer) not in PLAIN_LAYERS or getattr(layer, "is_initialized", False) for layer in layers)):
            return None
        return prefill_groups(self.rows.pending_vis.sum(1), call.cost, call.tuning.prefill_margin)

    def batch_can_pay(self, b: int, p: int) -> bool:
        """Whether any width pays for a step of ``b`` rows and ``p`` pending tokens each (kept per shape)."""
        if (b, p) not in self._can_pay:
            self._can_pay[b, p] = can_pay(self.step_costs(b, p, self.max_nodes), self.margin)
        return self._can_pay[b, p]

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
        drafts[:] = [d.shallowest(spare) if len(d) > spare else d for d in drafts]
        return min(width, spare)

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
            return self.prefill(self.groups)
        media = None if call.media is None else {MEDIA_KWARG: call.media}
        call.media = None
        return call.forward(step.ids, step.pos, step.mask, self.width + 1, extra=media)

    def prefill(self, groups: list[np.ndarray]) -> torch.Tensor:
        """The prompt's forward in groups of rows, each padded to its longest row, into caches of their own then
        placed, left-padded (zeros, masked), into the batch's; the logits [b, 1, V] of every row's last prompt token."""
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
                full = [[t.new_zeros((b, t.shape[1], length, t.shape[3])) for t in (layer.keys, layer.values)]
                        for layer in layers]
            for entries, layer in zip(full, layers):
                for whole, part in zip(entries, (layer.keys, layer.values)):
                    whole[index, :, length - width :] = part
            del cache, group_logits
        for i in range(len(full)):  # update copies each layer into the cache: drop ours as it goes
            self.cache.update(*full[i], i)
            full[i] = None
        call.decoder.prefill_groups = [g.tolist() for g in groups]
        return logits

    def keep(self, p: int, drafts, accepted) -> None:
        """Per row, keep its pending tokens' and accepted nodes' entries at the front of the step's columns."""
        rows, start, vis = self.rows, self.T, self.vis
        keeps = [list(range(p)) + [p + j for j in nodes] for nodes in accepted]
        most = keep_rows_entries(self.cache, p + self.width, keeps)
        vis[: len(keeps), start : start + most] = False
        for i, k in enumerate(keeps):
            if not self.done_before[i]:
                vis[i, start : start + p] = rows.pending_vis[i]
                vis[i, start + p : start + len(k)] = True
        self.T = start + most
        self.accepted = accepted

    def after_step(self) -> None:
        """Every row's last token becomes pending; finished rows' cache rows are dropped (a copy of the whole cache)
        once the forwards they cost since, on the cost curve, reach that copy's estimated time (ski rental: at most
        twice the better of dropping at once and never)."""
        rows, call = self.rows, self.call
        rows.next_pending(self.accepted, self.done_before)
        done = rows.done[rows.active]
        self.vis[: len(done)][done] = False  # nothing of a finished row is attended to any more
        live = [i for i, gone in enumerate(done) if not gone]
        b = len(rows.active)
        if len(live) == b:
            self.compact(None)
            return
        if call.cost is not None and live:
            self._dead_cost += float(call.cost(b * (1 + self.width)) - call.cost(len(live) * (1 + self.width)))
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
        gather_columns(self.cache, idx, T)
        crop_cache(self.cache, T - width)
        self.vis[:b, :T] = False
        self.vis[:b, :width] = new_vis
        self.T = width

    def finish(self) -> None:
        pass
