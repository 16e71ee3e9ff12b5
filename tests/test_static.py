"""Static caches: fixed-shape (bucketed) steps, rollback inside the cache's buffers, compiled forwards.

Plain static ``generate`` is the reference: the decoder on ``cache_implementation="static"`` must give its
tokens (greedy) and its distribution (sampled), eagerly and compiled (``backend="aot_eager"``,
``fullgraph=True``: no graph break, and no recompile once every bucket has run).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import CompileConfig, GenerationConfig, StaticCache

from lookahead import LookaheadDecoder
from lookahead._tuning import DEFAULT, Tuning
from lookahead.cost import CostModel
from lookahead.static import StaticMask, bucket_of, bucketed_curve, buckets_for, keep_static
from lookahead.whole_step import pack_step

from tiny import TINY_COST_CURVE, peaky_llama, tiny_model

FLAT = ((1, 0.010), (2, 0.010), (256, 0.0102))
REPETITIVE = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
STATIC_ARCHS = ["llama", "qwen2", "gpt2", "phi3", "gemma"]  # sliding-window static layers: tests/test_sliding.py
NO_BUDGET = Tuning(adaptive=False)  # every step verifies the whole draft
CODE_PROMPT = ("Here is a Python class. Add a docstring to every method and return the whole class.\n\n```python\n"
               "class Inventory:\n    def __init__(self):\n        self.items = {}\n\n    def add(self, name, count):\n"
               "        self.items[name] = self.items.get(name, 0) + count\n\n    def remove(self, name, count):\n"
               "        if self.items.get(name, 0) < count:\n            raise ValueError(name)\n"
               "        self.items[name] -= count\n```")


class FakeClock:
    """Every reading 1 ms after the last: every timed forward takes the same time, on any machine."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.001
        return self.t


def test_bucket_helpers_docstring_examples():
    assert buckets_for(20, DEFAULT.buckets) == (1, 8, 16, 32)
    assert bucket_of(9, (1, 8, 16), 100) == 16 and bucket_of(9, (1, 8, 16), 12) == 8
    curve = bucketed_curve(CostModel([(1, 0.010), (8, 0.012), (16, 0.015)]), (1, 8, 16))
    assert [round(float(curve(k)), 6) for k in (1, 2, 8, 9, 16, 24)] == [0.010, 0.012, 0.012, 0.015, 0.015, 0.018]


def test_static_mask_equals_the_dynamic_mask_and_hides_the_rest():
    rng = np.random.default_rng(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        columns, past = 160, 20
        pad = np.ones(columns + 1, bool)
        pad[:3] = False
        mask = StaticMask(32, columns, dtype, "cpu", pad)
        for _ in range(30):
            n = int(rng.integers(0, 20))
            parents = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int64)
            q = bucket_of(1 + n, (1, 8, 16, 32), columns - past)
            got = mask(past, 1, parents, None, q)
            _, _, want = pack_step(np.array([1]), np.array([past]), np.zeros(n, np.int64), parents, pad[: past + 1],
                                   past, dtype)
            assert got.shape == (1, 1, q, columns)
            assert torch.equal(got[0, 0, : 1 + n, : past + 1 + n], want[0, 0])
            neg = torch.finfo(dtype).min
            assert bool((got[0, 0, :, past + q :] == neg).all())  # columns after the step: hidden
            assert bool((got[0, 0, : 1 + n, past + 1 + n : past + q] == neg).all())  # the dummies, from real rows
            for r in range(1 + n, q):  # a dummy row: the cached columns, the pending token and itself
                seen = (got[0, 0, r] == 0).nonzero().flatten().tolist()
                assert seen == [c for c in range(past) if pad[c]] + [past, past + r]
            past += int(rng.integers(1, 5))


def test_keep_static_moves_the_kept_columns_and_gives_back_the_rest(tiny_models):
    model = tiny_models("llama")
    cache = StaticCache(config=model.config, max_cache_len=40)
    model(torch.tensor([REPETITIVE]), cache=cache, use_cache=True)
    layer = cache.layers[0]
    before = layer.keys.clone()
    keep_static(cache, 5, [0, 2, 5], 8)  # as if the step's 8 rows were written at columns 5 .. 12
    assert int(layer.cumulative_length) == 13 - 5
    assert torch.equal(layer.keys[:, :, 5:8], before[:, :, [5, 7, 10]])
    assert torch.equal(layer.keys[:, :, :5], before[:, :, :5])


