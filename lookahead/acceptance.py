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

from . import kernels as K
from .tuning import BudgetTuning

MATCH_BUCKETS = 3
"""Match buckets: 1 context token matched (or none), 2, 3 or more."""
CONTEXTS = 2 * MATCH_BUCKETS
"""A node's context: its match bucket, alone (the first :data:`MATCH_BUCKETS`) or agreed (the rest: another source
drafted the same path, ``Draft.agreement``), each learned apart from the same prior."""


class AcceptanceStats:
    """Online estimates of ``c(origin, context, depth, rank)``: P(node accepted | parent accepted).

    ``context`` is the node's match bucket (:data:`MATCH_BUCKETS`), alone or agreed (:data:`CONTEXTS`). Each
    estimate is the cell's
    acceptance rate shrunk towards the same (origin, context, rank) pooled over all depths, itself
    shrunk towards a Beta prior per rank (``tuning.priors``) whose mean is scaled per context
    (``tuning.match_scale``, clipped to [0.02, 0.98]) at the same strength ``a + b``. At depth ``d`` the
    pooled estimate ``p`` is lifted to ``1 - (1 - p) * tuning.depth_lift ** (d - 1)`` first: a chain whose
    ancestors were accepted is likelier to go on. Counts decay by ``tuning.decay`` per update so the
    estimates follow the text as it changes.

    Example (no data yet, prior only, ``depth_lift`` 0.95): a chain of two only children after a 2-token
    match gets ``c = 2/3 * 0.9 = 0.6`` at depth 1 and ``1 - 0.4 * 0.95 = 0.62`` at depth 2, so node
    probabilities ``[0.6, 0.372]``; after a 1-token match ``c`` is 1/3 and ``1 - 2/3 * 0.95 = 0.367``:
    ``[0.333, 0.122]``.
    """

    def __init__(self, origins: int, tuning: BudgetTuning | None = None):
        t = tuning or BudgetTuning()
        self.tuning = t
        priors = list(t.priors) + [t.priors[-1]] * (t.rank_cells - len(t.priors))
        a = np.array([p[0] for p in priors[: t.rank_cells]])[None, :]  # [1, rank]
        b = np.array([p[1] for p in priors[: t.rank_cells]])[None, :]
        scale = np.asarray(t.match_scale * (CONTEXTS // MATCH_BUCKETS))[:, None]  # agreed: as alone, until learned
        mean = np.clip(a / (a + b) * scale, 0.02, 0.98)  # [context, rank]
        self.prior_a, self.prior_b = mean * (a + b), (1 - mean) * (a + b)
        shape = (origins, CONTEXTS, t.depth_cells, t.rank_cells)
        self.tried = np.zeros(shape)
        self.accepted = np.zeros(shape)
        self._tried_pool = np.zeros((origins, CONTEXTS, t.rank_cells))  # tried summed over depths
        self._accepted_pool = np.zeros((origins, CONTEXTS, t.rank_cells))

    def carried(self, trials: float) -> tuple[np.ndarray, ...]:
        """What a later call starts from: the counts (tried, accepted, and their pools), scaled so that no cell
        weighs more than ``trials`` trials (its rates kept), so that a text whose acceptance differs overrides
        them within a few steps. Example: a cell tried 30 times with 24 accepted, ``trials`` 4 -> 4 tried, 3.2
        accepted; a cell tried twice keeps its counts."""
        def cap(tried, accepted):
            scale = np.minimum(1.0, trials / np.maximum(tried, 1e-12))
            return tried * scale, accepted * scale

        tried, accepted = cap(self.tried, self.accepted)
        tried_pool, accepted_pool = cap(self._tried_pool, self._accepted_pool)
        return tried, accepted, tried_pool, accepted_pool

    def start_from(self, counts: tuple[np.ndarray, ...]) -> None:
        """Begin with :meth:`carried` counts of an earlier call instead of none (the priors stay beneath them)."""
        self.tried, self.accepted, self._tried_pool, self._accepted_pool = (np.array(c, dtype=np.float64)
                                                                            for c in counts)

    def node_probabilities(self, draft) -> np.ndarray:
        """float[n]: P(node accepted) for each node of a :class:`~lookahead.draft.Draft`, in its cells."""
        return K.node_probabilities(draft.parents, draft.origin, draft.match, draft.agreement, draft.depth,
                                    draft.rank, self.prior_a, self.prior_b, self.tried, self.accepted,
                                    self._tried_pool, self._accepted_pool, self.tuning.pool_weight,
                                    self.tuning.depth_lift)

    def update(self, draft, accepted_nodes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Record one verified draft: every node whose parent was accepted (or is the root) was tried.

        Returns (c float[t], accepted bool[t]) of the ``t`` tried nodes, ``c`` as estimated before this
        update (what :class:`CopyBelief` weighs the outcomes against)."""
        if not len(draft.tokens):
            return np.zeros(0), np.zeros(0, dtype=bool)
        return K.record(draft.parents, draft.origin, draft.match, draft.agreement, draft.depth, draft.rank,
                        np.asarray(accepted_nodes, dtype=np.int64), self.prior_a, self.prior_b, self.tried,
                        self.accepted, self._tried_pool, self._accepted_pool, self.tuning.pool_weight,
                        self.tuning.decay, self.tuning.depth_lift)


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
        total = K.belief_log_ratio(np.asarray(c, dtype=np.float64), np.asarray(accepted, dtype=np.bool_),
                                   float(self.off_scale))
        self.log_odds = min(max(self.log_odds + total, -self.limit), self.limit)
