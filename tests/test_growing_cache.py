"""GrowingLayer: the decoder's cache layer that writes new entries in place instead of concatenating.

Every check compares it with transformers' own ``DynamicLayer`` fed the same operations: same entries,
same forwards' logits, same lengths, through crops, in-place gathers, row selection, reordering, and
growth past the spare columns.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from lookahead.compat import cache_kwarg_name
from lookahead.kv import GrowingLayer, keep_entries, new_cache

from tiny import TINY_ARCHS

GROW_COLUMNS = GrowingLayer.grow  # spare columns a growing layer allocates


def _entries(start: int, n: int, rows: int = 1) -> torch.Tensor:
    """[rows, 1, n, 2] with entry j of row r = (start + j + 1000 r, -(start + j))."""
    j = torch.arange(start, start + n, dtype=torch.float32)
    one = torch.stack([j, -j], -1)[None, None]  # [1, 1, n, 2]
    return torch.cat([one + 1000 * r for r in range(rows)])


def _both():
    return GrowingLayer(), DynamicLayer()


def _same(a, b) -> None:
    assert a.get_seq_length() == b.get_seq_length()
    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_updates_write_in_place_and_grow_with_spare_columns():
    grow, plain = _both()
    for layer in (grow, plain):
        layer.update(_entries(0, 5), _entries(0, 5) + 0.5)
    _same(grow, plain)
    storage = grow._storage[0]
    assert storage.shape[-2] == 5 + GROW_COLUMNS
    for i in range(GROW_COLUMNS):
        for layer in (grow, plain):
            layer.update(_entries(5 + i, 1), _entries(5 + i, 1) + 0.5)
        assert grow._storage[0] is storage  # no reallocation while the spare columns last
    _same(grow, plain)
    for layer in (grow, plain):
        keys, values = layer.update(_entries(5 + GROW_COLUMNS, 1), _entries(5 + GROW_COLUMNS, 1) + 0.5)
    assert grow._storage[0] is not storage and grow._storage[0].shape[-2] == 6 + 2 * GROW_COLUMNS
    _same(grow, plain)
    assert keys.shape == (1, 1, 6 + GROW_COLUMNS, 2)  # update returns the entries, not the buffer


def test_crop_then_update_reuses_the_freed_columns():
    grow, plain = _both()
    for layer in (grow, plain):
        layer.update(_entries(0, 10), _entries(0, 10))
        layer.crop(-4)
    _same(grow, plain)
    storage = grow._storage[0]
    for layer in (grow, plain):
        layer.update(_entries(50, 3), _entries(50, 3))
    assert grow._storage[0] is storage
    _same(grow, plain)
    assert grow.keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5, 50, 51, 52]


def test_crops_read_between_and_past_the_entries():
    """A crop only shortens the length; what is read after it (length, keys, values), a crop of more entries than
    the layer holds, a crop of none, and a positive count are DynamicLayer's."""
    grow, plain = _both()
    for layer in (grow, plain):
        layer.update(_entries(0, 9), _entries(0, 9) + 0.5)
        layer.crop(-2)
        layer.crop(-3)
        layer.crop(0)
    _same(grow, plain)
    assert grow.get_seq_length() == 4 and grow.keys[0, 0, :, 0].tolist() == [0, 1, 2, 3]
    for layer in (grow, plain):
        layer.crop(-7)  # more than it holds: none left
    _same(grow, plain)
    assert grow.get_seq_length() == 0
    for layer in (grow, plain):
        layer.update(_entries(20, 2), _entries(20, 2) + 0.5)
    _same(grow, plain)
    for layer in (grow, plain):
        with pytest.raises(ValueError, match="positive"):
            layer.crop(3)
    _same(grow, plain)


@pytest.mark.parametrize("which", ["keys", "values"])
def test_an_assignment_after_a_crop_is_adopted_with_the_cropped_other(which):
    """A crop, then one of the two assigned from outside: the other stays the cropped entries, and the next update
    continues both from there."""
    grow, plain = _both()
    for layer in (grow, plain):
        layer.update(_entries(0, 6), _entries(0, 6) + 0.5)
        layer.crop(-2)
        setattr(layer, which, _entries(100, 4))  # without reading the layer first
    _same(grow, plain)
    for layer in (grow, plain):
        layer.update(_entries(30, 1), _entries(30, 1) + 0.5)
    _same(grow, plain)
    assert grow.get_seq_length() == 5


