"""`DraftPolicy`: a step's whole draft decision and all learning from its verdict (the loop and
``benchmarks/replay.py`` drive it alike)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .._tuning import DEFAULT, Tuning
from ..budget import Budget
from ..cache import NgramTrie
from ..config import LookaheadConfig
from ..cost import CostModel
from .draft import MEMORY, TRIE, Draft
from .sources import CopySource, CorpusSource, FrequentSource, ModelSource, TrieSource, merge_proposals


@dataclass(frozen=True)
class Limits:
    """Bounds one call puts on every step: ``max_length`` (prompt + new tokens), ``kv_window`` (the cache's smallest
    sliding window, or None), ``max_rows`` (a static cache's largest bucket, or None) and ``chains`` (every draft one
    chain, no window: a model that takes no 4D mask)."""

    max_length: int
    kv_window: int | None = None
    max_rows: int | None = None
    chains: bool = False


class DraftPolicy:
    """Proposes, budgets and limits each step's draft; learns from each verdict. One per decoder (and per batch row).
    Each step every source proposes (the fallback ones only when none does), the trees are merged, the budget keeps
    the nodes and window rows worth their cost, and the call's :class:`Limits` apply. Usage::

        policy.start(prompt, Limits(max_length), cost)   # cost: a CostModel, or None for no budget
        while ...:
            draft = policy.draft(length, cached, last_pos)
            ...verify draft...
            policy.learn(draft, accepted_nodes, emitted, window_argmax, rows, seconds)
    """

    def __init__(self, config: LookaheadConfig, trie: NgramTrie, memory: NgramTrie | None = None,
                 tuning: Tuning = DEFAULT, draft=None, heads=None, successors=None, corpus: NgramTrie | None = None):
        self.config, self.tuning = config, tuning
        self.sources = make_sources(config, tuning, trie, memory, draft, heads, successors, corpus)
        self._lazy = [s for s in self.sources if s.learns_lazily]
        self._eager = [s for s in self.sources if not s.learns_lazily]
        self._unlearned: list[np.ndarray] = []  # emitted tokens the lazy sources have not learned yet
        columns = config.window_columns(tuning)
        self._window_spec = (columns, tuning.window_ngram, tuning.window_candidates) if columns else None
        self.window = None  # the window's source, made when a call first runs it (window.py is imported then)
        self.window_on = self._window_spec is not None and config.window != "auto"
        self.model = next((s for s in self.sources if isinstance(s, ModelSource)), None)
        self._primary = [s for s in self.sources if not s.fallback]
        self._fallback = [s for s in self.sources if s.fallback]
        self.budget: Budget | None = None
        self.limits = Limits(max_length=1 << 62)
        self.step_nodes = config.step_nodes(tuning)[0]  # this call's: "auto" widens it where that pays
        self._context: list[int] = []
        self._propose = True
        self.prompt_rows = False

    def bind_corpus(self, store: NgramTrie | None) -> None:
        """The corpus source drafts from ``store`` again (a pickle leaves the store behind)."""
        for source in self.sources:
            if isinstance(source, CorpusSource):
                source.trie = store

    def learn_prompt(self, tokens: np.ndarray, top_ids: np.ndarray, top_logits: np.ndarray) -> None:
        """Before the first step, when :attr:`prompt_rows`: the pending prompt's rows but the last (row ``j``: input
        ``tokens[j]``) with their top-k successor ids and logits."""
        if self.model is not None:
            tokens = np.asarray(tokens, dtype=np.int64)
            self.model.table.update(np.concatenate([[-1], tokens[:-1]]), tokens, top_ids, top_logits)

    @property
    def recycle_k(self) -> int:
        """The top-k :meth:`learn` wants of every verified row (0: none, also while no tree can pay)."""
        return self.model.k if self.model is not None and self._propose else 0

    def max_rows(self, window: bool | None = None) -> int:
        """The most new tokens one step can feed: the last token, the trees (at most ``step_nodes``) and the window's
        rows when it runs (``window``; None: this call's choice, known once :meth:`start` has seen the cost curve)."""
        window = self.window_on if window is None else window and self._window_spec is not None
        return self._rows(lambda s: s.limits()[0], window, self.step_nodes)

    def first_rows(self) -> int:
        """The most rows a step feeds before a call's cost curve is known (what a calibration measures): the narrow
        ``step_nodes``, no wide trees, the window only where it is set explicitly, whatever earlier calls chose."""
        window = self._window_spec is not None and self.config.window != "auto"
        return self._rows(lambda s: s.max_nodes, window, self.config.step_nodes(self.tuning)[0])

    def _rows(self, nodes, window: bool, step_nodes: int) -> int:
        """1 + the trees (``nodes(source)`` each, at most ``step_nodes`` in all) + the window's rows if ``window``."""
        others = sum(nodes(s) for s in self._primary if s is not self.window)
        if window:  # its n-grams (at most G * (N - 1) nodes) and its own rows (W * (N - 1))
            columns, ngram, candidates = self._window_spec
            others += candidates * (ngram - 1)
        drafted = min(max([others] + [nodes(s) for s in self._fallback]), step_nodes)
        return 1 + drafted + (columns * (ngram - 1) if window else 0)

    def start(self, prompt: Sequence[int], limits: Limits, cost: CostModel | None = None, model=None,
              learner=None) -> None:
        """Begin a call: the sources learn the prompt; a fresh budget prices with ``cost`` (None: no budget), taught
        by ``learner`` (a ``learned.LearnedCurve``) when given; ``model``: the target model (the model-prediction table is
        kept per model)."""
        t = self.tuning
        arr = np.asarray(prompt, dtype=np.int64)
        self._unlearned = []
        self._widen(False)
        self.limits = limits
        self.budget = None
        self.step_nodes = narrow = self.config.step_nodes(t)[0]
        self.window_on = self._window_spec is not None and not limits.chains and narrow > 0 and (
            self.config.window != "auto"
            or (cost is not None and float(cost(self.max_rows(window=True)) / cost(1)) <= t.window_auto_cost))
        if self.window_on and self.window is None:
            from .window import WindowSource

            self.window = WindowSource(*self._window_spec, t.max_match, t.window_draws)
            for group in (self.sources, self._primary, self._eager):
                group.append(self.window)
        for source in self.sources:
            source.start(arr, model)
        self._context = arr.tolist()
        # the prompt's own rows teach the model-prediction source where a forward's extra rows are nearly free
        self.prompt_rows = self.model is not None and (cost is None or float(cost(64) / cost(1)) <= t.prompt_rows_cost)
        wide = self.config.step_nodes(t)[1]
        if wide > narrow and cost is not None:  # "auto": the widest step the curve is flat that far for
            for level in (n for n in t.step_nodes_levels if narrow < n <= wide):
                self.step_nodes = level
                self._widen(level == t.step_nodes_levels[0])
                rows = self.max_rows()
                if ((limits.max_rows is None or rows <= limits.max_rows)
                        and float(cost(rows) / cost(1)) <= t.step_nodes_wide_cost):
                    break
            else:
                self.step_nodes = narrow
                self._widen(False)
        self.budget = None if cost is None else Budget(cost, t, self.max_rows(), learner)
        # no tree can pay on this curve (and no window needs drafting): skip proposing
        self._propose = self.budget is None or self.window_on or learner is not None or self.budget.drafting_can_pay

    def _widen(self, on: bool) -> None:
        for source in self.sources:
            source.wide = on

    def draft(self, length: int, cached: int, last_pos: int) -> Draft:
        """This step's draft. ``length``: tokens in the sequence; ``cached``: tokens in the KV cache once this step's
        pending tokens are in; ``last_pos``: the last pending token's position."""
        limits = self.limits
        room = limits.max_length - length - 1  # before the bonus token
        proposals = []
        if room > 0 and self._propose and self.step_nodes:
            self.catch_up()
            context = np.asarray(self._context[-self.tuning.max_match:], dtype=np.int64)
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
        # at most step_nodes nodes: without a budget the shallowest (cut in the merge), else the likeliest
        draft = merge_proposals(proposals, self.window.rows() if self.window_on else None,
                                self.step_nodes if self.budget is None else None)
        if self.budget is not None:
            draft = self.budget.plan(draft, self.step_nodes)
        if draft.window is not None and last_pos + int(draft.window.offsets.max()) > limits.max_length - 2:
            draft = draft.without_window()  # no row beyond the last position plain generate would feed
        if limits.chains:  # one chain, verified causally: the path expected to accept the most
            from .trees import best_chain

            weights = self.budget.probabilities_of(draft) if self.budget is not None else np.ones(len(draft))
            draft = draft.without_window().keep(best_chain(draft.parents, weights))
        if limits.kv_window is not None:  # stay below the sliding window, where rollback still works
            spare = limits.kv_window - 1 - cached
            if draft.rows > spare:
                draft = draft.without_window()
                if len(draft) > spare:
                    draft = draft.shallowest(spare)
        return draft

    def catch_up(self) -> None:
        """Hand the lazy sources the tokens emitted since they last learned (and, when the call ends, the rest of
        its output)."""
        if self._unlearned:
            arr = self._unlearned[0] if len(self._unlearned) == 1 else np.concatenate(self._unlearned)
            self._unlearned = []
            for source in self._lazy:
                source.learn(arr)

    def learn(self, draft: Draft, accepted_nodes: Sequence[int], emitted: Sequence[int],
              window_argmax: np.ndarray | None = None, rows: int = 0, seconds: float = 0.0,
              successors: tuple[np.ndarray, np.ndarray] | None = None, hidden=None) -> None:
        """After a verified step: its accepted nodes (root to leaf), emitted tokens, the window rows' argmax, the
        forward's ``rows`` and ``seconds`` (a learned curve's), the verified rows' ``successors`` (ids int64[1 + n, k],
        logits) when :attr:`recycle_k`, and the accepted path's final ``hidden`` states when a source wants them."""
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


def make_sources(config: LookaheadConfig, tuning: Tuning, trie: NgramTrie, memory: NgramTrie | None, draft=None,
                 heads=None, successors=None, corpus: NgramTrie | None = None) -> list:
    """The sources in merge order: the request's trie, the copy, a shared store, the corpus, the model's predictions,
    the draft passes (``lookahead.passes``), the heads, the frequent tokens; the window comes last, made by
    :meth:`DraftPolicy.start`. ``successors``: a model-prediction table a batch's rows share."""
    t = tuning
    tree = {"max_nodes": t.tree_nodes, "max_depth": t.tree_depth}
    sources = [TrieSource(trie, TRIE, t.max_match, per_request=True, **tree)]
    if t.copy_nodes:
        sources.append(CopySource(t.copy_capacity, t.copy_nodes, t.copy_depth, t.copy_branches, t.copy_branch_depth,
                                  t.copy_buckets))
    if memory is not None:
        sources.append(TrieSource(memory, MEMORY, t.max_match, per_request=False, **tree))
    if corpus is not None:
        sources.append(CorpusSource(corpus, t.max_match, **tree))
    if t.recycle_k:
        sources.append(ModelSource(t.recycle_k, t.recycle_nodes, t.recycle_depth, t.recycle_keep, successors,
                                   t.recycle_calibration, t.recycle_buckets))
    if draft is not None:
        from ..passes import draft_source

        sources.append(draft_source(draft, t))
    if heads is not None:
        sources.append(heads.make_source(config.step_nodes(t)[1], t))
    if t.fill_nodes:
        sources.append(FrequentSource(t.fill_nodes))
    return sources
