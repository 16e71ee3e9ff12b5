"""`DraftPolicy`: the whole decision of a step, and all learning from its verdict, in one object.

The decode loop asks it for a finished, immutable :class:`~lookahead.draft.Draft` and tells it what
was accepted; :mod:`benchmarks.replay` drives the very same object on recorded outputs. Per step:

1. **propose**: every source (``proposer.py``) drafts after the context (the frequent tokens only when none
   does); the trees are merged, and at most ``step_nodes`` of their nodes kept (the most probable by the
   acceptance estimates; without a budget, the shallowest).
2. **budget** (``adaptive=True``): keep the nodes, and the window rows, worth their cost (``budget.py``).
3. **limits**: no node beyond what may still be emitted (``max_length``); no window row past the
   last position plain ``generate`` would feed the model; every row below a sliding-window cache's
   window, where rollback still works.

After verification, :meth:`DraftPolicy.learn` feeds the emitted tokens to every source, the window
rows' argmax to the window, and the verdict (and, when refining, the step's time) to the budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import kernels as K
from .budget import Budget
from .cache import NgramTrie
from .config import STEP_NODES_LEVELS, STEP_NODES_WIDE_COST, WINDOW_AUTO_COST, LookaheadConfig
from .cost import CostModel
from .draft import MEMORY, TRIE, Draft
from .proposer import (
    CopySource,
    CorpusSource,
    FrequentSource,
    ModelSource,
    TrieSource,
    WindowSource,
    merge_proposals,
)
from .selfspec import make_draft_sources
from .source import DraftSource
from .tuning import BudgetTuning

PROMPT_ROWS_COST = 2.0
"""The model-prediction source learns the prompt's rows when 64 rows cost at most this many one-row forwards."""


@dataclass(frozen=True)
class Limits:
    """Bounds one call puts on every step: ``max_length`` (prompt + new tokens, as ``generate``'s),
    ``kv_window``, the smallest sliding window of the model's cache layers, or None, ``max_rows``, the most
    rows a step's forward can take (a static cache's largest bucket), or None, and ``chains``: every step's draft is
    one chain and no window rows run (a model that takes no 4D mask)."""

    max_length: int
    kv_window: int | None = None
    max_rows: int | None = None
    chains: bool = False


