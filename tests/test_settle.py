"""The cache a call was handed goes back as transformers made it (``kv.settle``).

During a call the decoder grows the cache's plain layers in place (``kv.GrowingLayer``), widens a padded row's
sliding layers, and gives a static cache's sliding layers its whole length (``kv.FullLengthSlidingLayer``). At the
end it settles the cache: every layer is again one of transformers' own classes, the one the cache was made with
(``DynamicLayer``, ``DynamicSlidingWindowLayer``, ``StaticLayer``, ``StaticSlidingWindowLayer``), holding what plain
``generate``'s would hold (a sliding layer: its window's last entries), so that a plain ``generate`` continuing from
it, or reusing the static cache, gives plain's tokens. Checked past the sliding window of a model that slides in
every layer (Mistral) and of one that names its layers' kinds (Gemma 3), on a dynamic and on a static cache.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as tf
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import (
    DynamicLayer,
    DynamicSlidingWindowLayer,
    StaticLayer,
    StaticSlidingWindowLayer,
)

from lookahead import LookaheadDecoder
from lookahead.compat import cache_kwarg_name

from tiny import TINY_COST_CURVE

WINDOW = 16
COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512)
TRANSFORMERS_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer, StaticLayer, StaticSlidingWindowLayer)


def _model(arch: str):
    """A tiny float64 model: ``mistral`` slides in every layer (window 16), ``gemma3`` names a sliding, a full and a
    sliding layer (``config.layer_types``), ``llama`` has no window."""
    torch.manual_seed(1234)
    if arch == "mistral":
        model = tf.MistralForCausalLM(tf.MistralConfig(sliding_window=WINDOW, num_hidden_layers=2, **COMMON))
    elif arch == "gemma3":
        model = tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(
            sliding_window=WINDOW, head_dim=8, num_hidden_layers=3,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"], **COMMON))
    elif arch == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(num_hidden_layers=2, **COMMON))
    else:
        raise KeyError(arch)
    model = model.eval().to(torch.float64)
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="module")
def models():
    made = {}

    def get(arch):
        if arch not in made:
            made[arch] = _model(arch)
        return made[arch]

    return get


def _prompt(length: int, seed: int = 0) -> torch.Tensor:
    """long[1, length]: 12 random ids repeated, so that drafts are accepted."""
    base = torch.randint(3, 96, (12,), generator=torch.Generator().manual_seed(seed))
    return base.repeat(length // 12 + 1)[:length][None]


def _kinds(cache) -> list[type]:
    return [type(layer) for layer in cache.layers]


def _layer_state(layer) -> tuple[int, torch.Tensor | None, torch.Tensor | None]:
    """(tokens seen, keys, values) of a layer as a later forward reads it: a static layer's filled columns (a ring's
    whole window once it is full), a dynamic one's entries."""
    if not layer.is_initialized:
        return 0, None, None
    if isinstance(layer, StaticSlidingWindowLayer):
        seen = int(layer.cumulative_length_int)
        kept = min(seen, layer.max_cache_len)
        return seen, layer.keys[:, :, :kept], layer.values[:, :, :kept]
    if isinstance(layer, StaticLayer):
        seen = int(layer.get_seq_length())
        return seen, layer.keys[:, :, :seen], layer.values[:, :, :seen]
    return int(layer.get_seq_length()), layer.keys, layer.values


