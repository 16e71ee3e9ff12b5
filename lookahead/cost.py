"""What a forward costs: the cost curve ``t(k)``, its calibration, and opt-in online refinement.

``t(k)`` is the seconds of one forward of the target model with ``k`` new tokens. Verifying ``k``
extra tokens is nearly free on a datacenter GPU and costs real time on a CPU, so the budget
(``budget.py``) prices every draft with this curve.

- :class:`CostModel`: an immutable piecewise-linear curve through measured points.
- :func:`calibrate`: measures a curve (a few forwards over a short context).
- :class:`Calibrations`: the curves measured or pinned so far, per model, in an object the decoder
  is given (:data:`DEFAULT_CALIBRATIONS` unless told otherwise); nothing else keeps a curve.
- :class:`CostRefiner`: opt-in (``LookaheadConfig.refine_cost``): folds measured step times into
  the curve of one call without ever changing the curve's *shape* from what was calibrated for
  a point it has not seen recently (see its docstring: why a naive refinement ratchets).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence

import numpy as np
import torch


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
    """Forward time as a piecewise-linear, non-decreasing function of the number of new tokens ``k``.

    Built from measured points ``[(k, seconds), ...]``; beyond the last point it extrapolates
    linearly with the slope of the last segment. Immutable: refinement makes a new curve.

    Example: ``CostModel([(1, .010), (2, .015), (4, .016)])(3)`` -> 0.0155; ``(8)`` -> 0.018.

    ``kernel_rows``: the row counts whose forwards this curve assumes run through the CPU kernels
    (``cpu_linear.fast_linears``), when its calibration chose them; empty: torch's path throughout.
    """

    def __init__(self, points: Sequence[tuple[int, float]], kernel_rows: frozenset[int] = frozenset()):
        self.kernel_rows = frozenset(kernel_rows)
        pts = sorted((int(k), float(t)) for k, t in points)
        if not pts or pts[0][0] < 1 or any(t <= 0 for _, t in pts):
            raise ValueError(f"cost curve needs points (k >= 1, seconds > 0); got {points!r}")
        self._ks = np.array([k for k, _ in pts], dtype=np.float64)
        self._ts = np.maximum.accumulate(np.array([t for _, t in pts], dtype=np.float64))  # monotone in k
        self._slope = (max((self._ts[-1] - self._ts[-2]) / (self._ks[-1] - self._ks[-2]), 0.0)
                       if len(self._ks) >= 2 else 0.0)
        self.points = tuple(zip(self._ks.astype(int).tolist(), self._ts.tolist()))

    @property
    def max_k(self) -> int:
        """The largest measured ``k`` (beyond it the curve extrapolates)."""
        return int(self._ks[-1])

    def __call__(self, k: int | np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        t = np.interp(k, self._ks, self._ts)
        return np.where(k > self._ks[-1], self._ts[-1] + self._slope * (k - self._ks[-1]), t)

    def scaled(self, factors: np.ndarray) -> CostModel:
        """A new curve with each point's seconds multiplied by ``factors`` (float[points])."""
        return CostModel(list(zip(self._ks.astype(int).tolist(), (self._ts * factors).tolist())), self.kernel_rows)

    def __eq__(self, other) -> bool:
        return isinstance(other, CostModel) and self.points == other.points and self.kernel_rows == other.kernel_rows

    def __repr__(self) -> str:
        return "CostModel(" + ", ".join(f"{k}: {t * 1e3:.1f} ms" for k, t in self.points) + ")"


class CostRefiner:
    """Online refinement of one call's cost curve from measured step times (opt-in).

    Why not simply move the measured point towards each measurement: a decoder that stops drafting
    observes only ``k = 1``. If the machine is faster than at calibration, ``t(1)`` falls, ``t(16)``
    keeps its stale value, ``t(16) / t(1)`` grows, drafting looks ever worse, and the points that
    would correct it are never observed again: a ratchet (it made a test suite fail on a faster
    machine). So the refined curve is ``base(k) * scale * shape[k]``:

    - ``scale``: one factor for the whole curve, an exponential mean of measured / base over every
      observation. A uniformly faster or slower machine moves it and nothing else, which changes
      no decision (the budget compares costs only with each other).
    - ``shape[i]``: a per-point correction, moved only by observations nearest to point ``i``
      (after dividing out ``scale``), and relaxed towards 1 by ``relax`` at every observation of any
      other point. A point that is not observed returns to its calibrated ratio to the others.

    Example: base ``t(1) = 10 ms, t(16) = 30 ms``; every step measures ``t(1) = 5 ms``. ``scale``
    tends to 0.5, ``shape[1]`` stays 1 and ``shape[16]`` stays 1: the curve becomes 5 ms / 15 ms,
    the ratio 3 is kept, where a per-point refinement would have drifted to 5 ms / 30 ms.
    """

    def __init__(self, base: CostModel, weight: float = 0.2, relax: float = 0.98):
        if not 0.0 < weight <= 1.0 or not 0.0 <= relax <= 1.0:
            raise ValueError(f"CostRefiner needs 0 < weight <= 1 and 0 <= relax <= 1; got {weight}, {relax}")
        self.base = base
        self.weight, self.relax = weight, relax
        self._log_k = np.log(base._ks)
        self.scale = 1.0
        self.shape = np.ones(len(base._ks))
        self.curve = base

    def observe(self, k: int, seconds: float) -> CostModel:
        """Fold one forward of ``k`` new tokens that took ``seconds``; returns the refined curve."""
        if k < 1 or seconds <= 0:
            return self.curve
        i = int(np.argmin(np.abs(self._log_k - np.log(k))))
        ratio = seconds / float(self.base(k))
        self.scale = float(np.exp((1 - self.weight) * np.log(self.scale) + self.weight * np.log(ratio)))
        others = np.arange(len(self.shape)) != i
        self.shape[others] = self.shape[others] ** self.relax  # relax towards 1 in log space
        self.shape[i] = float(np.exp((1 - self.weight) * np.log(self.shape[i])
                                     + self.weight * np.log(ratio / self.scale)))
        self.curve = self.base.scaled(self.scale * self.shape)
        return self.curve


