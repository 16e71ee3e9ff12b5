"""Several threads decoding on one model at once, plain ``generate`` among them: every greedy output is sequential
plain's, sampled calls finish, and nothing a call installs outlives it or acts on another thread's forward."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import lookahead.calibrate as calibrate_module
from lookahead import LookaheadDecoder
from lookahead._tuning import Tuning
from lookahead.cost import Calibrations, CostModel

from tiny import TINY_COST_CURVE, tiny_model

PROMPTS = [[5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 11, 5, 6, 7], [3, 4, 3, 4, 3, 4, 3, 4, 3], [9, 8, 7, 6, 5, 9, 8, 7, 6],
           [1, 2, 3, 4, 1, 2, 3, 4, 1, 2], [11, 12, 13, 11, 12, 13, 11, 12], [20, 21, 22, 23, 24, 25, 20, 21]]


def hooks(model) -> list:
    """Every hook of every module of ``model``, and its forward attributes: what a call must leave as it was."""
    return [(name, dict(m._forward_hooks), dict(m._forward_pre_hooks), m.__dict__.get("forward"))
            for name, m in model.named_modules()]


def jobs(model, new_tokens: int, decoder_factory, prompts: list):
    """A mix of calls: the decoder on one row and on a batch of two, plain generate, and sampled calls; each job
    returns (kind, inputs, output)."""
    def decoded(prompt):
        ids = torch.tensor([prompt])
        return "decoder", ids, None, model.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                                                    custom_generate=decoder_factory())

    def batch(a, b):
        width = max(len(a), len(b))
        ids = torch.tensor([[0] * (width - len(a)) + a, [0] * (width - len(b)) + b])
        mask = torch.tensor([[0] * (width - len(a)) + [1] * len(a), [0] * (width - len(b)) + [1] * len(b)])
        return "batch", ids, mask, model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                                  custom_generate=decoder_factory())

    def plain(prompt):
        ids = torch.tensor([prompt])
        return "plain", ids, None, model.generate(ids, max_new_tokens=new_tokens, do_sample=False)

    def sampled(prompt):
        ids = torch.tensor([prompt])
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=True, top_k=5,
                             custom_generate=decoder_factory())
        return "sampled", ids, None, out

    work = []
    for i, p in enumerate(prompts):
        work += [lambda p=p: decoded(p), lambda p=p: plain(p)]
        work.append(lambda i=i: batch(prompts[i], prompts[(i + 1) % len(prompts)]))
        if i % 2:
            work.append(lambda p=p: sampled(p))
    return work


def check_mix(model, new_tokens: int, decoder_factory, prompts: list = PROMPTS, threads: int = 4) -> None:
    before, environ = hooks(model), dict(os.environ)
    work = jobs(model, new_tokens, decoder_factory, prompts)
    seen: list = []
    stop = threading.Event()

    def watch():  # while the calls run, the model never carries a hook or a replaced forward
        while not stop.wait(0.01):
            seen.append(hooks(model) == before and dict(os.environ) == environ)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(lambda job: job(), work))
    finally:
        stop.set()
        watcher.join()
    assert all(seen)
    assert hooks(model) == before and dict(os.environ) == environ
    for kind, ids, mask, out in results:  # every greedy output against sequential plain's
        if kind == "sampled":
            assert out.shape[0] == 1 and out.shape[1] > ids.shape[1]
            continue
        expected = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False)
        assert torch.equal(out, expected), kind


@pytest.mark.parametrize("arch", ["llama", "mistral"])
def test_threads_on_one_tiny_model_give_plain_outputs(arch):
    model = tiny_model(arch)
    check_mix(model, 24, lambda: LookaheadDecoder(cost_curve=TINY_COST_CURVE))


@pytest.mark.smollm
def test_threads_on_the_real_model_give_plain_outputs(smollm):
    """SmolLM2 in fp32 on a CPU, its steps in a forced CPU layout (a shadow of its module tree: nothing on the
    model itself), beside plain generate in other threads."""
    model, _ = smollm
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # four decoding threads on a shared machine: no intra-op threads spinning against them
    try:
        check_mix(model, 12, lambda: LookaheadDecoder(cost_curve=((1, 0.06), (2, 0.05), (16, 0.09), (64, 0.2)),
                                                      _tuning=Tuning(linear_layout="transposed")), PROMPTS[:3])
    finally:
        torch.set_num_threads(threads)


def test_concurrent_first_calls_learn_one_curve():
    """Four threads' first calls on one model, with no curve known, time no forward apart from their own steps and
    teach one shared learned curve."""
    model = tiny_model("llama")
    calibrations = Calibrations()
    barrier = threading.Barrier(4)

    def one(prompt):
        decoder = LookaheadDecoder(_calibrations=calibrations)
        barrier.wait()
        out = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, custom_generate=decoder)
        return out, decoder.stats.target_calls, decoder.stats.new_tokens

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, PROMPTS[:4]))
    learned = [key for key in calibrations._curves[model] if key[-1].endswith("+learned")]
    assert len(learned) == 1
    for prompt, (out, calls, new) in zip(PROMPTS[:4], results):
        assert torch.equal(out, model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False))
        assert calls <= new  # the prefill's forward makes the first token: no forward was timed apart


def test_concurrent_first_calls_calibrate_once(monkeypatch):
    """Four threads' first calls on one model measure its cost curve once, not once per thread."""
    model = tiny_model("llama")
    measured = []
    real = calibrate_module.calibrate_curve

    def counting(time_one, sizes, clock, **kwargs):
        measured.append(threading.get_ident())
        return CostModel([(k, 0.01 + 0.0001 * k) for k in sizes], steps=True)

    monkeypatch.setattr(calibrate_module, "calibrate_curve", counting)
    calibrations = Calibrations()
    ticks = iter(range(10**9))
    barrier = threading.Barrier(4)

    def one(prompt):
        decoder = LookaheadDecoder(_calibrations=calibrations, _clock=lambda: next(ticks) * 1e-3,
                                   _tuning=Tuning(calibrate=True))
        barrier.wait()
        return model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, custom_generate=decoder)

    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(one, PROMPTS[:4]))
    assert len(measured) == 1
    assert real is not counting
    for prompt, out in zip(PROMPTS[:4], outs):
        assert torch.equal(out, model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False))


def test_one_decoder_refuses_a_second_concurrent_call():
    model = tiny_model("llama")
    decoder = LookaheadDecoder(cost_curve=TINY_COST_CURVE)
    decoder._busy.acquire()
    try:
        with pytest.raises(RuntimeError, match="already decoding"):
            model.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=4, custom_generate=decoder)
    finally:
        decoder._busy.release()


def test_an_enabled_model_serves_concurrent_calls_with_its_default_decoder():
    """``lookahead.enable(model, default=...)``: threads calling the model at once each decode with a decoder of their
    own (the default, or a sibling sharing its settings and store), every output plain's."""
    import lookahead
    from lookahead.cache import NgramTrie

    model = tiny_model("llama")
    store = NgramTrie(max_n=8, capacity=1 << 12)
    default = LookaheadDecoder(cost_curve=TINY_COST_CURVE, store=store)
    lookahead.enable(model, default=default)
    try:
        def one(prompt):
            return model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)

        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(one, PROMPTS * 2))
        siblings = model.generate._siblings.get(id(default), [])
        assert all(s.store is store and s.config == default.config for s in siblings)
    finally:
        lookahead.disable(model)
    for prompt, out in zip(PROMPTS * 2, outs):
        assert torch.equal(out, model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False))
