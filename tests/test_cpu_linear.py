"""The CPU linear kernels (lookahead/cpu_linear.py): values against torch, per-instance routing, path timing."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lookahead.cpu_linear import PathTimes, covered_linears, fast_linears, linear_into, measure_paths

from tiny import tiny_model

F = torch.nn.functional


def _bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """float[k, out]: sum |x| |w|, the scale of a dot product's rounding error."""
    return x.abs().double() @ w.abs().double().T


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.integers(1, 64), n=st.integers(1, 70), out=st.integers(1, 40), bias=st.booleans(),
       bf16=st.booleans(), threads=st.sampled_from([1, 2]), seed=st.integers(0, 2**31 - 1))
def test_kernel_matches_torch(rows, n, out, bias, bf16, threads, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n, generator=gen)
    w = torch.randn(out, n, generator=gen)
    b = torch.randn(out, generator=gen) if bias else None
    if bf16:  # the kernel widens bf16 exactly, so the reference is fp32 on the bf16 values
        w = w.to(torch.bfloat16).float()
        b = None if b is None else b.to(torch.bfloat16).float()
        wn = w.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    else:
        wn = w.numpy()
    y = np.full((rows, out), np.nan, np.float32)
    linear_into(x.numpy(), wn, np.zeros(0, np.float32) if b is None else b.numpy(), y, threads)
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    tol = 1e-5 * (_bound(x, w) + (0 if b is None else b.abs().double())) + 1e-6
    assert ((torch.from_numpy(y).double() - ref).abs() <= tol).all()


def test_linear_into_example_and_shape_check():
    y = np.empty((2, 2), np.float32)
    linear_into(np.ones((2, 3), np.float32), np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros(0, np.float32), y)
    assert y.tolist() == [[3, 12], [3, 12]]
    with pytest.raises(ValueError, match="shapes"):
        linear_into(np.ones((2, 4), np.float32), np.ones((2, 3), np.float32), np.zeros(0, np.float32), y)


class _MyLinear(torch.nn.Linear):
    pass


def _net(dtype=torch.float32) -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(13, 9), torch.nn.ReLU(), torch.nn.Linear(9, 7, bias=False),
                               _MyLinear(7, 5)).to(dtype)


def test_routes_exact_linears_per_instance_and_restores():
    net, other = _net(), _net()
    class_forward = torch.nn.Linear.forward
    x = torch.randn(3, 13)
    with torch.no_grad():
        ref = net(x)
        with fast_linears(net) as routed:
            assert routed == 2
            assert "forward" in net[0].__dict__ and "forward" in net[2].__dict__
            assert "forward" not in net[3].__dict__  # a subclass: left alone
            assert all("forward" not in m.__dict__ for m in other.modules())  # another model: untouched
            got = net(x)
    assert torch.nn.Linear.forward is class_forward
    assert all("forward" not in m.__dict__ for m in net.modules())
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_restores_on_exception():
    net = _net()
    with pytest.raises(KeyError), fast_linears(net):
        raise KeyError("boom")
    assert all("forward" not in m.__dict__ for m in net.modules())


def test_leaves_other_dtypes_and_existing_instance_forwards_alone():
    assert covered_linears(_net(torch.float64)) == []
    assert covered_linears(_net(torch.float16)) == []
    net = _net()
    own = net[0].forward
    net[0].forward = own  # an instance forward set by someone else (a hook library, say)
    with fast_linears(net) as routed:
        assert routed == 1 and net[0].__dict__["forward"] is own
    assert net[0].__dict__["forward"] is own


def test_bf16_module_matches_torch_to_one_rounding():
    net = _net(torch.bfloat16)
    x = torch.randn(5, 13).to(torch.bfloat16)
    with torch.no_grad():
        ref = net[0](x).float()
        with fast_linears(net):
            got = net[0](x).float()
    bound = _bound(x.float(), net[0].weight.float()) + net[0].bias.float().abs().double()
    assert ((got - ref).abs().double() <= 2**-7 * bound.float().double() + 1e-6).all()


