"""Linear layers computed the other way round or through oneDNN (``lookahead.cpu``): the same outputs, the same
decoding, and nothing installed on the user's model.

A call's multi-row steps run a *shadow* of the model (``shadow.py``): a copy of its module tree that shares every
parameter, in which each ``nn.Linear`` is a ``LayoutLinear`` over the same weight. The user's modules, their classes
and their hooks stay as they were, during the call and after it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lookahead.cpu.layouts as layouts_module
import lookahead.cpu.linear as linear_module
from lookahead import LookaheadDecoder
from lookahead._tuning import DEFAULT, Tuning
from lookahead.cost import STEP_VARIANT, Calibrations, CostModel
from lookahead.cpu.layouts import (
    ONEDNN_MAX_ROWS,
    LinearPlan,
    linear_modules,
    onednn_available,
    plan_layouts,
    whole_plan,
)
from lookahead.cpu.linear import LINEAR, ONEDNN, TRANSPOSED, LayoutLinear, onednn_linear, transposed_linear
from lookahead.shadow import shadow

from tiny import TINY_ARCHS, TINY_COST_CURVE, tiny_model

REPETITIVE = [3, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11]
LINEAR_MS = ((1, 80), (2, 126), (4, 126), (8, 116), (16, 142))
TRANSPOSED_MS = ((1, 80), (2, 69), (4, 79), (8, 120), (16, 124))
ONEDNN_MS = ((1, 88), (2, 92), (4, 99), (8, 106), (16, 132))
MAX_ROWS = DEFAULT.layout_max_rows  # the most rows a step computes the other way round
TRANSPOSED_VARIANT, ONEDNN_VARIANT = "+transposed-linears", "+onednn-linears"  # the layouts' calibrations
needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this torch has no oneDNN linear (mkldnn)")


def _curve(ms, steps: bool = False) -> CostModel:
    return CostModel([(k, t / 1e3) for k, t in ms], steps=steps)


def _ms(curve: CostModel) -> list[float]:
    return [round(t * 1e3, 1) for _, t in curve.points]


def _linear(bias: bool = True) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(24, 40, bias=bias)


def _hooks(model) -> dict:
    """Every module's hook dictionaries, by module, as (the dict object, its entries)."""
    names = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
             "_backward_hooks", "_backward_pre_hooks")
    return {id(m): [(id(getattr(m, n)), list(getattr(m, n).items())) for n in names] for m in model.modules()}


def _tree(model) -> list:
    """The module tree: (name, the module object, its class, its instance attributes' names) of every module."""
    return [(name, m, type(m), sorted(vars(m))) for name, m in model.named_modules()]


# -- the products ------------------------------------------------------------------------------------------------


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
def test_two_to_max_rows_come_out_transposed_and_the_others_untouched(bias, monkeypatch):
    """A ``LayoutLinear`` under the transposed plan: 2 to 16 rows the other way round (equal to float rounding,
    contiguous), one row and more than 16 ``F.linear``'s very product; the ``nn.Linear`` it stands for gets no hook
    of ours, and a hook the user put on it acts on every call of the layout's layer."""
    head = _linear(bias)
    calls, products = [], []
    head.register_forward_hook(lambda m, a, o: calls.append(a[0].shape[-2]))  # the user's hook: it acts
    monkeypatch.setattr(linear_module, "transposed_linear", lambda x, w, b: products.append(x.shape[-2]) or
                        transposed_linear(x, w, b))
    step = LayoutLinear(head, whole_plan(TRANSPOSED))
    assert step.weight is head.weight and step.bias is head.bias  # the same parameters, not copies
    x = torch.randn(1, 20, 24)
    with torch.no_grad():
        want = {m: F.linear(x[:, :m], head.weight, head.bias) for m in (1, 2, 16, 17)}
        got = {m: step(x[:, :m]) for m in (1, 2, 16, 17)}
    assert calls == [1, 2, 16, 17] and products == [2, 16]
    for m in (2, 16):
        assert got[m].shape == want[m].shape and got[m].is_contiguous()
        torch.testing.assert_close(got[m], want[m], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1], want[1]) and torch.equal(got[17], want[17])  # one row and above the cap: F.linear
    assert len(head._forward_hooks) == 1 and not head._forward_pre_hooks  # only the test's own hook


