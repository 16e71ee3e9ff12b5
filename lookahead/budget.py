"""The draft budget: which draft nodes a step verifies, and whether the window's rows run.

Each step keeps the ``k`` most probable nodes (a prefix that is always a tree) maximising expected
tokens per second, ``(1 + sum of their probabilities) / t(1 + k + m)``, with ``t`` the cost curve
(``cost.py``), node probabilities from the acceptance estimates (``acceptance.py``) and ``m`` the
window's rows; ``k = 0`` is a plain one-token step.

Worked example: node probabilities ``[0.9, 0.8, 0.1]``, cost ``t(1)=1, t(2)=1.1, t(3)=1.2, t(4)=2``:
``k=0`` gives 1/1 = 1.0 tokens per unit, ``k=1`` 1.9/1.1 = 1.73, ``k=2`` 2.7/1.2 = 2.25, ``k=3``
2.8/2 = 1.4: verify the two most probable nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import kernels as K
from .acceptance import AcceptanceStats, CopyBelief
from .cost import CostModel, CostRefiner
from .draft import ORIGINS, WINDOW, Draft
from .tuning import BudgetTuning


def can_pay(costs: np.ndarray, margin: float) -> bool:
    """Whether drafting could ever beat a plain step on ``costs`` (float[K + 1], a step's cost with ``k`` = 0..K
    draft nodes, ``costs[0]`` the plain step's), were every node surely accepted: ``(1 + k) * costs[0] >= margin
    * costs[k]`` for some ``k`` >= 1. When not, proposing is skipped altogether.

    Example: ``t(1) = 1, t(2) = 3, t(k) = k + 1`` beyond (costs ``[1, 3, 4, 5]``): ``(1 + k) / costs[k]`` stays
    below 1: False.
    """
    k = np.arange(1, len(costs))
    return bool(np.any((1 + k) * costs[0] >= margin * np.asarray(costs)[1:]))


class Prober:
    """Counts the steps that drafted nothing although drafts existed; every ``every``-th such step should
    verify one node anyway (:meth:`due`), so that acceptance estimates learned low can recover."""

    def __init__(self, every: int):
        self.every, self.idle = every, 0

    def due(self, drafted: bool) -> bool:
        """Record a step that did (``drafted``) or did not draft; True when this step should probe instead."""
        if drafted:
            self.idle = 0
            return False
        self.idle += 1
        if self.idle >= self.every:
            self.idle = 0
            return True
        return False


def choose_nodes(probs: np.ndarray, cost: CostModel | np.ndarray, extra_rows: int = 0, extra_gain: float = 0.0,
                 margin: float = 1.05, max_nodes: int | None = None) -> tuple[np.ndarray, float]:
    """The draft nodes worth verifying: (indices, sorted; expected tokens per second of the choice).

    ``probs``: float[n] acceptance probabilities of a tree's nodes (a child never above its parent).
    ``cost``: a curve, or its table ``cost(arange(K))`` for K > n + extra_rows + 1 (what a step passes).
    ``extra_rows``/``extra_gain``: rows and expected tokens another part of the step adds (the window).
    Maximises ``(1 + extra_gain + sum of chosen probs) / cost(1 + extra_rows + k)`` over k = 0..n;
    a k > 0 must beat k = 0 by the factor ``margin``, so estimation noise does not buy slower steps; ``k`` is at most
    ``max_nodes`` (None: n).
    """
    probs = np.asarray(probs, dtype=np.float64)
    table = cost(np.arange(len(probs) + extra_rows + 2)) if isinstance(cost, CostModel) else cost
    return K.choose(probs, table, extra_rows, float(extra_gain), float(margin),
                    len(probs) if max_nodes is None else max_nodes)


class Budget:
    """Per-step budget decisions of one decoding call, and what it learns from each verified step.

    One per call, with fresh acceptance estimates (one text's acceptance says little about the
    next one's). Node probabilities are the estimates times the call's :class:`CopyBelief` scale.
    The window's rows pay off in later steps (the n-grams they grow), so their worth is tracked as
    ``window_gain``: a running mean of window-made tokens accepted per step while the window runs;
    while the window is off it is re-tried every ``tuning.window_probe_every`` steps. A step that
    would verify no node although drafts exist verifies its most probable node every
    ``tuning.probe_every`` steps, so that estimates learned low can recover.

    The cost curve is fixed for the call unless ``refine`` is on (:class:`~lookahead.cost.CostRefiner`).
    """

    def __init__(self, cost: CostModel, tuning: BudgetTuning | None = None, refine: bool = False,
                 cost_rows: int = 1024):
        self.tuning = tuning = tuning or BudgetTuning()
        self.cost = cost
        self._table = cost(np.arange(cost_rows + 2))  # cost of every row count a step can have
        self.refiner = CostRefiner(cost, tuning.refine_weight, tuning.refine_relax) if refine else None
        self.acceptance = AcceptanceStats(len(ORIGINS), tuning)
        self.belief = CopyBelief(tuning)
        self.window_gain = tuning.window_gain_start
        self._since_window = 0
        self.prober = Prober(tuning.probe_every)
        self._planned: tuple[Draft, np.ndarray] | None = None  # the last plan's draft and its nodes' probabilities

    @property
    def drafting_can_pay(self) -> bool:
        """Whether any tree could be worth its cost on this curve: even if every drafted node were
        surely accepted, some ``k`` would have to beat a plain step by ``margin``. When not (a curve
        where one extra row costs as much as several tokens), proposing is skipped altogether.

        Example: ``t(1) = 1, t(2) = 3, t(k) = k + 1`` beyond: ``(1 + k) / t(1 + k)`` stays below 1.
        """
        return can_pay(self._table[1:], self.tuning.margin)

    def node_probabilities(self, draft: Draft, scaled: bool = True) -> np.ndarray:
        """float[n]: P(node accepted) for each node of ``draft``: the acceptance estimates, times the copy
        belief's scale when ``scaled`` (unscaled: the same order, for ranking nodes)."""
        probs = self.acceptance.node_probabilities(draft)
        return probs * self.belief.scale() if scaled else probs

    def probabilities_of(self, draft: Draft) -> np.ndarray:
        """:meth:`node_probabilities` of ``draft``, read from the last :meth:`plan` when ``draft`` is the draft it
        returned (a kept node's probability is its own and its kept ancestors', the same in the kept tree), so a
        batch that weighs its rows' planned drafts does not compute them twice."""
        planned = self._planned
        if planned is not None and planned[0] is draft:
            return planned[1]
        return self.node_probabilities(draft) if len(draft) else np.zeros(0)

    def plan(self, draft: Draft, max_nodes: int | None = None) -> Draft:
        """The part of ``draft`` worth verifying this step (nodes kept, window kept or dropped), at most
        ``max_nodes`` nodes (None: any number): the most probable ones, as :func:`choose_nodes` ranks them."""
        self.belief.step()
        n, window_rows = len(draft.tokens), draft.n_window_rows
        if not n and not window_rows:
            return draft
        probs = self.node_probabilities(draft) if n else np.zeros(0)
        margin = self.tuning.margin
        use_window = False
        if window_rows:  # the choice with the window's rows and without them, from one sort
            self._since_window += 1
            order, k, rate, k_w, rate_w = K.choose_with_window(probs, self._table, window_rows, float(self.window_gain),
                                                               float(margin), n if max_nodes is None else max_nodes)
            use_window = rate_w > rate or self._since_window >= self.tuning.window_probe_every
            if use_window:
                k, self._since_window = k_w, 0
            keep = np.sort(order[:k])
        else:
            keep, _ = choose_nodes(probs, self._table, margin=margin, max_nodes=max_nodes)
        if n and self.prober.due(bool(len(keep))):
            keep = np.argsort(-probs, kind="stable")[:1]  # the most probable node is a root child
        draft = draft.keep(keep)
        draft = draft if use_window else draft.without_window()
        self._planned = (draft, probs[keep])
        return draft

    def record(self, draft: Draft, accepted_nodes: Sequence[int], rows: int = 0, seconds: float = 0.0) -> None:
        """Learn from one verified step of ``draft`` (as verified); ``rows`` new tokens went through a
        forward of ``seconds`` (used only when refining the cost curve)."""
        if self.refiner is not None and rows:
            self.cost = self.refiner.observe(rows, seconds)
            self._table = self.cost(np.arange(len(self._table)))
        if len(draft):
            self.belief.update(*self.acceptance.update(draft, accepted_nodes))
        if draft.n_window_rows:
            origin = draft.origin
            window_accepted = sum(1 for j in accepted_nodes if origin[j] == WINDOW)
            keep = self.tuning.window_gain_keep
            self.window_gain = keep * self.window_gain + (1 - keep) * window_accepted
