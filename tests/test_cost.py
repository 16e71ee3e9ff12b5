"""Cost curves: the curve itself, calibration kept per model in a registry object, opt-in refinement
that cannot ratchet, and an injected clock. Every figure here is exact: no test reads the real clock.
Calibration under load and persisted curves: ``tests/test_calibration.py``."""

from __future__ import annotations

import dataclasses
import itertools
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lookahead import LookaheadDecoder
from lookahead._tuning import Tuning
from lookahead.cost import Calibrations, CostModel, set_cost_curve
from lookahead.learned import LearnedCurve
from lookahead.measuring import calibration_sizes

IDS = torch.tensor([[3, 10, 11, 12, 10, 11, 12]])
_TUNING_FIELDS = {f.name for f in dataclasses.fields(Tuning)}


def _decoder(**settings) -> LookaheadDecoder:
    """A decoder from settings of either kind: ``Tuning`` fields go to ``_tuning=``, the rest as given."""
    tuning = {k: settings.pop(k) for k in list(settings) if k in _TUNING_FIELDS}
    return LookaheadDecoder(_tuning=Tuning(**tuning) if tuning else None, **settings)


def known(registry: Calibrations, model) -> CostModel | None:
    """The curve ``registry`` kept first for ``model`` (measured, pinned or learnt), or None."""
    kept = [e.curve() if isinstance(e, LearnedCurve) else e.curve for e in registry._curves.get(model, {}).values()]
    return kept[0] if kept else None


class FakeClock:
    """Each reading advances by ``tick`` seconds: every measured forward takes exactly ``tick``."""

    def __init__(self, tick: float = 0.001):
        self.tick, self._t = tick, itertools.count()

    def __call__(self) -> float:
        return next(self._t) * self.tick


def test_cost_model_interpolates_and_extrapolates():
    c = CostModel([(1, 1.0), (3, 2.0)])
    assert c(2) == pytest.approx(1.5) and c(5) == pytest.approx(3.0)
    assert CostModel([(1, 0.010), (2, 0.015), (4, 0.016)])(3) == pytest.approx(0.0155)  # the docstring's
    assert CostModel([(1, 0.010), (2, 0.015), (4, 0.016)])(8) == pytest.approx(0.018)
    assert CostModel([(1, 2.0), (2, 1.0)]).points == ((1, 2.0), (2, 2.0))  # made monotone
    with pytest.raises(ValueError):
        CostModel([(0, 1.0)])


def test_learned_curve_prices_unseen_sizes_from_the_prior_and_ignores_a_sizes_first_timing():
    """The docstring's example, then: a size's first timing is not used (one-time costs), its second is; a larger
    size timed cheaper lowers a smaller one; the curve is capped at k one-row steps."""
    c = LearnedCurve(0.25, [(1, 0.010), (4, 0.012)])
    assert [round(float(c.curve()(k)) * 1e3, 3) for k in (1, 2, 3, 4, 8, 9, 20)] == [10, 12, 12, 12, 22, 24.5, 52]
    assert not c.observe(6, 0.5)  # the first timing of 6 rows: ignored
    assert float(c.curve()(6)) == pytest.approx(0.017)
    assert c.observe(6, 0.013) and float(c.curve()(6)) == pytest.approx(0.013)
    assert not c.observe(6, 0.020)  # slower than the fastest: nothing changes
    c.observe(2, 1.0)
    assert c.observe(2, 0.5) and float(c.curve()(2)) == pytest.approx(0.012)  # 4 rows cost less: so do 2
    fresh = LearnedCurve(0.1)
    assert float(fresh.curve()(4) / fresh.curve()(1)) == pytest.approx(1.3)  # nothing seen: the prior's ratios
    with pytest.raises(ValueError, match="slope"):
        LearnedCurve(0.0)


def test_a_call_learns_its_curve_from_its_steps_and_a_new_process_reads_it_back(tmp_path, monkeypatch):
    """No synthetic timing: a call with no curve known prices with the prior and its steps teach the curve; the
    curve is kept on disk, and a new registry (a new process) starts from it."""
    from lookahead import LookaheadDecoder

    from tiny import tiny_model

    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path))
    model = tiny_model("llama")
    ids = torch.tensor([[3, 10, 11, 12, 13, 14] * 5])
    plain = model.generate(ids, max_new_tokens=40, do_sample=False)
    registry = Calibrations(persist=True)
    decoder = LookaheadDecoder(_calibrations=registry, _tuning=Tuning(learn_keep_after=1))
    out = model.generate(ids, max_new_tokens=40, do_sample=False, custom_generate=decoder)
    assert torch.equal(out, plain)
    assert decoder.stats.cost_curve == ((1, 1.0), (2, 1.1))  # priced with the prior: nothing was timed before
    learned = known(registry, model)
    assert learned is not None and float(learned(1)) < 1.0  # now in seconds, from the steps
    assert os.listdir(tmp_path / "curves")
    again = Calibrations(persist=True)
    decoder = LookaheadDecoder(_calibrations=again)
    model.generate(ids, max_new_tokens=8, do_sample=False, custom_generate=decoder)
    assert decoder.stats.cost_curve[0][1] < 1.0  # read back: priced in seconds from the first step