def test_left_alone_where_a_gradient_is_recorded():
    head = _linear()
    step = LayoutLinear(head, whole_plan(TRANSPOSED))
    x = torch.randn(3, 24)
    step(x).sum().backward()  # gradients on: F.linear, differentiable, into the shared weight
    with torch.no_grad():
        z = step(x[None])  # 3 rows under no_grad: transposed
    assert head.weight.grad is not None
    torch.testing.assert_close(z[0], F.linear(x, head.weight, head.bias).detach(), rtol=1e-5, atol=1e-5)


def test_plan_layouts_docstring_examples():
    linear, transposed, onednn = (_curve(ms, steps=True) for ms in (LINEAR_MS, TRANSPOSED_MS, ONEDNN_MS))
    plan, curve = plan_layouts(linear, transposed, onednn)
    assert plan == LinearPlan(((1, LINEAR), (4, TRANSPOSED), (16, ONEDNN)))
    assert plan.describe() == "2-4 rows transposed, 5-16 rows oneDNN" and plan.kind(4) == TRANSPOSED != plan.kind(5)
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
    assert LinearPlan(((8, ONEDNN),)).kind(1) == LINEAR  # one row: always nn.Linear
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
    step = LayoutLinear(head, LinearPlan(((3, TRANSPOSED), (16, ONEDNN))))
    with torch.no_grad():
        want = {m: F.linear(x[:, :m], head.weight, head.bias) for m in (1, 2, 5, 16, 17)}
        got = {m: step(x[:, :m]) for m in (1, 2, 5, 16, 17)}
        strided = step(x.transpose(1, 2).contiguous().transpose(1, 2)[:, :6])  # rows not contiguous
    assert calls == [1, 2, 5, 16, 17, 6]  # the user's hook on the layer acts on each
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
        Tuning(linear_layout="sideways")


# -- the shadow ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", TINY_ARCHS)
@pytest.mark.parametrize("kind", [TRANSPOSED, ONEDNN])
def test_the_shadow_computes_the_models_logits_and_shares_its_parameters(arch, kind):
    """The shadow's forward of several rows is the model's to float rounding (its one-row forward exactly), with the
    very parameters of the model, and every linear layer a ``LayoutLinear`` over the model's own weight."""
    if kind == ONEDNN and not onednn_available():
        pytest.skip("this torch has no oneDNN linear (mkldnn)")
    model = tiny_model(arch).to(torch.float32)  # oneDNN takes fp32 weights
    steps = shadow(model, whole_plan(kind))
    assert steps is not model and shadow(model, whole_plan(kind)) is steps  # made once per model and plan
    assert {id(p) for p in steps.parameters()} == {id(p) for p in model.parameters()}
    linears = {id(m) for m in linear_modules(model)}
    layouts = [m for m in steps.modules() if isinstance(m, LayoutLinear)]
    assert len(layouts) == len(linears) and {id(m.original) for m in layouts} == linears
    assert all(m.weight is m.original.weight for m in layouts)
    assert not any(type(m) is torch.nn.Linear for m in steps.modules())
    ids = torch.randint(3, 96, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for rows in (1, 2, 5, 12):
            want, got = model(ids[:, :rows]).logits, steps(ids[:, :rows]).logits
            if rows == 1:
                assert torch.equal(got, want)
            else:
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_a_replaced_weight_makes_the_shadow_again():
    model = tiny_model("llama")
    steps = shadow(model, whole_plan(TRANSPOSED))
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() * 2)
    again = shadow(model, whole_plan(TRANSPOSED))
    assert again is not steps
    head = next(m for m in again.modules() if isinstance(m, LayoutLinear) and m.original is model.lm_head)
    assert head.weight is model.lm_head.weight


