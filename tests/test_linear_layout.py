"""Linear layers computed the other way round or through oneDNN (``linear_layout.py``): the same outputs, the same
decoding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead import decoder as decoder_mod
from lookahead import linear_layout as layout
from lookahead.cost import Calibrations, CostModel, step_variant
from lookahead.linear_layout import (
    LINEAR,
    MAX_ROWS,
    ONEDNN,
    TRANSPOSED,
    LinearPlan,
    StepLinears,
    TransposedLinears,
    linear_modules,
    onednn_available,
    onednn_linear,
    plan_layouts,
    transposed_linear,
)

from tiny import TINY_ARCHS, tiny_model

REPETITIVE = [3, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11]
LINEAR_MS = ((1, 80), (2, 126), (4, 126), (8, 116), (16, 142))
TRANSPOSED_MS = ((1, 80), (2, 69), (4, 79), (8, 120), (16, 124))
ONEDNN_MS = ((1, 88), (2, 92), (4, 99), (8, 106), (16, 132))
needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN linear (mkldnn)")


def _curve(ms, steps: bool = False) -> CostModel:
    return CostModel([(k, t / 1e3) for k, t in ms], steps=steps)


def _ms(curve: CostModel) -> list[float]:
    return [round(t * 1e3, 1) for _, t in curve.points]


def _linear(bias: bool = True) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(24, 40, bias=bias)


def test_transposed_linear_docstring_example_and_bias():
    w = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert transposed_linear(torch.tensor([[1.0, 2.0]]), w, None).tolist() == [[1.0, 3.0]]
    assert transposed_linear(torch.tensor([[1.0, 2.0]]), w, torch.tensor([0.5, -1.0])).tolist() == [[1.5, 2.0]]
    x = torch.randn(2, 4, 3).transpose(1, 2)  # rows [2, 3, 4], not contiguous
    w = torch.randn(5, 4)
    y = transposed_linear(x, w, None)
    assert y.shape == (2, 3, 5) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
def test_two_to_max_rows_come_out_transposed_and_the_others_untouched(bias):
    head = _linear(bias)
    calls = []
    head.register_forward_hook(lambda m, a, o: calls.append(a[0].shape[-2]))  # what nn.Linear itself got
    x = torch.randn(1, 20, 24)
    with torch.no_grad():
        want = {m: F.linear(x[:, :m], head.weight, head.bias) for m in (1, 2, 16, 17)}
        with TransposedLinears([head], max_rows=16):
            got = {m: head(x[:, :m]) for m in (1, 2, 16, 17)}
        after = head(x[:, :2])
    assert calls[:4] == [1, 0, 0, 17]  # 2 and 16 rows: nn.Linear got none
    for m in (2, 16):
        assert got[m].shape == want[m].shape and got[m].is_contiguous()
        torch.testing.assert_close(got[m], want[m], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1], want[1]) and torch.equal(got[17], want[17])  # one row and above the cap: nn.Linear
    assert torch.equal(after, want[2])  # the hooks are gone on exit


def test_left_alone_where_a_gradient_is_recorded():
    head = _linear()
    x = torch.randn(3, 24)
    with TransposedLinears([head]):
        head(x).sum().backward()  # gradients on: nn.Linear, differentiable
        with torch.no_grad():
            z = head(x[None])  # 3 rows under no_grad: transposed
    assert head.weight.grad is not None
    torch.testing.assert_close(z[0], F.linear(x, head.weight, head.bias).detach(), rtol=1e-5, atol=1e-5)


def test_a_hook_put_first_sees_the_real_rows():
    head, seen = _linear(), []
    with torch.no_grad(), TransposedLinears([head]):
        head.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[-2]), prepend=True)
        head(torch.randn(1, 5, 24))
    assert seen == [5]


def test_plan_layouts_docstring_examples():
    linear, transposed, onednn = (_curve(ms, steps=True) for ms in (LINEAR_MS, TRANSPOSED_MS, ONEDNN_MS))
    plan, curve = plan_layouts(linear, transposed, onednn)
    assert plan == LinearPlan(((1, LINEAR), (4, TRANSPOSED), (16, ONEDNN)))
    assert plan.describe() == "2-4 rows transposed, 5-16 rows oneDNN" and plan.most_rows(TRANSPOSED) == 4
    assert [plan.kind(r) for r in (1, 2, 4, 5, 8, 16, 17)] == [LINEAR, TRANSPOSED, TRANSPOSED, ONEDNN, ONEDNN,
                                                                 ONEDNN, LINEAR]
    assert _ms(curve) == [80, 69, 79, 96.4, 120] and curve.steps
    plan, curve = plan_layouts(linear, transposed)  # no oneDNN curve: 8 rows stay nn.Linear, 16 pay the other way
    assert plan.describe() == "2-4 rows transposed, 9-16 rows transposed" and _ms(curve) == [80, 69, 79, 116, 124]
    slower = _curve([(k, 1.5 * t) for k, t in TRANSPOSED_MS], steps=True)  # timed while the machine ran 1.5x slower
    assert plan_layouts(linear, slower)[0] == plan and _ms(plan_layouts(linear, slower)[1]) == _ms(curve)
    assert plan_layouts(linear, linear)[0] == LinearPlan(((16, LINEAR),))  # equal: not 5% cheaper anywhere
    assert not plan_layouts(linear, linear)[0] and plan_layouts(linear, linear)[1] == linear
    assert plan_layouts(transposed, linear)[0].describe() == "nn.Linear"  # 2 rows slower that way: none
    forced, curve = plan_layouts(linear, transposed, onednn, force=ONEDNN)
    assert forced.describe() == "2-16 rows oneDNN" and _ms(curve) == [80, 83.6, 90, 96.4, 120]
    given = plan_layouts(_curve(LINEAR_MS), _curve(TRANSPOSED_MS))[1]  # interpolated curves: non-decreasing
    assert _ms(given) == [80, 80, 80, 126, 126] and not given.steps


def test_a_layout_is_read_only_up_to_the_rows_it_covers():
    linear = _curve(((1, 80), (2, 126), (4, 126), (8, 116), (16, 142), (32, 200), (64, 300)), steps=True)
    wide = _curve(((1, 80), (2, 60), (4, 60), (8, 60), (16, 60), (32, 60), (64, 60)), steps=True)
    plan, _ = plan_layouts(linear, wide, _curve(((1, 80), (2, 200), (4, 200), (8, 200), (16, 70)), steps=True))
    assert plan.describe() == "2-16 rows transposed"  # the other way round: at most MAX_ROWS; oneDNN: its 16 rows
    plan, _ = plan_layouts(linear, None, wide)
    assert plan.describe() == "2-64 rows oneDNN"


def test_linear_plan_checks_its_bounds():
    assert LinearPlan(((4, TRANSPOSED), (8, LINEAR), (64, ONEDNN))).describe() == \
        "2-4 rows transposed, 9-64 rows oneDNN"
    assert LinearPlan().describe() == "nn.Linear" and not LinearPlan() and LinearPlan().kind(5) == LINEAR
    assert LinearPlan.uniform(ONEDNN, 8).kind(1) == LINEAR  # one row: always nn.Linear
    for bad in (((4, TRANSPOSED), (4, ONEDNN)), ((8, ONEDNN), (4, LINEAR)), ((0, ONEDNN),), ((4, 7),)):
        with pytest.raises(ValueError, match="LinearPlan.bounds"):
            LinearPlan(bad)


@needs_onednn
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_rows_match_f_linear_and_one_row_stays_nn_linear(bias):
    head = _linear(bias)
    calls = []
    head.register_forward_hook(lambda m, a, o: calls.append(a[0].shape[-2]))
    x = torch.randn(1, 20, 24)
    plan = LinearPlan(((3, TRANSPOSED), (16, ONEDNN)))
    with torch.no_grad():
        want = {m: F.linear(x[:, :m], head.weight, head.bias) for m in (1, 2, 5, 16, 17)}
        with StepLinears([head], plan):
            got = {m: head(x[:, :m]) for m in (1, 2, 5, 16, 17)}
            strided = head(x.transpose(1, 2).contiguous().transpose(1, 2)[:, :6])  # rows not contiguous
    assert calls[:5] == [1, 0, 0, 0, 17]
    for m in (2, 5, 16):
        assert got[m].shape == want[m].shape and got[m].is_contiguous()
        torch.testing.assert_close(got[m], want[m], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(strided, want[16][:, :6], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1], want[1]) and torch.equal(got[17], want[17])
    w = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert onednn_linear(torch.tensor([[1.0, 2.0]]), w, torch.tensor([0.5, -1.0])).tolist() == [[1.5, 2.0]]


def test_linear_modules_are_the_plain_cpu_linears(tiny_models):
    model = tiny_models("llama")
    found = linear_modules(model)
    assert found and all(type(m) is torch.nn.Linear for m in found)
    assert model.get_output_embeddings() in found
    with pytest.raises(ValueError, match="linear_layout"):
        LookaheadConfig(linear_layout="sideways")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_auto_takes_the_layout_where_the_calibration_timed_it_faster(dtype, monkeypatch):
    """Step curves in each layout, as timed: the call runs 2-4 rows transposed, and for fp32 weights 5-16 rows
    through oneDNN (fp64: not timed; 8 rows stay nn.Linear, 16 pay the other way round)."""
    model = tiny_model("llama").to(dtype)
    step = step_variant(model)  # "step+masked-gqa": the tiny Llama has grouped key/value heads
    curves = {step: _curve(LINEAR_MS), step + layout.VARIANT: _curve(TRANSPOSED_MS),
              step + layout.ONEDNN_VARIANT: _curve(ONEDNN_MS)}
    seen = []

    def get(self, model, max_rows, measure, variant="", persist=None):
        seen.append(variant)
        return curves[variant]

    monkeypatch.setattr(Calibrations, "get", get)
    monkeypatch.setattr(decoder_mod, "LAYOUT_MIN_WEIGHTS", 0)  # the tiny model counts as big enough
    decoder = LookaheadDecoder(calibrations=Calibrations())
    ids = torch.tensor([REPETITIVE])
    plain = model.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=None)
    ours = model.generate(ids, custom_generate=decoder, max_new_tokens=24, eos_token_id=None)
    assert ours.tolist() == plain.tolist()
    onednn = dtype == torch.float32 and onednn_available()
    timed = [step, step + layout.VARIANT] + ([step + layout.ONEDNN_VARIANT] if onednn else [])
    assert seen == timed and decoder.stats.transposed_rows == (4 if onednn else 16)
    plan, curve = plan_layouts(*(curves[v] for v in timed))
    assert decoder.stats.cost_curve == curve.points and decoder.stats.linear_layout == plan.describe()
    assert plan.describe() == ("2-4 rows transposed, 5-16 rows oneDNN" if onednn else
                               "2-4 rows transposed, 9-16 rows transposed")
    linear = LookaheadDecoder(calibrations=Calibrations(), linear_layout="linear")
    model.generate(ids, custom_generate=linear, max_new_tokens=8, eos_token_id=None)
    assert linear.stats.transposed_rows == 0 and seen[-1] == step  # nothing timed the other way
    assert linear.stats.linear_layout == "nn.Linear"


def test_auto_leaves_a_small_model_alone(tiny_models, monkeypatch):
    model = tiny_models("llama")
    assert layout.weights(linear_modules(model)) < layout.MIN_WEIGHTS
    seen = []
    monkeypatch.setattr(Calibrations, "get", lambda self, m, rows, measure, variant="", persist=None:
                        seen.append(variant) or _curve(LINEAR_MS))
    decoder = LookaheadDecoder(calibrations=Calibrations())
    model.generate(torch.tensor([REPETITIVE]), custom_generate=decoder, max_new_tokens=8, eos_token_id=None)
    assert seen == [step_variant(model)] and decoder.stats.transposed_rows == 0  # one calibration, nn.Linear


def test_auto_leaves_a_bf16_model_alone_and_transposed_still_forces_it(monkeypatch):
    """bf16 kernels are already fast for a few rows: ``auto`` times no second layout for a bf16 model, however big;
    ``"transposed"`` still computes it the other way round."""
    model = tiny_model("llama").to(torch.bfloat16)
    seen = []
    monkeypatch.setattr(Calibrations, "get", lambda self, m, rows, measure, variant="", persist=None:
                        seen.append(variant) or _curve(TRANSPOSED_MS if variant.endswith(layout.VARIANT) else LINEAR_MS))
    monkeypatch.setattr(decoder_mod, "LAYOUT_MIN_WEIGHTS", 0)  # the tiny model counts as big enough
    ids = torch.tensor([REPETITIVE])
    decoder = LookaheadDecoder(calibrations=Calibrations())  # (bf16 output: multi-row rounding may differ from plain)
    model.generate(ids, custom_generate=decoder, max_new_tokens=8, eos_token_id=None)
    assert seen == [step_variant(model)] and decoder.stats.transposed_rows == 0
    forced = LookaheadDecoder(calibrations=Calibrations(), linear_layout="transposed")
    model.generate(ids, custom_generate=forced, max_new_tokens=8, eos_token_id=None)
    assert forced.stats.transposed_rows == layout.MAX_ROWS


def test_both_layouts_are_timed_after_one_prefill():
    """A model with no kept curve calibrates both ways on one step timer: its context is prefilled once (an
    injected clock: nothing persisted, nothing read from disk)."""
    model = tiny_model("llama")  # no pinned curve: the decoder measures
    queries = []
    hook = model.register_forward_pre_hook(lambda m, args, kw: queries.append(kw["input_ids"].shape[1]),
                                           with_kwargs=True)
    ticks = iter(range(10**9))
    decoder = LookaheadDecoder(calibrations=Calibrations(), linear_layout="transposed",
                               clock=lambda: next(ticks) * 1e-3)
    try:
        model.generate(torch.tensor([REPETITIVE]), custom_generate=decoder, max_new_tokens=8, eos_token_id=None)
    finally:
        hook.remove()
    # [128, 1, 1, 2, ..., 64, ...: the linear rounds, then 1, 2, ..., 16, ...: the transposed rounds, then the call
    assert queries[0] == 128 and queries.count(128) == 1, queries  # one context for both calibrations
    assert queries.count(16) >= 4 and queries.count(64) >= 2  # two rounds each way (16 rows), two linear (64)
    assert decoder.stats.time_calibration > 0


def test_weights_count_a_shared_weight_once():
    a, b = _linear(), _linear()
    b.weight = a.weight
    assert layout.weights([a, b]) == layout.weights([a]) == 24 * 40


def test_a_pinned_curve_keeps_nn_linear_under_auto(tiny_models):
    model = tiny_models("llama")  # the fixture pins a curve: both ways read the same, so no row pays
    decoder = LookaheadDecoder()
    model.generate(torch.tensor([REPETITIVE]), custom_generate=decoder, max_new_tokens=8, eos_token_id=None)
    assert decoder.stats.transposed_rows == 0


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_decoding_with_the_linears_transposed_equals_plain(tiny_models, arch, monkeypatch):
    model = tiny_models(arch)
    ids = torch.tensor([REPETITIVE])
    plain = model.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None)
    products = []
    monkeypatch.setattr(layout, "transposed_linear",
                        lambda x, w, b: products.append(x.shape) or transposed_linear(x, w, b))
    decoder = LookaheadDecoder(linear_layout="transposed")
    ours = model.generate(ids, custom_generate=decoder, max_new_tokens=40, eos_token_id=None)
    assert ours.tolist() == plain.tolist()
    assert decoder.stats.target_calls < 40
    if linear_modules(model):  # drafted steps went through the other way round
        assert decoder.stats.transposed_rows == MAX_ROWS and products
        assert all(2 <= s[:-1].numel() <= MAX_ROWS for s in products)
    else:
        assert decoder.stats.transposed_rows == 0 and not products


def test_a_batch_with_the_linears_transposed_equals_plain(tiny_models):
    model = tiny_models("llama")
    ids = torch.tensor([REPETITIVE, REPETITIVE[::-1]])
    plain = model.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=None)
    ours = model.generate(ids, custom_generate=LookaheadDecoder(linear_layout="transposed"), max_new_tokens=24,
                          eos_token_id=None)
    assert ours.tolist() == plain.tolist()


@needs_onednn
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_decoding_with_the_linears_through_onednn_equals_plain(arch, monkeypatch):
    model = tiny_model(arch).to(torch.float32)
    ids = torch.tensor([REPETITIVE])
    plain = model.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None)
    products = []
    monkeypatch.setattr(layout, "onednn_linear", lambda x, w, b: products.append(x.shape) or onednn_linear(x, w, b))
    decoder = LookaheadDecoder(linear_layout="onednn")
    ours = model.generate(ids, custom_generate=decoder, max_new_tokens=40, eos_token_id=None)
    assert ours.tolist() == plain.tolist()
    assert decoder.stats.target_calls < 40
    if linear_modules(model):
        assert decoder.stats.linear_layout == f"2-{layout.ONEDNN_MAX_ROWS} rows oneDNN" and products
        assert all(s[:-1].numel() >= 2 for s in products)
    else:
        assert decoder.stats.linear_layout == "nn.Linear" and not products


def test_onednn_forced_where_it_cannot_run_is_a_clear_error(tiny_models, monkeypatch):
    model = tiny_models("llama")  # float64 weights
    with pytest.raises(ValueError, match="linear_layout='onednn'.*torch.float64"):
        model.generate(torch.tensor([REPETITIVE]), custom_generate=LookaheadDecoder(linear_layout="onednn"),
                       max_new_tokens=4, eos_token_id=None)
    monkeypatch.setattr(layout, "onednn_available", lambda: False)  # a torch without oneDNN
    with pytest.raises(ValueError, match="built with oneDNN"):
        tiny_model("llama").to(torch.float32).generate(
            torch.tensor([REPETITIVE]), custom_generate=LookaheadDecoder(linear_layout="onednn"), max_new_tokens=4,
            eos_token_id=None)
