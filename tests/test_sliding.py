"""One row decoded past a sliding attention window (``lookahead/sliding.py``): the same tokens as plain ``generate`` on
models that slide in every layer (Mistral), that name their layers' kinds (Gemma 3, Qwen2 with a window; Llama 4's
chunked attention), trees,
the lookahead window and the sampled path included; the cache it returns continues as plain's; on a static cache,
eager and compiled, as plain static ``generate``; a left-padded batch, or row, as plain ``generate``; what is still
refused (a padded row on a static cache) is refused before any forward; the masks on hand-made examples."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from lookahead import LookaheadDecoder
from lookahead._tuning import Tuning
from lookahead.compat import cache_kwarg_name
from lookahead.kv import CacheNotRollbackable
from lookahead.sliding import CHUNKED, FULL, SLIDING, SlidingWindow, is_sliding

from tiny import TINY_COST_CURVE

WINDOW = 16
COMMON = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512)


def _model(arch: str):
    """A tiny float64 model whose sliding layers see ``WINDOW`` tokens."""
    if arch == "mistral":  # every layer slides; no config.layer_types: one mask for all
        cfg, cls = tf.MistralConfig(sliding_window=WINDOW, num_hidden_layers=2, **COMMON), tf.MistralForCausalLM
    elif arch == "gemma3":  # sliding and full layers, named in config.layer_types: masks per layer type
        cfg = tf.Gemma3TextConfig(sliding_window=WINDOW, head_dim=8, num_hidden_layers=3,
                                  layer_types=[SLIDING, FULL, SLIDING], **COMMON)
        cls = tf.Gemma3ForCausalLM
    elif arch == "qwen2":  # the first layer full, the second sliding
        cfg = tf.Qwen2Config(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1, num_hidden_layers=2,
                             **COMMON)
        cls = tf.Qwen2ForCausalLM
    elif arch == "llama4":  # chunked attention (chunks of WINDOW positions) beside a full layer; experts: float32
        cfg = tf.Llama4TextConfig(attention_chunk_size=WINDOW, head_dim=8, num_hidden_layers=4, num_local_experts=2,
                                  interleave_moe_layer_step=1, intermediate_size_mlp=64, pad_token_id=0,
                                  bos_token_id=1, eos_token_id=2, **COMMON)
        cls = tf.Llama4ForCausalLM
    else:
        raise KeyError(arch)
    torch.manual_seed(1234)
    model = cls(cfg).eval().to(torch.float32 if arch == "llama4" else torch.float64)
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="module")
def models():
    cache = {}

    def get(arch):
        if arch not in cache:
            cache[arch] = _model(arch)
        return cache[arch]

    return get


def _prompt(length: int) -> torch.Tensor:
    """long[1, length]: 12 random ids repeated, so that the n-gram sources draft trees."""
    base = torch.randint(3, 96, (12,), generator=torch.Generator().manual_seed(0))
    return base.repeat(length // 12 + 1)[:length][None]


DECODERS = {
    "default": dict(cost_curve=TINY_COST_CURVE),
    "full trees and the window": dict(window=4, _tuning=Tuning(adaptive=False, tree_nodes=40, tree_depth=12)),
}


@pytest.mark.parametrize("arch", ["mistral", "gemma3", "qwen2", "llama4"])
@pytest.mark.parametrize("settings", list(DECODERS))
@pytest.mark.parametrize("prompt_length", [30, 9])  # longer than the window; shorter, the answer crossing it
def test_greedy_past_the_window_is_plain_generate(models, arch, settings, prompt_length):
    model, ids = models(arch), _prompt(prompt_length)
    kw = dict(max_new_tokens=50, do_sample=False, eos_token_id=None)
    plain = model.generate(ids, **kw)
    decoder = LookaheadDecoder(**DECODERS[settings])
    ours = model.generate(ids, custom_generate=decoder, **kw)
    assert ours.tolist() == plain.tolist()
    assert decoder.stats.target_calls < 50 and sum(b[0] for b in decoder.stats.budgets) > 0  # trees were verified


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_the_sampled_path_past_the_window(models, arch):
    """Sampling with ``top_k=1`` picks the argmax through the sampled verification (processed scores, the sampling
    acceptance rule): the same tokens as plain greedy decoding."""
    model, ids = models(arch), _prompt(30)
    plain = model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=None)
    ours = model.generate(ids, custom_generate=LookaheadDecoder(cost_curve=TINY_COST_CURVE), max_new_tokens=40,
                          do_sample=True, top_k=1, eos_token_id=None)
    assert ours.tolist() == plain.tolist()


def test_the_returned_cache_is_restricted_and_continues_as_plain(models):
    model, ids = models("gemma3"), _prompt(30)
    kw = dict(max_new_tokens=30, do_sample=False, eos_token_id=None, return_dict_in_generate=True)
    plain = model.generate(ids, **kw)
    ours = model.generate(ids, custom_generate=LookaheadDecoder(cost_curve=TINY_COST_CURVE), **kw)
    assert ours.sequences.tolist() == plain.sequences.tolist()
    for layer in ours.past_key_values.layers:
        if is_sliding(layer):  # as plain generate leaves it: its window's last tokens, recording nothing more
            assert not layer.record_past and layer.keys.shape[-2] == WINDOW - 1
    more = torch.cat([plain.sequences, _prompt(5)], dim=1)
    then = [model.generate(more, max_new_tokens=20, do_sample=False, eos_token_id=None,
                           **{cache_kwarg_name(model): out.past_key_values}).tolist() for out in (plain, ours)]
    assert then[0] == then[1]


@pytest.mark.parametrize("drafter", ["draft model", "early exit"])
def test_draft_passes_past_the_window(models, drafter):
    """A draft pass keeps a cache of its own (plain layers: a sliding one could not be cropped past the window)."""
    pytest.importorskip("lookahead.passes", reason="the draft passes (lookahead.passes) are not there yet")
    model, ids = models("mistral"), _prompt(30)
    kw = dict(max_new_tokens=40, do_sample=False, eos_token_id=None)
    plain = model.generate(ids, **kw)
    decoder = LookaheadDecoder(draft=model if drafter == "draft model" else "early-exit",
                               _tuning=Tuning(adaptive=False, self_draft_size=0.5))
    assert model.generate(ids, custom_generate=decoder, **kw).tolist() == plain.tolist()
    assert decoder.stats.accepted_by_origin["draft-model" if drafter == "draft model" else "early-exit"] > 0


def test_a_call_continuing_a_cache_already_past_the_window(models):
    """The cache of an earlier call holds the window's last tokens only (and the full layers everything): the
    decoder continues it as plain ``generate`` does."""
    import copy

    model, ids = models("gemma3"), _prompt(30)
    first = model.generate(ids, max_new_tokens=30, do_sample=False, eos_token_id=None, return_dict_in_generate=True)
    more = torch.cat([first.sequences, _prompt(7)], dim=1)
    outs = [model.generate(more, max_new_tokens=40, do_sample=False, eos_token_id=None,
                           **{cache_kwarg_name(model): copy.deepcopy(first.past_key_values)}, **extra).tolist()
            for extra in ({}, {"custom_generate": LookaheadDecoder(cost_curve=TINY_COST_CURVE)})]
    assert outs[0] == outs[1]


@pytest.mark.parametrize("arch", ["mistral", "gemma3", "qwen2", "llama4"])
@pytest.mark.parametrize("settings", list(DECODERS))
def test_a_static_cache_past_the_window_is_plain_static_generate(models, arch, settings):
    """The static cache's sliding layers are given its whole length before the first forward, the same attention
    through their own masks."""
    model, ids = models(arch), _prompt(30)
    kw = dict(max_new_tokens=40, do_sample=False, eos_token_id=None, cache_implementation="static")
    plain = model.generate(ids, **kw)
    decoder = LookaheadDecoder(**DECODERS[settings])
    assert model.generate(ids, custom_generate=decoder, **kw).tolist() == plain.tolist()
    assert decoder.stats.target_calls < 40


def test_a_static_cache_given_twice_keeps_its_sliding_layers_masked(models):
    """A ``StaticCache`` passed to two calls: the first gives its sliding layers the cache's length for the call and
    hands them back as transformers' own ring layers (``kv.settle``); the second continues it and still masks them by
    the window."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer

    model, ids = models("gemma3"), _prompt(30)
    cache = StaticCache(config=model.config, max_cache_len=120)
    kw = dict(do_sample=False, eos_token_id=None, **{cache_kwarg_name(model): cache})
    first = model.generate(ids, max_new_tokens=30, custom_generate=LookaheadDecoder(cost_curve=TINY_COST_CURVE), **kw)
    assert [type(layer) for layer in cache.layers] == [StaticSlidingWindowLayer, StaticLayer, StaticSlidingWindowLayer]
    more = torch.cat([first, _prompt(7)], dim=1)
    second = model.generate(more, max_new_tokens=30, custom_generate=LookaheadDecoder(cost_curve=TINY_COST_CURVE),
                            **kw)
    assert second.tolist() == model.generate(more, max_new_tokens=30, do_sample=False, eos_token_id=None).tolist()