def test_calibration_is_kept_per_model_in_the_registry_it_is_given(tiny_models):
    model = tiny_models("llama")
    registry = Calibrations(persist=False)
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        dec = LookaheadDecoder(_calibrations=registry, _clock=FakeClock(), _tuning=Tuning(calibrate=True))
        model.generate(IDS, custom_generate=dec, max_new_tokens=10, eos_token_id=None)
        first = len(calls)
        curve = known(registry, model)
        assert curve is not None and dec.stats.cost_curve == curve.points
        # a fake clock: every forward "took" one tick, so the measured curve is flat at exactly 1 ms
        assert [t for _, t in curve.points] == pytest.approx([0.001] * len(curve.points))
        # a prefill, an untimed 2-row step (calibrate.step_timer), then a one-token probe and 2 rounds of 7 sizes
        # (1 + max_draft_tokens = 64 rows) and a probe, trusted at once: 1 + 1 + 1 + 2 * 8 forwards. Ticks between the
        # call's own two readings: the untimed step's two, calibrate_curve's start, two readings per timed forward,
        # a deadline check before each forward of round 2: 2 + 1 + 2 * 17 + 7, and the second reading
        assert first - dec.stats.target_calls == 1 + 1 + 17 and dec.stats.time_calibration == pytest.approx(0.045)
        calls.clear()
        again = LookaheadDecoder(_calibrations=registry, _clock=FakeClock(), _tuning=Tuning(calibrate=True))
        model.generate(IDS, custom_generate=again, max_new_tokens=10, eos_token_id=None)
        assert len(calls) == again.stats.target_calls  # no second calibration
        assert again.stats.time_calibration == pytest.approx(0.001)  # one tick: a look-up, nothing measured
        assert known(Calibrations(), model) is None  # another registry knows nothing of it
    finally:
        handle.remove()


def test_calibration_covers_the_rows_a_step_can_feed(tiny_models):
    from lookahead.cache import NgramTrie

    assert calibration_sizes(1) == (1, 2, 4, 8, 16)
    assert calibration_sizes(17) == (1, 2, 4, 8, 16, 32)
    assert calibration_sizes(33) == (1, 2, 4, 8, 16, 32, 64)
    model = tiny_models("gpt2")
    registry = Calibrations(persist=False)
    dec = _decoder(copy_nodes=0, recycle_k=0, calibrate=True, _calibrations=registry,
                   _clock=FakeClock())  # 1 + 16 tree rows
    model.generate(IDS, custom_generate=dec, max_new_tokens=4, eos_token_id=None)
    assert [k for k, _ in dec.stats.cost_curve] == [1, 2, 4, 8, 16, 32]
    kept = known(registry, model)
    small = _decoder(tree_nodes=4, copy_nodes=4, recycle_k=0, calibrate=True,
                     _calibrations=registry)  # the kept curve serves
    model.generate(IDS, custom_generate=small, max_new_tokens=4, eos_token_id=None)
    assert known(registry, model) is kept and len(small.stats.cost_curve) == 6
    # a shared memory store doubles the tree, the window adds its rows: 1 + 32 + 3*3 + 4*3 = 54 rows
    big = _decoder(store=NgramTrie(12), window=4, window_ngram=4, window_candidates=3, copy_nodes=0, recycle_k=0,
                   calibrate=True, _calibrations=registry, _clock=FakeClock())
    assert big.policy.max_rows() == 54
    # the copy and model sources add 56 and 63, but a step verifies at most 63 (max_draft_tokens "auto" before a
    # call widens it): 1 + 63 + 4*3 rows
    assert _decoder(store=NgramTrie(12), window=4, window_ngram=4, window_candidates=3).policy.max_rows() == 76
    model.generate(IDS, custom_generate=big, max_new_tokens=4, eos_token_id=None)
    assert [k for k, _ in big.stats.cost_curve] == [1, 2, 4, 8, 16, 32, 64]
    assert known(registry, model) is not kept  # replaced: one per model


def test_a_pinned_curve_is_never_measured(tiny_models):
    model = tiny_models("qwen2")
    registry = Calibrations()
    set_cost_curve(model, [(1, 0.01), (2, 0.02)], registry)
    dec = LookaheadDecoder(_calibrations=registry, _clock=FakeClock())  # needs 17 rows, more than the pinned 2
    model.generate(IDS, custom_generate=dec, max_new_tokens=6, eos_token_id=None)
    # one tick between the pricing's two readings: a look-up, nothing measured
    assert dec.stats.cost_curve == ((1, 0.01), (2, 0.02)) and dec.stats.time_calibration == pytest.approx(0.001)