@pytest.mark.parametrize("arch", STATIC_ARCHS)
def test_greedy_on_a_static_cache_is_plain_static_generate(tiny_models, arch):
    model = tiny_models(arch)
    ids = torch.tensor([REPETITIVE])
    kw = dict(max_new_tokens=40, do_sample=False, cache_implementation="static", pad_token_id=0)
    plain = model.generate(ids, **kw)
    dec = LookaheadDecoder(cost_curve=FLAT)
    assert model.generate(ids, **kw, custom_generate=dec).tolist() == plain.tolist()
    assert dec.stats.target_calls < 40
    calibrated = LookaheadDecoder(_clock=FakeClock(), _calibrations=None)  # measured on the static path itself
    assert model.generate(ids, **kw, custom_generate=calibrated).tolist() == plain.tolist()
    assert calibrated.stats.cost_curve is not None


@pytest.mark.parametrize("nodes", [7, 8, 15, 16, 31, 32, 63])
def test_every_bucket_boundary_rolls_back_exactly(tiny_models, nodes):
    """The full tree of ``nodes`` every step: steps of 1 + nodes rows, on both sides of each bucket's size."""
    model = tiny_models("qwen2")
    ids = torch.tensor([REPETITIVE * 3])
    kw = dict(max_new_tokens=48, do_sample=False, cache_implementation="static", pad_token_id=0)
    plain = model.generate(ids, **kw)
    dec = LookaheadDecoder(max_draft_tokens=nodes, _tuning=Tuning(adaptive=False, tree_nodes=min(nodes, 16)))
    assert model.generate(ids, **kw, custom_generate=dec).tolist() == plain.tolist()
    assert max(n for n, _ in dec.stats.budgets[1:]) <= nodes


def test_a_cache_too_short_is_refused_and_one_just_long_enough_decodes_to_the_end(tiny_models):
    model = tiny_models("llama")
    ids = torch.tensor([REPETITIVE])
    needed = len(REPETITIVE) + 30 - 1
    short = StaticCache(config=model.config, max_cache_len=needed - 1)
    with pytest.raises(ValueError, match=f"holds {needed - 1} tokens and this call needs {needed}"):
        model.generate(ids, max_new_tokens=30, cache=short, custom_generate=LookaheadDecoder(cost_curve=FLAT))
    plain = model.generate(ids, max_new_tokens=30, do_sample=False, cache=StaticCache(config=model.config,
                                                                                      max_cache_len=needed))
    dec = LookaheadDecoder(_tuning=NO_BUDGET)  # the full tree every step: near the end it must shrink to the room
    exact = StaticCache(config=model.config, max_cache_len=needed)
    assert model.generate(ids, max_new_tokens=30, cache=exact, custom_generate=dec).tolist() == plain.tolist()


def test_a_batch_on_a_static_cache_is_refused(tiny_models):
    model = tiny_models("llama")
    with pytest.raises(ValueError, match="static cache.*batch size 1"):
        model.generate(torch.tensor([REPETITIVE, REPETITIVE]), max_new_tokens=4, cache_implementation="static",
                       custom_generate=LookaheadDecoder())


def test_compiled_buckets_are_exact_with_no_graph_break_and_no_recompile(tiny_models):
    model = tiny_models("llama")
    ids = torch.tensor([REPETITIVE])
    config = CompileConfig(fullgraph=True, backend="aot_eager", dynamic=False)
    config._compile_all_devices = True  # a CPU: compile as a CUDA user's generate would
    gen = GenerationConfig(max_new_tokens=40, do_sample=False, cache_implementation="static", compile_config=config,
                           pad_token_id=0)
    plain = model.generate(ids, generation_config=gen)
    torch._dynamo.reset()
    first = LookaheadDecoder(_tuning=NO_BUDGET)  # the full tree: several buckets
    assert model.generate(ids, generation_config=gen, custom_generate=first).tolist() == plain.tolist()
    assert first.stats.time_compile > 0
    again = LookaheadDecoder(_tuning=NO_BUDGET)
    with torch.compiler.set_stance("fail_on_recompile"):  # every bucket's graph is reused
        assert model.generate(ids, generation_config=gen, custom_generate=again).tolist() == plain.tolist()
    assert again.stats.time_compile == 0.0


