"""The cost curve ``t(k)``, the seconds of one decoding step with ``k`` new tokens, which the budget (``budget.py``)
prices every draft with (extra tokens are nearly free on a datacenter GPU, dear on a CPU); :class:`Calibrations` keeps
the curves per model (learnt, pinned, or measured by ``calibrate.py``) and on disk per model fingerprint."""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import math
import os
import platform
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from . import user_cache
from ._tuning import DEFAULT

log = logging.getLogger("lookahead")

CURVE_FORMAT = 3  # the version of a persisted curve's file
_CURVE_KIND = "lookahead cost curve"
STEP_VARIANT = "step"  # what a decoder's calibration times: whole steps (curves are kept per variant)


class CostModel:
    """Step time for ``k`` new tokens (rows) through measured points ``[(k, seconds), ...]``, extrapolated linearly past
    the last. ``steps``: priced as the next measured size (else interpolated, made non-decreasing); ``covers``: the rows
    its measurement was asked for. Immutable: a learned curve makes a new one when it changes."""

    def __init__(self, points: Sequence[tuple[int, float]], provisional: bool = False, steps: bool = False,
                 covers: int = 0):
        self.provisional, self.steps = bool(provisional), bool(steps)
        pts = sorted((int(k), float(t)) for k, t in points)
        if not pts or pts[0][0] < 1 or any(not t > 0 or not math.isfinite(t) for _, t in pts):
            raise ValueError(f"cost curve needs points (k >= 1, seconds > 0); got {points!r}")
        self._ks = np.array([k for k, _ in pts], dtype=np.float64)
        self._ts = np.array([t for _, t in pts], dtype=np.float64)
        if not self.steps:
            self._ts = np.maximum.accumulate(self._ts)  # non-decreasing in k
        self._slope = (max((self._ts[-1] - self._ts[-2]) / (self._ks[-1] - self._ks[-2]), 0.0)
                       if len(self._ks) >= 2 else 0.0)
        self.points = tuple(zip(self._ks.astype(int).tolist(), self._ts.tolist()))
        self.covers = max(int(covers), self.max_k)

    @property
    def max_k(self) -> int:
        """The largest measured ``k`` (beyond it the curve extrapolates)."""
        return int(self._ks[-1])

    def __call__(self, k: int | np.ndarray) -> np.ndarray:
        k = np.asarray(k, dtype=np.float64)
        if self.steps:
            t = self._ts[np.minimum(np.searchsorted(self._ks, k, side="left"), len(self._ks) - 1)]
        else:
            t = np.interp(k, self._ks, self._ts)
        return np.where(k > self._ks[-1], self._ts[-1] + self._slope * (k - self._ks[-1]), t)

    def __eq__(self, other) -> bool:
        return (isinstance(other, CostModel) and self.points == other.points
                and (self.provisional, self.steps, self.covers) == (other.provisional, other.steps, other.covers))

    def __repr__(self) -> str:
        return ("CostModel(" + ", ".join(f"{k}: {t * 1e3:.1f} ms" for k, t in self.points)
                + (", steps" if self.steps else "") + (", provisional" if self.provisional else "") + ")")


def describe(curve: CostModel) -> str:
    """One line for a log: ``t(1) = 31.0 ms; 16 tokens 2.4x, 64 tokens 5.1x`` (the largest sizes measured)."""
    t1 = float(curve(1))
    big = [k for k in (16, 64) if k <= curve.max_k] or [curve.max_k]
    return f"t(1) = {t1 * 1e3:.1f} ms; " + ", ".join(f"{k} tokens {float(curve(k)) / t1:.1f}x" for k in big)


def model_key(model) -> tuple:
    """What a measured curve depends on besides the model object: its device and dtype."""
    return (str(model.device), str(model.dtype))


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``'s ``model name``), else what ``platform`` knows of it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def config_digest(config) -> str:
    """A hash of the model's architecture: its config without its path, transformers version, dtype (kept apart) or GGUF
    quantisation entry, plus the attention implementation it runs."""
    volatile = ("transformers_version", "dtype", "torch_dtype")
    d = {k: v for k, v in config.to_dict().items() if not k.startswith("_") and k not in volatile}
    if (d.get("quantization_config") or {}).get("quant_method") == "gguf":
        del d["quantization_config"]  # transformers de-quantises GGUF weights: they run as plain ones
    d["attention"] = getattr(config, "_attn_implementation", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:20]


