"""How likely a drafted node is to be accepted: online estimates per cell, and the call's copy belief.

- :class:`AcceptanceStats`: ``c(origin, match, depth, rank)``, the probability that a drafted node
  is accepted given that its parent was. ``rank``: 0 for an only child, else 1 + its place among
  its siblings, so a unique continuation is told from a guess among several; ``match``: how many
  context tokens the source matched (bucketed 1, 2, 3+), which tells a copy of a longer passage
  from a guess after one common token. A node's acceptance probability is the product of ``c``
  along its path.
- :class:`CopyBelief`: one number per call, P(the text is copying right now), that scales every
  estimate, so that one rejected long-match tree lowers them all for a few steps.

Constants come from :class:`~lookahead.tuning.BudgetTuning`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .tuning import BudgetTuning

MATCH_BUCKETS = 3


def match_bucket(match) -> np.ndarray:
    """Context cell of each node from its match length: 0 for 1 token (or none), 1 for 2, 2 for 3 or more."""
    return np.clip(np.asarray(match, dtype=np.int64), 1, MATCH_BUCKETS) - 1


def tried_nodes(parents: np.ndarray, accepted_nodes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(accepted, tried): bool[n] each. A node was *tried* when its parent was accepted or is the root.

    Example: parents ``[-1, -1, 0, 2]``, accepted ``[0]`` -> accepted ``[T, F, F, F]``,
    tried ``[T, T, T, F]`` (node 3's parent, node 2, was rejected: node 3 was never compared).
    """
    parents = np.asarray(parents, dtype=np.int64)
    ok = np.zeros(len(parents), dtype=bool)
    ok[list(accepted_nodes)] = True
    return ok, np.where(parents >= 0, ok[np.maximum(parents, 0)], True)


def path_products(c: np.ndarray, parents: np.ndarray) -> np.ndarray:
    """float[n]: for a breadth-first tree, the product of ``c`` from the root down to each node.

    Example: c ``[0.5, 0.4, 0.8]``, parents ``[-1, -1, 0]`` -> ``[0.5, 0.4, 0.4]``.
    """
    prob = c.tolist()
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            prob[i] *= prob[p]
    return np.asarray(prob)