def _same_state(ours, plain, padding: int = 0) -> None:
    """Our settled cache holds what plain ``generate``'s holds, layer by layer (to float rounding: our entries
    come from multi-row forwards), but in the first ``padding`` columns, which no row attends to (what a padding
    token's entries hold past the first layer depends on how its fully masked row was computed)."""
    assert _kinds(ours) == _kinds(plain)
    for a, b in zip(ours.layers, plain.layers):
        (n, ka, va), (m, kb, vb) = _layer_state(a), _layer_state(b)
        assert n == m
        if ka is not None:
            assert ka.shape == kb.shape
            skip = padding if ka.shape[-2] == n else 0  # (a sliding layer holds the last tokens only)
            torch.testing.assert_close(ka[:, :, skip:], kb[:, :, skip:], rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(va[:, :, skip:], vb[:, :, skip:], rtol=1e-9, atol=1e-9)
        if isinstance(a, DynamicSlidingWindowLayer):
            assert not getattr(a, "record_past", False) and a.keys.shape[-2] == min(n, WINDOW - 1)


def _continue(model, sequences, cache, extra: torch.Tensor, **kw) -> list:
    """Plain greedy ``generate`` on ``sequences`` + ``extra``, continuing from a copy of ``cache``."""
    ids = torch.cat([sequences, extra], dim=1)
    return model.generate(ids, do_sample=False, max_new_tokens=20, eos_token_id=None,
                          **{cache_kwarg_name(model): copy.deepcopy(cache)}, **kw).tolist()


# -- a dynamic cache ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["mistral", "gemma3", "llama"])
@pytest.mark.parametrize("given", [False, True])
def test_a_dynamic_cache_past_the_window_goes_back_as_transformers_made_it(models, arch, given):
    """30 prompt tokens and 30 new ones (past the window of 16), into the cache generate made or one the caller
    passed: afterwards its layers are transformers' own (sliding ones restricted to their window, recording nothing),
    holding plain's entries, and plain ``generate`` continues from it as from plain's own cache."""
    model, ids = models(arch), _prompt(30)
    kw = dict(max_new_tokens=30, do_sample=False, eos_token_id=None, return_dict_in_generate=True)
    caches = [DynamicCache(config=model.config) for _ in range(2)] if given else [None, None]
    made = _kinds(caches[0]) if given else None
    extra = [{cache_kwarg_name(model): c} if c is not None else {} for c in caches]
    plain = model.generate(ids, **kw, **extra[0])
    decoder = LookaheadDecoder(cost_curve=TINY_COST_CURVE)
    ours = model.generate(ids, custom_generate=decoder, **kw, **extra[1])
    assert ours.sequences.tolist() == plain.sequences.tolist() and decoder.stats.accepted > 0
    cache = ours.past_key_values
    if given:
        assert cache is caches[1] and _kinds(cache) == made
    assert all(type(layer) in TRANSFORMERS_LAYERS for layer in cache.layers)
    if arch != "llama":
        assert DynamicSlidingWindowLayer in _kinds(cache)
    _same_state(cache, plain.past_key_values)
    more = _prompt(7, seed=1)
    want = _continue(model, plain.sequences, plain.past_key_values, more)
    assert _continue(model, ours.sequences, cache, more) == want
    assert want == model.generate(torch.cat([plain.sequences, more], 1), do_sample=False, max_new_tokens=20,
                                  eos_token_id=None).tolist()  # (continuing is plain decoding from scratch)


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_a_padded_rows_widened_sliding_layers_go_back_holding_their_window(models, arch):
    """One row with four columns of left padding, past the window: during the call its sliding layers keep every
    column (masked by position); afterwards they are transformers' sliding layers again, as plain's, and plain
    ``generate`` continues from the cache as from plain's."""
    model = models(arch)
    ids = torch.cat([torch.zeros((1, 4), dtype=torch.long), _prompt(26)], dim=1)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    kw = dict(attention_mask=mask, max_new_tokens=30, do_sample=False, eos_token_id=None,
              return_dict_in_generate=True)
    plain = model.generate(ids, **kw)
    ours = model.generate(ids, custom_generate=LookaheadDecoder(cost_curve=TINY_COST_CURVE), **kw)
    assert ours.sequences.tolist() == plain.sequences.tolist()
    _same_state(ours.past_key_values, plain.past_key_values, padding=4)
    more = _prompt(5, seed=2)
    longer = torch.cat([mask, torch.ones((1, ours.sequences.shape[1] - ids.shape[1] + 5), dtype=torch.long)], 1)
    assert _continue(model, ours.sequences, ours.past_key_values, more, attention_mask=longer) == \
        _continue(model, plain.sequences, plain.past_key_values, more, attention_mask=longer)


def test_a_second_decoder_call_continues_a_settled_dynamic_cache(models):
    """The settled cache is the decoder's own starting point too: a second call continues it, plain's tokens."""
    model, ids = models("gemma3"), _prompt(30)
    cache = DynamicCache(config=model.config)
    kw = dict(do_sample=False, eos_token_id=None, **{cache_kwarg_name(model): cache})
    first = model.generate(ids, max_new_tokens=30, custom_generate=LookaheadDecoder(cost_curve=TINY_COST_CURVE), **kw)
    assert all(type(layer) in TRANSFORMERS_LAYERS for layer in cache.layers)
    more = torch.cat([first, _prompt(7, seed=3)], dim=1)
    second = model.generate(more, max_new_tokens=30, custom_generate=LookaheadDecoder(cost_curve=TINY_COST_CURVE),
                            **kw)
    assert second.tolist() == model.generate(more, max_new_tokens=30, do_sample=False, eos_token_id=None).tolist()
    assert all(type(layer) in TRANSFORMERS_LAYERS for layer in cache.layers)


def test_a_batch_leaves_the_cache_it_was_handed_alone_and_returns_none_of_its_own(models):
    """A batch decodes into a cache of its own (its columns hold holes): the empty cache generate handed it stays
    transformers' and empty."""
    model = models("mistral")
    ids = torch.cat([_prompt(30), _prompt(30, seed=4)])
    cache = DynamicCache(config=model.config)
    made = _kinds(cache)
    kw = dict(max_new_tokens=24, do_sample=False, eos_token_id=None)
    plain = model.generate(ids, **kw)
    ours = model.generate(ids, custom_generate=LookaheadDecoder(cost_curve=TINY_COST_CURVE),
                          **{cache_kwarg_name(model): cache}, **kw)
    assert ours.tolist() == plain.tolist()
    assert _kinds(cache) == made and cache.get_seq_length() == 0


# -- a static cache ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["mistral", "gemma3", "llama"])
def test_a_static_cache_past_the_window_goes_back_as_transformers_made_it(models, arch):
    """A ``StaticCache`` of 128 columns through a call past the window: during it the sliding layers hold the
    cache's whole length; afterwards they are ``StaticSlidingWindowLayer``s again holding plain's window (the full
    ones plain's entries), plain ``generate`` continues from the cache as from plain's, and the cache, reset,
    serves a plain call as a new one would."""
    model, ids = models(arch), _prompt(30)
    name = cache_kwarg_name(model)
    caches = [StaticCache(config=model.config, max_cache_len=128) for _ in range(2)]
    made = _kinds(caches[0])
    assert (StaticSlidingWindowLayer in made) == (arch != "llama")
    seen = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append({type(layer).__name__ for layer in kwargs[name].layers}),
        with_kwargs=True)
    kw = dict(max_new_tokens=30, do_sample=False, eos_token_id=None)
    plain = model.generate(ids, **kw, **{name: caches[0]})
    seen.clear()
    try:
        decoder = LookaheadDecoder(cost_curve=TINY_COST_CURVE)
        ours = model.generate(ids, custom_generate=decoder, **kw, **{name: caches[1]})
    finally:
        hook.remove()
    assert ours.tolist() == plain.tolist() and decoder.stats.accepted > 0
    if arch != "llama":  # the call's steps saw the sliding layers at full length
        assert all("StaticSlidingWindowLayer" not in kinds and "FullLengthSlidingLayer" in kinds for kinds in seen)
    assert _kinds(caches[1]) == made
    _same_state(caches[1], caches[0])
    more = _prompt(7, seed=1)
    assert _continue(model, ours, caches[1], more) == _continue(model, plain, caches[0], more)
    caches[1].reset()  # reused: plain's tokens, as from a new cache
    assert model.generate(ids, **kw, **{name: caches[1]}).tolist() == plain.tolist()


def test_cache_implementation_static_returns_transformers_layers(models):
    """``cache_implementation="static"``: the cache generate made for the call comes back with its own classes and
    plain's contents."""
    model, ids = models("gemma3"), _prompt(30)
    kw = dict(max_new_tokens=30, do_sample=False, eos_token_id=None, cache_implementation="static",
              return_dict_in_generate=True)
    plain = model.generate(ids, **kw)
    ours = model.generate(ids, custom_generate=LookaheadDecoder(cost_curve=TINY_COST_CURVE), **kw)
    assert ours.sequences.tolist() == plain.sequences.tolist()
    assert isinstance(ours.past_key_values, StaticCache)
    _same_state(ours.past_key_values, plain.past_key_values)