def test_compiled_static_steps_past_the_window_reuse_their_graphs(models):
    from transformers import CompileConfig, GenerationConfig

    model, ids = models("gemma3"), _prompt(30)
    config = CompileConfig(fullgraph=True, backend="aot_eager", dynamic=False)
    config._compile_all_devices = True  # a CPU: compile as a CUDA user's generate would
    gen = GenerationConfig(max_new_tokens=40, do_sample=False, cache_implementation="static", compile_config=config,
                           eos_token_id=None, pad_token_id=0)
    # the reference runs eagerly: plain compiled generate recompiles its step at every token here (it guards on the
    # sliding layers' Python length; transformers 5.25), past fullgraph's recompile limit
    plain = model.generate(ids, max_new_tokens=40, do_sample=False, cache_implementation="static", eos_token_id=None)
    torch._dynamo.reset()
    full = Tuning(adaptive=False)
    assert model.generate(ids, generation_config=gen, custom_generate=LookaheadDecoder(_tuning=full)).tolist() \
        == plain.tolist()
    with torch.compiler.set_stance("fail_on_recompile"):  # every bucket's graph, its masks a dict, is reused
        assert model.generate(ids, generation_config=gen, custom_generate=LookaheadDecoder(_tuning=full)).tolist() \
            == plain.tolist()


