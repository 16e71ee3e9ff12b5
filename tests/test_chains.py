"""Models that take no 4D attention mask (Bloom, Falcon with ALiBi: their position biases come from a 2D mask's
shape): one row decodes with one chain of drafts per step, verified causally, the same tokens as plain ``generate``;
a batch, a padded row or a static cache is refused before any forward; the chain kernel on a hand-made tree; the
calibration's causal steps."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers as tf
from transformers.cache_utils import DynamicCache

from lookahead import LookaheadDecoder, compat
from lookahead._tuning import Tuning
from lookahead.calibrate import step_timer
from lookahead.drafting.trees import best_chain
from lookahead.verify import Verifier

from tiny import TINY_COST_CURVE


def _model(arch: str):
    if arch == "bloom":
        cfg, cls = tf.BloomConfig(vocab_size=96, hidden_size=32, n_layer=2, n_head=4), tf.BloomForCausalLM
    elif arch == "falcon-alibi":
        cfg = tf.FalconConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True)
        cls = tf.FalconForCausalLM
    else:
        raise KeyError(arch)
    torch.manual_seed(1234)
    model = cls(cfg).eval().to(torch.float64)
    model.generation_config.pad_token_id = 0
    return model


@pytest.fixture(scope="module")
def models():
    return {arch: _model(arch) for arch in ("bloom", "falcon-alibi")}


def _prompt(length: int = 30) -> torch.Tensor:
    base = torch.randint(3, 96, (12,), generator=torch.Generator().manual_seed(0))
    return base.repeat(length // 12 + 1)[:length][None]


class _Masks:
    """The attention masks the model's forwards were given (None, or their number of dimensions)."""

    def __init__(self, model):
        self.seen = []
        self.handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        mask = kwargs.get("attention_mask")
        self.seen.append(None if mask is None else mask.dim())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def test_which_models_take_tree_masks(models):
    assert not compat.takes_tree_masks(models["bloom"]) and not compat.takes_tree_masks(models["falcon-alibi"])
    torch.manual_seed(0)
    plain_falcon = tf.FalconForCausalLM(tf.FalconConfig(vocab_size=96, hidden_size=32, num_hidden_layers=1,
                                                        num_attention_heads=4))
    assert compat.takes_tree_masks(plain_falcon)


@pytest.mark.parametrize("arch", ["bloom", "falcon-alibi"])
@pytest.mark.parametrize("settings", [dict(cost_curve=TINY_COST_CURVE),
                                      dict(window=4, _tuning=Tuning(adaptive=False, tree_nodes=40, tree_depth=12))])
def test_one_chain_per_step_is_plain_generate(models, arch, settings):
    model, ids = models[arch], _prompt()
    kw = dict(max_new_tokens=50, do_sample=False, eos_token_id=None)
    plain = model.generate(ids, **kw)
    decoder = LookaheadDecoder(**settings)
    with _Masks(model) as masks:
        ours = model.generate(ids, custom_generate=decoder, **kw)
    assert ours.tolist() == plain.tolist()
    assert set(masks.seen[-decoder.stats.target_calls:]) == {None}  # every step causal: the model's own mask
    assert all(rows == 0 for _, rows in decoder.stats.budgets)  # no window rows
    assert decoder.stats.accepted > 0 and decoder.stats.target_calls < 40  # the chains were worth verifying


def test_the_sampled_path_with_chains(models):
    """``top_k=1`` sampling takes the sampled verification and picks the argmax: plain greedy's tokens."""
    model, ids = models["bloom"], _prompt()
    plain = model.generate(ids, max_new_tokens=40, do_sample=False, eos_token_id=None)
    ours = model.generate(ids, custom_generate=LookaheadDecoder(cost_curve=TINY_COST_CURVE), max_new_tokens=40,
                          do_sample=True, top_k=1, eos_token_id=None)
    assert ours.tolist() == plain.tolist()


def test_a_batch_a_padded_row_or_a_static_cache_is_refused_before_any_forward(models):
    model, ids = models["bloom"], _prompt()
    padded = torch.ones_like(ids)
    padded[0, 0] = 0
    with _Masks(model) as masks:
        for kw in (dict(input_ids=ids.repeat(2, 1)), dict(input_ids=ids, attention_mask=padded),
                   dict(input_ids=ids, cache_implementation="static")):
            with pytest.raises(ValueError, match="one unpadded row at a time on a dynamic cache"):
                model.generate(custom_generate=LookaheadDecoder(), max_new_tokens=5, **kw)
    assert not masks.seen


def test_best_chain_worked_example():
    parents = np.array([-1, 0, -1, 2, 3])
    assert best_chain(parents, np.array([0.9, 0.1, 0.5, 0.4, 0.3])).tolist() == [2, 3, 4]
    assert best_chain(parents, np.array([0.9, 0.2, 0.5, 0.4, 0.1])).tolist() == [0, 1]  # 1.1 beats 1.0
    assert best_chain(parents, np.ones(5)).tolist() == [2, 3, 4]  # the deepest
    assert best_chain(np.array([-1, -1]), np.ones(2)).tolist() == [0]  # equal: the first met
    assert best_chain(np.zeros(0, np.int64), np.zeros(0)).tolist() == []


def test_the_calibration_times_causal_steps(models):
    model = models["bloom"]
    call = SimpleNamespace(  # what step_timer reads of a call of a model that takes no 4D mask
        model=model, device=model.device, dtype=model.dtype, tuning=Tuning(recycle_k=8), chains=True,
        cache_kwarg=compat.cache_kwarg_name(model), keeps_logits=compat.supports_logits_to_keep(model),
        verifier=Verifier(model.device, model.config.vocab_size, [None], None, False))
    time_one = step_timer(call, DynamicCache, lambda: 0.0, 4, model, context=16)
    assert time_one(4) == 0.0 and time_one(1) == 0.0  # (the injected clock) steps of 4 and 1 rows ran


class _Puts:
    """A streamer that records each put()."""

    def __init__(self):
        self.puts, self.ends = [], 0

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ends += 1


def test_an_enabled_default_runs_plain_generate_where_the_set_up_refuses(models):
    """lookahead.enable(model, default=...): a call only the decoder's set-up can refuse (a batch of an ALiBi model)
    runs plain generate with a warning, its streamer getting the prompt once; an explicit flag raises instead."""
    import lookahead

    model = _model("bloom")  # its own: enable() changes the instance
    batch = _prompt().repeat(2, 1)
    kw = dict(max_new_tokens=8, do_sample=False, eos_token_id=None)
    plain = _Puts()
    expected = model.generate(batch, **kw)
    lookahead.enable(model, default=LookaheadDecoder())
    with pytest.warns(UserWarning, match="runs plain generate.*one unpadded row at a time"):
        assert model.generate(batch, **kw).tolist() == expected.tolist()
    with pytest.warns(UserWarning, match="runs plain generate"):
        model.generate(batch[:1], attention_mask=torch.cat([torch.zeros(1, 1), torch.ones(1, 29)], 1).long(),
                       streamer=plain, **kw)
    assert plain.puts[0] == batch[0].tolist() and sum(len(p) for p in plain.puts[1:]) == 8 and plain.ends == 1
    with pytest.raises(ValueError, match="one unpadded row at a time"):
        model.generate(batch, lookahead=True, **kw)
    lookahead.disable(model)
