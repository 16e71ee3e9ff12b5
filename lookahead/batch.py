"""Batched decoding (batch size > 1): every row exact, ONE forward per step for the whole batch.

``LookaheadDecoder.__call__`` hands a batch of more than one row (left-padded prompts, or a prompt
expanded by ``num_return_sequences``) to :class:`BatchCall`; batch size 1 keeps the single-row loop
(``decoder.SingleCall``). Both are loops over the pieces of ``call.py``. Per step:

1. **draft, per row**: each row has its own :class:`~lookahead.policy.DraftPolicy` (its own trie, copy
   index and model-prediction table; a shared ``trie=`` store is read by every row and learns each row's
   output as its own stream when the call ends). A row's policy prices its nodes on a flat curve, i.e.
   keeps every node worth anything; the batch then chooses one *width* for all rows (below).
2. **width, for the batch** (:func:`choose_width`): all rows are padded to the same number of draft
   nodes ``w`` (dummy nodes, masked), so a step costs the forward of ``b * (p + w)`` new tokens (``b``
   active rows, ``p`` pending tokens each): ``t(b * (p + w))`` on the call's cost curve. The width
   maximises the time it saves the batch until its last row ends, net of what it adds to this forward:
   a token of the row expected to end last saves a step of the batch's tail, any other row's only its
   share of the steps it is in (:func:`token_values`). So a row that is not copying never buys width
   that only the others would pay for, and rows that will end early anyway buy little of it on a CPU (on
   a GPU, where width costs nothing, every row drafts). (At the prompt's step the drafts are priced by
   what they add to the prompt's forward, :meth:`BatchCall.step_costs`.)
   **The prompt's step**, when the prompts' lengths differ enough that the cost curve says so
   (:func:`prefill_groups`; a CPU, where a forward's cost grows with its tokens): the rows are prefilled in
   groups of similar length, each group padded only to its own longest row, and their keys/values are
   placed, left-padded, into the batch's cache; plain ``generate`` computes every padding position. No
   drafts at that step. ``LookaheadConfig(batch_prefill="padded")`` keeps one padded forward.
3. **pack** (:func:`pack_batch`): ids and positions ``[b, p + w]``, a 4D mask ``[b, 1, p + w, T + p + w]``;
   each row's positions count only its real tokens.
4. **forward**, then every row's argmax and top-k in one pass, the greedy verdicts of every row in one
   Numba pass (with processors or sampling: ``verify.py`` per row, each row its own position uniforms),
   and the stopping criteria on every row's emitted tokens in one pass.
5. **KV, per row** (``kv_cache.keep_rows_entries``): each row's kept entries (its pending tokens and accepted
   nodes) are gathered to the front of the step's columns, one gather per layer for all rows; the step keeps
   as many columns as the row that kept most, and a row that kept fewer has masked *holes* there. Holes and left padding are
   squeezed out (:func:`realign_index`, right-aligned) once they exceed :data:`HOLE_SLACK` columns beyond
   the longest row, so the cache never holds more than plain batched decoding's (whose columns are
   the longest row's plus the others' padding) plus ``HOLE_SLACK`` and one step's rows, and the
   spare columns of its layers' buffers (:class:`~lookahead.kv_cache.GrowingLayer`: at most
   ``GROW_COLUMNS``, which save a copy of the whole cache at every forward).
6. **finished rows** stop drafting at once and leave the batch (their cache rows are dropped, a copy of
   the whole cache) once the forwards they have cost since, on the cost curve, reach that copy's time;
   the forward then shrinks to the rows still decoding. The output pads them with ``pad_token_id``
   exactly as plain ``generate`` does.

Plain ``generate``'s batch semantics that the output reproduces: all rows run until every row has
stopped; with an EOS criterion (``eos_token_id`` set) a stopped row's later tokens are
``pad_token_id``; without one, a row stopped by another criterion (a user criterion, ``stop_strings``)
keeps its real continuation until the last row stops. The result is ``prompt + max(new tokens)`` long.

Not in batched mode: the lookahead window (``window_width``, turned off: it is per-row Jacobi state),
draft passes (``self_draft``, ``draft_model``), ``output_scores``/``output_logits`` (a finished row's
scores in plain ``generate`` come from forwards this decoder never runs), a cache given with content, and
the returned cache (``return_dict_in_generate`` returns the sequences with no cache: ours has holes).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch

from . import call
from . import kernels as K
from .budget import Prober, can_pay
from .cache import NgramTrie
from .cost import CostModel
from .draft import Draft
from .kv_cache import PLAIN_LAYERS, cache_layers, check_rollbackable, keep_rows_entries, kv_layers, new_cache
from .policy import DraftPolicy, Limits
from .stats import DecodeStats
from .verify import PositionUniforms, Verdict

HOLE_SLACK = 16
"""Hole columns beyond the longest row that the cache may hold before it is re-aligned (a full copy)."""

COPY_SECONDS_PER_BYTE = 1 / 4e9
"""A whole-cache copy's time per byte before one was measured (then a running mean of the measured ones)."""