@pytest.mark.parametrize("layout_name", ["transposed", "auto"])
def test_nothing_is_installed_on_the_users_model(layout_name):
    """A call whose steps run the shadow leaves the user's model as it was: the same module objects of the same
    classes with the same attributes, every module's hook dictionaries the same objects with the same hooks, during
    each forward of the call and after it; no linear layer's product changes for another caller."""
    model = tiny_model("llama")
    user_hook = model.model.layers[0].mlp.register_forward_hook(lambda m, a, o: None)  # one of the user's own
    during = []

    def check(module, args, kwargs):
        during.append(_tree(model) == tree and _hooks(model) == hooks)

    handle = model.register_forward_pre_hook(check, with_kwargs=True)
    tree, hooks = _tree(model), _hooks(model)  # the checking hook among them
    curve = None if layout_name == "auto" else ((1, 0.0025), (2, 0.0027), (16, 0.0030), (64, 0.0036))
    ticks = iter(range(10**9))
    decoder = LookaheadDecoder(cost_curve=curve, _calibrations=Calibrations(), _clock=lambda: next(ticks) * 1e-3,
                               _tuning=Tuning(linear_layout=layout_name, layout_min_weights=0))
    ids = torch.tensor([REPETITIVE])
    try:
        plain = model.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=None)
        during.clear()
        ours = model.generate(ids, custom_generate=decoder, max_new_tokens=24, eos_token_id=None)
        assert _tree(model) == tree and _hooks(model) == hooks
    finally:
        handle.remove()
        user_hook.remove()
    assert ours.tolist() == plain.tolist()
    assert len(during) >= decoder.stats.target_calls and all(during)  # the shadow's steps run the model's hooks too
    assert max(n for n, _ in decoder.stats.budgets) > 0  # drafted steps ran
    if layout_name == "transposed":
        assert decoder.stats.linear_layout == f"2-{MAX_ROWS} rows transposed"
    assert all(type(m) is torch.nn.Linear for m in linear_modules(model))
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_a_users_hook_on_a_linear_layer_acts_in_the_shadows_steps_too():
    """A forward hook the user put on a linear layer (here one that steers the output layer towards token 12) acts in
    every forward of plain ``generate``: the decoder's steps through the shadow must run it too, for plain's tokens."""
    model = tiny_model("llama")

    def steer(module, args, output):
        output = output.clone()
        output[..., 12] += 0.5
        return output

    handle = model.lm_head.register_forward_hook(steer)
    try:
        ids = torch.tensor([REPETITIVE])
        plain = model.generate(ids, do_sample=False, max_new_tokens=30, eos_token_id=None)
        decoder = LookaheadDecoder(cost_curve=((1, 0.0025), (2, 0.0027), (16, 0.0030), (64, 0.0036)),
                                   _tuning=Tuning(linear_layout="transposed"))
        ours = model.generate(ids, custom_generate=decoder, max_new_tokens=30, eos_token_id=None)
    finally:
        handle.remove()
    assert decoder.stats.linear_layout != "nn.Linear"
    assert ours.tolist() == plain.tolist()


@pytest.mark.parametrize("replaced", ["lm_head", "mlp"])
@pytest.mark.parametrize("layout_name", ["transposed", "auto"])  # auto: the grouped attention's shadow, on a CPU
def test_a_replaced_module_is_not_computed_from_a_stale_shadow(layout_name, replaced):
    """After a call, the user replaces a module (an adapter library swapping a linear layer, a new head): the next
    call's steps compute with the new module, as plain ``generate`` does."""
    model = tiny_model("llama")
    ids = torch.tensor([REPETITIVE])
    tuning = Tuning(linear_layout=layout_name)
    curve = ((1, 0.0025), (2, 0.0027), (16, 0.0030), (64, 0.0036))
    model.generate(ids, custom_generate=LookaheadDecoder(cost_curve=curve, _tuning=tuning), max_new_tokens=8,
                   eos_token_id=None)
    torch.manual_seed(5)
    if replaced == "lm_head":
        model.lm_head = torch.nn.Linear(32, 96, bias=False).to(torch.float64)
    else:
        import copy

        mlp = copy.deepcopy(model.model.layers[1].mlp)
        with torch.no_grad():
            for p in mlp.parameters():
                p.mul_(-4.0)
        model.model.layers[1].mlp = mlp
    plain = model.generate(ids, do_sample=False, max_new_tokens=30, eos_token_id=None)
    ours = model.generate(ids, custom_generate=LookaheadDecoder(cost_curve=curve, _tuning=tuning), max_new_tokens=30,
                          eos_token_id=None)
    assert ours.tolist() == plain.tolist()


