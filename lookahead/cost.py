"""What a step costs: the cost curve ``t(k)``, its calibration, where curves are kept, and opt-in refinement.

``t(k)`` is the seconds of one decoding step with ``k`` new tokens. Verifying ``k`` extra tokens is nearly free on
a datacenter GPU and costs real time on a CPU, so the budget (``budget.py``) prices every draft with it.

- :class:`CostModel`: an immutable curve through measured points.
- :func:`calibrate_curve`: a curve from any timing function, in interleaved rounds with robust statistics; one
  measured on a busy machine comes back ``provisional``.
- :class:`Calibrations`: the curves known per model object, measured once under a lock (concurrent first calls
  of a model measure once) and kept on disk per model fingerprint (:class:`CurveStore`).
- :class:`CostRefiner`: opt-in (``Tuning.refine_cost``) refinement of one call's curve from its step times.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import torch

from . import user_cache
from ._tuning import DEFAULT

log = logging.getLogger("lookahead")

CURVE_FORMAT = 3  # the version of a persisted curve's file
_CURVE_KIND = "lookahead cost curve"
STEP_VARIANT = "step"
"""What a decoder's calibration times (curves are kept per variant): whole decoding steps."""
_BAR: ContextVar = ContextVar("lookahead_calibration_bar", default=None)


def calibration_sizes(max_rows: int) -> tuple[int, ...]:
    """Powers of two from 1 up to the first >= ``max_rows`` (and >= 16). Example: 17 -> ``(1, 2, 4, 8, 16, 32)``."""
    sizes = [1]
    while sizes[-1] < max(max_rows, 16):
        sizes.append(2 * sizes[-1])
    return tuple(sizes)


class CostModel:
    """Forward time as a function of the number of new tokens (rows) ``k``, from measured points
    ``[(k, seconds), ...]``. Immutable: refinement makes a new curve."""

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

    def scaled(self, factors: np.ndarray) -> CostModel:
        """A new curve with each point's seconds multiplied by ``factors`` (float[points]); the flags are kept."""
        return CostModel(list(zip(self._ks.astype(int).tolist(), (self._ts * factors).tolist())), self.provisional,
                         self.steps, self.covers)

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


class CostRefiner:
    """Online refinement of one call's cost curve from measured step times (opt-in). The refined curve is
    ``base(k) * scale * shape[k]``: ``scale`` an exponential mean of measured / base over every observation (a
    uniformly faster machine moves it and no decision), ``shape[i]`` a per-point correction moved only by
    observations nearest point ``i`` and relaxed towards 1 at every other one. Moving each point towards its own
    measurements would ratchet: a decoder that stops drafting observes only ``k = 1``, and stale large points
    would make drafting look ever worse.

    Example: base ``t(1) = 10 ms, t(16) = 30 ms``; every step measures ``t(1) = 5 ms``. ``scale``
    tends to 0.5, ``shape[1]`` stays 1 and ``shape[16]`` stays 1: the curve becomes 5 ms / 15 ms,
    the ratio 3 is kept, where a per-point refinement would have drifted to 5 ms / 30 ms."""

    def __init__(self, base: CostModel, weight: float = DEFAULT.refine_weight, relax: float = DEFAULT.refine_relax):
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


def round_order(sizes: Sequence[int], r: int) -> tuple[int, ...]:
    """The order round ``r`` times ``sizes`` in: rotated by ``r``, reversed on odd rounds, so that no size is
    always timed first, last, or right after the same other size.

    Example: ``round_order((1, 2, 4), 0)`` -> ``(1, 2, 4)``; ``1`` -> ``(1, 4, 2)``; ``2`` -> ``(4, 1, 2)``.
    """
    s = tuple(sizes)
    r %= 2 * len(s)
    rotated = s[r % len(s):] + s[: r % len(s)]
    return rotated[::-1] if r % 2 else rotated


def fastest(samples: dict[int, list[float]]) -> dict[int, float]:
    """Per size, its fastest timing: load only ever adds time, so the minimum is the best estimate."""
    return {k: min(v) for k, v in samples.items() if v}


def disagreement(samples: dict[int, list[float]], agreement: float = DEFAULT.agreement) -> str | None:
    """Why the fastest timings are not yet trusted, or None when, for every size, the two fastest of its
    timings agree within ``agreement`` (so the minimum is not one lucky or one slowed reading).

    Example: ``{1: [.010, .011], 16: [.030, .050, .070]}`` -> ``"the two fastest timings of 16 tokens
    differ by 1.67x"``.
    """
    for k, v in sorted(samples.items()):
        if len(v) < 2:
            return f"{len(v)} usable timing(s) of {_tokens(k)}"
        a, b = sorted(v)[:2]
        if b > agreement * a:
            return f"the two fastest timings of {_tokens(k)} differ by {b / a:.2f}x"
    return None


