"""Hardware-aware draft budget: how many draft nodes to verify, and whether to run the window.

Verifying k extra tokens is nearly free on a datacenter GPU and costs real time on a CPU, so the
right budget depends on the hardware. Three pieces:

- :class:`CostModel`: seconds of one forward as a function of the number of new tokens ``k``,
  measured once per (model, device, dtype) in the process by :func:`calibrate` (a few forwards
  over a short context), or supplied by ``LookaheadConfig.cost_curve``.
- :class:`AcceptanceStats`: online estimates of ``c(origin, match, depth, rank)``, the probability
  that a drafted node is accepted given that its parent was (``rank``: 0 for an only child,
  else 1 + its place among its siblings, so a unique continuation is told from a guess among
  several; ``match``: how many context tokens the store matched, 1, 2 or 3+, which tells a copy of
  a longer passage from a guess after one common token). A node's acceptance probability is the
  product of ``c`` along its path.
- :func:`choose_nodes`: each step, keep the ``k`` most probable nodes (a prefix that is always a
  tree) maximising expected tokens per second, ``(1 + sum of their probabilities) / t(1 + k + m)``,
  with ``m`` the window's rows; ``k = 0`` is a plain one-token step.

Worked example: node probabilities ``[0.9, 0.8, 0.1]``, cost ``t(1)=1, t(2)=1.1, t(3)=1.2, t(4)=2``:
``k=0`` gives 1/1 = 1.0 tokens per unit, ``k=1`` 1.9/1.1 = 1.73, ``k=2`` 2.7/1.2 = 2.25, ``k=3``
2.8/2 = 1.4: verify the two most probable nodes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from .tree import tree_depth_rank

_CURVES: dict[tuple, CostModel] = {}


def calibration_sizes(max_rows: int) -> tuple[int, ...]:
    """Powers of two from 1 up to the first >= ``max_rows`` (and >= 16): the ``k`` a calibration times.

    Example: ``calibration_sizes(17)`` -> ``(1, 2, 4, 8, 16, 32)``; beyond the last point the curve
    extrapolates linearly.
    """
    sizes = [1]
    while sizes[-1] < max(max_rows, 16):
        sizes.append(2 * sizes[-1])
    return tuple(sizes)


class CostModel:
    """Forward time as a piecewise-linear function of the number of new tokens ``k``.

    Built from measured points ``[(k, seconds), ...]``; beyond the last point it extrapolates
    linearly with the slope of the last segment (never decreasing).
    """

    def __init__(self, points: Sequence[tuple[int, float]], learn: bool = False):
        pts = sorted((int(k), float(t)) for k, t in points)
        if not pts or pts[0][0] < 1 or any(t <= 0 for _, t in pts):
            raise ValueError(f"cost curve needs points (k >= 1, seconds > 0); got {points!r}")
        self._ks = np.array([k for k, _ in pts], dtype=np.float64)
        self._raw = np.array([t for _, t in pts], dtype=np.float64)
        self.learn = learn
        self._refresh()

    def _refresh(self) -> None:
        self._ts = np.maximum.accumulate(self._raw)  # monotone in k
        self.points = tuple(zip(self._ks.astype(int).tolist(), self._ts.tolist()))

    def copy(self) -> CostModel:
        """An independent curve with the same points and ``learn`` setting."""
        return CostModel(self.points, learn=self.learn)

    def observe(self, k: int, seconds: float, weight: float = 0.2) -> None:
        """Fold a measured forward of ``k`` new tokens into the curve (when ``learn`` is on).

        The point nearest to ``k`` (in log scale) moves towards the measurement, scaled by the curve's
        own shape between points, so that a calibration disturbed by a busy machine heals as
        decoding runs. Explicitly supplied curves do not learn. A decoding call learns on its own copy
        of the process's calibrated curve (:class:`Budget` makes it), so that one noisy forward cannot
        bend the curve for every later call: with one curve shared by a whole benchmark run, a few
        slow two-token forwards had raised t(2)/t(1) from 1.7 to 2.4 and the decoder stopped drafting
        on a prompt where it otherwise accepted 2.2 tokens per call.
        """
        if not self.learn or k < 1 or seconds <= 0:
            return
        i = int(np.argmin(np.abs(np.log(self._ks) - np.log(k))))
        predicted = float(self(k))
        target = self._raw[i] * seconds / predicted if predicted > 0 else seconds
        self._raw[i] = (1 - weight) * self._raw[i] + weight * target
        self._refresh()

    def __call__(self, k: int | np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        t = np.interp(k, self._ks, self._ts)
        if len(self._ks) >= 2:
            slope = max((self._ts[-1] - self._ts[-2]) / (self._ks[-1] - self._ks[-2]), 0.0)
            t = np.where(k > self._ks[-1], self._ts[-1] + slope * (k - self._ks[-1]), t)
        return t

    def __repr__(self) -> str:
        return "CostModel(" + ", ".join(f"{k}: {t * 1e3:.1f} ms" for k, t in self.points) + ")"


def _model_key(model) -> tuple:
    cfg = model.config
    return (type(model).__name__, getattr(cfg, "name_or_path", ""), getattr(cfg, "hidden_size", None),
            getattr(cfg, "num_hidden_layers", None), getattr(cfg, "vocab_size", None), str(model.device),
            str(model.dtype))


def calibrate(model, cache_factory, forward_kwargs_name: str = "cache", keeps_logits: bool = True, context: int = 128,
              sizes: Sequence[int] | None = None, repeats: int = 2, max_rows: int = 64) -> CostModel:
    """Measure the forward time for each ``k`` in ``sizes`` (default: :func:`calibration_sizes` of
    ``max_rows``, the most new tokens a step of the caller can feed) after a ``context``-token
    prefill; each ``k`` keeps the fastest of ``repeats`` runs.

    Runs once per (model, device, dtype) in the process; later calls return the kept curve, unless a
    caller needs more rows than it covers (then the bigger sizes are measured and the curve replaced).
    About 3 s for SmolLM2-135M on one core of this 2-core CPU (sizes up to 32, two repeats).
    """
    sizes = tuple(sizes) if sizes is not None else calibration_sizes(max_rows)
    key = _model_key(model)
    if key in _CURVES and _CURVES[key].points[-1][0] >= max(sizes):
        return _CURVES[key]
    device = model.device
    vocab = model.config.vocab_size
    limit = getattr(model.config, "max_position_embeddings", None) or 4096
    context = max(1, min(context, limit - max(sizes) - 1))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, context + max(sizes)), generator=gen).to(device)
    cache = cache_factory()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        model(input_ids=ids[:, :context], use_cache=True, **{forward_kwargs_name: cache})
        best = {}
        for _ in range(repeats):
            for k in sizes:
                pos = torch.arange(context, context + k, device=device)[None]
                sync()
                t = time.perf_counter()
                model(input_ids=ids[:, context : context + k], position_ids=pos, use_cache=True,
                      **{forward_kwargs_name: cache}, **({"logits_to_keep": k} if keeps_logits else {}))
                sync()
                elapsed = time.perf_counter() - t
                cache.crop(-k)
                best[k] = min(best.get(k, float("inf")), elapsed)
    return set_cost_curve(model, sorted(best.items()))


def set_cost_curve(model, points: Sequence[tuple[int, float]]) -> CostModel:
    """Keep ``points`` as ``model``'s cost curve for the process, as if :func:`calibrate` had measured it.

    For a curve measured earlier (``decoder.stats.cost_curve``) or a deterministic one in tests; it
    must reach the most rows a decoder feeds (up to 64 by default), else calibration measures again.
    Example: ``set_cost_curve(model, [(1, 0.010), (64, 0.011)])`` (a flat, GPU-like curve).
    """
    curve = CostModel(points, learn=True)
    _CURVES[_model_key(model)] = curve
    return curve


def forget_calibrations() -> None:
    """Drop every kept cost curve (the next run calibrates again)."""
    _CURVES.clear()


MATCH_BUCKETS = 3


def match_bucket(match) -> np.ndarray:
    """Context cell of each node from its match length: 0 for 1 token (or none), 1 for 2, 2 for 3 or more."""
    return np.clip(np.asarray(match, dtype=np.int64), 1, MATCH_BUCKETS) - 1


class AcceptanceStats:
    """Online estimates of ``c(origin, context, depth, rank)``: P(node accepted | parent accepted).

    ``context`` is the node's match bucket (:func:`match_bucket`). Each estimate is the cell's
    acceptance rate shrunk towards the same (origin, context, rank) pooled over all depths, itself
    shrunk towards a Beta prior: by rank, an only child (the one continuation the store has ever
    seen) starts at 2/3, a first child among several at 1/3, later siblings at 1/10; the prior's mean
    is then scaled per context by ``context_scale`` (default: x0.5 after a 1-token match, x0.9 after
    2, x1.3 after 3 or more, clipped to [0.02, 0.98]), as measured on SmolLM2's outputs of every
    benchmark workload (``benchmarks/replay.py``), so that a fresh decoder drafts where copying is
    likely and spends few steps learning that one-token matches guess badly. The prior weighs as
    1.5 trials (half of what it was before the replay showed that weaker priors learn a
    non-repeating text sooner at no cost to the mean). Depths beyond
    ``max_depth`` share the last depth's cell, ranks beyond ``max_rank`` the last rank's. Counts
    decay by ``decay`` per update so the estimates follow the text as it changes.

    Example (no data yet, prior only): a chain of two only children after a 2-token match gets
    ``c = 2/3 * 0.9 = 0.6`` per level, so node probabilities ``[0.6, 0.36]``; after a 1-token match
    ``[1/3, 1/9]``.
    """

    def __init__(self, origins: int = 3, max_depth: int = 8, max_rank: int = 4,
                 priors: tuple[tuple[float, float], ...] = ((1.0, 0.5), (0.5, 1.0), (0.15, 1.35)),
                 decay: float = 0.97,
                 context_scale: tuple[float, ...] | None = (0.5, 0.9, 1.3)):
        self.max_depth, self.max_rank = max_depth, max_rank
        priors = list(priors) + [priors[-1]] * (max_rank - len(priors))
        self.prior_a = np.array([a for a, _ in priors[:max_rank]])
        self.prior_b = np.array([b for _, b in priors[:max_rank]])
        self.decay = decay
        if context_scale is not None and len(context_scale) != MATCH_BUCKETS:
            raise ValueError(f"context_scale needs one factor per match bucket ({MATCH_BUCKETS}); "
                             f"got {context_scale!r}")
        self.context_scale = None if context_scale is None else np.asarray(context_scale, dtype=np.float64)
        shape = (origins, MATCH_BUCKETS, max_depth, max_rank)
        self.tried = np.zeros(shape)
        self.accepted = np.zeros(shape)

    def _cells(self, origin, context, depth, rank):
        origin = np.asarray(origin, dtype=np.int64)
        return (origin, np.broadcast_to(np.asarray(context, dtype=np.int64), origin.shape),
                np.minimum(np.asarray(depth) - 1, self.max_depth - 1), np.minimum(np.asarray(rank), self.max_rank - 1))

    def conditional(self, origin, context, depth, rank) -> np.ndarray:
        """Shrunk twice: a (origin, context, depth, rank) cell towards its pooled-over-depths mean,
        which is shrunk towards the (rank, context) prior, so rarely seen deep cells borrow from shallow ones."""
        cell = self._cells(origin, context, depth, rank)
        o, ctx, _, r = cell
        a, b = self.prior_a[r], self.prior_b[r]
        if self.context_scale is not None:  # same prior strength a + b, mean scaled per context
            mean = np.clip(a / (a + b) * self.context_scale[ctx], 0.02, 0.98)
            a, b = mean * (a + b), (1 - mean) * (a + b)
        pooled = (self.accepted.sum(axis=2)[o, ctx, r] + a) / (self.tried.sum(axis=2)[o, ctx, r] + a + b)
        weight = 2.0
        return (self.accepted[cell] + weight * pooled) / (self.tried[cell] + weight)

    def node_probabilities(self, parents: np.ndarray, origin: np.ndarray, context=0,
                           depth_rank: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """float[n]: P(node accepted) for a breadth-first tree, the product of ``c`` along its path.
        ``context``: the step's context cell (an int, or int[n] per node). ``depth_rank``: the nodes'
        (depth, rank) cells, by default ``tree_depth_rank(parents)`` (a draft passes those of the
        tree as proposed, which stay its cells when the budget keeps only part of it)."""
        depth, rank = tree_depth_rank(parents) if depth_rank is None else depth_rank
        c = self.conditional(origin, context, depth, rank)
        prob = np.empty(len(parents))
        for i, p in enumerate(np.asarray(parents).tolist()):
            prob[i] = c[i] * (prob[p] if p >= 0 else 1.0)
        return prob

    def update(self, parents: np.ndarray, origin: np.ndarray, accepted_nodes: Sequence[int],
               context=0, depth_rank: tuple[np.ndarray, np.ndarray] | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """Record one verified tree: every node whose parent was accepted (or is the root) was tried.
        ``context`` and ``depth_rank`` as in :meth:`node_probabilities`.

        Returns (c float[t], accepted bool[t]) of the ``t`` tried nodes, ``c`` as estimated before this
        update (what :class:`CopyBelief` weighs the outcomes against)."""
        parents = np.asarray(parents)
        if not len(parents):
            return np.zeros(0), np.zeros(0, dtype=bool)
        ok, parent_ok = tried_nodes(parents, accepted_nodes)
        depth, rank = tree_depth_rank(parents) if depth_rank is None else depth_rank
        context = np.broadcast_to(np.asarray(context, dtype=np.int64), parents.shape)
        tried = (np.asarray(origin)[parent_ok], context[parent_ok], depth[parent_ok], rank[parent_ok])
        c = self.conditional(*tried)
        self.tried *= self.decay
        self.accepted *= self.decay
        cells = self._cells(*tried)
        np.add.at(self.tried, cells, 1.0)
        np.add.at(self.accepted, cells, ok[parent_ok].astype(np.float64))
        return c, ok[parent_ok]


def tried_nodes(parents: np.ndarray, accepted_nodes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(accepted, tried): bool[n] each. A node was *tried* when its parent was accepted or is the root.

    Example: parents ``[-1, -1, 0, 2]``, accepted ``[0]`` -> accepted ``[T, F, F, F]``,
    tried ``[T, T, T, F]`` (node 3's parent, node 2, was rejected: node 3 was never compared).
    """
    parents = np.asarray(parents, dtype=np.int64)
    ok = np.zeros(len(parents), dtype=bool)
    ok[list(accepted_nodes)] = True
    return ok, np.where(parents >= 0, ok[np.maximum(parents, 0)], True)