# -- the calibration's choice --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_auto_takes_the_layout_where_the_calibration_timed_it_faster(dtype, monkeypatch):
    """Step curves in each layout, as timed: the call runs 2-4 rows transposed, and for fp32 weights 5-16 rows
    through oneDNN (fp64: not timed; 8 rows stay nn.Linear, 16 pay the other way round)."""
    model = tiny_model("llama").to(dtype)
    seen = []

    def get(self, model, max_rows, measure, variant="", persist=None):
        seen.append(variant)
        base = seen[0]  # the nn.Linear steps' variant ("step", or the grouped attention's "step+...")
        return _curve({base: LINEAR_MS, base + TRANSPOSED_VARIANT: TRANSPOSED_MS,
                       base + ONEDNN_VARIANT: ONEDNN_MS}[variant])

    monkeypatch.setattr(Calibrations, "get", get)
    tuning = Tuning(layout_min_weights=0)  # the tiny model counts as big enough
    decoder = LookaheadDecoder(_calibrations=Calibrations(), _tuning=tuning)
    ids = torch.tensor([REPETITIVE])
    plain = model.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=None)
    ours = model.generate(ids, custom_generate=decoder, max_new_tokens=24, eos_token_id=None)
    assert ours.tolist() == plain.tolist()
    onednn = dtype == torch.float32 and onednn_available()
    base = seen[0]
    assert base.startswith(STEP_VARIANT)
    timed = [base, base + TRANSPOSED_VARIANT] + ([base + ONEDNN_VARIANT] if onednn else [])
    assert seen == timed
    plan, curve = plan_layouts(*(_curve(ms) for ms in (LINEAR_MS, TRANSPOSED_MS, ONEDNN_MS)[: len(timed)]))
    assert decoder.stats.cost_curve == curve.points and decoder.stats.linear_layout == plan.describe()
    assert plan.describe() == ("2-4 rows transposed, 5-16 rows oneDNN" if onednn else
                               "2-4 rows transposed, 9-16 rows transposed")
    linear = LookaheadDecoder(_calibrations=Calibrations(), _tuning=Tuning(layout_min_weights=0,
                                                                           linear_layout="linear"))
    model.generate(ids, custom_generate=linear, max_new_tokens=8, eos_token_id=None)
    assert seen[-1] == base and linear.stats.linear_layout == "nn.Linear"  # nothing timed the other way


def test_auto_leaves_a_small_model_alone(tiny_models, monkeypatch):
    model = tiny_models("llama")
    assert sum(p.numel() for p in model.parameters() if p.dim() == 2) < DEFAULT.layout_min_weights
    seen = []
    monkeypatch.setattr(Calibrations, "get", lambda self, m, rows, measure, variant="", persist=None:
                        seen.append(variant) or _curve(LINEAR_MS))
    decoder = LookaheadDecoder(_calibrations=Calibrations())
    model.generate(torch.tensor([REPETITIVE]), custom_generate=decoder, max_new_tokens=8, eos_token_id=None)
    assert len(seen) == 1 and seen[0].startswith(STEP_VARIANT)  # one calibration, nn.Linear
    assert decoder.stats.linear_layout == "nn.Linear"