class AcceptanceStats:
    """Online estimates of ``c(origin, context, depth, rank)``: P(node accepted | parent accepted).

    ``context`` is the node's match bucket (:func:`match_bucket`). Each estimate is the cell's
    acceptance rate shrunk towards the same (origin, context, rank) pooled over all depths, itself
    shrunk towards a Beta prior per rank (``tuning.priors``) whose mean is scaled per context
    (``tuning.match_scale``, clipped to [0.02, 0.98]) at the same strength ``a + b``. Counts decay by
    ``tuning.decay`` per update so the estimates follow the text as it changes.

    Example (no data yet, prior only): a chain of two only children after a 2-token match gets
    ``c = 2/3 * 0.9 = 0.6`` per level, so node probabilities ``[0.6, 0.36]``; after a 1-token match
    ``[1/3, 1/9]``.
    """

    def __init__(self, origins: int, tuning: BudgetTuning | None = None):
        t = tuning or BudgetTuning()
        self.tuning = t
        self.max_depth, self.max_rank = t.depth_cells, t.rank_cells
        priors = list(t.priors) + [t.priors[-1]] * (t.rank_cells - len(t.priors))
        a = np.array([p[0] for p in priors[: t.rank_cells]])[None, :]  # [1, rank]
        b = np.array([p[1] for p in priors[: t.rank_cells]])[None, :]
        mean = np.clip(a / (a + b) * np.asarray(t.match_scale)[:, None], 0.02, 0.98)  # [context, rank]
        self.prior_a, self.prior_b = mean * (a + b), (1 - mean) * (a + b)
        shape = (origins, MATCH_BUCKETS, t.depth_cells, t.rank_cells)
        self.tried = np.zeros(shape)
        self.accepted = np.zeros(shape)
        self._tried_pool = np.zeros((origins, MATCH_BUCKETS, t.rank_cells))  # tried summed over depths
        self._accepted_pool = np.zeros((origins, MATCH_BUCKETS, t.rank_cells))

    def _cells(self, origin, context, depth, rank):
        origin = np.asarray(origin, dtype=np.int64)
        return (origin, np.broadcast_to(np.asarray(context, dtype=np.int64), origin.shape),
                np.minimum(np.asarray(depth) - 1, self.max_depth - 1), np.minimum(np.asarray(rank), self.max_rank - 1))

    def conditional(self, origin, context, depth, rank) -> np.ndarray:
        """``c`` per node (arrays of equal length): the cell shrunk towards its pooled mean, shrunk
        towards the (context, rank) prior."""
        o, ctx, d, r = self._cells(origin, context, depth, rank)
        a, b = self.prior_a[ctx, r], self.prior_b[ctx, r]
        pooled = (self._accepted_pool[o, ctx, r] + a) / (self._tried_pool[o, ctx, r] + a + b)
        w = self.tuning.pool_weight
        return (self.accepted[o, ctx, d, r] + w * pooled) / (self.tried[o, ctx, d, r] + w)

    def node_probabilities(self, draft) -> np.ndarray:
        """float[n]: P(node accepted) for each node of a :class:`~lookahead.draft.Draft`, in its cells."""
        c = self.conditional(draft.origin, match_bucket(draft.match), draft.depth, draft.rank)
        return path_products(c, draft.parents)

    def update(self, draft, accepted_nodes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Record one verified draft: every node whose parent was accepted (or is the root) was tried.

        Returns (c float[t], accepted bool[t]) of the ``t`` tried nodes, ``c`` as estimated before this
        update (what :class:`CopyBelief` weighs the outcomes against)."""
        if not len(draft.tokens):
            return np.zeros(0), np.zeros(0, dtype=bool)
        ok, parent_ok = tried_nodes(draft.parents, accepted_nodes)
        tried = (draft.origin[parent_ok], match_bucket(draft.match)[parent_ok], draft.depth[parent_ok],
                 draft.rank[parent_ok])
        c = self.conditional(*tried)
        for arr in (self.tried, self.accepted, self._tried_pool, self._accepted_pool):
            arr *= self.tuning.decay
        o, ctx, d, r = self._cells(*tried)
        hit = ok[parent_ok].astype(np.float64)
        np.add.at(self.tried, (o, ctx, d, r), 1.0)
        np.add.at(self.accepted, (o, ctx, d, r), hit)
        np.add.at(self._tried_pool, (o, ctx, r), 1.0)
        np.add.at(self._accepted_pool, (o, ctx, r), hit)
        return c, ok[parent_ok]


class CopyBelief:
    """How much to trust the acceptance estimates right now: P(the text is copying).

    Whether drafts get accepted depends on the text more than on anything the estimates condition
    on: an answer that quotes its prompt's code accepts most drafts after a three-token match, a
    chat reply that never repeats accepts none, and one :class:`AcceptanceStats` cell learns that
    only from its own trials. This belief couples the cells. Two hypotheses: *copying*, drafts are
    accepted at the estimated rates ``c``; *not copying*, at ``off_scale * c``. Each verified node is
    a Bernoulli trial whose log-likelihood ratio moves the log-odds (clipped to ``±limit``); every
    step the log-odds relax towards the prior's by the factor ``relax``. Node probabilities are
    scaled by ``scale() = belief + (1 - belief) * off_scale``.

    Worked example (prior 0.9, off_scale 0.3, relax 0.9): a rejected only child with ``c = 0.87``
    adds ``log((1 - 0.87) / (1 - 0.3 * 0.87)) = -1.74`` to the prior's log-odds 2.20: belief 0.61,
    scale 0.73; at the next step the log-odds relax to ``2.20 - 0.9 * 1.74 = 0.63``, scale 0.76.
    An accepted node adds ``log(1 / 0.3) = +1.20``.
    """

    def __init__(self, tuning: BudgetTuning | None = None):
        t = tuning or BudgetTuning()
        self.off_scale, self.relax, self.limit = t.belief_off_scale, t.belief_relax, t.belief_limit
        self.prior_log_odds = float(np.log(t.belief_prior / (1 - t.belief_prior)))
        self.log_odds = self.prior_log_odds

    @property
    def belief(self) -> float:
        return float(1.0 / (1.0 + np.exp(-self.log_odds)))

    def scale(self) -> float:
        """The factor on every node's acceptance probability: 1 when surely copying, ``off_scale`` when surely not."""
        b = self.belief
        return b + (1.0 - b) * self.off_scale

    def step(self) -> None:
        """One decoding step passed: the log-odds relax towards the prior's."""
        self.log_odds = self.prior_log_odds + (self.log_odds - self.prior_log_odds) * self.relax

    def update(self, c: np.ndarray, accepted: np.ndarray) -> None:
        """Learn from tried nodes: ``c`` float[t], their estimated conditional acceptance; ``accepted`` bool[t]."""
        c = np.clip(np.asarray(c, dtype=np.float64), 1e-6, 1 - 1e-6)
        ratio = np.where(np.asarray(accepted, dtype=bool), 1.0 / self.off_scale,
                         (1.0 - c) / (1.0 - self.off_scale * c))
        self.log_odds = float(np.clip(self.log_odds + np.log(ratio).sum(), -self.limit, self.limit))
