"""Calibration that survives a busy machine (``calibrate.calibrate_curve``) and curves kept across processes
(``cost.Calibrations`` with a ``CurveStore``). Every timing is scripted: no test reads the real clock."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from lookahead import user_cache
from lookahead.calibrate import calibrate_curve, capped_curve, disagreement, round_order
from lookahead.cost import (
    CURVE_FORMAT,
    Calibrations,
    CostModel,
    CurveStore,
    curve_fingerprint,
)
from lookahead.measuring import calibration_progress, write_json_atomic

from tiny import tiny_model

SIZES = (1, 2, 4, 8, 16)
TRUE = {1: 0.010, 2: 0.011, 4: 0.013, 8: 0.016, 16: 0.022}


class Ticks:
    """A clock that moves only when a test moves it (``now``): deadlines never fire unless a test wants."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Timer:
    """``time_one``: the true time of ``k`` times the slow-down ``factor(call index, k)`` scripts."""

    def __init__(self, factor=lambda i, k: 1.0, clock: Ticks | None = None, tick: float = 0.0):
        self.factor, self.calls, self.clock, self.tick = factor, [], clock, tick

    def __call__(self, k: int) -> float:
        i = len(self.calls)
        self.calls.append(k)
        if self.clock is not None:
            self.clock.now += self.tick
        return TRUE[k] * self.factor(i, k)


ROUND = len(SIZES) + 1  # time_one calls per round: every size, then a one-token probe


def test_round_order_rotates_and_reverses():
    assert [round_order((1, 2, 4), r) for r in range(4)] == [(1, 2, 4), (1, 4, 2), (4, 1, 2), (4, 2, 1)]
    firsts = {round_order(SIZES, r)[0] for r in range(2 * len(SIZES))}
    assert firsts == set(SIZES)  # no size is always timed first


def test_a_quiet_machine_gives_the_true_curve_in_two_interleaved_rounds():
    timer = Timer()
    curve = calibrate_curve(timer, SIZES, clock=Ticks())
    assert curve.points == tuple(TRUE.items()) and not curve.provisional
    assert len(timer.calls) == 1 + 2 * ROUND  # a probe, then 2 rounds of the sizes and a probe: trusted at once
    rounds = [timer.calls[1 + r * ROUND: r * ROUND + ROUND] for r in range(2)]
    assert all(sorted(r) == list(SIZES) for r in rounds) and rounds[0] != rounds[1]
    assert timer.calls[ROUND] == timer.calls[2 * ROUND] == 1  # each round ends with a probe


def test_a_calibrated_curve_keeps_a_size_that_costs_less_than_one_row():
    true = {1: 0.010, 2: 0.008, 4: 0.009, 8: 0.016, 16: 0.022}  # a BLAS whose one-row product is slow
    curve = calibrate_curve(lambda k: true[k], SIZES, clock=Ticks())
    assert curve.steps and curve.points == tuple(true.items()) and float(curve(3)) == 0.009


def test_one_slowed_round_costs_one_more_round_and_none_of_its_timings():
    """Another process ran during round 2 only (its sizes 4x slower, its probes not): after it no size's two
    timings agree, so a third round is timed, and every size's curve point comes from rounds 1 and 3."""
    timer = Timer(lambda i, k: 4.0 if ROUND + 1 <= i < 2 * ROUND else 1.0)
    curve = calibrate_curve(timer, SIZES, clock=Ticks())
    assert curve.points == tuple(TRUE.items()) and not curve.provisional
    assert len(timer.calls) == 1 + 3 * ROUND


def test_a_round_whose_probes_disagree_is_not_used():
    """A one-token probe 3x slower than the one before it: the machine's speed changed, so the rounds on
    either side of it are dropped (the first one's timings are all too fast here), and two more rounds are
    timed before any size has two usable timings."""
    timer = Timer(lambda i, k: (0.5 if 1 <= i < ROUND else 3.0 if i == ROUND else 1.0))
    curve = calibrate_curve(timer, SIZES, clock=Ticks())
    assert curve.points == tuple(TRUE.items()) and not curve.provisional
    assert len(timer.calls) == 1 + 4 * ROUND