class CopyBelief:
    """How much to trust the acceptance estimates right now: P(the text is copying).

    Whether drafts get accepted depends on the text more than on anything the estimates condition
    on: an answer that quotes its prompt's code accepts most drafts after a three-token match, a
    chat reply that never repeats accepts none, and one :class:`AcceptanceStats` cell learns that
    only from its own trials. This belief couples the cells. Two hypotheses: *copying*, drafts are
    accepted at the estimated rates ``c``; *not copying*, at ``off_scale * c``. Each verified node is
    a Bernoulli trial whose log-likelihood ratio moves the log-odds (clipped to ``±limit``); every
    step the log-odds relax towards the prior's by the factor ``relax``, so that a text which stops
    copying is drafted on sparingly for a few steps and then tried again. Node probabilities are
    scaled by ``scale() = belief + (1 - belief) * off_scale``.

    Worked example (prior 0.9, off_scale 0.3, relax 0.9): a rejected only child with ``c = 0.87``
    adds ``log((1 - 0.87) / (1 - 0.3 * 0.87)) = -1.74`` to the prior's log-odds 2.20: belief 0.61,
    scale 0.73; at the next step the log-odds relax to ``2.20 - 0.9 * 1.74 = 0.63``, scale 0.76.
    An accepted node adds ``log(1 / 0.3) = +1.20``.

    Measured on SmolLM2's recorded outputs (``python -m benchmarks.replay``), the belief raises the
    worst prompt's modelled speed-up from about 0.97x to 0.98x with the mean unchanged: a
    fresh decoder stops repeating failed big trees on a text that does not repeat.
    """

    def __init__(self, prior: float = 0.9, off_scale: float = 0.3, relax: float = 0.9, limit: float = 6.0):
        for name, value in (("prior", prior), ("off_scale", off_scale)):
            if not 0.0 < value < 1.0:
                raise ValueError(f"CopyBelief {name} must be in (0, 1); got {value!r}")
        if not 0.0 <= relax <= 1.0:
            raise ValueError(f"CopyBelief relax must be in [0, 1]; got {relax!r}")
        self.off_scale, self.relax, self.limit = off_scale, relax, limit
        self.prior_log_odds = float(np.log(prior / (1 - prior)))
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