@pytest.mark.parametrize("cache", [None, "static"])
def test_a_forward_the_user_compiled_runs_eagerly_and_the_decoder_says_so(cache):
    """model.forward = torch.compile(model.forward): the decoder's steps (a new shape or mask at almost every step)
    compile nothing (each would be a new graph, for minutes on a real model), the output is plain's, and a warning
    says why and what compiles steps instead."""
    from lookahead.cost import set_cost_curve

    model = tiny_model("llama")  # its own: the shared tiny models keep their plain forward
    set_cost_curve(model, TINY_COST_CURVE)
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()  # compiled code is kept per code object: no graph, and no recompilation count, left over
    model.forward = torch.compile(model.forward, backend=counting_backend)
    ids = torch.tensor([REPETITIVE])
    kw = dict(max_new_tokens=30, do_sample=False, eos_token_id=None, cache_implementation=cache)
    plain = model.generate(ids, **kw)
    assert graphs  # plain generate compiled its steps
    compiled = len(graphs)
    decoder = LookaheadDecoder(_tuning=NO_BUDGET)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        ours = model.generate(ids, custom_generate=decoder, **kw)
    assert ours.tolist() == plain.tolist()
    assert decoder.stats.target_calls < 30  # drafts were verified
    assert len(graphs) == compiled
    assert any("model.forward is compiled" in str(w.message) for w in said)
    torch._dynamo.reset()


def test_sampling_on_a_static_cache_follows_the_target_distribution():
    model = peaky_llama(16)
    prompt = [1, 2, 2, 7, 2, 2, 12, 2, 2, 3, 2, 2]
    ids = torch.tensor([prompt])
    with torch.no_grad():
        p1 = torch.softmax(model(ids).logits[0, -1] / 0.7, -1)
        both = torch.cat([ids.repeat(16, 1), torch.arange(16)[:, None]], 1)
        p2 = torch.softmax(model(both).logits[:, -1] / 0.7, -1)
    exact = (p1[:, None] * p2).double().numpy()
    torch.manual_seed(0)
    counts = np.zeros((16, 16))
    dec = LookaheadDecoder(_tuning=Tuning(trie_capacity=4096, adaptive=False))
    n = 1200
    for _ in range(n):
        out = model.generate(ids, custom_generate=dec, do_sample=True, temperature=0.7, max_new_tokens=2,
                             eos_token_id=None, pad_token_id=0, cache_implementation="static")
        counts[out[0, -2], out[0, -1]] += 1
    keep = exact.reshape(-1) * n >= 5
    observed = counts.reshape(-1)[keep]
    expected = exact.reshape(-1)[keep] / exact.reshape(-1)[keep].sum() * observed.sum()
    assert chisquare(observed, expected).pvalue > 1e-4


@pytest.mark.smollm
def test_smollm2_on_a_static_cache_is_plain_static_generate(smollm):
    model, tok = smollm
    inputs = dict(tok.apply_chat_template([{"role": "user", "content": CODE_PROMPT}], add_generation_prompt=True,
                                          return_tensors="pt", return_dict=True))
    kw = dict(max_new_tokens=48, do_sample=False, cache_implementation="static")
    plain = model.generate(**inputs, **kw)
    dec = LookaheadDecoder(cost_curve=FLAT)
    assert model.generate(**inputs, **kw, custom_generate=dec).tolist() == plain.tolist()
    assert dec.stats.target_calls < 48


@pytest.mark.parametrize("impl", ["sliding_window", "hybrid_chunked"])
def test_the_older_names_of_a_static_cache_decode_on_it(impl):
    """transformers still takes "sliding_window" and "hybrid_chunked" (and "hybrid" where a call asks for it) for a
    static cache whose layer types it infers: the decoder decodes on it, plain's tokens, where it refused them."""
    import transformers as tf

    from lookahead.cost import set_cost_curve

    torch.manual_seed(0)
    model = tf.Gemma2ForCausalLM(tf.Gemma2Config(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=16, max_position_embeddings=512)).eval().to(torch.float64)
    model.generation_config.pad_token_id = 0
    set_cost_curve(model, TINY_COST_CURVE)
    ids = torch.randint(3, 96, (12,), generator=torch.Generator().manual_seed(0)).repeat(3)[:30][None]
    kw = dict(max_new_tokens=30, do_sample=False, eos_token_id=None, cache_implementation=impl,
              return_dict_in_generate=True)
    plain = model.generate(ids, **kw)
    decoder = LookaheadDecoder()
    ours = model.generate(ids, custom_generate=decoder, **kw)
    assert ours.sequences.tolist() == plain.sequences.tolist()
    assert isinstance(ours.past_key_values, StaticCache) and decoder.stats.accepted > 0