def model_key(model) -> tuple:
    """What a measured curve depends on besides the model object: its device and dtype."""
    return (str(model.device), str(model.dtype))


class Calibrations:
    """The cost curves known so far, per model object (held weakly: a curve dies with its model).

    ``get`` returns a curve covering ``max_rows``, measuring it with ``measure`` on first use (and
    again when a caller needs more rows than a measured curve covers). ``pin`` keeps a given curve
    as if measured; a pinned curve is never re-measured. ``forget`` drops one model's or all.

    A decoder uses :data:`DEFAULT_CALIBRATIONS` unless given its own object, so a process measures
    each model once; tests pass their own or pin a curve, so nothing carries from one test to the next.
    """

    def __init__(self):
        self._curves: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get(self, model, max_rows: int, measure: Callable[[tuple[int, ...]], CostModel], variant: str = ""
            ) -> CostModel:
        """``variant``: what else the measurement depends on (``"cpu-kernels"``: both paths timed); a
        pinned curve applies to every variant."""
        curves = self._curves.get(model, {})
        pinned = curves.get(model_key(model))
        if pinned is not None and pinned[1]:
            return pinned[0]
        key = model_key(model) + ((variant,) if variant else ())
        entry = curves.get(key)
        if entry is not None and (entry[1] or entry[0].max_k >= max_rows):
            return entry[0]
        curve = measure(calibration_sizes(max_rows))
        self._curves.setdefault(model, {})[key] = (curve, False)
        return curve

    def pin(self, model, points: Sequence[tuple[int, float]]) -> CostModel:
        curve = points if isinstance(points, CostModel) else CostModel(points)
        self._curves.setdefault(model, {})[model_key(model)] = (curve, True)
        return curve

    def known(self, model) -> CostModel | None:
        entry = self._curves.get(model, {}).get(model_key(model))
        return None if entry is None else entry[0]

    def __reduce__(self):
        """Pickle / deepcopy: the default registry stays the default one; another becomes an empty one
        (its keys are live model objects, which do not travel)."""
        return (_default_calibrations, ()) if self is DEFAULT_CALIBRATIONS else (Calibrations, ())

    def forget(self, model=None) -> None:
        if model is None:
            self._curves = weakref.WeakKeyDictionary()
        else:
            self._curves.pop(model, None)


DEFAULT_CALIBRATIONS = Calibrations()


def _default_calibrations() -> Calibrations:
    return DEFAULT_CALIBRATIONS


def set_cost_curve(model, points: Sequence[tuple[int, float]], calibrations: Calibrations | None = None
                   ) -> CostModel:
    """Use ``points`` as ``model``'s cost curve from now on, as if calibration had measured it.

    For a curve measured earlier (``decoder.stats.cost_curve``) or a known one (a flat curve for a
    GPU). Example: ``set_cost_curve(model, [(1, 0.010), (64, 0.011)])``.
    """
    return (calibrations or DEFAULT_CALIBRATIONS).pin(model, points)


def measure_cost_curve(model, cache_factory, sizes: Sequence[int], cache_kwarg: str | None = None,
                       keeps_logits: bool = True, context: int = 128, repeats: int = 2,
                       clock: Callable[[], float] = time.perf_counter) -> CostModel:
    """Time one forward for each ``k`` in ``sizes`` after a ``context``-token prefill; each ``k`` keeps
    the fastest of ``repeats`` runs. About 3 s for SmolLM2-135M on one core of a 2-core CPU.
    ``cache_kwarg``: the forward's name for the cache, by default the model's own
    (:func:`lookahead.compat.cache_kwarg_name`)."""
    if cache_kwarg is None:
        from .compat import cache_kwarg_name

        cache_kwarg = cache_kwarg_name(model)
    device = model.device
    limit = getattr(model.config, "max_position_embeddings", None) or 4096
    context = max(1, min(context, limit - max(sizes) - 1))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, context + max(sizes)), generator=gen).to(device)
    cache = cache_factory()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best: dict[int, float] = {}
    with torch.no_grad():
        model(input_ids=ids[:, :context], use_cache=True, **{cache_kwarg: cache})
        for _ in range(repeats):
            for k in sizes:
                pos = torch.arange(context, context + k, device=device)[None]
                sync()
                t = clock()
                model(input_ids=ids[:, context : context + k], position_ids=pos, use_cache=True,
                      **{cache_kwarg: cache}, **({"logits_to_keep": k} if keeps_logits else {}))
                sync()
                elapsed = clock() - t
                cache.crop(-k)
                best[k] = min(best.get(k, float("inf")), elapsed)
    return CostModel(sorted(best.items()))
