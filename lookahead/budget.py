"""The draft budget: which draft nodes a step verifies, and whether the window's rows run.

Each step keeps the ``k`` most probable nodes (a prefix that is always a tree) maximising expected tokens per second,
``(1 + sum of their probabilities) / t(1 + k + m)``, with ``t`` the cost curve (``cost.py``), node probabilities from
:class:`AcceptanceStats` times the call's :class:`CopyBelief`, and ``m`` the window's rows; ``k = 0`` is a plain step. A
batch chooses one width for all its rows (``batch.choose_width``).

Worked example: probabilities ``[0.9, 0.8, 0.1]``, ``t(1)=1, t(2)=1.1, t(3)=1.2, t(4)=2``: ``k=0`` gives 1.0 tokens per
unit, ``k=1`` 1.9/1.1 = 1.73, ``k=2`` 2.7/1.2 = 2.25, ``k=3`` 2.8/2 = 1.4: verify the two likeliest.

A node's *cell* is (origin, context, depth, rank): ``context`` its match bucket (1, 2, 3+), alone or agreed (another
source drafted the same path); ``rank`` 0 for an only child, else 1 + its place among its siblings. ``c(cell)``
estimates P(node accepted | parent accepted); a node's probability is the product down its path.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from ._tuning import DEFAULT, Tuning
from .cost import CostModel
from .drafting.draft import ORIGINS, WINDOW, Draft

MATCH_BUCKETS = 3
CONTEXTS = 2 * MATCH_BUCKETS  # a match bucket alone, or agreed


@njit(cache=True)
def belief_log_ratio(c, accepted, off_scale):
    """:class:`CopyBelief`'s log-likelihood ratio of tried nodes with estimates ``c`` float64[t] (clipped to
    [1e-6, 1 - 1e-6]) and outcomes ``accepted`` bool[t]: ``log(1 / off_scale)`` per accepted node,
    ``log((1 - c) / (1 - off_scale * c))`` per rejected one."""
    total = 0.0
    for i in range(c.shape[0]):
        if accepted[i]:
            total += np.log(1.0 / off_scale)
        else:
            x = min(max(c[i], 1e-6), 1 - 1e-6)
            total += np.log((1.0 - x) / (1.0 - off_scale * x))
    return total


@njit(cache=True)
def _conditional(o, ctx, d, r, prior_a, prior_b, tried, accepted, tried_pool, accepted_pool, pool_weight, depth_lift):
    a = prior_a[ctx, r]
    b = prior_b[ctx, r]
    pooled = (accepted_pool[o, ctx, r] + a) / (tried_pool[o, ctx, r] + a + b)
    pooled = 1.0 - (1.0 - pooled) * depth_lift ** d  # the depth cell's target: deeper, likelier to go on
    return (accepted[o, ctx, d, r] + pool_weight * pooled) / (tried[o, ctx, d, r] + pool_weight)


@njit(cache=True)
def _cell(match, agreement, depth, rank, n_ctx, max_depth, max_rank):
    """A node's (context, depth, rank) cells; an agreed node's context is in the second half."""
    buckets = n_ctx // 2
    ctx = min(max(match, 1), buckets) - 1 + (buckets if agreement > 0 else 0)
    return ctx, min(depth - 1, max_depth - 1), min(rank, max_rank - 1)


@njit(cache=True)
def node_probabilities(parents, origin, match, agreement, depth, rank, prior_a, prior_b, tried, accepted, tried_pool,
                       accepted_pool, pool_weight, depth_lift):
    """float64[n]: P(node accepted), the product of the conditional estimates ``c`` down its path (see
    :class:`AcceptanceStats`). ``agreement``: per node, how many other sources drafted it; ``tried`` / ``accepted``:
    float64[origins, contexts, depths, ranks] counts; ``*_pool``: the same summed over depths; ``prior_a`` /
    ``prior_b``: float64[contexts, ranks]. Example (priors only): two only children whose ``c`` is 0.6 ->
    ``[0.6, 0.36]``; with ``depth_lift`` 0.5 the second ``c`` is ``1 - 0.4 * 0.5 = 0.8`` -> ``[0.6, 0.48]``."""
    n_ctx, max_depth, max_rank = tried.shape[1], tried.shape[2], tried.shape[3]
    prob = np.empty(len(parents))
    for i in range(len(parents)):
        ctx, d, r = _cell(match[i], agreement[i], depth[i], rank[i], n_ctx, max_depth, max_rank)
        c = _conditional(origin[i], ctx, d, r, prior_a, prior_b, tried, accepted, tried_pool, accepted_pool,
                         pool_weight, depth_lift)
        prob[i] = c * prob[parents[i]] if parents[i] >= 0 else c
    return prob


@njit(cache=True)
def record(parents, origin, match, agreement, depth, rank, accepted_nodes, prior_a, prior_b, tried, accepted,
           tried_pool, accepted_pool, pool_weight, decay, depth_lift):
    """Learn one verified tree in place: a node whose parent was accepted (or is the root) was *tried*; counts decay by
    ``decay`` first. Returns (c float64[t], hit bool[t]) of the ``t`` tried nodes in index order, ``c`` as estimated
    before. Example: parents ``[-1, -1, 0, 2]``, accepted ``[0]``: nodes 0, 1, 2 were tried, node 0 hit."""
    n = len(parents)
    ok = np.zeros(n, np.bool_)
    for j in accepted_nodes:
        ok[j] = True
    n_ctx, max_depth, max_rank = tried.shape[1], tried.shape[2], tried.shape[3]
    c = np.empty(n)
    hit = np.empty(n, np.bool_)
    t = 0
    for i in range(n):
        if parents[i] < 0 or ok[parents[i]]:
            ctx, d, r = _cell(match[i], agreement[i], depth[i], rank[i], n_ctx, max_depth, max_rank)
            c[t] = _conditional(origin[i], ctx, d, r, prior_a, prior_b, tried, accepted, tried_pool,
                                accepted_pool, pool_weight, depth_lift)
            hit[t] = ok[i]
            t += 1
    tried *= decay
    accepted *= decay
    tried_pool *= decay
    accepted_pool *= decay
    for i in range(n):
        if parents[i] < 0 or ok[parents[i]]:
            ctx, d, r = _cell(match[i], agreement[i], depth[i], rank[i], n_ctx, max_depth, max_rank)
            o = origin[i]
            tried[o, ctx, d, r] += 1.0
            tried_pool[o, ctx, r] += 1.0
            if ok[i]:
                accepted[o, ctx, d, r] += 1.0
                accepted_pool[o, ctx, r] += 1.0
    return c[:t], hit[:t]


@njit(cache=True)
def choose(probs, cost_table, extra_rows, extra_gain, margin, max_k):
    """(node indices int64[k], sorted; expected tokens per second): the best prefix by probability (stable, so parents
    before children), at most ``max_k`` long, maximising ``(1 + extra_gain + sum of chosen probs) /
    cost_table[1 + extra_rows + k]``; ``k > 0`` must beat ``k = 0`` by the factor ``margin`` (the module's example)."""
    order = np.argsort(-probs, kind="mergesort")  # stable
    k, rate = _best_prefix(probs, order, cost_table, extra_rows, extra_gain, margin, max_k)
    return np.sort(order[:k]), rate


@njit(cache=True)
def choose_with_window(probs, cost_table, window_rows, window_gain, margin, max_k):
    """:func:`choose` without and with the window (``window_rows`` more rows, ``window_gain`` more expected tokens),
    from one sort: (order int64[n] of the nodes by probability; k, rate without the window; k, rate with it). The
    caller keeps ``np.sort(order[:k])`` of its choice."""
    order = np.argsort(-probs, kind="mergesort")  # stable
    k, rate = _best_prefix(probs, order, cost_table, 0, 0.0, margin, max_k)
    k_w, rate_w = _best_prefix(probs, order, cost_table, window_rows, window_gain, margin, max_k)
    return order, k, rate, k_w, rate_w


@njit(cache=True)
def _best_prefix(probs, order, cost_table, extra_rows, extra_gain, margin, max_k):
    """(k, rate): :func:`choose`'s best prefix length of ``order`` and its rate."""
    base = 1.0 + extra_gain
    total, plain = 0.0, base / cost_table[1 + extra_rows]
    best_k, best_rate = 0, plain
    for k in range(1, min(len(probs), max_k) + 1):
        total += probs[order[k - 1]]
        rate = (base + total) / cost_table[1 + extra_rows + k]
        if rate > best_rate:
            best_k, best_rate = k, rate
    if best_rate < margin * plain:
        return 0, plain
    return best_k, best_rate


class AcceptanceStats:
    """Online estimates of ``c(origin, context, depth, rank)``: the cell's rate shrunk towards its (origin, context,
    rank) pooled over depths, itself shrunk towards a Beta prior per rank (``priors``) whose mean is scaled per match
    bucket (``match_scale``, clipped to [0.02, 0.98]). At depth ``d`` the pooled ``p`` is lifted to
    ``1 - (1 - p) * depth_lift ** (d - 1)``. Counts decay by ``decay`` per update."""

    def __init__(self, origins: int, tuning: Tuning = DEFAULT):
        t = self.tuning = tuning
        priors = (list(t.priors) + [t.priors[-1]] * t.rank_cells)[: t.rank_cells]  # the last one for later ranks
        a, b = np.array(priors, dtype=np.float64).T[:, None, :]
        scale = np.asarray(t.match_scale * (CONTEXTS // MATCH_BUCKETS))[:, None]
        mean = np.clip(a / (a + b) * scale, 0.02, 0.98)  # [context, rank]
        self.prior_a, self.prior_b = mean * (a + b), (1 - mean) * (a + b)
        shape = (origins, CONTEXTS, t.depth_cells, t.rank_cells)
        self.tried, self.accepted = np.zeros(shape), np.zeros(shape)
        self._tried_pool = np.zeros((origins, CONTEXTS, t.rank_cells))
        self._accepted_pool = np.zeros((origins, CONTEXTS, t.rank_cells))

    def node_probabilities(self, draft) -> np.ndarray:
        """float[n]: P(node accepted) for each node of ``draft``."""
        return node_probabilities(draft.parents, draft.origin, draft.match, draft.agreement, draft.depth,
                                  draft.rank, self.prior_a, self.prior_b, self.tried, self.accepted,
                                  self._tried_pool, self._accepted_pool, self.tuning.pool_weight,
                                  self.tuning.depth_lift)

    def update(self, draft, accepted_nodes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Record one verified draft; (c float[t], accepted bool[t]) of the tried nodes, ``c`` as before."""
        if not len(draft.tokens):
            return np.zeros(0), np.zeros(0, dtype=bool)
        t = self.tuning
        return record(draft.parents, draft.origin, draft.match, draft.agreement, draft.depth, draft.rank,
                      np.asarray(accepted_nodes, dtype=np.int64), self.prior_a, self.prior_b, self.tried,
                      self.accepted, self._tried_pool, self._accepted_pool, t.pool_weight, t.decay, t.depth_lift)


class CopyBelief:
    """P(the text is copying right now): one number per call scaling every estimate, so one rejected long-match tree
    lowers them all for a few steps. Copying accepts at ``c``, not copying at ``off_scale * c``; each tried node's
    log-likelihood ratio (:func:`belief_log_ratio`) moves the log-odds (clipped to ``+-limit``), which relax towards
    the prior's by ``relax`` per step. Scale: ``belief + (1 - belief) * off_scale``. Example (prior 0.9, off_scale
    0.3): a rejected only child with ``c = 0.87`` adds ``log(0.13 / 0.739) = -1.74`` to the prior's 2.20: belief 0.61,
    scale 0.73."""

    def __init__(self, tuning: Tuning = DEFAULT):
        self.off_scale, self.relax, self.limit = tuning.belief_off_scale, tuning.belief_relax, tuning.belief_limit
        self.prior_log_odds = float(np.log(tuning.belief_prior / (1 - tuning.belief_prior)))
        self.log_odds = self.prior_log_odds

    @property
    def belief(self) -> float:
        return float(1.0 / (1.0 + np.exp(-self.log_odds)))

    def scale(self) -> float:
        b = self.belief
        return b + (1.0 - b) * self.off_scale

    def step(self) -> None:
        self.log_odds = self.prior_log_odds + (self.log_odds - self.prior_log_odds) * self.relax

    def update(self, c: np.ndarray, accepted: np.ndarray) -> None:
        total = belief_log_ratio(np.asarray(c, dtype=np.float64), np.asarray(accepted, dtype=np.bool_),
                                 float(self.off_scale))
        self.log_odds = min(max(self.log_odds + total, -self.limit), self.limit)


def can_pay(costs: np.ndarray, margin: float) -> bool:
    """Whether drafting could ever beat a plain step on ``costs`` (float[K + 1], ``costs[0]`` the plain step's) were
    every node accepted. Example: costs ``[1, 3, 4, 5]`` -> False."""
    k = np.arange(1, len(costs))
    return bool(np.any((1 + k) * costs[0] >= margin * np.asarray(costs)[1:]))


class Prober:
    """:meth:`due` is True every ``every``-th step that drafted nothing though drafts existed: verify one node, so low
    estimates can recover."""

    def __init__(self, every: int):
        self.every, self.idle = every, 0

    def due(self, drafted: bool) -> bool:
        self.idle = 0 if drafted else self.idle + 1
        due = self.idle >= self.every
        if due:
            self.idle = 0
        return due


def choose_nodes(probs: np.ndarray, cost, extra_rows: int = 0, extra_gain: float = 0.0, margin: float = DEFAULT.margin,
                 max_nodes: int | None = None) -> tuple[np.ndarray, float]:
    """:func:`choose` on ``cost``, a curve or its table: (nodes worth verifying, sorted; tokens per second)."""
    probs = np.asarray(probs, dtype=np.float64)
    table = cost(np.arange(len(probs) + extra_rows + 2)) if isinstance(cost, CostModel) else cost
    return choose(probs, table, extra_rows, float(extra_gain), float(margin),
                  len(probs) if max_nodes is None else max_nodes)


class Budget:
    """One row's per-step choices and what it learns from each verified step: the acceptance estimates (fresh per call),
    the copy belief, the window's worth (a running mean of window-made
    tokens accepted per step, re-tried every ``window_probe_every`` steps while off) and a prober. ``learner``: a
    ``learned.LearnedCurve`` that each step's time teaches (None: ``cost`` is fixed for the call)."""

    def __init__(self, cost: CostModel, tuning: Tuning = DEFAULT, cost_rows: int = 1024, learner=None):
        self.tuning = tuning
        self.cost = cost if learner is None else learner.curve()
        self._table = self.cost(np.arange(cost_rows + 2))
        self.learner = learner
        self.acceptance = AcceptanceStats(len(ORIGINS), tuning)
        self.belief = CopyBelief(tuning)
        self.window_gain = tuning.window_gain_start
        self._since_window = 0
        self.prober = Prober(tuning.probe_every)
        self._planned: tuple[Draft, np.ndarray] | None = None

    @property
    def drafting_can_pay(self) -> bool:
        return can_pay(self._table[1:], self.tuning.margin)

    def node_probabilities(self, draft: Draft) -> np.ndarray:
        return self.acceptance.node_probabilities(draft) * self.belief.scale()

    def probabilities_of(self, draft: Draft) -> np.ndarray:
        """:meth:`node_probabilities` of ``draft``, from the last :meth:`plan` when it returned ``draft``."""
        planned = self._planned
        if planned is not None and planned[0] is draft:
            return planned[1]
        return self.node_probabilities(draft) if len(draft) else np.zeros(0)

    def plan(self, draft: Draft, max_nodes: int | None = None) -> Draft:
        """The part of ``draft`` worth verifying this step (at most ``max_nodes`` nodes, the likeliest)."""
        self.belief.step()
        n, window_rows = len(draft.tokens), draft.n_window_rows
        if not n and not window_rows:
            return draft
        probs = self.node_probabilities(draft) if n else np.zeros(0)
        margin = self.tuning.margin
        use_window = False
        if window_rows:  # with the window's rows and without them, from one sort
            self._since_window += 1
            order, k, rate, k_w, rate_w = choose_with_window(probs, self._table, window_rows, float(self.window_gain),
                                                             float(margin), n if max_nodes is None else max_nodes)
            use_window = rate_w > rate or self._since_window >= self.tuning.window_probe_every
            if use_window:
                k, self._since_window = k_w, 0
            keep = np.sort(order[:k])
        else:
            keep, _ = choose_nodes(probs, self._table, margin=margin, max_nodes=max_nodes)
        if n and self.prober.due(bool(len(keep))):
            keep = np.argsort(-probs, kind="stable")[:1]
        draft = draft.keep(keep)
        draft = draft if use_window else draft.without_window()
        self._planned = (draft, probs[keep])
        return draft

    def record(self, draft: Draft, accepted_nodes: Sequence[int], rows: int = 0, seconds: float = 0.0) -> None:
        """Learn from one verified step of ``draft``; ``rows`` new tokens took ``seconds`` (used by a learner)."""
        if self.learner is not None and rows and self.learner.observe(rows, seconds):
            self.cost = self.learner.curve()
            self._table = self.cost(np.arange(len(self._table)))
        if len(draft):
            self.belief.update(*self.acceptance.update(draft, accepted_nodes))
        if draft.n_window_rows:
            window_accepted = sum(1 for j in accepted_nodes if draft.origin[j] == WINDOW)
            keep = self.tuning.window_gain_keep
            self.window_gain = keep * self.window_gain + (1 - keep) * window_accepted