def _tokens(k: int) -> str:
    return f"{k} token" + ("s" if k != 1 else "")


def capped_curve(times: dict[int, float]) -> dict[int, float]:
    """``times`` with every ``t(k)`` at most ``k * t(1)``: ``k`` one-token forwards compute the same as one of
    ``k`` tokens, so a larger figure can only come from load. Needs ``times[1]``.

    Example: ``{1: .010, 4: .060, 16: .100}`` -> ``{1: .010, 4: .040, 16: .100}``.
    """
    t1 = times[1]
    return {k: min(t, k * t1) for k, t in times.items()}


@contextlib.contextmanager
def calibration_progress(desc: str) -> Iterator[object | None]:
    """While entered, :func:`calibrate_curve` counts its timed runs on a progress bar (``tqdm.auto``: a notebook
    widget or a line on stderr) labelled ``desc``, shown once it has run :data:`PROGRESS_DELAY` seconds and
    removed when done. None (no bar) when transformers' progress bars are switched off
    (``transformers.utils.logging.disable_progress_bar()``). Yields the bar or None."""
    from transformers.utils import logging as hf_logging

    bar = None
    if hf_logging.is_progress_bar_enabled():
        from tqdm.auto import tqdm

        bar = tqdm(desc=desc, unit="step", delay=DEFAULT.progress_delay, leave=False, dynamic_ncols=True)
    token = _BAR.set(bar)
    try:
        yield bar
    finally:
        _BAR.reset(token)
        if bar is not None:
            bar.close()


def _counted(time_one: Callable[[int], float], bar) -> Callable[[int], float]:
    """``time_one`` that also advances ``bar`` (None: ``time_one`` itself)."""
    if bar is None:
        return time_one

    def timed(k: int) -> float:
        seconds = time_one(k)
        bar.update(1)
        return seconds

    return timed


def _round(time_one: Callable[[int], float], order: Sequence[int], over: Callable[[], bool],
           enough: Callable[[int, float], bool] | None = None) -> dict[int, float] | None:
    """One round's timings, ``{k: seconds}`` in ``order``; None when ``over()`` says time is up before the
    round ends. ``enough(k, seconds)``: True ends the round after timing ``k`` (what was timed is returned)."""
    times = {}
    for k in order:
        if over():
            return None
        times[k] = time_one(k)
        if enough is not None and enough(k, times[k]):
            break
    return times


def _steep(time_one: Callable[[int], float], probe: float, ratio: float, agreement: float = DEFAULT.agreement,
           drift: float = DEFAULT.drift) -> Callable[[int, float], bool]:
    """The first round's stop test: ``k`` >= 2 rows took at least ``ratio`` one-token forwards (``probe``), and
    timed once more beside a new probe, the two timings of ``k`` agree within ``agreement``, the probes within
    ``drift``, and the lesser of each pair still says so. A size that does not pass lets the round go on, and the
    next steep size is tested the same way; a machine whose load slows some timings and not others (the pairs
    disagree) is timed at every size, as before."""

    def enough(k: int, seconds: float) -> bool:
        if k < 2 or seconds < ratio * probe:
            return False
        again, one = time_one(k), time_one(1)
        return (_agree(seconds, again, agreement) and _agree(probe, one, drift)
                and min(seconds, again) >= ratio * min(probe, one))

    return enough


def _agree(a: float, b: float, factor: float) -> bool:
    """Whether two timings of the same thing agree within ``factor`` (the larger at most ``factor`` times the other)."""
    return max(a, b) <= factor * min(a, b)