FLAT = CostModel(((1, 1.0), (2, 1.0)))
"""The curve a row's own budget prices with: every node with any chance is kept; the batch chooses the width."""


# -- pure functions ------------------------------------------------------------------------------------


PREFILL_MARGIN = 1.1
"""Grouped prefill must be estimated this much cheaper than one padded forward (its extra forwards' host
work is not on the cost curve)."""


def prefill_groups(lengths: np.ndarray, cost, margin: float = PREFILL_MARGIN) -> list[np.ndarray] | None:
    """The rows of a left-padded prompt batch in groups, each prefilled by its own forward padded only to
    its longest row, when the cost curve puts the groups' forwards below one forward of the whole padded
    batch by ``margin``; None when it does not (or the rows are equally long).

    ``lengths``: int[b], each row's real prompt tokens. A group of ``g`` rows whose longest has ``l``
    tokens costs ``t(g * l)``; an optimal split is a run of the rows sorted by length (moving a row to
    the group of rows of its length never costs more), found by dynamic programming over the cut points.

    Example: lengths [10, 200, 12, 190], ``t(k) = 0.1 + 0.001 k``: one padded forward is t(4 x 200) = 0.9 s;
    the groups [0, 2] (t(2 x 12) = 0.124 s) and [3, 1] (t(2 x 200) = 0.5 s) cost 0.624 s, below 0.9 / 1.1;
    each row alone would cost 0.812 s. Returns [array([0, 2]), array([3, 1])].
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if n < 2 or lengths.min() < 1 or lengths.min() == lengths.max():
        return None
    order = np.argsort(lengths, kind="stable")
    sl = lengths[order]
    best = np.zeros(n + 1)
    cut = np.zeros(n + 1, dtype=np.int64)
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


def choose_width(gains: list[np.ndarray], values: np.ndarray, cost: np.ndarray, margin: float = 1.05) -> int:
    """Draft nodes per row (the step's padded width ``w``) that save the batch the most time until its last
    row ends: maximises ``sum_i values[i] * gains[i][min(w, n_i)] - (cost[w] - cost[0])``, where
    ``values[i]`` is the seconds one more accepted token of row ``i`` saves later; a ``w > 0`` must save
    ``margin`` times its extra cost. Ties: the smaller width.

    Example: two rows, gains ``[0, .9, 1.7]`` and ``[0]``, values ``[0.02, 0.1]`` (the first row will finish
    before the second), cost ``[1.0, 1.02, 1.2]``: savings ``0, 0.018 - 0.02, 0.034 - 0.2`` -> ``w = 0``;
    with values ``[0.1, 0.1]``: ``0, 0.09 - 0.02, 0.17 - 0.2`` -> ``w = 1``.
    """
    width = len(cost) - 1
    saved = np.zeros(width + 1)
    for g, value in zip(gains, values):
        g = np.asarray(g, dtype=np.float64)[: width + 1] * value
        saved[: len(g)] += g
        saved[len(g):] += g[-1]
    extra = np.asarray(cost, dtype=np.float64) - float(cost[0])
    net = saved - extra
    best = int(np.argmax(net))
    if best and saved[best] < margin * extra[best]:
        return 0
    return best


def token_values(remaining: np.ndarray, paces: np.ndarray, step: float, single: float) -> np.ndarray:
    """Seconds one more accepted token of each live row saves before the batch ends (float[b]), for
    :func:`choose_width`. The batch runs until its last row ends, so tokens are not all worth the same:

    - the row expected to end last (most remaining tokens over its tokens per step so far, ``remaining /
      paces``) decodes the batch's tail alone: its token saves a single-row step, ``single = t(1)``; with one
      row left this is the single-row budget's rule (draft iff ``(1 + gain) t(1) > t(1 + w)``);
    - any other row's token saves its share of the steps it is in, ``(t(b) - t(1)) / (b - 1)`` for ``b`` rows,
      ``step = t(b)``: the forward it leaves becomes that much cheaper.

    Example: remaining [100, 40], paces [1, 2], t(2) = 0.12, t(1) = 0.1: [0.1, 0.02]. On a flat curve (a GPU)
    the others' tokens are worth almost nothing, but a width there costs nothing either.
    """
    b = len(remaining)
    values = np.full(b, max(step - single, 0.0) / (b - 1) if b > 1 else single)
    values[int(np.argmax(remaining / paces))] = single
    return values


def top_nodes(probs: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` most probable nodes, sorted (a child's probability never exceeds its parent's, and a parent
    comes first among equals, so the set is closed under parents). Example: ``[.9, .2, .8]``, 2 -> ``[0, 2]``."""
    return np.sort(np.argsort(-np.asarray(probs), kind="stable")[:k])


def step_gather_index(keeps: list[list[int]], width: int) -> np.ndarray:
    """int64[b, width]: per row, the step's columns it keeps (in order), padded with its last kept column.

    Example: keeps ``[[0, 2, 3], [0]]``, width 3 -> ``[[0, 2, 3], [0, 0, 0]]`` (row 1's last two are holes).
    """
    idx = np.empty((len(keeps), width), dtype=np.int64)
    for i, keep in enumerate(keeps):
        idx[i, : len(keep)] = keep
        idx[i, len(keep):] = keep[-1]
    return idx


def realign_index(visible: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(idx int64[b, T'], visible bool[b, T']): every row's visible columns right-aligned, T' = the most any row has.

    Example: visible ``[[F, T, F, T], [T, T, T, F]]`` -> T' = 3, idx ``[[1, 1, 3], [0, 1, 2]]``, visible
    ``[[F, T, T], [T, T, T]]`` (row 0's first column is a hole pointing at a column of its own).
    """
    counts = visible.sum(1)
    width = max(int(counts.max()), 1)
    idx = np.zeros((visible.shape[0], width), dtype=np.int64)
    new_visible = np.zeros((visible.shape[0], width), dtype=bool)
    for i in range(visible.shape[0]):
        cols = np.flatnonzero(visible[i])
        if len(cols):
            idx[i, width - len(cols):] = cols
            idx[i, : width - len(cols)] = cols[0]
            new_visible[i, width - len(cols):] = True
    return idx, new_visible


def pack_batch(pending: np.ndarray, pending_pos: np.ndarray, col_visible: np.ndarray, drafts: list[Draft],
               width: int, dtype: torch.dtype, device, fill_token: int = 0):
    """The inputs of one batched step: (input ids long[b, q], position ids long[b, q], mask [b, 1, q, T + q]).

    ``pending`` / ``pending_pos``: int64[b, p], every row's pending tokens and their positions;
    ``col_visible``: bool[b, T + p], which cached and pending columns each row sees (False: padding, holes);
    ``drafts``: each row's tree (no window), padded to ``width`` nodes with dummy children of the root
    (token ``fill_token``, one past the last pending position, seeing only the cache, the pending tokens and
    themselves; never verified). q = p + width. Worked example: p = 1, width 2, row 0 drafts ``[a, b]``
    (``b`` after ``a``), row 1 drafts nothing: row 1's two columns are dummies, each sees only itself and
    the pending token::

        row 0:  p a b      row 1:  p d d
        p       1 0 0      p       1 0 0
        a       1 1 0      d       1 1 0
        b       1 1 1      d       1 0 1
    """
    b, p = pending.shape
    q = p + width
    past = col_visible.shape[1] - p
    host_dtype = np.float64 if dtype == torch.float64 else np.float32
    neg = float(torch.finfo(dtype).min)
    mask = np.empty((b, q, past + q), dtype=host_dtype)
    ids = np.full((b, q), fill_token, dtype=np.int64)
    pos = np.empty((b, q), dtype=np.int64)
    parents = np.full((b, width), -1, dtype=np.int64)  # a dummy node: a child of the root nothing else sees
    ids[:, :p] = pending
    pos[:, :p] = pending_pos
    pos[:, p:] = pending_pos[:, -1:] + 1
    for i, d in enumerate(drafts):
        n = len(d)
        if n:
            parents[i, :n] = d.parents
            ids[i, p : p + n] = d.tokens
            pos[i, p : p + n] = pending_pos[i, -1] + d.depth
    K.fill_batch_masks(mask, p, parents, col_visible, neg)
    return (torch.from_numpy(ids).to(device), torch.from_numpy(pos).to(device),
            torch.from_numpy(mask[:, None]).to(device, dtype))


def row_processors(processors, r: int, b: int) -> list:
    """Row ``r``'s logits processors (of ``b`` rows), called with that row alone (input ids [1, L], scores
    [1, V]), as ``verify.py`` calls them: row-wise processors as they are; the per-row state of the ones
    ``generate`` builds with one (the repetition penalty's padding lengths, the encoder repetition penalty's
    prompt) sliced to the row, in copies (the caller's processors are not changed). Processors bound to the
    whole batch raise. A user's own processor is taken to work row by row, like transformers' own ones.

    Example: ``RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=tensor([2, 0]))``, row 1 -> a copy
    whose ``prompt_ignore_length`` is ``tensor([0])``.
    """
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


# -- the shared store, read by every row ----------------------------------------------------------------


class ReadOnlyStore:
    """A shared ``trie=`` store as a row's memory source sees it: proposals from it, nothing written while
    the rows decode (rows interleave in one thread, whose one stream would join their n-grams);
    :meth:`BatchCall.output` writes each row's output as its own stream instead."""

    def __init__(self, store: NgramTrie):
        self.store = store

    @property
    def max_n(self) -> int:
        return self.store.max_n

    def propose(self, *args, **kwargs):
        return self.store.propose(*args, **kwargs)

    def insert(self, tokens) -> None:
        pass

    def reset_stream(self) -> None:
        pass


# -- the call --------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One row's state. ``length``: tokens in its sequence (its left padding included, as ``max_length``
    counts them); ``limit``: the length it stops at at the latest; ``stop``: the length at which a stopping
    criterion first held (None: not yet); ``done``: out of the batch."""

    policy: DraftPolicy
    prompt: np.ndarray
    length: int
    limit: int
    last_pos: int = 0
    pending: int = 0
    stop: int | None = None
    done: bool = False
    uniforms: PositionUniforms | None = None
    stats: DecodeStats = field(default_factory=DecodeStats)


class BatchCall:
    """One batched ``generate`` call (batch size > 1): its state and the decode loop (:meth:`run`)."""

    def __init__(self, decoder, model, input_ids, logits_processor, stopping_criteria, generation_config,
                 streamer, model_kwargs):
        self.setup = setup = call.prepare(decoder, model, input_ids, logits_processor, stopping_criteria,
                                          generation_config, model_kwargs, row_processors)
        gen = setup.gen
        self.model, self.streamer, self.clock = model, streamer, decoder.clock
        self.decoder, self.stats = decoder, decoder.stats
        self.max_length, self.pads, self.cache, self.device = setup.max_length, setup.pads, setup.cache, setup.device
        pad = getattr(gen, "_pad_token_tensor", None)
        pad = gen.pad_token_id if pad is None else pad
        self.pad = None if pad is None else int(torch.as_tensor(pad).reshape(-1)[0])
        if self.pads and self.pad is None:
            raise ValueError("If `eos_token_id` is defined, make sure that `pad_token_id` is defined.")

        b, length = input_ids.shape
        self.prompt_length = length
        ids = input_ids.cpu().numpy().astype(np.int64)  # int64[b, L], host copy
        mask = model_kwargs.get("attention_mask")
        visible = np.ones((b, length), dtype=bool) if mask is None else mask.bool().cpu().numpy()
        self.pending, self.pending_vis = ids, visible  # [b, L] each: the first step's pending tokens
        self.pending_pos = np.maximum(np.cumsum(visible, 1) - 1, 0)
        cap = max(self.max_length, length) + 1
        self.fill = self.pad if self.pad is not None else 0
        self.seq = torch.full((b, cap), self.fill, dtype=torch.long, device=self.device)  # the output buffer
        self.seq[:, :length] = input_ids
        self.seq_host = self.seq.numpy() if setup.on_cpu else None

        self.cost = setup.cost
        self.margin = decoder.tuning.margin
        self.prober = Prober(decoder.tuning.probe_every)
        self.max_nodes = decoder.config.step_nodes_range[0]  # a batch's rows never widen ("auto")
        decoder.stats.step_nodes = self.max_nodes
        self._can_pay: dict[tuple[int, int], bool] = {}
        self._dead_cost = 0.0  # forward seconds finished rows have cost since the last drop
        self._copy_seconds_per_byte = COPY_SECONDS_PER_BYTE

        if setup.sliding is not None:  # past a sliding window: those layers keep every column, masked by the window
            setup.sliding.widen(self.cache)
        limits = Limits(self.max_length, setup.kv_window)
        self.rows: list[Row] = []
        for i, (policy, uniforms) in enumerate(zip(decoder.policies_for(b), call.uniforms(setup, b))):
            prompt = ids[i][visible[i]]
            policy.start(prompt, limits, FLAT if self.cost is not None else None, model)
            self.rows.append(Row(policy, prompt, length, self.max_length, last_pos=int(self.pending_pos[i, -1]),
                                 uniforms=uniforms))
        decoder.prefill_groups = None  # the prompt's row groups when it was prefilled in groups (prefill())
        self.active = list(range(b))  # the rows in the cache, in its batch order
        self.T = 0  # cache columns
        self.vis = np.zeros((b, cap + HOLE_SLACK + 2 * (self.max_nodes + 1) + length), dtype=bool)
        self.streamed = length  # columns handed to the streamer so far
        self.media = call.media_of(model_kwargs)  # the images' features: the prompt's step reads them, no later one

    # -- the loop ----------------------------------------------------------------------------------------

    def run(self):
        """The decode loop: draft -> pack -> forward -> read rows -> verify -> emit -> keep KV -> learn."""
        stats, clock = self.stats, self.clock
        checked = False
        while any(not self.rows[r].done for r in self.active):
            t0 = clock()
            rows = [self.rows[r] for r in self.active]  # the cache's rows: a finished one waits to be dropped
            p = self.pending.shape[1]
            groups = self.prefill_plan()
            if groups is not None:  # the prompt, in groups of rows of similar length; no drafts this step
                drafts, width = [Draft.empty()] * len(rows), 0
                k = max(row.policy.recycle_k for row in rows)
                t1 = clock()
                logits = self.prefill(groups)  # [b, 1, V]
            else:
                drafts, k = self.draft(rows, p)
                if self.media is not None:  # the prompt's step, with its images' features: no drafts beside them
                    drafts = [Draft.empty()] * len(rows)
                width = max((len(d) for d in drafts), default=0)
                width = self.fit_kv_window(p, width, drafts)
                col_visible = np.concatenate([self.vis[: len(rows), : self.T], self.pending_vis], axis=1)
                ids, pos, mask = pack_batch(self.pending, self.pending_pos, col_visible, drafts, width,
                                            self.setup.dtype, self.device)
                if self.setup.sliding is not None:  # the sliding layers' masks, by each row's positions
                    cached = np.cumsum(self.vis[: len(rows), : self.T], axis=1) - 1  # int64[b, T]
                    mask = self.setup.sliding.batch_masks(mask, pos, torch.from_numpy(cached).to(self.device))
                t1 = clock()
                media = None if self.media is None else {call.MEDIA_KWARG: self.media}
                self.media = None
                logits = call.forward(self.setup, stats, ids, pos, mask, width + 1, extra=media)  # [b, 1 + w, V]
            if not checked:
                check_rollbackable(self.cache)
                checked = True
            t2 = clock()
            verdicts, tops = self.verify(rows, logits, drafts, k)
            t3 = clock()
            emitted = self.emit(rows, verdicts)
            prefix = list(range(p))
            keeps = []
            last_pos = self.pending_pos[:, -1].tolist()
            for i, (row, d, verdict, n_emit) in enumerate(zip(rows, drafts, verdicts, emitted)):
                if verdict is None:  # finished: nothing to verify or keep
                    keeps.append(prefix)
                    continue
                nodes = verdict.nodes
                n_acc = min(len(nodes), n_emit)
                keeps.append(prefix + [p + j for j in nodes[:n_acc]] if n_acc else prefix)
                row.last_pos = last_pos[i] + n_acc + 1
                row.pending = verdict.tokens[n_emit - 1]
                successors = None if tops is None else (tops[0][i, : len(d) + 1], tops[1][i, : len(d) + 1])
                row.policy.learn(d, nodes, verdict.tokens[:n_emit], None, 0, 0.0, successors)
                row.stats.target_calls += 1
                row.stats.record_step(d, nodes[:n_acc], n_emit, 0.0, 0.0, 0.0, 0.0)
            stats.time_propose += t1 - t0
            stats.time_forward += t2 - t1
            stats.time_verify += t3 - t2
            self.keep_kv(p, width, keeps)
            self.finish_rows(width)
            self.next_pending()
            self.stream()
            stats.time_bookkeeping += clock() - t3
        call.finish(self.setup, stats)
        return self.output()

    # -- one step's parts ------------------------------------------------------------------------------------

    def prefill_plan(self) -> list[np.ndarray] | None:
        """At the prompt's step: the rows' prefill groups (:func:`prefill_groups`), or None for one padded
        forward (the prefill is not grouped with a pinned flat curve, a sliding-window or shared-KV cache,
        ``batch_prefill="padded"``, or when the groups would not pay)."""
        if (self.T or self.cost is None or self.decoder.config.batch_prefill == "padded" or self.media is not None
                or self.setup.kv_window is not None or self.setup.sliding is not None):
            return None
        if not _plain_layers(self.cache):
            return None
        return prefill_groups(self.pending_vis.sum(1), self.cost)

    def prefill(self, groups: list[np.ndarray]) -> torch.Tensor:
        """The prompt's forward in groups of rows, each padded only to its longest row, into caches of their
        own whose entries are then placed, left-padded, into the batch's cache: what one padded forward
        would have written at the real columns (the padding columns hold zeros, masked as before).
        Returns the float logits [b, 1, V] of every row's last prompt token.

        Memory: at most the prompt's keys/values once, plus one group's cache (while it runs) or one layer's
        (while it is handed over), where one padded forward holds the prompt's once plus its activations."""
        b, length = self.pending.shape
        logits, full = None, None
        for g in groups:
            width = int(self.pending_vis[g].sum(1).max())
            ids, pos, mask = pack_batch(self.pending[g][:, -width:], self.pending_pos[g][:, -width:],
                                        self.pending_vis[g][:, -width:], [Draft.empty()] * len(g), 0,
                                        self.setup.dtype, self.device)
            cache = new_cache(self.model)
            group_logits = call.forward(self.setup, self.stats, ids, pos, mask, 1, cache)  # [g, 1, V]
            rows = torch.from_numpy(g).to(self.device)
            if logits is None:
                logits = group_logits.new_empty((b, 1, group_logits.shape[-1]))
            logits[rows] = group_logits
            layers = cache_layers(cache)
            if full is None:  # per layer: keys and values [b, heads, length, head_dim], zeros where padded
                full = [(layer.keys.new_zeros((b, *layer.keys.shape[1:2], length, layer.keys.shape[3])),
                         layer.values.new_zeros((b, *layer.values.shape[1:2], length, layer.values.shape[3])))
                        for layer in layers]
            for (keys, values), layer in zip(full, layers):
                keys[rows, :, length - width :] = layer.keys
                values[rows, :, length - width :] = layer.values
            del cache, group_logits
        for i in range(len(full)):  # update copies each layer into the cache: drop ours as it goes
            keys, values = full[i]
            full[i] = None
            self.cache.update(keys, values, i)
            del keys, values
        self.decoder.prefill_groups = [g.tolist() for g in groups]
        return logits

    def batch_can_pay(self, b: int, p: int) -> bool:
        """Whether any width could pay at ``b`` rows and ``p`` pending tokens, were every node accepted."""
        key = (b, p)
        if key not in self._can_pay:
            self._can_pay[key] = can_pay(self.step_costs(b, p, self.max_nodes), self.margin)
        return self._can_pay[key]

    def step_costs(self, b: int, p: int, widest: int) -> np.ndarray:
        """float[widest + 1]: what a step of ``b`` rows, ``p`` pending tokens each and width ``w`` costs, as
        the width's rule compares it: ``t(b * (1 + w))``; with a long pending run (the prompt), a plain step's
        ``t(b)`` plus what the drafts add to that forward, ``t(b * (p + w)) - t(b * p)``: the prompt's own
        forward is paid whatever the width, and the drafts' tokens are worth what they save of plain steps.

        Example: ``t(k) = 1 + k / 100``, b = 4, p = 100: ``w = 1`` costs ``t(4) + 0.04 = 1.08``, not ``t(404)``,
        against which 1 expected token would always look free.
        """
        w = np.arange(widest + 1)
        if p == 1:
            return self.cost(b * (1 + w))
        return self.cost(b) + self.cost(b * (p + w)) - self.cost(b * p)

    def draft(self, rows: list[Row], p: int) -> tuple[list[Draft], int]:
        """(each row's draft, trimmed to the step's width; the top-k the rows' model sources want, 0 for none)."""
        b = len(rows)
        if self.cost is not None and not self.batch_can_pay(b, p):
            return [Draft.empty()] * b, 0
        drafts = [Draft.empty() if row.done else row.policy.draft(row.length, self.T + p, row.last_pos).without_window()
                  for row in rows]
        k = max((row.policy.recycle_k for row in rows if not row.done), default=0)
        if self.cost is None or not any(len(d) for d in drafts):
            return drafts, k
        probs = [row.policy.budget.probabilities_of(d) for row, d in zip(rows, drafts)]
        live = [row for row in rows if not row.done]
        gains = [np.concatenate([[0.0], np.cumsum(np.sort(pr)[::-1])]) for row, pr in zip(rows, probs) if not row.done]
        widest = max(len(d) for d in drafts)
        paces = np.array([max(1.0, row.stats.new_tokens / max(row.stats.target_calls, 1)) for row in live])
        remaining = np.array([row.limit - row.length for row in live], dtype=np.float64)
        values = token_values(remaining, paces, float(self.cost(len(live))), float(self.cost(1)))
        width = choose_width(gains, values, self.step_costs(b, p, widest), self.margin)
        if self.prober.due(bool(width)):  # estimates learned low can recover
            width = 1
        return [d.keep(top_nodes(pr, width)) if len(d) > width else d for d, pr in zip(drafts, probs)], k

    def fit_kv_window(self, p: int, width: int, drafts: list[Draft]) -> int:
        """Below a sliding-window cache's window, where rollback still works: re-align, then narrow the step."""
        kv_window = self.setup.kv_window
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

    def verify(self, rows: list[Row], logits: torch.Tensor, drafts: list[Draft], k: int):
        """(per row its verdict, None for a finished row; the top-k (ids int64[b, 1 + w, k], logits
        float32[b, 1 + w, k]) of each row's root and draft nodes when ``k``, else None).

        Greedy with no processors: every row's argmax and top-k in one pass over its real rows (a dummy node is
        not read, ``call.read_rows``), then every row's verdict in one Numba pass (``call.greedy_verdicts``)."""
        setup = self.setup
        counts = np.array([0 if row.done else len(d) + 1 for row, d in zip(rows, drafts)], dtype=np.int64)
        argmax, tops = call.read_rows(setup, logits, counts if setup.argmax_verdicts else None, counts,
                                      call.top_width(setup, k))
        live = [i for i, row in enumerate(rows) if not row.done]
        verdicts: list[Verdict | None] = [None] * len(rows)
        read = tops
        if tops is not None and k < tops[0].shape[2]:  # the sources' top-k, of the wider one the bans needed
            tops = (tops[0][:, :, :k], tops[1][:, :, :k]) if k else None
        if setup.argmax_verdicts and (setup.bans is None or setup.bans.apply(argmax, read, counts,
                                                                             self.row_lengths(rows, drafts))):
            for i, v in zip(live, call.greedy_verdicts(argmax[live], [drafts[i] for i in live])):
                verdicts[i] = v
            return verdicts, tops
        for i in live:
            r, row, n = self.active[i], rows[i], len(drafts[i])
            uniforms = row.uniforms.take(row.stats.new_tokens, n + 1) if row.uniforms is not None else None
            verdicts[i] = call.processed_verdict(setup, logits[i], drafts[i], self.seq[r : r + 1, : row.length],
                                                 setup.processors[r], uniforms)
        return verdicts, tops

    @staticmethod
    def row_lengths(rows: list[Row], drafts: list[Draft]) -> np.ndarray:
        """int64[b, 1 + w]: the sequence length each verified row continues (its root's, then each node's)."""
        width = max((len(d) for d in drafts), default=0)
        lengths = np.zeros((len(rows), 1 + width), np.int64)
        for i, (row, d) in enumerate(zip(rows, drafts)):
            lengths[i, 0] = row.length
            lengths[i, 1 : 1 + len(d)] = row.length + d.depth
        return lengths

    def emit(self, rows: list[Row], verdicts: list[Verdict | None]) -> list[int]:
        """Append each row's verdict tokens until it stops; returns how many each emitted (0: finished rows).
        The host-checkable criteria of every row in one pass (``call.first_stops``), then, where there are
        others, those token by token up to the first stop."""
        setup = self.setup
        live = [i for i, v in enumerate(verdicts) if v is not None]
        starts = np.array([rows[i].length for i in live], dtype=np.int64)
        limits = np.array([rows[i].limit for i in live], dtype=np.int64)
        index, by_limit = call.first_stops(setup, [verdicts[i].tokens for i in live], starts, limits)
        emitted = [0] * len(rows)
        for j, i in enumerate(live):
            row, tokens, r, start = rows[i], verdicts[i].tokens, self.active[i], rows[i].length
            if self.seq_host is not None:
                self.seq_host[r, start : start + len(tokens)] = tokens
            else:
                self.seq[r, start : start + len(tokens)] = torch.tensor(tokens, dtype=torch.long, device=self.device)
            n_emit, stop, by_length = len(tokens), int(index[j]), bool(by_limit[j])
            if row.stop is not None:  # stopped already (no EOS criterion): only its length limit counts
                stop, by_length = self._limit_index(start, len(tokens), row.limit), True
            elif setup.other_stops:  # the criteria on tensors, token by token up to the host's stop
                for t in range(stop + 1 if stop >= 0 else len(tokens)):
                    if call.other_stop(setup, self.seq[r : r + 1, : start + t + 1], None):
                        if t < stop or stop < 0:
                            stop, by_length = t, False
                        break
            if stop >= 0 and by_length:
                n_emit = stop + 1
            elif stop >= 0:  # a criterion holds at token `stop`: with an EOS criterion the row ends there, else it
                row.stop = start + stop + 1  # keeps its real continuation (as plain generate) up to its limit
                limit = self._limit_index(start, len(tokens), row.limit)
                n_emit = stop + 1 if self.pads else (limit + 1 if limit >= 0 else len(tokens))
            if n_emit < len(tokens):  # the buffer past a row's end holds the padding again
                self.seq[r, start + n_emit : start + len(tokens)] = self.fill
            row.length = start + n_emit
            if row.length >= row.limit and row.stop is None:
                row.stop = row.length
            emitted[i] = n_emit
        return emitted

    @staticmethod
    def _limit_index(start: int, n: int, limit: int) -> int:
        """The index of the token at which a row of ``start`` tokens reaches ``limit``, or -1 within ``n``."""
        i = limit - start - 1
        return i if 0 <= i < n else -1

    def finish_rows(self, width: int) -> None:
        """Mark the rows that are done: stopped (with an EOS criterion), or, without one, past the length at
        which the last row stopped (every row runs to it, as in plain generate). A finished row stops
        drafting at once; its cache row is dropped (a copy of the whole cache) once the forwards it has
        cost since it finished, on the cost curve, reach the copy's estimated time (ski rental: at most
        twice the better of dropping at once and never dropping)."""
        rows = self.rows
        if self.pads:
            finished = [r for r in self.active if rows[r].stop is not None]
        else:
            finished = [r for r in self.active if rows[r].length >= self.max_length]
            if all(row.stop is not None for row in rows):
                final = max(row.stop for row in rows)
                for r in self.active:
                    rows[r].limit = final
                finished += [r for r in self.active if rows[r].length >= final]
        for i, r in enumerate(self.active):
            if r in finished and not rows[r].done:
                rows[r].done = True
                self.vis[i] = False  # nothing of it is attended to any more; a re-alignment drops its columns
        live = [i for i, r in enumerate(self.active) if not rows[r].done]
        b = len(self.active)
        if len(live) == b:
            self.compact(None)
            return
        if self.cost is not None and live:
            self._dead_cost += float(self.cost(b * (1 + width)) - self.cost(len(live) * (1 + width)))
            if self._dead_cost < self._cache_bytes() * self._copy_seconds_per_byte:
                self.compact(None)
                return
        t = self.clock()
        size = self._cache_bytes()
        self.compact(live)
        if size:
            seconds = call.shared_seconds(self.setup, max(self.clock() - t, 0.0))
            self._copy_seconds_per_byte = 0.5 * self._copy_seconds_per_byte + 0.5 * seconds / size
        self._dead_cost = 0.0

    def _cache_bytes(self) -> int:
        return sum(2 * layer.keys.numel() * layer.keys.element_size() for layer in kv_layers(self.cache))

    def keep_kv(self, p: int, width: int, keeps: list[list[int]]) -> None:
        """Per row, keep its pending tokens' and accepted nodes' entries at the front of the step's columns."""
        start = self.T
        most = keep_rows_entries(self.cache, p + width, keeps)
        vis = self.vis
        vis[: len(keeps), start : start + most] = False
        for i, k in enumerate(keeps):
            if not self.rows[self.active[i]].done:
                vis[i, start : start + p] = self.pending_vis[i]
                vis[i, start + p : start + len(k)] = True
        self.T = start + most

    def compact(self, keep: list[int] | None, force: bool = False) -> None:
        """Drop the cache rows not in ``keep`` (indices into the active rows; None: all stay), then squeeze
        the holes out (every row right-aligned) when they exceed :data:`HOLE_SLACK` columns, or ``force``."""
        if keep is not None:
            self.active = [self.active[i] for i in keep]
            self.pending = self.pending[keep]
            self.pending_pos = self.pending_pos[keep]
            self.pending_vis = self.pending_vis[keep]
            self.vis[: len(keep)] = self.vis[keep]
            if not keep:
                return
            self.cache.batch_select_indices(torch.tensor(keep, dtype=torch.long, device=self.device))
        b, T = len(self.active), self.T
        vis = self.vis[:b, :T]
        if not force and T - int(vis.sum(1).max()) <= HOLE_SLACK:
            return
        idx, new_vis = realign_index(vis)
        width = idx.shape[1]
        index = torch.from_numpy(idx).to(self.device)
        for layer in kv_layers(self.cache):
            for name in ("keys", "values"):
                t = getattr(layer, name)
                t[:, :, :width] = t.gather(2, index[:, None, :, None].expand(t.shape[0], t.shape[1], width, t.shape[3]))
        if T > width:
            self.cache.crop(-(T - width))
        self.vis[:b, :T] = False
        self.vis[:b, :width] = new_vis
        self.T = width

    def next_pending(self) -> None:
        """Every active row's last emitted token becomes its one pending token."""
        rows = [self.rows[r] for r in self.active]  # a finished row's pending token: a dummy only it sees
        self.pending = np.array([[self.fill if row.done else row.pending] for row in rows],
                                dtype=np.int64).reshape(len(rows), 1)
        self.pending_pos = np.array([[row.last_pos] for row in rows], dtype=np.int64).reshape(len(rows), 1)
        self.pending_vis = np.ones((len(rows), 1), dtype=bool)

    def final_length(self) -> int:
        if self.pads:
            return max(row.length for row in self.rows)
        return max(row.stop if row.stop is not None else row.length for row in self.rows)

    def stream(self, final: int | None = None) -> None:
        """Hand the streamer every column all rows have emitted (a finished row's: ``pad_token_id``), one
        ``[B]`` tensor per column, as plain ``generate`` puts one per step."""
        if self.streamer is None:
            return
        if final is None:
            live = [self.rows[r].length for r in self.active if not self.rows[r].done]
            final = min(live) if live else self.final_length()
        for c in range(self.streamed, final):
            self.streamer.put(self.seq[:, c].cpu().clone())
        self.streamed = max(self.streamed, final)

    def output(self):
        final = self.final_length()
        self.stream(final)
        if self.streamer is not None:
            self.streamer.end()
        memory = self.decoder.memory
        if memory is not None:  # each row's output, its own stream
            for r, row in enumerate(self.rows):
                end = row.stop if row.stop is not None else row.length
                memory.reset_stream()
                memory.insert(self.seq[r, self.prompt_length : min(end, final)].cpu().numpy())
                memory.reset_stream()
        for row in self.rows:
            row.policy.finish()
        self.decoder.row_stats = [row.stats for row in self.rows]
        stats = self.stats  # the call's: its rows' steps (each row's, one after the other) and tokens
        for row in self.rows:
            stats.budgets += row.stats.budgets
            stats.accepted_per_step += row.stats.accepted_per_step
            stats.new_tokens += row.stats.new_tokens
            stats.drafted_by_origin.update(row.stats.drafted_by_origin)
            stats.accepted_by_origin.update(row.stats.accepted_by_origin)
        sequences = self.seq[:, :final].clone()
        if not self.setup.return_dict:
            return sequences
        from . import compat

        return compat.decoder_only_output(sequences, None, None, None)


def _plain_layers(cache) -> bool:
    """Whether every layer of the (empty) ``cache`` is a plain full-attention layer, one per decoder layer: then
    a layer's entries can be handed over whole with ``cache.update`` (a sliding-window layer's update would
    keep only its window)."""
    layers = cache_layers(cache)
    return bool(layers) and all(type(layer) in PLAIN_LAYERS and not getattr(layer, "is_initialized", False)
                                for layer in layers)