def test_auto_leaves_a_bf16_model_alone_and_transposed_still_forces_it(monkeypatch):
    """bf16 kernels are already fast for a few rows: ``auto`` times no second layout for a bf16 model, however big;
    ``"transposed"`` still computes it the other way round."""
    model = tiny_model("llama").to(torch.bfloat16)
    seen = []
    monkeypatch.setattr(Calibrations, "get", lambda self, m, rows, measure, variant="", persist=None:
                        seen.append(variant) or _curve(TRANSPOSED_MS if variant.endswith(TRANSPOSED_VARIANT)
                                                       else LINEAR_MS))
    ids = torch.tensor([REPETITIVE])
    decoder = LookaheadDecoder(_calibrations=Calibrations(), _tuning=Tuning(layout_min_weights=0))
    model.generate(ids, custom_generate=decoder, max_new_tokens=8, eos_token_id=None)  # (bf16: rounding may differ)
    assert len(seen) == 1 and decoder.stats.linear_layout == "nn.Linear"
    forced = LookaheadDecoder(_calibrations=Calibrations(), _tuning=Tuning(linear_layout="transposed"))
    model.generate(ids, custom_generate=forced, max_new_tokens=8, eos_token_id=None)
    assert forced.stats.linear_layout == f"2-{MAX_ROWS} rows transposed"


def test_both_layouts_are_timed_after_a_prefill_each_at_most():
    """A model with no kept curve calibrates both ways, each on a step timer prefilled once, not once per size or
    round (an injected clock: nothing persisted, nothing read from disk). (The old decoder shared one prefilled
    context between the layouts; the new one makes a timer per runner.)"""
    model = tiny_model("llama")  # no pinned curve: the decoder measures
    queries = []
    hook = model.register_forward_pre_hook(lambda m, args, kw: queries.append(kw["input_ids"].shape[1]),
                                           with_kwargs=True)
    ticks = iter(range(10**9))
    decoder = LookaheadDecoder(_calibrations=Calibrations(),
                               _tuning=Tuning(linear_layout="transposed", calibrate=True),
                               _clock=lambda: next(ticks) * 1e-3)
    try:
        model.generate(torch.tensor([REPETITIVE]), custom_generate=decoder, max_new_tokens=8, eos_token_id=None)
    finally:
        hook.remove()
    # [128, 1, 1, 2, ..., 64, ...: the linear rounds, then 1, 2, ..., 16, ...: the transposed rounds, then the call
    assert queries[0] == 128 and queries.count(128) <= 2, queries  # at most one context per layout
    assert queries.count(16) >= 4 and queries.count(64) >= 2  # two rounds each way (16 rows), two linear (64)
    assert decoder.stats.time_calibration > 0


def test_a_pinned_curve_keeps_nn_linear_under_auto(tiny_models):
    model = tiny_models("llama")  # the fixture pins a curve: both ways read the same, so no row pays
    decoder = LookaheadDecoder(_tuning=Tuning(layout_min_weights=0))
    model.generate(torch.tensor([REPETITIVE]), custom_generate=decoder, max_new_tokens=8, eos_token_id=None)
    assert decoder.stats.linear_layout == "nn.Linear"


# -- decoding ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_decoding_with_the_linears_transposed_equals_plain(tiny_models, arch, monkeypatch):
    model = tiny_models(arch)
    ids = torch.tensor([REPETITIVE])
    plain = model.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None)
    products = []
    monkeypatch.setattr(linear_module, "transposed_linear",
                        lambda x, w, b: products.append(x.shape) or transposed_linear(x, w, b))
    decoder = LookaheadDecoder(_tuning=Tuning(linear_layout="transposed"))
    ours = model.generate(ids, custom_generate=decoder, max_new_tokens=40, eos_token_id=None)
    assert ours.tolist() == plain.tolist()
    assert decoder.stats.target_calls < 40
    if linear_modules(model):  # drafted steps went through the other way round
        assert decoder.stats.linear_layout == f"2-{MAX_ROWS} rows transposed" and products
        assert all(2 <= s[:-1].numel() <= MAX_ROWS for s in products)
    else:
        assert decoder.stats.linear_layout == "nn.Linear" and not products


