"""The cost curve a decoder learns from its calls' own steps where none was measured (:class:`LearnedCurve`),
kept per model in a ``cost.Calibrations`` and on disk between processes."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence

import numpy as np

from .cost import Calibrations, CostModel, curve_fingerprint, model_key

log = logging.getLogger("lookahead")


class LearnedCurve:
    """A cost curve learned from calls' own steps: per step size ``k`` the fastest time seen (load only adds time),
    from its second timing on (a size's first step in a process pays one-time set-up costs). Shared by a model's calls
    (under ``lock``) and kept on disk between processes.

    :meth:`curve`: the fastest times, each lowered to that of any larger size and capped at ``k`` one-row steps. A
    size not seen costs ``slope`` one-row steps per token more than the largest size seen below it (never more than a
    larger size seen): a cautious prior, so a first call drafts little and learns upward. Example: ``slope=0.25``,
    seen ``{1: 10 ms, 4: 12 ms}``: ``t(2) = 12.5 ms``, ``t(3) = 12 ms``, ``t(8) = 12 + 4 * 2.5 = 22 ms``."""

    def __init__(self, slope: float, points: Sequence[tuple[int, float]] = ()):
        if not slope > 0:
            raise ValueError(f"LearnedCurve needs slope > 0; got {slope}")
        self.slope = float(slope)
        self.fastest: dict[int, float] = {int(k): float(t) for k, t in points}
        self.timed: set[int] = set(self.fastest)  # sizes timed at least once in this process (or kept)
        self.lock = threading.Lock()
        self.seen = 0  # steps observed in this process
        self._curve = self._make()

    def observe(self, k: int, seconds: float) -> bool:
        """Fold one step of ``k`` rows that took ``seconds``; True when the curve changed."""
        if k < 1 or not seconds > 0:
            return False
        with self.lock:
            self.seen += 1
            if k not in self.timed:
                self.timed.add(k)
                return False
            if seconds >= self.fastest.get(k, math.inf):
                return False
            self.fastest[k] = seconds
            self._curve = self._make()
            return True

    def curve(self) -> CostModel:
        return self._curve

    def _make(self) -> CostModel:
        seen = sorted(self.fastest.items())
        if not seen:
            return CostModel([(1, 1.0), (2, 1.0 + self.slope)])  # seconds unknown yet: only ratios matter
        ks = np.array([k for k, _ in seen])
        ts = np.minimum.accumulate(np.array([t for _, t in seen])[::-1])[::-1]  # no larger size costs less
        t1 = float(ts[0]) if ks[0] == 1 else float(ts[0]) / (1.0 + self.slope * (ks[0] - 1))
        top = int(ks[-1])
        k = np.arange(1, 2 * top + 2)
        below = np.searchsorted(ks, k, side="right") - 1  # the largest size seen <= k (-1: none)
        base_k = np.where(below >= 0, ks[np.maximum(below, 0)], 1)
        base_t = np.where(below >= 0, ts[np.maximum(below, 0)], t1)
        t = base_t + self.slope * t1 * (k - base_k)  # unseen: the prior's price from the size seen below
        above = np.minimum(np.searchsorted(ks, k, side="left"), len(ks) - 1)
        t = np.where(k <= top, np.minimum(t, ts[above]), t)  # and never above a larger size seen
        return CostModel(list(zip(k.tolist(), np.minimum(t, k * t1).tolist())), steps=True, covers=1 << 12)


def learner(calibrations: Calibrations, model, variant: str, slope: float, persist: bool | None = None
            ) -> LearnedCurve:
    """The :class:`LearnedCurve` of ``model`` for ``variant``: kept in ``calibrations``, else read back from disk
    (what an earlier process learnt), else a new one pricing with ``slope``."""
    name = variant + "+learned"

    def read_back() -> LearnedCurve:
        store = calibrations.store(persist)
        stored = store.load(curve_fingerprint(model, name), 1) if store is not None else None
        if stored is None:
            log.info("no cost curve is known for this model here: calls price drafts cautiously and learn "
                     "the curve from their own steps (kept for later calls and processes)")
            return LearnedCurve(slope)
        log.info("using the cost curve learnt for this model on %s (%s)", stored.measured, stored.path)
        return LearnedCurve(slope, stored.curve.points[:-1])

    return calibrations.kept(model, model_key(model) + (name,), read_back)


def keep_learned(calibrations: Calibrations, model, variant: str, learned: LearnedCurve, min_steps: int,
                 persist: bool | None = None) -> None:
    """Write ``learned``'s curve to disk, for the next process, once this process's steps taught it enough."""
    store = calibrations.store(persist)
    if store is not None and learned.seen >= min_steps and learned.fastest:
        store.save(curve_fingerprint(model, variant + "+learned"), learned.curve(), 0.0)