def test_busy_then_quiet_measures_again_and_trusts_the_quiet_rounds(caplog):
    """The first two rounds' sizes are slowed 1.9x and 3.1x (their probes are not): after round 2 the two
    fastest timings of every size differ by 1.63x, after round 3 by 1.9x; round 4 is the second quiet one."""
    slow = {0: 1.9, 1: 3.1}
    timer = Timer(lambda i, k: 1.0 if k == 1 or i > 2 * ROUND else slow[(i - 1) // ROUND])
    with caplog.at_level(logging.INFO, logger="lookahead"):
        curve = calibrate_curve(timer, SIZES, clock=Ticks())
    assert curve.points == tuple(TRUE.items()) and not curve.provisional
    assert len(timer.calls) == 1 + 4 * ROUND
    assert "the machine looks busy (the two fastest timings of 2 tokens differ by 1.63x)" in caplog.text


def test_a_machine_busy_throughout_gives_a_provisional_capped_curve_after_bounded_rounds(caplog):
    """Every timing of a size > 1 is slowed by a different factor, up to 40x: no two agree, ever."""
    timer = Timer(lambda i, k: 1.0 if k == 1 else 1.5 + (i % 13) * 3.0)
    with caplog.at_level(logging.INFO, logger="lookahead"):
        curve = calibrate_curve(timer, SIZES, clock=Ticks(), attempts=3, stop_ratio=None)
    assert len(timer.calls) == 1 + 2 * 3 * ROUND  # no more than rounds * attempts rounds
    assert curve.provisional
    times = dict(curve.points)
    assert times[1] == TRUE[1] and all(times[k] <= k * TRUE[1] + 1e-12 for k in SIZES)
    assert all(times[k] >= TRUE[k] for k in SIZES)  # load only adds time
    assert "stays provisional" in caplog.text


def test_a_calibration_counts_every_timed_run_on_its_progress_bar():
    """Quiet: the bar's total is the 2 rounds it takes; busy for 2 rounds: it grows by a round each time one
    more is timed, and ends full."""
    for factor, rounds in ((lambda i, k: 1.0, 2),
                           (lambda i, k: 1.0 if k == 1 or i > 2 * ROUND else (1.9, 3.1)[(i - 1) // ROUND], 4)):
        timer = Timer(factor)
        with calibration_progress("calibrating") as bar:
            assert bar is not None
            calibrate_curve(timer, SIZES, clock=Ticks())
            assert bar.n == bar.total == len(timer.calls) == 1 + rounds * ROUND


def test_no_progress_bar_when_transformers_progress_bars_are_off():
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        with calibration_progress("calibrating") as bar:
            assert bar is None
            assert calibrate_curve(Timer(), SIZES, clock=Ticks()).points == tuple(TRUE.items())
    finally:
        hf_logging.enable_progress_bar()


def test_the_deadline_bounds_a_calibration_on_a_crawling_machine():
    clock = Ticks()
    timer = Timer(lambda i, k: 1.0 if k == 1 else 2.0 + (i % 7), clock=clock, tick=1.0)  # each forward: 1 s
    curve = calibrate_curve(timer, SIZES, clock=clock, max_seconds=10.0, stop_ratio=None)
    assert curve.provisional
    # a probe and the first round (ends at 7 s, always finished), then the second round's forwards while
    # the clock reads at most 10 s: 4 of them; the unfinished round is dropped
    assert len(timer.calls) == 1 + (len(SIZES) + 1) + 4
    assert dict(curve.points)[16] <= 16 * dict(curve.points)[1]


STEEP = {1: 0.010, 2: 0.020, 4: 0.040, 8: 0.080, 16: 0.160}  # each row costs a one-token forward (a docstring's)


def test_a_steep_curve_stops_timing_sizes_that_cost_too_many_forwards():
    """8 rows cost 8x the probe, and again when re-timed: 16 is never timed, in any round; the curve covers 16 rows
    by its last segment, and the progress bar's total is the runs made."""
    calls = []

    def time_one(k):
        calls.append(k)
        return STEEP[k]

    with calibration_progress("calibrating") as bar:
        curve = calibrate_curve(time_one, SIZES, clock=Ticks())
        assert bar.n == bar.total == len(calls)
    assert 16 not in calls
    assert calls[:7] == [1, 1, 2, 4, 8, 8, 1]  # probe, round 0 from the smallest up, 8 re-timed beside a probe
    assert len(calls) == 1 + 4 + 2 + 1 + 4 + 1  # then round 0's probe, round 1 and its probe
    assert curve == CostModel([(k, STEEP[k]) for k in (1, 2, 4, 8)], steps=True, covers=16)
    assert float(curve(16)) == pytest.approx(0.160) and not curve.provisional
    assert calibrate_curve(lambda k: STEEP[k], SIZES, clock=Ticks(), stop_ratio=None).points == tuple(STEEP.items())
    assert calibrate_curve(lambda k: TRUE[k], SIZES, clock=Ticks()).covers == 16  # not steep: every size timed
    with pytest.raises(ValueError, match="stop_ratio"):
        calibrate_curve(lambda k: STEEP[k], SIZES, stop_ratio=1.0)


def test_a_steep_size_whose_second_timing_disagrees_lets_the_next_steep_size_stop_the_round():
    steep = {**STEEP, 32: 0.320}
    calls = []

    def time_one(k):
        calls.append(k)
        return 0.120 if len(calls) == 6 else steep[k]  # 8 rows re-timed slower (1.5x): no stop at 8

    curve = calibrate_curve(time_one, (*SIZES, 32), clock=Ticks())
    assert calls[:10] == [1, 1, 2, 4, 8, 8, 1, 16, 16, 1] and 32 not in calls
    assert curve.max_k == 16 and curve.covers == 32


@pytest.mark.parametrize("slow", ["size", "probe"])
def test_one_slowed_timing_cannot_stop_a_calibration(slow):
    """Round 0 sees 2 rows cost 12x the probe once (load), but re-timed they cost 1.1x (or the re-timed probe was
    slowed instead, so the two probes disagree): the round goes on to every size, as on a quiet machine."""
    calls = []

    def time_one(k):
        calls.append(k)
        i = len(calls) - 1
        if slow == "size" and i == 2:  # round 0's first timing of 2 rows
            return 0.120
        if slow == "probe" and i in (2, 4):  # 2 rows slowed, then the probe beside its re-timing
            return 0.120 if i == 2 else 0.040
        return TRUE[k]

    curve = calibrate_curve(time_one, SIZES, clock=Ticks())
    assert calls[:5] == [1, 1, 2, 2, 1] and set(calls) == set(SIZES)
    assert curve.points == tuple(TRUE.items()) and curve.covers == 16


def test_a_curve_that_covers_more_than_it_measured_is_kept_and_read_back(tmp_path, llama):
    store = CurveStore(str(tmp_path))
    fingerprint = curve_fingerprint(llama)
    curve = CostModel([(1, 0.010), (2, 0.020), (4, 0.040), (8, 0.080)], steps=True, covers=64)
    path = store.save(fingerprint, curve, 1.0)
    assert store.load(fingerprint, 64).curve == curve and store.load(fingerprint, 65) is None
    with open(path) as f:
        data = json.load(f)
    del data["covers"]  # a file written before calibrations stopped early: it covers its largest point
    with open(path, "w") as f:
        json.dump(data, f)
    assert store.load(fingerprint, 8).curve.covers == 8 and store.load(fingerprint, 9) is None
    for bad in (4, "64", True):
        data["covers"] = bad
        with open(path, "w") as f:
            json.dump(data, f)
        assert store.load(fingerprint, 8) is None, bad
    registry = Calibrations()
    measured = []

    def measure(sizes):
        measured.append(sizes)
        return curve

    assert registry.get(llama, 64, measure) is curve and registry.get(llama, 40, measure) is curve
    assert measured == [(1, 2, 4, 8, 16, 32, 64)]  # covered: not measured again for 40 or 64 rows


def test_capped_curve_and_disagreement():
    assert capped_curve({1: 0.010, 4: 0.060, 16: 0.100}) == {1: 0.010, 4: 0.040, 16: 0.100}
    assert disagreement({1: [0.010, 0.011], 16: [0.030, 0.050, 0.070]}) == (
        "the two fastest timings of 16 tokens differ by 1.67x")
    assert disagreement({1: [0.010, 0.011, 0.5], 16: [0.030, 0.031]}) is None
    assert disagreement({1: [0.010]}) == "1 usable timing(s) of 1 token"
    with pytest.raises(ValueError, match="rounds"):
        calibrate_curve(Timer(), SIZES, rounds=0)


def test_provisional_counts_in_equality():
    curve = CostModel([(1, 0.01), (16, 0.02)], provisional=True)
    assert curve != CostModel([(1, 0.01), (16, 0.02)]) and curve == CostModel(curve.points, provisional=True)
    assert repr(curve).endswith(", provisional)") and not CostModel([(1, 0.01)]).provisional


# --- Calibrations: what is kept, where, and when it is measured again ----------------------------------


class Measure:
    """A ``measure(sizes)`` that returns scripted curves and counts its calls."""

    def __init__(self, *curves: CostModel):
        self.curves, self.calls = list(curves), []

    def __call__(self, sizes):
        self.calls.append(sizes)
        curve = self.curves[min(len(self.calls), len(self.curves)) - 1]
        return CostModel([(k, float(curve(k))) for k in sizes], provisional=curve.provisional)


QUIET = CostModel([(1, 0.010), (64, 0.030)])
BUSY = CostModel([(1, 0.010), (64, 0.200)], provisional=True)


@pytest.fixture
def llama():
    return tiny_model("llama")


def test_a_measured_curve_is_persisted_and_a_new_process_uses_it(tmp_path, llama, caplog):
    first = Measure(QUIET)
    with caplog.at_level(logging.INFO, logger="lookahead"):
        curve = Calibrations(persist=True, folder=str(tmp_path)).get(llama, 17, first)
    assert len(first.calls) == 1 and "calibrating the cost curve once for this model (about" in caplog.text
    assert "calibrated in" in caplog.text and "saved to" in caplog.text
    files = os.listdir(tmp_path / "curves")
    assert len(files) == 1 and files[0].endswith(".json")
    again, other_object = Measure(QUIET), tiny_model("llama")  # another process: a new registry, a new model
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lookahead"):
        loaded = Calibrations(persist=True, folder=str(tmp_path)).get(other_object, 17, again)
    assert again.calls == [] and loaded == curve
    assert "using the cost curve measured for this model on" in caplog.text


def test_a_persisted_curve_keeps_its_reading_and_an_older_format_is_measured_again(tmp_path, llama):
    store = CurveStore(str(tmp_path))
    fingerprint = curve_fingerprint(llama)
    measured = CostModel([(1, 0.010), (2, 0.008), (4, 0.012)], steps=True)
    path = store.save(fingerprint, measured, 1.0)
    with open(path) as f:
        data = json.load(f)
    assert data["format"] == CURVE_FORMAT == 3 and data["steps"] is True
    assert store.load(fingerprint, 4).curve == measured
    store.save(fingerprint, CostModel(measured.points), 1.0)  # a given curve's reading is kept as well
    assert not store.load(fingerprint, 4).curve.steps
    data["format"] = 2  # format 2 kept its points made non-decreasing: what was measured is lost
    with open(path, "w") as f:
        json.dump(data, f)
    assert store.load(fingerprint, 4) is None


def test_nothing_is_persisted_when_asked_not_to(tmp_path, llama, monkeypatch):
    Calibrations(folder=str(tmp_path)).get(llama, 17, Measure(QUIET))  # one's own registry: memory only
    Calibrations(persist=False, folder=str(tmp_path)).get(llama, 17, Measure(QUIET))
    Calibrations(persist=True, folder=str(tmp_path)).get(llama, 17, Measure(QUIET), persist=False)
    monkeypatch.setenv("LOOKAHEAD_PERSIST", "0")
    Calibrations(persist=True, folder=str(tmp_path)).get(llama, 17, Measure(QUIET))
    assert not (tmp_path / "curves").exists()


def test_a_persisted_curve_that_does_not_fit_is_measured_again(tmp_path, llama, monkeypatch):
    registry = Calibrations(persist=True, folder=str(tmp_path))
    registry.get(llama, 17, Measure(QUIET))  # sizes 1..32
    store = CurveStore(str(tmp_path))
    path = store.path(curve_fingerprint(llama))
    fresh = Measure(QUIET)
    Calibrations(persist=True, folder=str(tmp_path)).get(llama, 40, fresh)  # 64 rows: more than the file has
    assert len(fresh.calls) == 1 and store.load(curve_fingerprint(llama), 40) is not None  # overwritten

    def damaged(edit) -> int:
        data = json.loads(open(path).read())
        edit(data)
        with open(path, "w") as f:
            json.dump(data, f)
        m = Measure(QUIET)
        Calibrations(persist=True, folder=str(tmp_path)).get(llama, 17, m)
        return len(m.calls)

    assert damaged(lambda d: d.update(format=CURVE_FORMAT + 1)) == 1  # another version
    assert damaged(lambda d: d.update(points=[[1, -0.01], [2, 0.02]])) == 1  # not a curve
    assert damaged(lambda d: d.update(points=[[2, 0.01], [1, 0.02]])) == 1
    assert damaged(lambda d: d["fingerprint"].update(cpu="another")) == 1  # another machine's
    assert damaged(lambda d: d.update(provisional=True)) == 1  # never trusted across processes
    assert damaged(lambda d: None) == 0  # intact again after the last measurement
    with open(path, "w") as f:
        f.write('{"points": [[1, 0.0')  # half a file
    m = Measure(QUIET)
    Calibrations(persist=True, folder=str(tmp_path)).get(llama, 17, m)
    assert len(m.calls) == 1
    torch.set_num_threads(torch.get_num_threads() + 1)  # another thread count: another fingerprint
    try:
        m = Measure(QUIET)
        Calibrations(persist=True, folder=str(tmp_path)).get(llama, 17, m)
        assert len(m.calls) == 1 and len(os.listdir(tmp_path / "curves")) == 2
    finally:
        torch.set_num_threads(torch.get_num_threads() - 1)


def test_a_provisional_curve_is_never_persisted_and_is_retried_later_in_the_process(tmp_path, llama):
    clock = Ticks()
    registry = Calibrations(persist=True, folder=str(tmp_path), clock=clock, retry_after=30.0)
    measure = Measure(BUSY, BUSY, QUIET)
    assert registry.get(llama, 17, measure).provisional
    assert not (tmp_path / "curves").exists()
    clock.now = 29.0
    assert registry.get(llama, 17, measure).provisional and len(measure.calls) == 1  # not yet due
    clock.now = 30.0
    assert registry.get(llama, 17, measure).provisional and len(measure.calls) == 2  # due: measured again
    clock.now = 30.0 + 59.0
    registry.get(llama, 17, measure)
    assert len(measure.calls) == 2  # provisional twice in a row: the next try waits twice as long
    clock.now = 30.0 + 60.0
    curve = registry.get(llama, 17, measure)
    assert len(measure.calls) == 3 and not curve.provisional
    # the refresh replaced the whole curve: no point of the busy measurement survives in it
    assert curve.points == Measure(QUIET)(curve_sizes(curve)).points
    assert len(os.listdir(tmp_path / "curves")) == 1  # the trusted one is saved
    clock.now = 10**6
    registry.get(llama, 17, measure)
    assert len(measure.calls) == 3  # a trusted curve is kept


def curve_sizes(curve: CostModel) -> tuple[int, ...]:
    return tuple(k for k, _ in curve.points)


def test_a_pinned_curve_is_never_persisted(tmp_path, llama):
    registry = Calibrations(persist=True, folder=str(tmp_path))
    registry.pin(llama, [(1, 0.01), (2, 0.02)])
    assert registry.get(llama, 64, Measure(QUIET)).points == ((1, 0.01), (2, 0.02))
    assert not (tmp_path / "curves").exists()


def test_the_fingerprint_names_what_the_curve_depends_on(llama):
    same = curve_fingerprint(tiny_model("llama"))
    assert curve_fingerprint(llama) == same  # another object of the same architecture
    assert curve_fingerprint(llama.to(torch.float32)) != same  # the weights' dtype
    assert curve_fingerprint(tiny_model("llama", layers=3)) != same  # the architecture
    assert curve_fingerprint(tiny_model("llama"), "step") != same  # what was timed
    assert set(same) == {"format", "model", "dtype", "device", "threads", "cpu", "torch", "transformers",
                         "variant"}


def test_the_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path / "mine"))
    assert user_cache.cache_dir() == str(tmp_path / "mine")
    monkeypatch.delenv("LOOKAHEAD_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache.cache_dir() == str(tmp_path / "xdg" / "lookahead")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert user_cache.cache_dir() == str(tmp_path / "home" / ".cache" / "lookahead")
    for off in ("0", "false", "No", "off"):
        monkeypatch.setenv("LOOKAHEAD_PERSIST", off)
        assert not user_cache.persist_enabled()
    monkeypatch.setenv("LOOKAHEAD_PERSIST", "1")
    assert user_cache.persist_enabled()


def test_the_tests_never_touch_the_users_cache():
    """conftest points LOOKAHEAD_CACHE at a folder of the test session."""
    home = os.path.join(os.path.expanduser("~"), ".cache", "lookahead")
    assert not user_cache.cache_dir().startswith(home) and "lookahead-cache" in user_cache.cache_dir()


def test_a_failed_write_is_logged_and_not_raised(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="lookahead"):
        assert not write_json_atomic(str(blocker / "x.json"), {"a": 1})
    assert "could not write" in caplog.text
    assert write_json_atomic(str(tmp_path / "ok.json"), {"a": 1})
    assert user_cache.read_json(str(tmp_path / "ok.json")) == {"a": 1}
    assert set(os.listdir(tmp_path)) == {"file", "ok.json"}  # no temporary file left behind


def test_the_process_default_persists_and_survives_pickling():
    import pickle

    from lookahead.cost import DEFAULT_CALIBRATIONS

    assert DEFAULT_CALIBRATIONS.persist and not Calibrations().persist
    assert pickle.loads(pickle.dumps(DEFAULT_CALIBRATIONS)) is DEFAULT_CALIBRATIONS
    copy = pickle.loads(pickle.dumps(Calibrations(persist=True, folder="/x")))
    assert (copy.persist, copy.folder) == (True, "/x")