class DraftPolicy:
    """Proposes, budgets and limits each step's draft; learns from each verdict. One per decoder.

    Usage (what the decode loop and the replay both do)::

        policy.start(prompt, Limits(max_length), cost)   # cost: a CostModel, or None for no budget
        while ...:
            draft = policy.draft(length, cached, last_pos)
            ...verify draft...
            policy.learn(draft, accepted_nodes, emitted, window_argmax, rows, seconds)
    """

    def __init__(self, config: LookaheadConfig, trie: NgramTrie, memory: NgramTrie | None = None,
                 tuning: BudgetTuning | None = None, draft_model=None, heads=None, successors=None,
                 corpus: NgramTrie | None = None):
        self.config = config
        self.tuning = tuning or BudgetTuning()
        self.sources = make_sources(config, trie, memory, draft_model, heads, successors, corpus)
        self.wants_hidden = any(s.wants_hidden for s in self.sources)
        self._lazy = [s for s in self.sources if s.learns_lazily]
        self._eager = [s for s in self.sources if not s.learns_lazily]
        self._unlearned: list[np.ndarray] = []  # emitted tokens the lazy sources have not learned yet
        self._carried = None  # the acceptance estimates the last call ended with (tuning.carry_trials)
        self.window = next((s for s in self.sources if isinstance(s, WindowSource)), None)
        # whether the window runs in this call: config.window_width="auto" decides at start, on the cost curve
        self.window_on = self.window is not None and config.window_width != "auto"
        self.model = next((s for s in self.sources if isinstance(s, ModelSource)), None)
        self._primary = [s for s in self.sources if not s.fallback]
        self._fallback = [s for s in self.sources if s.fallback]  # asked only on a priced step nothing else drafts
        self.budget: Budget | None = None
        self.limits = Limits(max_length=1 << 62)
        self.step_nodes = config.step_nodes_range[0]  # this call's: "auto" widens it at start where that pays
        self._context: list[int] = []
        self._propose = True
        self.prompt_rows = False

    def bind_corpus(self, store: NgramTrie | None) -> None:
        """The corpus source drafts from ``store`` again (the corpus's store, which a pickle of the policy leaves
        behind: ``CorpusSource.transient``)."""
        for source in self.sources:
            if isinstance(source, CorpusSource):
                source.bind(store)

    def learn_prompt(self, tokens: np.ndarray, top_ids: np.ndarray, top_logits: np.ndarray) -> None:
        """Before the first step, when :attr:`prompt_rows`: the rows of the pending prompt ``tokens`` but the
        last (row ``j``: input ``tokens[j]``), their top-k successor ids and logits."""
        if self.model is not None:
            tokens = np.asarray(tokens, dtype=np.int64)
            self.model.table.update(np.concatenate([[-1], tokens[:-1]]), tokens, top_ids, top_logits)

    @property
    def recycle_k(self) -> int:
        """How many top-k successors of every verified row :meth:`learn` wants (0: none, also while no tree
        can pay on this call's cost curve: then nothing is proposed, so the table's upkeep would be wasted)."""
        return self.model.k if self.model is not None and self._propose else 0

    def max_rows(self, window: bool | None = None) -> int:
        """The most new tokens one step can feed: the last token, the sources' trees (at most ``step_nodes``; a
        ``fallback`` source's only alone), the window's own rows when it runs (``window``: whether to count them; None:
        this call's choice, which for an ``"auto"`` window is known once :meth:`start` has seen the cost curve:
        before, the rows the calibration must measure)."""
        window = self.window_on if window is None else window and self.window is not None
        others = sum(s.limits()[0] for s in self._primary if s is not self.window or window)
        drafted = min(max([others] + [s.limits()[0] for s in self._fallback]), self.step_nodes)
        return 1 + drafted + (self.window.max_rows - self.window.max_nodes if window else 0)

    def start(self, prompt: Sequence[int], limits: Limits, cost: CostModel | None = None, model=None) -> None:
        """Begin a call: the sources learn the prompt; a fresh budget prices with ``cost`` (None: no budget).
        ``model``: the target model, which the model-prediction source keeps its table for (with
        ``recycle_keep``, another model's empties it)."""
        arr = np.asarray(prompt, dtype=np.int64)
        self._unlearned = []
        self._widen(False)  # a source starts with its trees as configured, not the last call's widest
        for source in self.sources:
            source.start(arr, model)
        self._context = arr.tolist()
        self.limits = limits
        self.budget = None  # priced below, once the window's choice (and so the most rows of a step) is made
        # the prompt's own rows teach the model-prediction source before the first step, when the decoder keeps
        # their logits: worth it where a forward's extra rows are nearly free; on a CPU the output layer over a
        # long prompt costs several one-token forwards (SmolLM2's is a 576 x 49152 matrix per row)
        self.prompt_rows = self.model is not None and (cost is None or float(cost(64) / cost(1)) <= PROMPT_ROWS_COST)
        narrow, wide = self.config.step_nodes_range
        self.step_nodes = narrow
        self.window_on = self.window is not None and not limits.chains and (
            self.config.window_width != "auto"
            or (cost is not None and float(cost(self.max_rows(window=True)) / cost(1)) <= WINDOW_AUTO_COST))
        if wide > narrow and cost is not None:  # "auto": the widest step the curve is flat that far for
            for level in (n for n in STEP_NODES_LEVELS if narrow < n <= wide):
                self.step_nodes = level
                self._widen(level == STEP_NODES_LEVELS[0])
                rows = self.max_rows()
                if ((limits.max_rows is None or rows <= limits.max_rows)
                        and float(cost(rows) / cost(1)) <= STEP_NODES_WIDE_COST):
                    break
            else:
                self.step_nodes = narrow
                self._widen(False)
        self.budget = None if cost is None else Budget(cost, self.tuning, self.config.refine_cost, self.max_rows())
        if self.budget is not None and self._carried is not None:
            self.budget.acceptance.start_from(self._carried)
        # no tree can pay on this curve (and no window needs drafting): skip proposing (refinement may change it)
        self._propose = (self.budget is None or self.window_on or self.config.refine_cost
                         or self.budget.drafting_can_pay)

    def _widen(self, on: bool) -> None:
        """The sources draft their widest trees (``DraftSource.limits``) in this call's steps, or not."""
        for source in self.sources:
            source.wide = on

    def draft(self, length: int, cached: int, last_pos: int) -> Draft:
        """This step's draft. ``length``: tokens in the sequence (prompt + emitted); ``cached``: tokens in
        the KV cache once this step's pending tokens are in; ``last_pos``: the last pending token's position."""
        cfg, limits = self.config, self.limits
        room = limits.max_length - length - 1  # before the bonus token
        proposals = []
        if room > 0 and self._propose and self.step_nodes:
            self.catch_up()
            context = np.asarray(self._context[-cfg.max_match:], dtype=np.int64)
            for source in self._primary:
                if source is self.window and not self.window_on:
                    continue
                most_nodes, deepest = source.limits()
                depth = min(deepest, room)
                if source.priced:  # a draft pass costs its forwards: as deep as pays, or 0
                    depth = source.priced_depth(depth, None if self.budget is None else self.budget.cost,
                                                self.tuning.margin)
                    if not depth:
                        continue
                p = source.propose(context, min(most_nodes, self.step_nodes), depth)
                if p is not None:
                    proposals.append((source.origin, p))
            if not proposals and self.budget is not None:  # priced, as every node
                for source in self._fallback:
                    p = source.propose(context, min(source.max_nodes, self.step_nodes), min(source.max_depth, room))
                    if p is not None:
                        proposals.append((source.origin, p))
        # at most step_nodes nodes: without a budget the shallowest (cut in the merge), else the most probable
        # (a parent before its children), which the budget's choice among them picks in the same pass
        draft = merge_proposals(proposals, self.window.rows() if self.window_on else None,
                                self.step_nodes if self.budget is None else None)
        if self.budget is not None:
            draft = self.budget.plan(draft, self.step_nodes)
        if draft.window is not None and last_pos + int(draft.window.offsets.max()) > limits.max_length - 2:
            draft = draft.without_window()  # no row beyond the last position plain generate would feed
        if limits.chains:  # one chain, verified causally: the path expected to accept the most (else the deepest)
            weights = self.budget.probabilities_of(draft) if self.budget is not None else np.ones(len(draft))
            draft = draft.without_window().keep(K.best_chain(draft.parents, weights))
        if limits.kv_window is not None:  # stay below the sliding window, where rollback still works
            spare = limits.kv_window - 1 - cached
            if draft.rows > spare:
                draft = draft.without_window()
                if len(draft) > spare:
                    draft = draft.shallowest(spare)
        return draft

    def finish(self) -> None:
        """The call ended: the lazy sources learn the rest of the output (:meth:`catch_up`), and the acceptance
        estimates are kept for the next call (``tuning.carry_trials``)."""
        self.catch_up()
        if self.budget is not None and self.tuning.carry_trials > 0:
            self._carried = self.budget.acceptance.carried(self.tuning.carry_trials)

    def catch_up(self) -> None:
        """Hand the sources that learn lazily (``DraftSource.learns_lazily``) the tokens emitted since they last
        learned; the decode loop calls it when a call ends, so a shared store has learned the whole output."""
        if self._unlearned:
            arr = self._unlearned[0] if len(self._unlearned) == 1 else np.concatenate(self._unlearned)
            self._unlearned = []
            for source in self._lazy:
                source.learn(arr)

    def learn(self, draft: Draft, accepted_nodes: Sequence[int], emitted: Sequence[int],
              window_argmax: np.ndarray | None = None, rows: int = 0, seconds: float = 0.0,
              successors: tuple[np.ndarray, np.ndarray] | None = None, hidden=None) -> None:
        """After a verified step: ``accepted_nodes`` of ``draft`` (root to leaf), the ``emitted`` tokens,
        the window rows' argmax (when they ran), the forward's ``rows`` and ``seconds``, and (when
        :attr:`recycle_k`) ``successors``: (ids int64[1 + n, k], logits float[1 + n, k]), the top-k of
        the verified rows: the last context token's, then each draft node's; (when :attr:`wants_hidden`)
        ``hidden``, the final hidden states float[1 + len(accepted_nodes), H] of the accepted path's rows (the
        last: the row whose logits gave the last emitted token)."""
        if successors is not None:
            for source in self.sources:
                if source.wants_rows:
                    source.learn_rows(draft, accepted_nodes, *successors)
        if self.budget is not None:
            self.budget.record(draft, accepted_nodes, rows, seconds)
        if hidden is not None:
            for source in self.sources:
                if source.wants_hidden:
                    source.observe_hidden(hidden)
        arr = np.asarray(emitted, dtype=np.int64)
        for source in self._eager:
            source.learn(arr)
        if self._lazy:
            self._unlearned.append(arr)
        self._context.extend(emitted)
        if window_argmax is not None and self.window_on:
            self.window.advance(window_argmax, len(arr))


