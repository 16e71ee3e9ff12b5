"""What the command line and the examples show while they work: the library's log lines, each long phase's
start and time, and a torch thread count that suits a busy machine.

The library never prints: it logs on the ``"lookahead"`` logger (loading, converting, calibrating). The one
thing it draws is a progress bar while a calibration that runs over a second times its steps (once per model;
``cost.calibration_progress``; transformers' ``disable_progress_bar()`` turns it off as it does transformers'
own). :func:`log_to_stderr` shows those INFO lines on stderr, one plain line each::

    loaded SmolLM2-135M-Instruct from its converted weights in 1.2 s (~/.cache/lookahead/models/...)
    calibrating the cost curve once for this model (about 2 s) ...
    calibrated in 2.3 s: t(1) = 52.0 ms; 16 tokens 1.6x, 64 tokens 3.1x; saved to ~/.cache/lookahead/...

Threads: torch's CPU threads wait for each other at every operation, so when other work holds a core, the
thread that shares it stalls every step: on a 2-core machine kept busy by other work, one thread ran a
model 5-20x faster than two. :func:`set_threads` (``"auto"``) keeps torch's default unless other work holds
cores torch would use right now (:func:`busy_cores`), and then runs on the cores left (at least one),
saying so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass

log = logging.getLogger("lookahead")


class _StderrHandler(logging.StreamHandler):
    """A StreamHandler that writes to whatever ``sys.stderr`` is when a line is logged (it may be replaced,
    e.g. by a test's capture), one plain message per line."""

    def __init__(self):
        super().__init__(sys.stderr)
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # StreamHandler assigns it; the live sys.stderr is used instead
        pass


def log_to_stderr(level: int = logging.INFO) -> logging.Handler:
    """Show the ``"lookahead"`` logger's lines from ``level`` up on stderr, as plain messages, for the rest of
    the process (once: a second call returns the same handler)."""
    for h in log.handlers:
        if isinstance(h, _StderrHandler):
            return h
    handler = _StderrHandler()
    log.addHandler(handler)
    if not log.level or log.level > level:
        log.setLevel(level)
    return handler


@contextlib.contextmanager
def logging_to_stderr(level: int = logging.INFO):
    """:func:`log_to_stderr` for the duration of a ``with`` block; the logger's handlers and level are put
    back afterwards (the command line runs inside one)."""
    before, handlers = log.level, list(log.handlers)
    log_to_stderr(level)
    try:
        yield
    finally:
        for h in list(log.handlers):
            if h not in handlers:
                log.removeHandler(h)
        log.setLevel(before)


@dataclass
class Timing:
    """What :func:`phase` measured: ``seconds`` is set when the phase ends."""

    what: str
    seconds: float = 0.0


@contextlib.contextmanager
def phase(what: str):
    """Log ``what ...`` when a long phase starts and ``what: 2.3 s`` when it ends (INFO, ``"lookahead"``);
    yields a :class:`Timing` whose ``seconds`` the end sets. Example::

        with phase("plain generate") as plain:
            model.generate(...)
        print(plain.seconds)
    """
    log.info("%s ...", what)
    timing = Timing(what)
    t = time.perf_counter()
    try:
        yield timing
    finally:
        timing.seconds = time.perf_counter() - t
    log.info("%s: %.1f s", what, timing.seconds)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_cores(interval: float = 0.25) -> float | None:
    """How many cores other work keeps busy right now: ``/proc/stat``'s busy share of all cores over
    ``interval`` seconds while this process sleeps, else the 1-minute load average (which also counts this
    process's own recent work); None where the system tells neither."""
    def sample() -> tuple[int, int] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle

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
    """Torch threads for a machine with ``cores`` of which other work keeps ``load`` busy: ``default`` when
    the cores it would use are free, else the cores left over (rounded, at least 1).

    Examples: ``auto_threads(2, 2, 0.3)`` -> 2; ``auto_threads(2, 2, 1.0)`` -> 1; ``auto_threads(8, 16, 9.0)``
    -> 7; ``auto_threads(2, 2, None)`` -> 2.
    """
    if load is None:
        return default
    free = cores - load
    if free >= default - 0.5:
        return default
    return max(1, min(default, int(free + 0.5)))


def set_threads(requested: int | str | None = "auto") -> int:
    """Set torch's CPU threads: a number as given; ``"auto"`` as :func:`auto_threads` chooses, logging why
    when it differs from torch's default; None leaves torch's choice. Returns the count in use."""
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
                 "instead of %d (--threads N to choose)", load, cores, chosen, "" if chosen == 1 else "s",
                 default)
    return chosen


def contention_hint(threads: int) -> str | None:
    """A line for a run that keeps its thread count (a benchmark) on a machine that looks busy, else None."""
    cores, load = usable_cores(), busy_cores()
    if load is None or auto_threads(threads, cores, load) == threads:
        return None
    better = auto_threads(threads, cores, load)
    return (f"the machine looks busy (other work keeps {load:.1f} of {cores} cores busy): timings on "
            f"{threads} torch threads will be slow and noisy; --threads {better} suits it better")
