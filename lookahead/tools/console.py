"""What the command line and the examples show while they work: the ``"lookahead"`` logger's lines on stderr, each
long phase's start and time, and a torch thread count that suits a busy machine (torch's threads wait for each other
at every operation: one sharing a core stalls every step)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from types import SimpleNamespace

log = logging.getLogger("lookahead")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time (a test may capture it)."""

    def emit(self, record):
        self.stream = sys.stderr
        super().emit(record)


def log_to_stderr(level: int = logging.INFO) -> logging.Handler:
    """Show the ``"lookahead"`` logger's lines from ``level`` up on stderr for the rest of the process (a second
    call returns the same handler)."""
    for h in log.handlers:
        if isinstance(h, _StderrHandler):
            return h
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    if not log.level or log.level > level:
        log.setLevel(level)
    return handler


@contextlib.contextmanager
def logging_to_stderr(level: int = logging.INFO):
    """:func:`log_to_stderr` for a ``with`` block."""
    before, handlers = log.level, list(log.handlers)
    log_to_stderr(level)
    try:
        yield
    finally:
        for h in [h for h in log.handlers if h not in handlers]:
            log.removeHandler(h)
        log.setLevel(before)


@contextlib.contextmanager
def phase(what: str):
    """Log ``what ...`` at the start and ``what: 2.3 s`` at the end; yields an object whose ``seconds`` is set then."""
    log.info("%s ...", what)
    timing, t = SimpleNamespace(what=what, seconds=0.0), time.perf_counter()
    try:
        yield timing
    finally:
        timing.seconds = time.perf_counter() - t
    log.info("%s: %.1f s", what, timing.seconds)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where known)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_cores(interval: float = 0.25) -> float | None:
    """How many cores other work keeps busy: ``/proc/stat``'s busy share over ``interval`` seconds while this
    process sleeps, else the 1-minute load average; None where the system tells neither."""

    def sample() -> tuple[int, int] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        return sum(fields[:8]), sum(fields[3:5])  # all, idle + iowait

    first = sample()
    if first is not None:
        time.sleep(interval)
        second = sample()
        total, idle = second[0] - first[0], second[1] - first[1]
        if total > 0:
            return (os.cpu_count() or 1) * (total - idle) / total
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def auto_threads(default: int, cores: int, load: float | None) -> int:
    """Torch threads for ``cores`` cores of which other work keeps ``load`` busy: ``default`` when enough are free,
    else the cores left (rounded, at least 1)."""
    if load is None or cores - load >= default - 0.5:
        return default
    return max(1, min(default, int(cores - load + 0.5)))


def set_threads(requested: int | str | None = "auto") -> int:
    """Set torch's CPU threads (process-wide): a number; ``"auto"``: :func:`auto_threads`' choice, logged when it
    differs from torch's default; None: torch's choice. Returns the count in use."""
    import torch

    if requested is None:
        return torch.get_num_threads()
    if requested != "auto":
        torch.set_num_threads(int(requested))
        return int(requested)
    default, cores, load = torch.get_num_threads(), usable_cores(), busy_cores()
    chosen = auto_threads(default, cores, load)
    if chosen != default:
        torch.set_num_threads(chosen)
        log.info("the machine looks busy (other work keeps %.1f of %d cores busy): torch runs on %d thread%s "
                 "instead of %d (--threads N to choose)", load, cores, chosen, "" if chosen == 1 else "s", default)
    return chosen


def contention_hint(threads: int) -> str | None:
    """A warning for a run that keeps its thread count (a benchmark) on a machine that looks busy, else None."""
    cores, load = usable_cores(), busy_cores()
    better = auto_threads(threads, cores, load)
    if better == threads:
        return None
    return (f"the machine looks busy (other work keeps {load:.1f} of {cores} cores busy): timings on {threads} "
            f"torch threads will be slow and noisy; --threads {better} suits it better")