def test_in_place_gather_lands_in_the_buffer():
    """keep_entries writes into ``layer.keys`` in place: the next update must keep those writes."""
    caches = [DynamicCache(), DynamicCache()]
    caches[0].layers.append(GrowingLayer())
    caches[1].layers.append(DynamicLayer())
    for cache in caches:
        cache.update(_entries(0, 7), _entries(0, 7) + 0.5, 0)
        keep_entries(cache, n_new=5, keep=[0, 2, 4])
        cache.update(_entries(9, 1), _entries(9, 1) + 0.5, 0)
    _same(caches[0].layers[0], caches[1].layers[0])
    assert caches[0].layers[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 4, 6, 9]


@pytest.mark.parametrize("operation", ["select", "reorder", "repeat", "reset", "crop-reset"])
def test_entries_replaced_from_outside_are_adopted(operation):
    """Row selection, beam reordering, repetition and reset replace ``keys`` with tensors of their own."""
    grow, plain = _both()
    for layer in (grow, plain):
        layer.update(_entries(0, 6, rows=3), _entries(0, 6, rows=3) + 0.5)
        if operation == "select":
            layer.batch_select_indices(torch.tensor([2, 0]))
        elif operation == "reorder":
            layer.reorder_cache(torch.tensor([1, 1, 0]))
        elif operation == "repeat":
            layer.batch_repeat_interleave(2)
        else:
            if operation == "crop-reset":  # a crop's shorter length not yet read: reset drops it too
                layer.crop(-2)
            layer.reset()
    rows = plain.keys.shape[0] if plain.is_initialized else 3
    for layer in (grow, plain):
        layer.update(_entries(6, 2, rows=rows), _entries(6, 2, rows=rows) + 0.5)
    _same(grow, plain)


def test_new_cache_replaces_only_plain_layers():
    from tiny import tiny_model

    model = tiny_model("mistral")
    model.config.sliding_window = 8
    model.config.layer_types = ["sliding_attention", "full_attention"]
    cache = new_cache(model)
    assert isinstance(cache, DynamicCache)
    types = [type(layer) for layer in cache.layers]
    assert GrowingLayer in types and DynamicSlidingWindowLayer in types


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_forwards_with_growing_layers_equal_plain_cache_bit_for_bit(arch, tiny_models, monkeypatch):
    """A prompt, then single tokens and a crop, past a reallocation: logits identical to DynamicCache's."""
    monkeypatch.setattr(GrowingLayer, "grow", 3)  # reallocate often
    model = tiny_models(arch)
    kw = cache_kwarg_name(model)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (2, 20), generator=gen)
    logits = []
    for cache in (new_cache(model), DynamicCache(config=model.config)):
        out = []
        with torch.no_grad():
            out.append(model(input_ids=ids[:, :6], use_cache=True, **{kw: cache}).logits)
            for t in range(6, 14):
                if t == 10:
                    cache.crop(-2)  # drop two entries, then decode over them again
                    for s in (8, 9):
                        out.append(model(input_ids=ids[:, s : s + 1], position_ids=torch.tensor([[s]] * 2),
                                         use_cache=True, **{kw: cache}).logits)
                out.append(model(input_ids=ids[:, t : t + 1], position_ids=torch.tensor([[t]] * 2), use_cache=True,
                                 **{kw: cache}).logits)
        logits.append(torch.cat(out, 1))
        assert cache.get_seq_length() == 14
    assert torch.equal(logits[0], logits[1])


def test_generate_fills_its_own_cache_and_hands_it_back_plain(tiny_models):
    """generate() hands the decoder an empty DynamicCache: the decoder fills that object (its layers growing during
    the call) and returns it with plain ``DynamicLayer``s again (``kv.settle``); plain generate continues from it as
    from its own."""
    from lookahead import LookaheadDecoder

    model = tiny_models("llama")
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])
    given = DynamicCache(config=model.config)
    seen = []  # the layers' classes at each forward of the call
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append({type(layer) for layer in kwargs[cache_kwarg_name(model)].layers}),
        with_kwargs=True)
    try:
        out = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False, custom_generate=LookaheadDecoder(),
                             return_dict_in_generate=True, **{cache_kwarg_name(model): given})
    finally:
        hook.remove()
    assert seen and all(types == {GrowingLayer} for types in seen)  # the given cache's layers grew in place
    cache = getattr(out, "cache", None) or out.past_key_values
    assert cache is given and all(type(layer) is DynamicLayer for layer in cache.layers)
    plain = model.generate(input_ids=ids, max_new_tokens=6, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(out.sequences, plain.sequences)
    more = model.generate(input_ids=out.sequences, max_new_tokens=4, do_sample=False,
                          **{cache_kwarg_name(model): cache})
    assert torch.equal(more, model.generate(input_ids=out.sequences, max_new_tokens=4, do_sample=False))
