"""Measuring a cost curve with timed steps, robust to a busy machine. Imported only by an explicit measurement
(``python -m lookahead warmup --calibrate``, ``Tuning.calibrate``); a call learns its curve from its own steps."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from . import compat
from ._tuning import DEFAULT
from .checks import vocabulary_size
from .cost import CostModel
from .kv import keep_entries, new_cache
from .measuring import PROGRESS
from .packing import StepMask

log = logging.getLogger("lookahead")


def round_order(sizes: Sequence[int], r: int) -> tuple[int, ...]:
    """The order round ``r`` times ``sizes`` in: rotated by ``r``, reversed on odd rounds, so no size is always timed
    first, last or after the same size. Example: rounds 0-2 of ``(1, 2, 4)``: ``(1, 2, 4)``, ``(1, 4, 2)``,
    ``(4, 1, 2)``."""
    s = tuple(sizes)
    r %= 2 * len(s)
    rotated = s[r % len(s):] + s[: r % len(s)]
    return rotated[::-1] if r % 2 else rotated


def fastest(samples: dict[int, list[float]]) -> dict[int, float]:
    """Per size, its fastest timing: load only ever adds time, so the minimum is the best estimate."""
    return {k: min(v) for k, v in samples.items() if v}


def disagreement(samples: dict[int, list[float]], agreement: float = DEFAULT.agreement) -> str | None:
    """Why the fastest timings are not yet trusted, or None when for every size the two fastest agree within
    ``agreement``. Example:
    ``{1: [.010, .011], 16: [.030, .050, .070]}`` -> ``"the two fastest timings of 16 tokens differ by 1.67x"``."""
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
    """``times`` (which holds ``times[1]``) with every ``t(k)`` at most ``k * t(1)``: ``k`` one-token forwards compute
    as much, so more can only come from load. Example:
    ``{1: .010, 4: .060, 16: .100}`` -> ``{1: .010, 4: .040, 16: .100}``."""
    t1 = times[1]
    return {k: min(t, k * t1) for k, t in times.items()}


def _counted(time_one: Callable[[int], float], bar) -> Callable[[int], float]:
    """``time_one`` that also advances ``bar``."""

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
    """The first round's stop test ``enough(k, seconds)``: ``k >= 2`` rows took at least ``ratio`` probes (one-token
    forwards, ``probe``), and timed once more beside a new probe, the two timings of ``k`` agree within ``agreement``,
    the probes within ``drift``, and the lesser of each pair still says so. Otherwise the round goes on."""

    def enough(k: int, seconds: float) -> bool:
        if k < 2 or seconds < ratio * probe:
            return False
        again, one = time_one(k), time_one(1)
        return (_agree(seconds, again, agreement) and _agree(probe, one, drift)
                and min(seconds, again) >= ratio * min(probe, one))

    return enough


def _agree(a: float, b: float, factor: float) -> bool:
    """Whether the larger of two timings is at most ``factor`` times the other."""
    return max(a, b) <= factor * min(a, b)


def calibrate_curve(time_one: Callable[[int], float], sizes: Sequence[int],
                    clock: Callable[[], float] = time.perf_counter, rounds: int = DEFAULT.rounds,
                    attempts: int = DEFAULT.attempts, max_seconds: float = DEFAULT.max_seconds,
                    agreement: float = DEFAULT.agreement, drift: float = DEFAULT.drift,
                    stop_ratio: float | None = DEFAULT.stop_ratio) -> CostModel:
    """A cost curve from ``time_one(k) -> seconds`` (one timed run of whatever is priced: a forward of ``k`` new tokens,
    or a whole step of ``k`` rows), robust to a machine that other work slows: interleaved rounds, probes between them
    that must agree, the fastest timings; provisional when they never agree. Example: ``lambda k: 0.010 * k`` over sizes
    ``(1, 2, 4, 8, 16)``: 8 rows cost 8x the probe (twice), so 16 is never timed:
    ``CostModel(1: 10.0 ms, ..., 8: 80.0 ms, steps)`` covering 16 rows."""
    sizes = tuple(sorted({int(k) for k in sizes} | {1}))
    covers = sizes[-1]
    if rounds < 1 or attempts < 1 or agreement < 1.0 or drift < 1.0 or (stop_ratio is not None and stop_ratio <= 1):
        raise ValueError(f"calibrate_curve needs rounds, attempts >= 1, agreement, drift >= 1 and stop_ratio > 1 "
                         f"or None; got {rounds}, {attempts}, {agreement}, {drift}, {stop_ratio}")
    start = clock()

    def over() -> bool:
        return clock() - start > max_seconds

    bar = PROGRESS.get()  # calibration_progress's, when one is entered
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
            if _agree(probe, after, drift):  # the probes bracketing the round agree
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
    log.warning("the cost curve stays provisional: the machine was busy while it was measured (%s); it is "
                "measured again later in this process, and not saved", why)
    return CostModel(sorted(capped_curve(fastest(every)).items()), provisional=True, steps=True, covers=covers)


def step_timer(call, cache_factory, clock, max_rows: int, runner, context: int = 128):
    """``time_one(k) -> seconds``: one decoding step of ``k`` rows after a ``context``-token prefix, end to end as the
    loop runs it (``k`` > 1: mask, forward through ``runner``, argmax and top-k readout, a KV keep; ``k`` = 1: a plain
    step). Timed entries are cropped again; an untimed 2-row step first pays one-time costs."""
    model, device, dtype = call.model, call.device, call.dtype
    limit = getattr(model.config, "max_position_embeddings", None) or 4096
    context = max(1, min(context, limit - max_rows - 1))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocabulary_size(model), (1, context + max_rows), generator=gen).to(device)
    cache = cache_factory()
    kwarg, keeps_logits, k_top = call.cache_kwarg, call.keeps_logits, call.tuning.recycle_k
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    mask = StepMask(max_rows + 1, context + max_rows + 2, dtype, device)
    masks = not call.chains
    with torch.no_grad():
        model(input_ids=ids[:, :context], use_cache=True, **{kwarg: cache})

    def time_one(k: int) -> float:
        pos = torch.arange(context, context + k, device=device)[None]
        kwargs = {kwarg: cache, "use_cache": True}
        with torch.no_grad():
            sync()
            t = clock()
            m = None if k == 1 or not masks else mask(context, 1, np.arange(-1, k - 2))  # a chain of k - 1 nodes
            logits = compat.last_logits(runner if k > 1 else model, ids[:, context : context + k], pos, m, kwargs,
                                        keeps_logits, k)
            rows = np.array([k])
            call.verifier.read_rows(logits, rows, rows, k_top if k > 1 else 0)
            if k > 1:
                keep_entries(cache, k, [0, k - 1])  # the pending token and an accepted node: a gather
            sync()
            elapsed = clock() - t
            compat.crop_cache(cache, 2 if k > 1 else 1)
        return elapsed

    if max_rows >= 2:
        time_one(2)
    return time_one


def measure_curve(decoder, call, variant: str, layouts: bool) -> CostModel:
    """Time ``call``'s model's steps now (``Tuning.calibrate``): the curve, kept where ``decoder`` finds it on later
    calls, and (``layouts``) the CPU layouts planned from it (``call.runner`` set)."""
    from transformers import DynamicCache

    model, base, tuning = call.model, call.runner, decoder.tuning
    rows = decoder.policy.first_rows()
    persist = None if decoder.clock is time.perf_counter else False  # an injected clock is not this machine's
    factory = (lambda: new_cache(model)) if call.window is None else DynamicCache
    timer = []  # one prefilled timer per runner

    def measure(sizes, runner=base):
        if not timer or timer[0][0] < max(sizes) or timer[0][1] is not runner:
            timer[:] = [(max(sizes), runner, step_timer(call, factory, decoder.clock, max(sizes), runner))]
        return calibrate_curve(timer[0][2], sizes, clock=decoder.clock)

    curve = decoder.calibrations.get(model, rows, measure, variant, persist=persist)
    if layouts:
        from .cpu.layouts import plan_steps

        curve, call.runner, decoder.stats.linear_layout = plan_steps(model, curve, measure, decoder.calibrations,
                                                                     rows, tuning, persist, base, variant)
    return curve