def curve_fingerprint(model, variant: str = "") -> dict:
    """What a persisted curve depends on: :func:`config_digest`, dtype, device (with a GPU's name), torch's thread
    count, CPU model, torch and transformers versions, what was timed (``variant``) and :data:`CURVE_FORMAT`."""
    import transformers

    device = str(model.device)
    if model.device.type == "cuda" and torch.cuda.is_available():
        device += " " + torch.cuda.get_device_name(model.device)
    return {"format": CURVE_FORMAT, "model": f"{type(model).__name__} {config_digest(model.config)}",
            "dtype": str(model.dtype), "device": device,
            "threads": torch.get_num_threads(), "cpu": cpu_model(), "torch": torch.__version__,
            "transformers": transformers.__version__, "variant": variant}


@dataclass(frozen=True)
class StoredCurve:
    """A curve read back from disk, with where and when it was measured."""

    curve: CostModel
    path: str
    measured: str


class CurveStore:
    """Measured curves on disk, one per fingerprint: ``<folder>/curves/<hash>.json`` holding ``{"kind", "format",
    "fingerprint", "points": [[k, seconds], ...], "steps", "covers", "measured": ISO time, "seconds"}``. :meth:`load`
    returns a curve only when it passes :func:`_parse_curve` and covers ``max_rows`` (else it is measured again and
    overwritten); provisional curves are never written."""

    def __init__(self, folder: str | None = None):
        self.folder = os.path.join(folder or user_cache.cache_dir(), "curves")

    def path(self, fingerprint: dict) -> str:
        digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
        return os.path.join(self.folder, f"{digest}.json")

    def load(self, fingerprint: dict, max_rows: int) -> StoredCurve | None:
        path = self.path(fingerprint)
        data = user_cache.read_json(path)
        curve = None if data is None else _parse_curve(data, fingerprint)
        if curve is None or curve.covers < max_rows:
            return None
        return StoredCurve(curve, path, str(data.get("measured", "")))

    def save(self, fingerprint: dict, curve: CostModel, seconds: float) -> str | None:
        """Write ``curve``; its path, or None (a provisional curve, or a failed write, which is logged)."""
        if curve.provisional:
            return None
        path = self.path(fingerprint)
        data = {"kind": _CURVE_KIND, "format": CURVE_FORMAT, "fingerprint": fingerprint,
                "points": [[k, t] for k, t in curve.points], "steps": curve.steps, "covers": curve.covers,
                "measured": datetime.datetime.now().isoformat(timespec="seconds"),
                "seconds": round(seconds, 3)}
        from .measuring import write_json_atomic

        return path if write_json_atomic(path, data) else None


def _parse_curve(data: dict, fingerprint: dict) -> CostModel | None:
    """The curve in a persisted record, or None unless kind, format and fingerprint match exactly, every point is
    ``[int k >= 1, 0 < seconds < inf]`` with ``k`` increasing, and ``covers`` (absent in older files) is an int >= the
    last ``k``."""
    if (data.get("kind") != _CURVE_KIND or data.get("format") != CURVE_FORMAT
            or data.get("fingerprint") != fingerprint or data.get("provisional")):
        return None
    try:
        pts = [(k, float(t)) for k, t in data.get("points")]
    except (TypeError, ValueError):
        return None
    ks = [k for k, _ in pts]
    covers = data.get("covers", ks[-1] if ks else 0)
    if (not ks or any(type(k) is not int for k in (*ks, covers)) or ks[0] < 1 or covers < ks[-1]
            or any(b <= a for a, b in zip(ks, ks[1:])) or any(not 0 < t < math.inf for _, t in pts)):
        return None
    return CostModel(pts, steps=bool(data.get("steps", False)), covers=covers)


@dataclass
class _Entry:
    curve: CostModel
    pinned: bool
    measured_at: float = 0.0
    retries: int = 0