def choose_nodes(probs: np.ndarray, cost: CostModel, extra_rows: int = 0, extra_gain: float = 0.0,
                 margin: float = 1.05) -> np.ndarray:
    """The draft nodes worth verifying: indices (sorted) of the best prefix by probability.

    ``probs``: float[n] acceptance probabilities of a tree's nodes (a child never above its parent).
    ``extra_rows``/``extra_gain``: rows and expected tokens another part of the step adds (the window).
    Maximises ``(1 + extra_gain + sum of chosen probs) / cost(1 + extra_rows + k)`` over k = 0..n;
    a k > 0 must beat k = 0 by the factor ``margin``, so estimation noise does not buy slower steps.
    """
    probs = np.asarray(probs, dtype=np.float64)
    order = sorted(range(len(probs)), key=lambda i: (-probs[i], i))  # parents come before children
    gains = 1.0 + extra_gain + np.concatenate([[0.0], np.cumsum(probs[order])])
    rate = gains / cost(1 + extra_rows + np.arange(len(probs) + 1))
    k = int(np.argmax(rate))
    if rate[k] < margin * rate[0]:
        k = 0
    return np.sort(np.asarray(order[:k], dtype=np.int64))


class Budget:
    """Per-step budget decisions of one decoding call: which draft nodes to verify, whether the window runs.

    One per call, with fresh acceptance estimates: replayed on SmolLM2's outputs, estimates carried
    from earlier prompts lowered the mean modelled speed-up (1.345x fresh, 1.300x carried across all
    32 prompts, 1.196x carried within each workload) and the worst prompt (0.975x fresh, 0.862x
    carried): how often one text's drafts are accepted says little about the next text's.

    Node probabilities are the acceptance estimates times the call's :class:`CopyBelief` scale.
    The window's rows pay off in later steps (the n-grams they grow), so their worth is tracked as
    ``window_gain``: a running mean of window-made tokens accepted per step while the window runs.
    While the window is off it is re-tried every ``window_probe_every`` steps. A step that would
    verify no node although drafts exist verifies its most probable node every ``probe_every``
    steps, so that estimates learned low can recover; on this CPU such a probe costs about 0.65 of a
    step when it fails, hence the long default interval.
    """

    def __init__(self, cost: CostModel, stats: AcceptanceStats | None = None, probe_every: int = 64,
                 window_probe_every: int = 16, belief: CopyBelief | None = None):
        self.cost = cost.copy()  # learns for this call only
        self.acceptance = stats or AcceptanceStats()
        self.belief = belief or CopyBelief()
        self.probe_every = probe_every
        self.window_probe_every = window_probe_every
        self.window_gain = 1.0  # optimistic start: the window is tried first
        self._since_window = 0
        self._since_draft = 0

    def plan(self, draft) -> tuple[np.ndarray, bool]:
        """(node indices to verify, run the window rows?) for this step's :class:`~lookahead.proposer.Draft`."""
        self.belief.step()
        n, window_rows = len(draft.tokens), draft.n_window_rows
        probs = (self.acceptance.node_probabilities(draft.parents, draft.origin, match_bucket(draft.match),
                                                    (draft.depth, draft.rank)) * self.belief.scale()
                 if n else np.zeros(0))
        use_window = False
        if window_rows:
            with_w = choose_nodes(probs, self.cost, window_rows, self.window_gain)
            without = choose_nodes(probs, self.cost)
            rate_w = (1 + self.window_gain + probs[with_w].sum()) / self.cost(1 + window_rows + len(with_w))
            rate_0 = (1 + probs[without].sum()) / self.cost(1 + len(without))
            self._since_window += 1
            use_window = bool(rate_w > rate_0) or self._since_window >= self.window_probe_every
            keep = with_w if use_window else without
        else:
            keep = choose_nodes(probs, self.cost)
        if n and not len(keep):
            self._since_draft += 1
            if self._since_draft >= self.probe_every:
                keep = np.argsort(-probs, kind="stable")[:1]  # the most probable node is a root child
        if len(keep):
            self._since_draft = 0
        if use_window:
            self._since_window = 0
        return keep, use_window

    def record(self, draft, accepted_nodes, window_accepted: int, rows: int = 0, seconds: float = 0.0) -> None:
        """Learn from one verified step of ``draft`` (as verified: the nodes and window rows it ran);
        ``rows`` new tokens went through a forward of ``seconds``."""
        self.cost.observe(rows, seconds)
        self.belief.update(*self.acceptance.update(draft.parents, draft.origin, accepted_nodes,
                                                   match_bucket(draft.match), (draft.depth, draft.rank)))
        if draft.n_window_rows:
            self.window_gain = 0.9 * self.window_gain + 0.1 * window_accepted