def calibrate_curve(time_one: Callable[[int], float], sizes: Sequence[int],
                    clock: Callable[[], float] = time.perf_counter, rounds: int = DEFAULT.rounds,
                    attempts: int = DEFAULT.attempts, max_seconds: float = DEFAULT.max_seconds, agreement: float = DEFAULT.agreement,
                    drift: float = DEFAULT.drift, stop_ratio: float | None = DEFAULT.stop_ratio) -> CostModel:
    """A cost curve from ``time_one(k) -> seconds`` (one timed run of whatever is priced: a forward of ``k``
    new tokens, or a whole decoding step with ``k`` rows), robust to a machine that other work slows.

    Example: ``calibrate_curve(lambda k: 0.010 + 0.001 * k, (1, 2, 4))`` -> ``CostModel(1: 11.0 ms,
    2: 12.0 ms, 4: 14.0 ms, steps)`` after 1 + 2 * 4 calls of ``time_one``. With ``lambda k: 0.010 * k`` and
    sizes ``(1, 2, 4, 8, 16)``: 8 rows cost 8x the probe (and again, timed once more), so 16 is never timed:
    ``CostModel(1: 10.0 ms, 2: 20.0 ms, 4: 40.0 ms, 8: 80.0 ms, steps)`` covering 16 rows (priced 160 ms)."""
    sizes = tuple(sorted({int(k) for k in sizes} | {1}))
    covers = sizes[-1]
    if rounds < 1 or attempts < 1 or agreement < 1.0 or drift < 1.0 or (stop_ratio is not None and stop_ratio <= 1):
        raise ValueError(f"calibrate_curve needs rounds, attempts >= 1, agreement, drift >= 1 and stop_ratio > 1 "
                         f"or None; got {rounds}, {attempts}, {agreement}, {drift}, {stop_ratio}")
    start = clock()

    def over() -> bool:
        return clock() - start > max_seconds

    bar = _BAR.get()  # calibration_progress's, when one is entered
    if bar is not None:
        bar.total = 1 + rounds * (len(sizes) + 1)  # a quiet machine's runs: the first probe, then the rounds
    time_one = _counted(time_one, bar)
    usable: dict[int, list[float]] = {k: [] for k in sizes}
    every: dict[int, list[float]] = {k: [] for k in sizes}
    probe = time_one(1)
    why = None
    for done in range(rounds * attempts):
        if bar is not None and done >= rounds:  # a round more than a quiet machine's
            bar.total += len(sizes) + 1
        enough = None
        if not done and stop_ratio is not None:  # round 0 times the sizes in increasing order
            enough = _steep(time_one, probe, stop_ratio, agreement, drift)
        times = _round(time_one, round_order(sizes, done), over if done else (lambda: False), enough)
        if times is None:  # out of time: the unfinished round is dropped
            why = f"{disagreement(usable, agreement)}; stopped after {max_seconds:.0f} s"
            break
        if len(times) < len(sizes):  # stopped early: the sizes above its last are never timed
            sizes = sizes[: len(times)]
            usable, every = {k: usable[k] for k in sizes}, {k: every[k] for k in sizes}
        if bar is not None and not done:  # what round 0 ran (2 runs per stop test), then a quiet machine's rest
            bar.total = bar.n + 1 + (rounds - 1) * (len(sizes) + 1)
        after = time_one(1)
        for k, t in times.items():
            every[k].append(t)
        if _agree(probe, after, drift):
            for k, t in times.items():
                usable[k].append(t)
        probe = after
        if done + 1 < rounds:
            continue
        why = disagreement(usable, agreement)
        if why is None:
            return CostModel(sorted(fastest(usable).items()), steps=True, covers=covers)
        if done + 1 == rounds:
            log.info("the machine looks busy (%s): timing more rounds", why)
        if over():
            why += f"; stopped after {max_seconds:.0f} s"
            break
    curve = CostModel(sorted(capped_curve(fastest(every)).items()), provisional=True, steps=True, covers=covers)
    log.warning("the cost curve stays provisional: the machine was busy while it was measured (%s); it is "
                "measured again later in this process, and not saved", why)
    return curve


