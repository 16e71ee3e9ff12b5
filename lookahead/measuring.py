"""What measuring a cost curve does besides timing it: its sizes, a forecast of its seconds, a progress bar,
and the write that saves it. Imported only to measure a curve (``calibrate.py``) or save one."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar

from ._tuning import DEFAULT

log = logging.getLogger("lookahead")


def calibration_sizes(max_rows: int) -> tuple[int, ...]:
    """Powers of two from 1 up to the first >= ``max_rows`` (and >= 16). Example: 17 -> ``(1, 2, 4, 8, 16, 32)``."""
    return tuple(1 << i for i in range((max(max_rows, 16) - 1).bit_length() + 1))


PROGRESS: ContextVar = ContextVar("lookahead_calibration_bar", default=None)


@contextlib.contextmanager
def calibration_progress(desc: str) -> Iterator[object | None]:
    """While entered, :func:`calibrate.calibrate_curve` counts its timed runs on a ``tqdm.auto`` bar labelled
    ``desc``, shown after ``DEFAULT.progress_delay`` seconds. Yields the bar, or None when transformers' bars are off."""
    from transformers.utils import logging as hf_logging

    bar = None
    if hf_logging.is_progress_bar_enabled():
        from tqdm.auto import tqdm

        bar = tqdm(desc=desc, unit="step", delay=DEFAULT.progress_delay, leave=False, dynamic_ncols=True)
    token = PROGRESS.set(bar)
    try:
        yield bar
    finally:
        PROGRESS.reset(token)
        if bar is not None:
            bar.close()


def estimate_calibration_seconds(model, sizes: Sequence[int], rounds: int = DEFAULT.rounds) -> float:
    """A rough forecast of a calibration's seconds on a quiet machine, for the line announcing it: each forward reads
    every weight once or computes ``2 * parameters * k`` operations, whichever takes longer."""
    params = sum(p.numel() for p in model.parameters())
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth, flops, overhead = (1e12, 1e14, 0.01) if model.device.type != "cpu" else (1e10, 1e11, 0.0)

    def forward(k: int) -> float:
        return overhead + max(nbytes / bandwidth, 2.0 * params * k / flops)

    per_round = sum(forward(k) for k in sizes) + forward(1)
    return forward(128) + forward(1) + rounds * per_round


def announced_measurement(model, max_rows: int, measure: Callable[[tuple[int, ...]], object], variant: str, entry,
                          store) -> tuple[object, float]:
    """(curve, seconds) of ``measure(sizes)`` for ``cost.Calibrations.get``, announced in the log with a forecast
    and counted on a progress bar. ``entry``: the curve kept before (provisional, or for fewer rows), or None."""
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
    with calibration_progress(f"lookahead calibration ({variant or 'forwards'}), once per model"):
        curve = measure(sizes)
    return curve, time.perf_counter() - t


def write_json_atomic(path: str, data: dict) -> bool:
    """Write ``data`` as JSON to ``path`` (through a temporary file, renamed); False (logged), never raising,
    on failure."""
    folder = os.path.dirname(path)
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return True
    except OSError as err:
        log.warning("could not write %s (%s); it will be measured again next time", path, err)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        return False
