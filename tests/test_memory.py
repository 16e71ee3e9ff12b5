"""A trie shared across calls (``LookaheadDecoder(store=...)``): earlier outputs draft later requests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lookahead import LookaheadDecoder
from lookahead._tuning import Tuning
from lookahead.cache import NgramTrie

PROMPT = [3, 41, 7, 88, 19, 64, 2, 53, 30, 77, 9]


def test_second_request_drafts_from_first_output(tiny_models):
    model = tiny_models("llama")
    memory = NgramTrie(max_n=8, capacity=4096)
    dec = LookaheadDecoder(store=memory, _tuning=Tuning(adaptive=False))
    ids = torch.tensor([PROMPT])
    plain = model.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None)
    first = model.generate(ids, custom_generate=dec, max_new_tokens=40, eos_token_id=None)
    calls_first = dec.stats.target_calls
    assert dec.stats.accepted_by_origin["memory"] == 0
    second = model.generate(ids, custom_generate=dec, max_new_tokens=40, eos_token_id=None)
    assert first.tolist() == second.tolist() == plain.tolist()
    assert dec.stats.accepted_by_origin["memory"] > 0
    assert dec.stats.target_calls < calls_first


def test_memory_learns_outputs_not_prompts(tiny_models):
    model = tiny_models("qwen2")
    memory = NgramTrie(max_n=4, capacity=4096)
    dec = LookaheadDecoder(store=memory)
    out = model.generate(torch.tensor([PROMPT]), custom_generate=dec, max_new_tokens=12, eos_token_id=None)
    grams = memory.ngrams()
    new = out[0, len(PROMPT):].tolist()
    assert (PROMPT[0], PROMPT[1]) not in grams  # the prompt's n-grams fade with the request
    assert tuple(new[:2]) in grams and memory.step == len(new)


def test_memory_stays_bounded(tiny_models):
    memory = NgramTrie(max_n=3, capacity=64)
    dec = LookaheadDecoder(store=memory)
    model = tiny_models("llama")
    for seed in range(4):
        prompt = np.random.default_rng(seed).integers(0, 96, 12).tolist()
        model.generate(torch.tensor([prompt]), custom_generate=dec, max_new_tokens=30, eos_token_id=None)
        assert len(memory) <= 64


def test_store_argument_is_checked():
    with pytest.raises(TypeError, match="NgramTrie"):
        LookaheadDecoder(store={})
    with pytest.raises(TypeError, match="unknown setting.*'trie'"):  # the old name
        LookaheadDecoder(trie=NgramTrie(max_n=3, capacity=64))


def test_a_store_from_a_bigger_vocabulary_is_refused_before_any_forward(tiny_models, tmp_path):
    """Saved without vocab_size, a store's ids are checked against the model's vocabulary at the call's
    start (it used to fail mid-generate with IndexError)."""
    model = tiny_models("llama")  # vocabulary of 96
    store = NgramTrie(max_n=6, capacity=4096)
    store.insert([5, 6, 120, 7, 8])
    store.save(str(tmp_path / "store.bin"))
    loaded = NgramTrie.load(str(tmp_path / "store.bin"))
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(ValueError, match=r"token id 120, outside this model's vocabulary of 96"):
            model.generate(torch.tensor([[3, 5, 6]]), max_new_tokens=8,
                           custom_generate=LookaheadDecoder(store=loaded, cost_curve=((1, 1.0), (64, 1.0))))
    finally:
        handle.remove()
    assert calls == []
    assert NgramTrie(max_n=3, capacity=64).max_token() == -1