def make_sources(config: LookaheadConfig, trie: NgramTrie, memory: NgramTrie | None, draft_model=None,
                 heads=None, successors=None, corpus: NgramTrie | None = None) -> list[DraftSource]:
    """The sources a :class:`~lookahead.config.LookaheadConfig` (and a user's ``draft_model``, trained
    ``heads``: an object whose ``make_source(config)`` returns their :class:`DraftSource`, and ``corpus``: the
    read-only store of a ``corpus.DraftCorpus``) ask for, in merge order; the draft passes (``selfspec.py``) and
    the heads after the others, then the frequent tokens (asked only when no other source drafts), the window
    last. ``successors``: the model-prediction source's table, when it is shared (a batch's rows)."""
    sources: list[DraftSource] = [TrieSource(trie, TRIE, config.max_match, per_request=True,
                                             max_nodes=config.tree_nodes, max_depth=config.tree_depth)]
    if config.copy_nodes:  # after the trie: a node both draft keeps the trie's estimates (replayed: better)
        sources.append(CopySource(config.copy_capacity, config.copy_nodes, config.copy_depth, config.copy_branches))
    if memory is not None:
        sources.append(TrieSource(memory, MEMORY, config.max_match, per_request=False, max_nodes=config.tree_nodes,
                                  max_depth=config.tree_depth))
    if corpus is not None:
        sources.append(CorpusSource(corpus, config.max_match, max_nodes=config.tree_nodes, max_depth=config.tree_depth))
    if config.recycle_k:
        sources.append(ModelSource(config.recycle_k, config.recycle_nodes, config.recycle_depth, config.recycle_keep,
                                   successors))
    sources.extend(make_draft_sources(config, draft_model))
    if heads is not None:
        sources.append(heads.make_source(config))
    if config.fill_nodes:
        sources.append(FrequentSource(config.fill_nodes))
    if config.window_columns:
        sources.append(WindowSource(config.window_columns, config.window_ngram, config.window_candidates,
                                    config.max_match))
    return sources