def test_explicit_curve_or_fixed_budget_skip_calibration(tiny_models):
    model = tiny_models("qwen2")
    registry = Calibrations()
    dec = LookaheadDecoder(cost_curve=((1, 0.01), (64, 0.02)), _calibrations=registry)
    model.generate(IDS, custom_generate=dec, max_new_tokens=10, eos_token_id=None)
    assert dec.stats.cost_curve == ((1, 0.01), (64, 0.02))
    fixed = _decoder(adaptive=False, _calibrations=registry)
    model.generate(IDS, custom_generate=fixed, max_new_tokens=10, eos_token_id=None)
    assert fixed.stats.cost_curve is None
    assert known(registry, model) is None


@pytest.mark.parametrize("tick", [0.0001, 0.01])
def test_call_counts_do_not_depend_on_the_clock(tiny_models, tick):
    """The same curve gives the same steps whatever the forwards take (a pinned curve learns nothing)."""
    model = tiny_models("llama")
    ids = torch.tensor([[3, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10]])
    curve = ((1, 0.0025), (2, 0.0027), (16, 0.0030), (64, 0.0036))
    budgets = []
    for clock in (FakeClock(tick), FakeClock(0.0025)):
        dec = LookaheadDecoder(cost_curve=curve, _clock=clock)
        model.generate(ids, custom_generate=dec, max_new_tokens=24, eos_token_id=None)
        budgets.append(dec.stats.budgets)
    assert budgets[0] == budgets[1] and any(n for n, _ in budgets[0])


def test_a_given_curve_is_made_non_decreasing_and_positive():
    pts = CostModel([(1, 0.003), (2, 0.002), (4, 0.004)]).points
    assert all(t > 0 for _, t in pts) and np.all(np.diff([t for _, t in pts]) >= 0)


def test_a_measured_curve_reads_as_steps_at_its_measured_prices():
    c = CostModel([(1, 0.010), (2, 0.008), (4, 0.012)], steps=True)  # the docstring's
    assert [float(c(k)) for k in (0, 1, 2, 3, 4)] == pytest.approx([0.010, 0.010, 0.008, 0.012, 0.012])
    assert float(c(6)) == pytest.approx(0.016)  # beyond the last point: the last segment's 2 ms per row
    assert c.points == ((1, 0.010), (2, 0.008), (4, 0.012))  # as measured: 2 rows stay cheaper than one
    assert c != CostModel(c.points) and repr(c).endswith("steps)")
    assert float(CostModel(c.points)(3)) == pytest.approx(0.011)  # interpolated, after 2 rows read as 10 ms


def test_a_step_that_two_rows_make_cheaper_verifies_a_node_however_unlikely():
    from lookahead.budget import choose_nodes

    steps = CostModel([(1, 0.010), (2, 0.008), (4, 0.012)], steps=True)
    keep, rate = choose_nodes(np.array([0.0, 0.0]), steps)
    assert keep.tolist() == [0] and rate == pytest.approx(1 / 0.008)
    keep, rate = choose_nodes(np.array([0.0, 0.0]), CostModel(steps.points))  # read as 10 ms: not worth it
    assert keep.tolist() == [] and rate == pytest.approx(1 / 0.010)


def test_the_step_timer_runs_one_untimed_two_row_step_before_it_times_any(tiny_models):
    """A process's first multi-row step pays one-time costs (5-7x a one-row step on a CPU); the calibration's first
    timing of 2 rows must not be that one."""
    from lookahead import compat
    from lookahead.calibrate import step_timer
    from lookahead.kv import new_cache
    from lookahead.verify import Verifier

    model = tiny_models("llama")

    def call(keeps_logits: bool) -> SimpleNamespace:  # what step_timer reads of a call
        return SimpleNamespace(model=model, device=model.device, dtype=model.dtype, tuning=Tuning(recycle_k=4),
                               cache_kwarg=compat.cache_kwarg_name(model), keeps_logits=keeps_logits, chains=False,
                               verifier=Verifier(model.device, model.config.vocab_size, [None], None, False))

    rows = []
    handle = model.register_forward_pre_hook(lambda m, args, kwargs: rows.append(kwargs["input_ids"].shape[1]),
                                             with_kwargs=True)
    try:
        clock = FakeClock()
        time_one = step_timer(call(compat.supports_logits_to_keep(model)), lambda: new_cache(model), clock, 8, model,
                              context=16)
        assert rows == [16, 2]  # the prefill, then the untimed 2-row step
        assert time_one(2) == pytest.approx(0.001) and rows == [16, 2, 2]
        assert step_timer(call(True), lambda: new_cache(model), clock, 1, model,
                          context=16) and rows[3:] == [16]  # one row only: nothing to warm
    finally:
        handle.remove()