def test_policy_chooses_rows_and_fallbacks_call_torch():
    net = _net()
    asked = []

    def use(rows):
        asked.append(rows)
        return rows == 2

    x3, x2 = torch.randn(3, 13), torch.randn(2, 13)
    with torch.no_grad(), fast_linears(net, use=use):
        assert torch.equal(net[0](x3), F.linear(x3, net[0].weight, net[0].bias))  # torch: bit for bit
        net[0](x2)
        with pytest.raises(RuntimeError, match="dtype"):  # another dtype: torch's own error, not asked
            net[0](x2.double())
    assert asked == [3, 2]
    with fast_linears(net, use=use):  # autograd needs a graph: torch, not asked
        out = net[0](x3)
    assert out.grad_fn is not None and asked == [3, 2]


def test_leading_dims_noncontiguous_input_never_modified():
    net = _net()
    base = torch.randn(13, 4, 3)
    x = base.permute(2, 1, 0)  # (3, 4, 13), not contiguous
    before = base.clone()
    with torch.no_grad():
        ref = net[0](x)
        with fast_linears(net, use={12}):
            got = net[0](x)
    assert got.shape == (3, 4, 9) and torch.equal(base, before)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_nested_entries_share_and_the_last_exit_restores():
    net = _net()
    policy = frozenset({1, 2})
    with fast_linears(net, use=policy):
        with fast_linears(net, use=policy):
            pass
        assert "forward" in net[0].__dict__
        with pytest.raises(RuntimeError, match="different"), fast_linears(net, use={3}):
            pass
        assert "forward" in net[0].__dict__
    assert "forward" not in net[0].__dict__


def test_two_models_in_two_threads():
    nets = [_net(), _net()]
    x = torch.randn(4, 13)
    refs = [n(x).detach() for n in nets]
    results, barrier = {}, threading.Barrier(2)

    def run(i):
        with torch.no_grad(), fast_linears(nets[i]):
            barrier.wait()
            results[i] = nets[i](x)
            barrier.wait()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        torch.testing.assert_close(results[i], refs[i], rtol=1e-5, atol=1e-6)
        assert all("forward" not in m.__dict__ for m in nets[i].modules())


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_greedy_generate_identical_inside_the_context(arch):
    model = tiny_model(arch).to(torch.float32)
    ids = torch.randint(3, 96, (1, 12), generator=torch.Generator().manual_seed(1))
    kwargs = dict(max_new_tokens=24, do_sample=False)
    plain = model.generate(ids, **kwargs)
    with fast_linears(model) as routed:
        assert routed == len([m for m in model.modules() if isinstance(m, torch.nn.Linear)])
        fast = model.generate(ids, **kwargs)
    assert torch.equal(plain, fast)
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_path_times_validation_and_rows():
    t = PathTimes((1, 2, 4, 8), (0.05, 0.08, 0.09, 0.10), (0.03, 0.04, 0.10, 0.09))
    assert t.faster == {1: "kernel", 2: "kernel", 4: "torch", 8: "kernel"}
    assert t.curve_points == ((1, 0.03), (2, 0.04), (4, 0.09), (8, 0.09))
    assert t.kernel_rows() == frozenset({1, 2, 8})
    for bad in [dict(sizes=(2, 1)), dict(sizes=(0, 1)), dict(torch_s=(0.1,)), dict(kernel_s=(0.1, 0.0))]:
        args = dict(sizes=(1, 2), torch_s=(0.1, 0.1), kernel_s=(0.1, 0.1)) | bad
        with pytest.raises(ValueError, match="PathTimes"):
            PathTimes(**args)