def _left_padded(*rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids long[b, L], attention mask long[b, L]) of ``rows``, left-padded with 0 to the longest."""
    length = max(len(r) for r in rows)
    ids, mask = torch.zeros((len(rows), length), dtype=torch.long), torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, length - len(r):], mask[i, length - len(r):] = r, 1
    return ids, mask


@pytest.mark.parametrize("arch", ["mistral", "gemma3", "qwen2", "llama4"])
@pytest.mark.parametrize("sample", [False, True])
def test_a_batch_past_the_window_is_plain_batched_generate(models, arch, sample):
    """Three left-padded rows of 30, 21 and 9 tokens, 40 new ones each: the sliding layers keep every column (the
    rows' holes differ), masked by each row's positions. Sampled: ``top_k=1`` through the sampled verification."""
    model = models(arch)
    ids, mask = _left_padded(_prompt(30)[0], _prompt(21)[0] + 1, _prompt(9)[0] + 2)
    kw = dict(max_new_tokens=40, eos_token_id=None, attention_mask=mask, pad_token_id=0)
    plain = model.generate(ids, do_sample=False, **kw)
    decoder = LookaheadDecoder(cost_curve=TINY_COST_CURVE)
    ours = model.generate(ids, custom_generate=decoder, **kw, **(dict(do_sample=True, top_k=1) if sample else
                                                                 dict(do_sample=False)))
    assert ours.tolist() == plain.tolist()
    assert decoder.stats.target_calls < 40


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_one_padded_row_past_the_window_is_plain_generate(models, arch):
    """A row with left padding (batch size 1): its sliding layers keep every column, masked by its positions, as a
    batch's."""
    model = models(arch)
    ids, mask = _left_padded(_prompt(30)[0], _prompt(26)[0])
    ids, mask = ids[1:], mask[1:]  # the second row alone, with its four columns of padding
    kw = dict(max_new_tokens=40, do_sample=False, eos_token_id=None, attention_mask=mask, pad_token_id=0)
    plain = model.generate(ids, **kw)
    decoder = LookaheadDecoder(cost_curve=TINY_COST_CURVE)
    assert model.generate(ids, custom_generate=decoder, **kw).tolist() == plain.tolist()
    assert decoder.stats.target_calls < 40


def test_a_padded_row_continuing_a_cache_past_the_window_is_refused_before_any_forward(models):
    """Its sliding layers hold only the window's last tokens: the earlier columns a padded row's masks need are
    gone."""
    model = models("mistral")
    first = model.generate(_prompt(30), max_new_tokens=5, do_sample=False, eos_token_id=None,
                           return_dict_in_generate=True)
    ids = torch.cat([torch.zeros((1, 1), dtype=torch.long), first.sequences, _prompt(3)], dim=1)
    mask = torch.ones_like(ids)
    mask[0, 0] = 0
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        with pytest.raises(CacheNotRollbackable, match="starts from an empty cache"):
            model.generate(ids, attention_mask=mask, custom_generate=LookaheadDecoder(), max_new_tokens=5,
                           **{cache_kwarg_name(model): first.past_key_values})
    finally:
        handle.remove()
    assert not calls


def test_a_padded_row_on_a_static_cache_past_the_window_is_refused_before_any_forward(models):
    model = models("mistral")
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        ids = _prompt(30)
        mask = torch.ones_like(ids)
        mask[0, 0] = 0
        with pytest.raises(CacheNotRollbackable, match="unpadded row only"):
            model.generate(ids, attention_mask=mask, custom_generate=LookaheadDecoder(), max_new_tokens=5,
                           cache_implementation="static")
    finally:
        handle.remove()
    assert not calls


def test_masks_worked_example():
    """The module docstring's example: window 4, 5 tokens cached, the pending token (position 5) and a node under
    it (position 6). Only the sliding layers' mask hides position 2 from the node; a chunked layer's (chunks of 4:
    positions 4-7) hides 2 and 3 from both."""
    neg = torch.finfo(torch.float32).min
    full = torch.zeros((1, 1, 2, 7))
    full[0, 0, 0, 6] = neg  # the pending row does not see the node
    sliding = SlidingWindow(4).masks(full, torch.tensor([[5, 6]]), past=5)
    assert sliding.shape == (1, 1, 2, 5)  # positions 2, 3, 4 cached, then 5 and 6
    assert (sliding[0, 0] == neg).tolist() == [[False, False, False, False, True], [True, False, False, False, False]]
    assert (full == 0).sum() == 13  # not changed
    both = SlidingWindow(4, (SLIDING, FULL)).masks(full, torch.tensor([[5, 6]]), past=5)
    assert both[FULL] is full and torch.equal(both[SLIDING], sliding)
    assert set(SlidingWindow(4, (SLIDING,)).masks(full, torch.tensor([[5, 6]]), past=5)) == {SLIDING}
    chunked = SlidingWindow(4, (CHUNKED, FULL)).masks(full, torch.tensor([[5, 6]]), past=5)[CHUNKED]
    assert (chunked[0, 0] == neg).tolist() == [[True, True, False, False, True], [True, True, False, False, False]]
    early = SlidingWindow(4).masks(torch.zeros((1, 1, 1, 3)), torch.tensor([[2]]), past=2)  # inside the window
    assert early.shape == (1, 1, 1, 3) and not (early == neg).any()


def test_static_masks_read_a_step_columns_positions():
    """On a static cache a step's columns hold its rows' positions, by depth: chunks of 4, 2 tokens cached, the
    pending token (position 2, column 2) and two sibling nodes (position 3, columns 3 and 4). The second sibling's
    column is in chunk 0 by its position, so it sees itself (and the pending token, and the cached ones)."""
    neg = torch.finfo(torch.float32).min
    full = torch.zeros((1, 1, 3, 6))
    full[0, 0, 0, 3:] = neg  # the pending row sees columns 0-2
    full[0, 0, 1, 4:] = neg  # the first sibling: 0-3
    full[0, 0, 2, 3] = full[0, 0, 2, 5] = neg  # the second: 0-2 and itself (column 4)
    masks = SlidingWindow(4, (CHUNKED, FULL)).static_masks(full, torch.tensor([[2, 3, 3]]), past=2)
    assert masks[FULL] is full and torch.equal(masks[CHUNKED], full)  # every visible key is in the row's chunk
    sliding = SlidingWindow(3).static_masks(full, torch.tensor([[2, 3, 3]]), past=2)  # a window of 3
    assert (sliding[0, 0] == neg).tolist() == [[False, False, False, True, True, True],
                                               [True, False, False, False, True, True],
                                               [True, False, False, True, False, True]]


@pytest.mark.parametrize("kwargs, field", [(dict(window=1), "window"),
                                           (dict(window=8, layer_types=("linear_attention",)), "layer_types")])
def test_sliding_window_config_is_validated(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SlidingWindow(**kwargs)