def test_a_batch_with_the_linears_transposed_equals_plain(tiny_models):
    model = tiny_models("llama")
    ids = torch.tensor([REPETITIVE, REPETITIVE[::-1]])
    plain = model.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=None)
    decoder = LookaheadDecoder(_tuning=Tuning(linear_layout="transposed"))
    ours = model.generate(ids, custom_generate=decoder, max_new_tokens=24, eos_token_id=None)
    assert ours.tolist() == plain.tolist()
    assert decoder.stats.linear_layout == f"2-{MAX_ROWS} rows transposed"


@needs_onednn
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_decoding_with_the_linears_through_onednn_equals_plain(arch, monkeypatch):
    model = tiny_model(arch).to(torch.float32)
    ids = torch.tensor([REPETITIVE])
    plain = model.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None)
    products = []
    monkeypatch.setattr(linear_module, "onednn_linear", lambda x, w, b: products.append(x.shape) or onednn_linear(x, w, b))
    # a pinned curve: a measured one would make the drafting (and target_calls) depend on the machine's load
    decoder = LookaheadDecoder(cost_curve=TINY_COST_CURVE, _tuning=Tuning(linear_layout="onednn"))
    ours = model.generate(ids, custom_generate=decoder, max_new_tokens=40, eos_token_id=None)
    assert ours.tolist() == plain.tolist()
    assert decoder.stats.target_calls < 40
    if linear_modules(model):
        assert decoder.stats.linear_layout == f"2-{ONEDNN_MAX_ROWS} rows oneDNN" and products
        assert all(s[:-1].numel() >= 2 for s in products)
    else:
        assert decoder.stats.linear_layout == "nn.Linear" and not products


def test_onednn_forced_where_it_cannot_run_is_a_clear_error(tiny_models, monkeypatch):
    model = tiny_models("llama")  # float64 weights
    with pytest.raises(ValueError, match="linear_layout='onednn'.*float32"):
        model.generate(torch.tensor([REPETITIVE]), custom_generate=LookaheadDecoder(_tuning=Tuning(
            linear_layout="onednn")), max_new_tokens=4, eos_token_id=None)
    monkeypatch.setattr(layouts_module, "onednn_available", lambda: False)  # a torch without oneDNN
    with pytest.raises(ValueError, match="built with oneDNN"):
        tiny_model("llama").to(torch.float32).generate(
            torch.tensor([REPETITIVE]), custom_generate=LookaheadDecoder(_tuning=Tuning(linear_layout="onednn")),
            max_new_tokens=4, eos_token_id=None)


def test_a_kept_nn_linear_curve_without_kept_layout_curves_decodes_with_nn_linear(monkeypatch):
    """The ``nn.Linear`` step curve is kept (a warm-up on a busy machine keeps no provisional layout curve), the
    layouts' are not: a call that measures nothing reads what is kept, runs ``nn.Linear`` and gives plain's
    tokens (it once called a missing measurement)."""
    model = tiny_model("llama")
    asked = []

    def get(self, model, max_rows, measure, variant="", persist=None):
        asked.append((variant, measure))
        return _curve(LINEAR_MS) if len(asked) == 1 else None  # measure is None: nothing is timed in a call

    monkeypatch.setattr(Calibrations, "get", get)
    decoder = LookaheadDecoder(_calibrations=Calibrations(), _tuning=Tuning(layout_min_weights=0))
    ids = torch.tensor([REPETITIVE])
    plain = model.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=None)
    assert model.generate(ids, custom_generate=decoder, max_new_tokens=24, eos_token_id=None).tolist() == plain.tolist()
    assert len(asked) >= 2 and all(measure is None for _, measure in asked)
    assert decoder.stats.linear_layout == "nn.Linear"