def test_measure_paths_with_a_fake_clock():
    """The fake clock advances 1 s per reading on the kernel path and 3 s on torch's: kernels win at every k."""
    model = tiny_model("llama").to(torch.float32)
    now = [0.0]

    def clock():
        now[0] += 1.0 if "forward" in model.lm_head.__dict__ else 3.0
        return now[0]

    times = measure_paths(model, (1, 4, 2), clock=clock, context=8, repeats=2)
    assert times.sizes == (1, 2, 4) and times.torch_s == (3.0,) * 3 and times.kernel_s == (1.0,) * 3
    assert times.kernel_rows() == frozenset({1, 2, 3, 4})
    assert times.curve_points == ((1, 1.0), (2, 1.0), (4, 1.0))
    assert all("forward" not in m.__dict__ for m in model.modules())
    with torch.no_grad(), fast_linears(model, use=times):
        assert model(torch.tensor([[5, 6]])).logits.shape == (1, 2, 96)


# --- through the decoder ---------------------------------------------------------------------------------

FLAT = ((1, 0.010), (2, 0.010), (256, 0.0102))


def _float32(arch: str):
    model = tiny_model(arch).to(torch.float32)
    model.generation_config.pad_token_id = 0
    return model


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_decoder_routes_the_rows_its_curve_chose_and_restores(arch, monkeypatch):
    import lookahead.cpu_linear as cl
    from lookahead import LookaheadDecoder
    from lookahead.cost import Calibrations, CostModel

    model = _float32(arch)
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6]])
    plain = model.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=None)
    rows_seen = []
    real = cl.linear_into
    monkeypatch.setattr(cl, "linear_into", lambda x, *a, **kw: (rows_seen.append(x.shape[0]), real(x, *a, **kw)))
    calibrations = Calibrations()
    calibrations.pin(model, CostModel(FLAT, kernel_rows=frozenset(range(2, 65))))  # every step but 1 row
    dec = LookaheadDecoder(calibrations=calibrations, cpu_kernels=True)
    out = model.generate(ids, custom_generate=dec, max_new_tokens=24, eos_token_id=None)
    assert out.tolist() == plain.tolist()
    assert rows_seen and 1 not in rows_seen and set(rows_seen) <= set(range(2, 65))
    assert not any("forward" in m.__dict__ for m in model.modules())  # restored after the call
    rows_seen.clear()  # the switch
    model.generate(ids, custom_generate=LookaheadDecoder(calibrations=calibrations), max_new_tokens=24,
                   eos_token_id=None)
    assert not rows_seen  # off by default


def test_the_decoder_restores_the_layers_when_a_call_fails():
    from lookahead import LookaheadDecoder
    from lookahead.cost import Calibrations, CostModel

    model = _float32("llama")
    calibrations = Calibrations()
    calibrations.pin(model, CostModel(FLAT, kernel_rows=frozenset(range(1, 65))))

    def stop(input_ids, scores, **kwargs):
        raise KeyboardInterrupt  # a user's interrupt in the middle of decoding

    with pytest.raises(KeyboardInterrupt):
        model.generate(torch.tensor([[3, 4, 5, 3, 4]]),
                       custom_generate=LookaheadDecoder(calibrations=calibrations, cpu_kernels=True),
                       max_new_tokens=8, eos_token_id=None, stopping_criteria=[stop])
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_calibration_times_both_paths_on_a_cpu_and_pinned_curves_win():
    from lookahead import LookaheadDecoder
    from lookahead.cost import Calibrations, CostModel

    model = _float32("llama")
    ticks = iter(range(10**6))
    dec = LookaheadDecoder(calibrations=Calibrations(), clock=lambda: float(next(ticks)), cpu_kernels=True)
    curve = dec.cost_curve(model)  # every forward takes one tick on either path: torch wins ties
    assert curve.kernel_rows == frozenset() and len(curve.points) >= 5
    assert dec.calibrations.get(model, 1, lambda sizes: None, "cpu-kernels") is curve  # measured once
    torch_only = LookaheadDecoder(calibrations=dec.calibrations, cpu_kernels=False,
                                  clock=lambda: float(next(ticks))).cost_curve(model)
    assert torch_only is not curve  # the torch-only variant is measured (and kept) separately
    pinned = dec.calibrations.pin(model, CostModel(FLAT))
    assert dec.cost_curve(model) is pinned
    assert LookaheadDecoder(calibrations=dec.calibrations).cost_curve(model) is pinned
