"""`BudgetTuning`: every constant of the draft budget in one validated place, each with its reason.

The figures behind the defaults (replays of SmolLM2's recorded outputs on every benchmark
workload, before/after tables) are in ``benchmarks/results/budget-tuning.md``; this page says only
what each constant does.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BudgetTuning:
    """Constants of :class:`~lookahead.budget.Budget` and the estimates it owns.

    Acceptance estimates (:class:`~lookahead.acceptance.AcceptanceStats`):

    - ``priors``: Beta prior ``(a, b)`` per sibling rank (0 = only child, 1 = first of several,
      2+ = later siblings): an only child is the one continuation the store ever saw, so it starts
      likelier (2/3) than a first guess among several (1/3) or a later one (1/10).
    - ``match_scale``: the prior's mean is scaled per match bucket (1, 2, 3+ context tokens matched):
      a copy of a longer passage is likelier to continue than a guess after one common token.
    - ``depth_cells`` / ``rank_cells``: deeper nodes / later siblings share the last cell (few trials each).
    - ``pool_weight``: trials a (depth) cell's pooled-over-depths mean weighs as, so rare deep cells
      borrow from shallow ones.
    - ``depth_lift``: what a depth cell borrows is lifted towards 1, ``1 - (1 - pooled) * depth_lift **
      (depth - 1)``: a chain accepted this deep is likelier to go on than its first node was (recorded
      outputs accepted deep chain nodes 2-20x as often as the product of per-level estimates said);
      1 borrows the pooled mean as it is.
    - ``decay``: per-step decay of every count, so estimates follow a text as it changes.
    - ``carry_trials``: a call of a decoder starts from the estimates its previous call ended with, each cell
      weighing at most this many trials (0: every call starts from the priors alone). Only the budget's
      choices depend on them, never a verdict: output stays exactly plain ``generate``'s.

    Copy belief (:class:`~lookahead.acceptance.CopyBelief`), one per call, coupling all cells:

    - ``belief_prior``: P(copying) at the start and the level it relaxes to.
    - ``belief_off_scale``: acceptance under "not copying", as a fraction of the estimate.
    - ``belief_relax``: per-step relaxation of the log-odds towards the prior, so a text that stops
      copying is tried again after a few steps.
    - ``belief_limit``: bound of the log-odds, so no run of outcomes makes the belief unmovable.

    Choice (:func:`~lookahead.budget.choose_nodes`, :class:`~lookahead.budget.Budget`):

    - ``margin``: a drafted step must beat a plain one by this factor in expected tokens per second,
      so estimation noise does not buy slower steps.
    - ``probe_every``: a step that would verify nothing although drafts exist verifies its most
      probable node every this many steps, so estimates learned low can recover (a failed probe
      costs a fraction of a step, hence a long interval).
    - ``window_probe_every``: while the window is off, it is re-tried every this many steps.
    - ``window_gain_start`` / ``window_gain_keep``: the window's worth (window-made tokens accepted per
      step while it runs) starts optimistic, then is a running mean keeping this fraction per step.

    Cost refinement (:class:`~lookahead.cost.CostRefiner`, only with ``LookaheadConfig.refine_cost``):

    - ``refine_weight``: weight of one measured step in the running means.
    - ``refine_relax``: per-observation pull of an unobserved point's correction back towards 1.
    """

    priors: tuple[tuple[float, float], ...] = ((1.0, 0.5), (0.5, 1.0), (0.15, 1.35))
    match_scale: tuple[float, float, float] = (0.5, 0.9, 1.3)
    depth_cells: int = 8
    rank_cells: int = 4
    pool_weight: float = 2.0
    depth_lift: float = 0.95
    decay: float = 0.97
    carry_trials: float = 0.0
    belief_prior: float = 0.9
    belief_off_scale: float = 0.3
    belief_relax: float = 0.9
    belief_limit: float = 6.0
    margin: float = 1.05
    probe_every: int = 64
    window_probe_every: int = 16
    window_gain_start: float = 1.0
    window_gain_keep: float = 0.9
    refine_weight: float = 0.2
    refine_relax: float = 0.98

    def __post_init__(self) -> None:
        def bad(name, why):
            return ValueError(f"BudgetTuning.{name}={getattr(self, name)!r} is invalid: {why}")

        if not self.priors or any(len(p) != 2 or p[0] <= 0 or p[1] <= 0 for p in self.priors):
            raise bad("priors", "needs one (a > 0, b > 0) pair per rank")
        if len(self.match_scale) != 3 or any(s <= 0 for s in self.match_scale):
            raise bad("match_scale", "needs three positive factors (match 1, 2, 3+)")
        for name in ("depth_cells", "rank_cells", "probe_every", "window_probe_every"):
            if getattr(self, name) < 1:
                raise bad(name, "must be >= 1")
        for name in ("decay", "belief_relax", "window_gain_keep", "refine_relax"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise bad(name, "must be in [0, 1]")
        for name in ("belief_prior", "belief_off_scale"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise bad(name, "must be in (0, 1)")
        if not 0.0 < self.depth_lift <= 1.0:
            raise bad("depth_lift", "must be in (0, 1]")
        if not 0.0 < self.refine_weight <= 1.0:
            raise bad("refine_weight", "must be in (0, 1]")
        for name in ("pool_weight", "belief_limit", "margin", "window_gain_start", "carry_trials"):
            if getattr(self, name) < 0:
                raise bad(name, "must be >= 0")

