"""The LM head computed the other way round (``head_layout.py``): the same logits, the same decoding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead import head_layout as layout
from lookahead.head_layout import (
    TransposedHead,
    can_transpose,
    head_for,
    transposed_head_pays,
    transposed_linear,
)

from tiny import TINY_ARCHS

REPETITIVE = [3, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11]


def _linear(bias: bool = True) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(24, 40, bias=bias)


def test_transposed_linear_docstring_example_and_bias():
    out = transposed_linear(torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 0.0], [1.0, 1.0]]), None)
    assert out.tolist() == [[1.0, 3.0]]
    out = transposed_linear(torch.tensor([[1.0, 2.0]]), torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([0.5, -1.0]))
    assert out.tolist() == [[1.5, 2.0]]


@pytest.mark.parametrize("bias", [True, False])
def test_rows_two_to_max_come_out_transposed_and_the_others_untouched(bias):
    head = _linear(bias)
    calls = []
    head.register_forward_hook(lambda m, a, o: calls.append(a[0].shape[-2]))  # what nn.Linear itself got
    x = torch.randn(1, 20, 24)
    with torch.no_grad():
        want = {m: F.linear(x[:, :m], head.weight, head.bias) for m in (1, 2, 16, 17)}
        with TransposedHead(head, max_rows=16):
            got = {m: head(x[:, :m]) for m in (1, 2, 16, 17)}
        after = head(x[:, :2])
    assert calls[:4] == [1, 0, 0, 17]  # 2 and 16 rows: nn.Linear got none
    for m in (2, 16):
        assert got[m].shape == want[m].shape and got[m].is_contiguous()
        torch.testing.assert_close(got[m], want[m], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1], want[1]) and torch.equal(got[17], want[17])  # one row and above the cap: nn.Linear
    assert torch.equal(after, want[2])  # the hooks are gone on exit


def test_left_alone_where_a_gradient_is_recorded_or_the_input_does_not_fit():
    head = _linear()
    x = torch.randn(3, 24)
    with TransposedHead(head):
        y = head(x)  # gradients on: nn.Linear, differentiable
        y.sum().backward()
        with torch.no_grad():
            z = head(x.double().float()[None])  # 3 rows under no_grad: transposed
    assert head.weight.grad is not None
    torch.testing.assert_close(z[0], F.linear(x, head.weight, head.bias).detach(), rtol=1e-5, atol=1e-5)


def test_a_hook_put_first_sees_the_real_rows():
    head, seen = _linear(), []
    with torch.no_grad(), TransposedHead(head):
        head.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[-2]), prepend=True)
        head(torch.randn(1, 5, 24))
    assert seen == [5]


def test_the_decision_times_both_ways_on_the_clock_given_and_is_kept():
    ticks = iter([0.0, 10.0, 10.0, 12.0])  # nn.Linear 10 s, the other way round 2 s
    head = _linear()
    assert transposed_head_pays(head, clock=lambda: next(ticks), min_weights=0)
    assert transposed_head_pays(head, clock=lambda: 1 / 0, min_weights=0)  # kept: not timed again
    ticks = iter([0.0, 10.0, 10.0, 19.0])  # 0.9x: below the bar
    assert not transposed_head_pays(_linear(), clock=lambda: next(ticks), min_weights=0)
    assert not transposed_head_pays(_linear(), clock=lambda: 1 / 0)  # 960 weights: too small to look at


def test_head_for_follows_the_setting(tiny_models):
    model = tiny_models("llama")
    assert head_for(model, "linear") is None
    assert head_for(model, "auto") is None  # a tiny head: nn.Linear, without timing anything
    assert isinstance(head_for(model, "transposed"), TransposedHead)
    with pytest.raises(ValueError, match="head_layout"):
        head_for(model, "sideways")
    with pytest.raises(ValueError, match="head_layout"):
        LookaheadConfig(head_layout="sideways")


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_decoding_with_the_head_transposed_equals_plain(tiny_models, arch, monkeypatch):
    model = tiny_models(arch)
    ids = torch.tensor([REPETITIVE])
    plain = model.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None)
    products = []
    monkeypatch.setattr(layout, "transposed_linear", lambda x, w, b: products.append(x.shape) or transposed_linear(x, w, b))
    decoder = LookaheadDecoder(head_layout="transposed")
    ours = model.generate(ids, custom_generate=decoder, max_new_tokens=40, eos_token_id=None)
    assert ours.tolist() == plain.tolist()
    assert decoder.stats.target_calls < 40
    if can_transpose(model.get_output_embeddings()):  # drafted steps went through the transposed head
        assert decoder._head_transposed and products and all(2 <= s[-2] <= 16 for s in products)
    else:
        assert not decoder._head_transposed and not products


def test_a_batch_with_the_head_transposed_equals_plain(tiny_models):
    model = tiny_models("llama")
    ids = torch.tensor([REPETITIVE, REPETITIVE[::-1]])
    plain = model.generate(ids, do_sample=False, max_new_tokens=24, eos_token_id=None)
    ours = model.generate(ids, custom_generate=LookaheadDecoder(head_layout="transposed"), max_new_tokens=24,
                          eos_token_id=None)
    assert ours.tolist() == plain.tolist()