def estimate_calibration_seconds(model, sizes: Sequence[int], rounds: int = DEFAULT.rounds) -> float:
    """A rough forecast of :func:`measure_cost_curve`'s time on a quiet machine, for the line that says a
    calibration is starting: each forward reads every weight once (about 10 GB/s on a CPU, 1 TB/s on a GPU)
    or computes ``2 * parameters * k`` operations (about 100 GFLOP/s on a CPU, 100 TFLOP/s on a GPU),
    whichever takes longer. Example: SmolLM2-135M in fp32 on a 2-core CPU: about 2 s."""
    params = sum(p.numel() for p in model.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gpu = model.device.type != "cpu"
    bandwidth, flops, overhead = (1e12, 1e14, 0.01) if gpu else (1e10, 1e11, 0.0)

    def forward(k: int) -> float:
        return overhead + max(nbytes / bandwidth, 2.0 * params * k / flops)

    per_round = sum(forward(k) for k in sizes) + forward(1)
    return forward(128) + forward(1) + rounds * per_round


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


def device_name(device: torch.device) -> str:
    """``"cpu"``, or the device and the accelerator's name, e.g. ``"cuda:0 NVIDIA H200"``."""
    if device.type == "cuda" and torch.cuda.is_available():
        return f"{device} {torch.cuda.get_device_name(device)}"
    return str(device)


_VOLATILE = ("transformers_version", "dtype", "torch_dtype")


def config_digest(config) -> str:
    """A hash of the model's architecture: its config without the path it came from, the transformers
    version that wrote it, the dtype (kept apart) or a GGUF file's quantisation entry, plus the attention
    implementation it runs."""
    d = {k: v for k, v in config.to_dict().items() if not k.startswith("_") and k not in _VOLATILE}
    if (d.get("quantization_config") or {}).get("quant_method") == "gguf":
        del d["quantization_config"]  # transformers de-quantises GGUF weights: they run as plain ones
    d["attention"] = getattr(config, "_attn_implementation", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:20]


def curve_fingerprint(model, variant: str = "") -> dict:
    """Everything a measured curve depends on: the architecture (:func:`config_digest`), the weights' dtype,
    the device, torch's thread count, the CPU model, the torch and transformers versions (their kernels
    differ), what was timed (``variant``) and :data:`CURVE_FORMAT`. Two processes with equal fingerprints
    share a persisted curve."""
    import transformers

    return {"format": CURVE_FORMAT, "model": f"{type(model).__name__} {config_digest(model.config)}",
            "dtype": str(model.dtype), "device": device_name(model.device),
            "threads": torch.get_num_threads(), "cpu": cpu_model(), "torch": torch.__version__,
            "transformers": transformers.__version__, "variant": variant}


@dataclass(frozen=True)
class StoredCurve:
    """A curve read back from disk, with where and when it was measured."""

    curve: CostModel
    path: str
    measured: str
    seconds: float


class CurveStore:
    """Measured cost curves on disk: ``<folder>/curves/<hash of the fingerprint>.json``, one per fingerprint.

    A file holds ``{"kind", "format", "fingerprint", "points": [[k, seconds], ...],
    "measured": ISO time, "seconds": the calibration's time}``. :meth:`load` returns a curve only when
    the file parses, its format is :data:`CURVE_FORMAT`, its fingerprint is the asked one exactly, every
    point is ``(k >= 1, 0 < seconds < inf)`` with ``k`` increasing, and it covers ``max_rows``; anything else
    is treated as absent (and measured again, which overwrites it). Provisional curves are never written.
    """

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
        return StoredCurve(curve, path, str(data.get("measured", "")), float(data.get("seconds", 0.0) or 0.0))

    def save(self, fingerprint: dict, curve: CostModel, seconds: float) -> str | None:
        """Write ``curve`` for ``fingerprint``; the file's path, or None (a provisional curve, or a failed
        write, which is logged)."""
        if curve.provisional:
            return None
        path = self.path(fingerprint)
        data = {"kind": _CURVE_KIND, "format": CURVE_FORMAT, "fingerprint": fingerprint,
                "points": [[k, t] for k, t in curve.points], "steps": curve.steps, "covers": curve.covers,
                "measured": datetime.datetime.now().isoformat(timespec="seconds"),
                "seconds": round(seconds, 3)}
        return path if user_cache.write_json_atomic(path, data) else None


def _parse_curve(data: dict, fingerprint: dict) -> CostModel | None:
    """The curve in a persisted record, or None when any check of :class:`CurveStore` fails."""
    if (data.get("kind") != _CURVE_KIND or data.get("format") != CURVE_FORMAT
            or data.get("fingerprint") != fingerprint or data.get("provisional")):
        return None
    points = data.get("points")
    if not isinstance(points, list) or not points:
        return None
    try:
        pts = [(int(k), float(t)) for k, t in points]
    except (TypeError, ValueError):
        return None
    ks = [k for k, _ in pts]
    if (any(not isinstance(k, int) or isinstance(k, bool) for k, _ in points) or ks[0] < 1
            or any(b <= a for a, b in zip(ks, ks[1:])) or any(not 0 < t < math.inf for _, t in pts)):
        return None
    covers = data.get("covers", ks[-1])  # absent in a file written before calibrations stopped early
    if not isinstance(covers, int) or isinstance(covers, bool) or covers < ks[-1]:
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
        """Where curves persist, or None when persisting is off (here, for this call, or by the
        environment)."""
        on = self.persist if persist is None else persist
        return CurveStore(self.folder) if on and user_cache.persist_enabled() else None

    def get(self, model, max_rows: int, measure: Callable[[tuple[int, ...]], CostModel], variant: str = "",
            persist: bool | None = None) -> CostModel:
        """``variant``: what else the measurement depends on (``"step"``: whole decoding steps timed, a static
        cache's buckets); a pinned curve applies to every variant. ``persist``: this call's choice over the registry's (False
        for a measurement that is not the machine's, e.g. one timed with an injected clock). A measurement that
        runs longer than :data:`PROGRESS_DELAY` shows a progress bar (:func:`calibration_progress`): one timed on an
        injected clock takes milliseconds and never does."""
        with self._lock:
            curves = self._curves.get(model, {})
            pinned = curves.get(model_key(model))
            if pinned is not None and pinned.pinned:
                return pinned.curve
            key = model_key(model) + ((variant,) if variant else ())
            entry = curves.get(key)
            fits = entry is not None and (entry.pinned or entry.curve.covers >= max_rows)
            if fits and not self._retry_due(entry):
                return entry.curve
            store = self.store(persist)
            fingerprint = curve_fingerprint(model, variant) if store is not None else None
            stored = store.load(fingerprint, max_rows) if store is not None else None
            if stored is not None:
                log.info("using the cost curve measured for this model on %s (%s; %s)", stored.measured,
                         describe(stored.curve), stored.path)
                self._keep(model, key, _Entry(stored.curve, False, self.clock()))
                return stored.curve
            sizes = calibration_sizes(max_rows)
            about = max(1.0, estimate_calibration_seconds(model, sizes))
            if entry is None:
                log.info("calibrating the cost curve once for this model%s (about %.0f s) ...",
                         "" if store is not None else " in this process", about)
            else:
                log.info("measuring the cost curve again, %s (about %.0f s) ...",
                         "the last one was provisional" if entry.curve.provisional
                         else f"for {max_rows} rows (it covered {entry.curve.covers})", about)
            t = time.perf_counter()
            desc = f"lookahead calibration ({variant or 'forwards'}), once per model"
            with calibration_progress(desc):
                curve = measure(sizes)
            seconds = time.perf_counter() - t
            again = entry is not None and entry.curve.provisional and curve.provisional
            retries = entry.retries + 1 if again else 0
            self._keep(model, key, _Entry(curve, False, self.clock(), retries))
            path = store.save(fingerprint, curve, seconds) if store is not None else None
            log.info("calibrated in %.1f s: %s%s", seconds, describe(curve),
                     f"; saved to {path}" if path else "; provisional" if curve.provisional else "")
            return curve

    def _retry_due(self, entry: _Entry) -> bool:
        return (entry.curve.provisional and not entry.pinned
                and self.clock() - entry.measured_at >= self.retry_after * 2 ** entry.retries)

    def _keep(self, model, key: tuple, entry: _Entry) -> None:
        self._curves.setdefault(model, {})[key] = entry

    def pin(self, model, points: Sequence[tuple[int, float]]) -> CostModel:
        curve = points if isinstance(points, CostModel) else CostModel(points)
        with self._lock:
            self._keep(model, model_key(model), _Entry(curve, True))
        return curve

    def known(self, model, variant: str | None = None) -> CostModel | None:
        """The curve kept for ``model`` (``variant``: what was timed; None: a pinned curve, else the one a
        ``LookaheadDecoder`` measures, :data:`STEP_VARIANT`), or None."""
        curves = self._curves.get(model, {})
        entry = curves.get(model_key(model))
        if variant is None and entry is None:  # the decoder's: with grouped attention on a CPU, else plain steps
            entry = curves.get(model_key(model) + (STEP_VARIANT + "+grouped",))
            variant = None if entry is not None else STEP_VARIANT
        if variant:
            entry = curves.get(model_key(model) + (variant,))
        return None if entry is None else entry.curve

    def __reduce__(self):
        """Pickle / deepcopy: the default registry stays the default one; another becomes an empty one with
        the same persistence (its keys are live model objects, which do not travel)."""
        if self is DEFAULT_CALIBRATIONS:
            return (_default_calibrations, ())
        return (Calibrations, (self.persist, self.folder))

    def forget(self, model=None) -> None:
        with self._lock:
            if model is None:
                self._curves = weakref.WeakKeyDictionary()
            else:
                self._curves.pop(model, None)


DEFAULT_CALIBRATIONS = Calibrations(persist=True)


def _default_calibrations() -> Calibrations:
    return DEFAULT_CALIBRATIONS


def set_cost_curve(model, points: Sequence[tuple[int, float]], calibrations: Calibrations | None = None
                   ) -> CostModel:
    """Use ``points`` as ``model``'s cost curve from now on, as if calibration had measured it.

    For a curve measured earlier (``decoder.stats.cost_curve``) or a known one (a flat curve for a
    GPU). Example: ``set_cost_curve(model, [(1, 0.010), (64, 0.011)])``.
    """
    return (calibrations or DEFAULT_CALIBRATIONS).pin(model, points)