class Calibrations:
    """The cost curves known so far, per model object (held weakly: a curve dies with its model)."""

    def __init__(self, persist: bool = False, folder: str | None = None,
                 clock: Callable[[], float] = time.monotonic, retry_after: float = DEFAULT.retry_after):
        self.persist, self.folder, self.clock, self.retry_after = persist, folder, clock, retry_after
        self._curves: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.RLock()  # one measurement at a time: two at once would slow each other

    def store(self, persist: bool | None = None) -> CurveStore | None:
        """Where curves persist, or None when persisting is off (here, for this call, or by the environment)."""
        on = self.persist if persist is None else persist
        return CurveStore(self.folder) if on and user_cache.persist_enabled() else None

    def get(self, model, max_rows: int, measure: Callable[[tuple[int, ...]], CostModel] | None = None,
            variant: str = "", persist: bool | None = None) -> CostModel | None:
        """``model``'s curve for ``max_rows``: pinned (for every ``variant``), kept, stored on disk, or measured now by
        ``measure(sizes)`` with a progress bar (None: not measured, None returned). ``variant``: what else it depends on
        (``"step"``: whole steps timed); ``persist``: this call's choice over the registry's (False for a measurement
        that is not the machine's, e.g. on an injected clock)."""
        with self._lock:
            curves = self._curves.get(model, {})
            pinned = curves.get(model_key(model))
            if pinned is not None and pinned.pinned:
                return pinned.curve
            key = model_key(model) + ((variant,) if variant else ())
            entry = curves.get(key)
            fits = entry is not None and entry.curve.covers >= max_rows
            if fits and not (entry.curve.provisional  # a provisional curve is retried
                             and self.clock() - entry.measured_at >= self.retry_after * 2 ** entry.retries):
                return entry.curve
            store = self.store(persist)
            fingerprint = curve_fingerprint(model, variant) if store is not None else None
            stored = store.load(fingerprint, max_rows) if store is not None else None
            if stored is not None:
                log.info("using the cost curve measured for this model on %s (%s; %s)", stored.measured,
                         describe(stored.curve), stored.path)
                self._curves.setdefault(model, {})[key] = _Entry(stored.curve, False, self.clock())
                return stored.curve
            if measure is None:
                return None
            from .measuring import announced_measurement

            curve, seconds = announced_measurement(model, max_rows, measure, variant, entry, store)
            again = entry is not None and entry.curve.provisional and curve.provisional
            retries = entry.retries + 1 if again else 0
            self._curves.setdefault(model, {})[key] = _Entry(curve, False, self.clock(), retries)
            path = store.save(fingerprint, curve, seconds) if store is not None else None
            log.info("calibrated in %.1f s: %s%s", seconds, describe(curve),
                     f"; saved to {path}" if path else "; provisional" if curve.provisional else "")
            return curve

    def kept(self, model, key: tuple, make: Callable[[], object]):
        """What this registry keeps for ``model`` under ``key``, else ``make()``'s, kept from now on
        (``learned.py``'s curves)."""
        with self._lock:
            found = self._curves.setdefault(model, {}).get(key)
            if found is None:
                found = self._curves[model][key] = make()
            return found

    def pin(self, model, points: Sequence[tuple[int, float]]) -> CostModel:
        curve = points if isinstance(points, CostModel) else CostModel(points)
        with self._lock:
            self._curves.setdefault(model, {})[model_key(model)] = _Entry(curve, True)
        return curve

    def __reduce__(self):
        """Pickle / deepcopy: the default registry stays the default one; another becomes an empty one with the same
        persistence (its keys are live model objects)."""
        return "DEFAULT_CALIBRATIONS" if self is DEFAULT_CALIBRATIONS else (Calibrations, (self.persist, self.folder))


DEFAULT_CALIBRATIONS = Calibrations(persist=True)


def set_cost_curve(model, points: Sequence[tuple[int, float]], calibrations: Calibrations | None = None
                   ) -> CostModel:
    """Use ``points`` as ``model``'s cost curve from now on, as if calibration had measured it (an earlier
    ``decoder.stats.cost_curve``, or a flat curve for a GPU). Example:
    ``set_cost_curve(model, [(1, 0.010), (64, 0.011)])``."""
    return (calibrations or DEFAULT_CALIBRATIONS).pin(model, points)
