"""Batched decoding (batch size > 1, ``batch.Padded``): every row exactly what plain batched generate gives.

Greedy: token for token, the padding of finished rows and the final length included, on several tiny
float64 architectures (left padding, EOS in some rows, several lengths), and on SmolLM2 when installed.
Sampled: each row's next two tokens follow the target's processed distribution (chi-square, as in
``test_sampling.py``), with ``num_return_sequences`` and left padding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
    TemperatureLogitsWarper,
    TextStreamer,
    TopKLogitsWarper,
)
from transformers.generation.streamers import BaseStreamer

import lookahead.verify.sampled as verify_mod
from lookahead import LookaheadDecoder, NgramTrie
from lookahead._tuning import DEFAULT, Tuning
from lookahead.batch import (
    choose_width,
    keep_rows_entries,
    pack_batch,
    prefill_groups,
    realign_index,
    row_processors,
    token_values,
    top_nodes,
)
from lookahead.compat import cache_kwarg_name
from lookahead.cost import CostModel
from lookahead.drafting.draft import Draft

from draft_reference import build_draft
from tiny import peaky_llama

REP = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7, 8, 9, 10, 11, 5, 6, 7]
PROMPTS = [REP, [3, 4, 3, 4, 3, 4, 3, 4, 12, 13], [20, 21, 22, 23, 24, 25, 26, 20, 21, 22, 23], [40, 41]]
ARCHS = ["llama", "gpt2", "qwen2", "gemma"]
CPU_CURVE = ((1, 0.055), (2, 0.09), (4, 0.08), (8, 0.095), (16, 0.135), (32, 0.22), (64, 0.35))
"""SmolLM2's forward time on a 2-core CPU with AVX-512 (torch eager, fp32), pinned for the test."""


def _batch(prompts, pad: int = 0) -> dict:
    """Left-padded input ids and attention mask, as a tokenizer with padding_side='left' makes them."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return {"input_ids": ids, "attention_mask": mask}


def _both(model, inputs, decoder=None, **kw):
    """(plain generate's output, the decoder's output, the decoder)."""
    decoder = decoder or LookaheadDecoder()
    plain = model.generate(**inputs, **kw)
    ours = model.generate(**inputs, **kw, custom_generate=decoder)
    return plain, ours, decoder


@pytest.fixture(scope="module")
def tiny(tiny_models):
    return tiny_models


# -- greedy: identical rows -------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("size", [1, 2, 4])
def test_greedy_rows_identical_to_plain_batched(tiny, arch, size):
    model = tiny(arch)
    inputs = _batch(PROMPTS[:size])
    plain, ours, dec = _both(model, inputs, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert ours.shape == plain.shape and ours.tolist() == plain.tolist()
    assert dec.stats.accepted > 0, "the test must exercise accepted drafts"
    assert dec.stats.target_calls < 30


@pytest.mark.parametrize("arch", ["llama", "phi3"])
@pytest.mark.parametrize("copy_cost", [0.0, 1.0])  # finished rows leave the cache at once / stay to the end
def test_eos_in_some_rows_pads_them_as_plain_does(tiny, arch, copy_cost):
    model = tiny(arch)
    inputs = _batch(PROMPTS)
    kw = dict(max_new_tokens=30, do_sample=False, pad_token_id=0)
    free = model.generate(**inputs, **kw, eos_token_id=None)
    width = inputs["input_ids"].shape[1]
    eos = int(free[0, width + 4])  # row 0 stops at its fifth token; rows without it run on
    dec = LookaheadDecoder(_tuning=Tuning(copy_seconds_per_byte=copy_cost))
    plain, ours, _ = _both(model, inputs, dec, **kw, eos_token_id=eos)
    assert ours.shape == plain.shape and ours.tolist() == plain.tolist()
    rows_with_eos = [(plain[i, width:] == eos).any().item() for i in range(len(PROMPTS))]
    assert any(rows_with_eos) and not all(rows_with_eos), "some rows must stop early, others not"
    assert plain[0, width + 5:].eq(0).all(), "a finished row is padded"


@pytest.mark.parametrize("new", [1, 2, 7])
def test_max_new_tokens(tiny, new):
    model = tiny("llama")
    plain, ours, _ = _both(model, _batch(PROMPTS[:3]), max_new_tokens=new, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    assert ours.tolist() == plain.tolist()


def test_realigned_cache_every_step_still_identical(tiny):
    """No hole slack: the cache is squeezed (every row right-aligned, the padding dropped) at every step."""
    model = tiny("qwen2")
    dec = LookaheadDecoder(_tuning=Tuning(hole_slack=0))
    plain, ours, dec = _both(model, _batch(PROMPTS), dec, max_new_tokens=30, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    assert ours.tolist() == plain.tolist() and dec.stats.accepted > 0


def test_cache_never_holds_more_than_plain_plus_one_step(tiny):
    """Before every forward the cache holds at most plain batched decoding's longest cache plus the hole slack."""
    model = tiny("llama")
    inputs = _batch(PROMPTS)
    seen = []
    kw = cache_kwarg_name(model)  # `cache` on transformers 5.24, `past_key_values` on 5.17

    def hook(module, args, kwargs):
        seen.append((kwargs[kw].get_seq_length(), kwargs["input_ids"].shape[1]))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        dec = LookaheadDecoder()
        ours = model.generate(**inputs, max_new_tokens=40, do_sample=False, eos_token_id=None, pad_token_id=0,
                              custom_generate=dec)
    finally:
        handle.remove()
    plain_most = inputs["input_ids"].shape[1] + 40 - 1  # plain's cache before its last forward
    assert max(t for t, _ in seen) <= plain_most + DEFAULT.hole_slack
    assert ours.shape[1] == inputs["input_ids"].shape[1] + 40 and dec.stats.accepted > 0


def test_stopping_criterion_without_eos_keeps_stopped_rows_decoding(tiny):
    """Without an EOS criterion plain generate does not pad: a row stopped by another criterion keeps its real
    tokens until every row has stopped."""
    model = tiny("llama")
    inputs = _batch(PROMPTS)
    width = inputs["input_ids"].shape[1]
    free = model.generate(**inputs, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
    stop_token = int(free[1, width + 3])

    class StopOn(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == stop_token

    plain, ours, _ = _both(model, inputs, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0,
                           stopping_criteria=StoppingCriteriaList([StopOn()]))
    assert ours.tolist() == plain.tolist()


def test_repetition_penalty_sees_each_rows_own_padding(tiny):
    """generate gives the penalty each row's padding length (a [batch] tensor); each row gets its own."""
    model = tiny("llama")
    plain, ours, _ = _both(model, _batch(PROMPTS), max_new_tokens=25, do_sample=False, eos_token_id=None,
                           pad_token_id=0, repetition_penalty=1.3)
    assert ours.tolist() == plain.tolist()


def test_streamer_gets_the_columns_plain_puts(tiny):
    class Collect(BaseStreamer):
        def __init__(self):
            self.puts = []

        def put(self, value):
            self.puts.append(value.tolist())

        def end(self):
            self.puts.append("end")

    model = tiny("llama")
    inputs = _batch(PROMPTS)
    free = model.generate(**inputs, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    kw = dict(max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=int(free[0, -15]))
    a, b = Collect(), Collect()
    model.generate(**inputs, **kw, streamer=a)
    model.generate(**inputs, **kw, streamer=b, custom_generate=LookaheadDecoder())
    assert a.puts == b.puts


def test_text_streamer_refuses_a_batch_as_plain_does(tiny):
    model = tiny("llama")

    class Tok:
        def decode(self, *args, **kwargs):
            return ""

    for extra in ({}, {"custom_generate": LookaheadDecoder()}):
        with pytest.raises(ValueError, match="batch size 1"):
            model.generate(**_batch(PROMPTS[:2]), max_new_tokens=3, pad_token_id=0, streamer=TextStreamer(Tok()),
                           **extra)


def test_shared_store_learns_each_row_as_its_own_stream(tiny):
    model = tiny("llama")
    store = NgramTrie(max_n=8, capacity=4096)
    dec = LookaheadDecoder(store=store)
    inputs = _batch(PROMPTS)
    kw = dict(max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    plain = model.generate(**inputs, **kw)
    for _ in range(2):
        assert model.generate(**inputs, **kw, custom_generate=dec).tolist() == plain.tolist()
    assert dec.stats.accepted_by_origin["memory"] > 0
    width = inputs["input_ids"].shape[1]
    row = plain[2, width : width + 4].numpy()  # an n-gram of row 2's output
    tokens, parents = store.propose(row[:3], 4, 1, 3)
    assert row[3] in tokens[parents == -1]


def test_return_dict_and_clear_refusals(tiny):
    model = tiny("llama")
    inputs = _batch(PROMPTS[:2])
    out = model.generate(**inputs, max_new_tokens=5, pad_token_id=0, return_dict_in_generate=True,
                         custom_generate=LookaheadDecoder())
    assert out.sequences.tolist() == model.generate(**inputs, max_new_tokens=5, pad_token_id=0).tolist()
    with pytest.raises(ValueError, match="scores or logits"):
        model.generate(**inputs, max_new_tokens=5, pad_token_id=0, return_dict_in_generate=True,
                       output_scores=True, custom_generate=LookaheadDecoder())
    with pytest.raises(ValueError, match="prefix_allowed_tokens_fn|PrefixConstrained"):
        model.generate(**inputs, max_new_tokens=5, pad_token_id=0, custom_generate=LookaheadDecoder(),
                       prefix_allowed_tokens_fn=lambda b, ids: list(range(10)))


def test_sampled_rows_repeat_per_seed_with_num_return_sequences(tiny):
    model = tiny("llama")
    dec = LookaheadDecoder()
    outs = []
    for _ in range(2):
        torch.manual_seed(5)
        outs.append(model.generate(**_batch(PROMPTS[:2]), max_new_tokens=12, do_sample=True, temperature=0.8,
                                   num_return_sequences=3, eos_token_id=None, pad_token_id=0,
                                   custom_generate=dec).tolist())
    assert outs[0] == outs[1] and len(outs[0]) == 6


# -- sampling: each row's distribution -------------------------------------------------------------------

VOCAB = 16
SAMPLE_PROMPTS = [[1, 2, 2, 7, 2, 2, 12, 2, 2, 3, 2, 2], [4, 2, 2, 9, 2, 2, 9, 2, 2]]
CALLS = 700  # x 2 return sequences: 1400 samples per prompt
LEVEL = 1e-4


@pytest.fixture(scope="module")
def peaky():
    return peaky_llama(VOCAB)


SAMPLING = dict(temperature=0.8, top_k=10, repetition_penalty=1.2)


def _exact(model, prompt) -> np.ndarray:
    """P(a, b) of the next two tokens, float[V, V], by enumeration with generate's processors."""
    procs = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(SAMPLING["repetition_penalty"]),
                                 TemperatureLogitsWarper(SAMPLING["temperature"]), TopKLogitsWarper(SAMPLING["top_k"])])
    ids = torch.tensor([prompt])
    with torch.no_grad():
        p1 = torch.softmax(procs(ids, model(ids).logits[:, -1].float()), -1)[0]
        both = torch.cat([ids.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], 1)
        logits2 = model(both).logits[:, -1].float()
        p2 = torch.stack([torch.softmax(procs(both[a : a + 1], logits2[a : a + 1]), -1)[0] for a in range(VOCAB)])
    return (p1[:, None] * p2).double().numpy()


def _pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit; cells expected below 5 pooled into one (as test_sampling does)."""
    n = counts.sum()
    expected, observed = probs.ravel() * n, counts.ravel()
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 1e-12:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def _draw(model) -> tuple[list[np.ndarray], int, int]:
    inputs = _batch(SAMPLE_PROMPTS)
    width = inputs["input_ids"].shape[1]
    counts = [np.zeros((VOCAB, VOCAB)) for _ in SAMPLE_PROMPTS]
    dec = LookaheadDecoder(_tuning=Tuning(trie_capacity=4096, adaptive=False))  # the whole tree: the acceptance rule
    drafted = accepted = 0
    for _ in range(CALLS):
        out = model.generate(**inputs, custom_generate=dec, do_sample=True, max_new_tokens=2, eos_token_id=None,
                             pad_token_id=0, num_return_sequences=2, **SAMPLING)
        for row, (a, b) in enumerate(out[:, width:].tolist()):
            counts[row // 2][a, b] += 1
        drafted += dec.stats.drafted
        accepted += dec.stats.accepted
    return counts, drafted, accepted


def test_sampled_rows_follow_the_target_distribution(peaky):
    torch.manual_seed(2024)
    counts, drafted, accepted = _draw(peaky)
    assert 0 < accepted < drafted, "the test must exercise both acceptance and rejection"
    for prompt, c in zip(SAMPLE_PROMPTS, counts):
        p = _pvalue(c, _exact(peaky, prompt))
        assert p > LEVEL, f"row of prompt {prompt}: samples do not follow the target distribution (p={p:.2e})"


def test_a_wrong_rule_fails_the_same_check(peaky, monkeypatch):
    def no_residual(scores, kids, u):  # a classic bug: on rejection, sample afresh from p, not the residual
        x, child = exact(scores, kids, u)
        return (x, child) if child >= 0 else (exact(scores, {}, float(torch.rand(())))[0], -1)

    exact = verify_mod._choose_sampled
    monkeypatch.setattr(verify_mod, "_choose_sampled", no_residual)
    torch.manual_seed(2024)
    counts, _, _ = _draw(peaky)
    assert min(_pvalue(c, _exact(peaky, prompt)) for prompt, c in zip(SAMPLE_PROMPTS, counts)) < LEVEL


# -- pure functions ----------------------------------------------------------------------------------------


def test_choose_width_docstring_examples():
    gains = [np.array([0.0, 0.9, 1.7]), np.array([0.0])]
    cost = np.array([1.0, 1.02, 1.2])
    assert choose_width(gains, np.array([0.02, 0.1]), cost) == 0  # the copying row ends first anyway
    assert choose_width(gains, np.array([0.1, 0.1]), cost) == 1
    assert choose_width(gains, np.array([0.1, 0.1]), np.array([1.0, 1.0, 1.0])) == 2  # width is free: widest
    assert choose_width([np.array([0.0])] * 2, np.array([0.1, 0.1]), np.array([1.0, 1.0])) == 0  # nothing to gain


def test_token_values_docstring_example():
    np.testing.assert_allclose(token_values(np.array([100.0, 40.0]), np.array([1.0, 2.0]), 0.12, 0.1), [0.1, 0.02])
    # the row expected to end last is the one with most remaining steps, not tokens: 60 at pace 3 < 30 at pace 1
    np.testing.assert_allclose(token_values(np.array([60.0, 30.0]), np.array([3.0, 1.0]), 0.12, 0.1), [0.02, 0.1])
    # one row left: the single-row budget's rule, draft iff (1 + gain) t(1) > t(1 + w)
    np.testing.assert_allclose(token_values(np.array([30.0]), np.array([2.0]), 0.1, 0.1), [0.1])


def test_small_helpers_docstring_examples():
    assert top_nodes(np.array([0.9, 0.2, 0.8]), 2).tolist() == [0, 2]
    idx, vis = realign_index(np.array([[False, True, False, True], [True, True, True, False]]))
    assert idx.tolist() == [[1, 1, 3], [0, 1, 2]] and vis.tolist() == [[False, True, True], [True, True, True]]
    penalty = RepetitionPenaltyLogitsProcessor(1.3)
    penalty.prompt_ignore_length = torch.tensor([2, 0])  # as generate builds it on 5.24 (5.17's takes ints only)
    procs = row_processors([penalty], 1, 2)
    assert procs[0].prompt_ignore_length.tolist() == [0]


def test_keep_rows_entries_docstring_example():
    """keeps [[0, 2, 3], [0]]: row 0 keeps the step's columns 0, 2, 3, row 1 column 0 and two holes (its last kept
    column repeated); the step's region is cropped to 3 columns, the cached ones before it untouched."""
    from transformers import DynamicCache

    cache = DynamicCache()
    old = torch.arange(2 * 2 * 3 * 1, dtype=torch.float64).view(2, 2, 3, 1)
    step = 100 + torch.arange(2 * 2 * 5 * 1, dtype=torch.float64).view(2, 2, 5, 1)
    cache.update(old, -old, 0)
    cache.update(step, -step, 0)
    assert keep_rows_entries(cache, 5, [[0, 2, 3], [0]]) == 3
    keys, values = cache.layers[0].keys, cache.layers[0].values
    assert cache.get_seq_length() == 6 and keys.shape == (2, 2, 6, 1)
    torch.testing.assert_close(keys[:, :, :3], old)
    torch.testing.assert_close(keys[0, :, 3:], step[0, :, [0, 2, 3]])
    torch.testing.assert_close(keys[1, :, 3:], step[1, :, [0, 0, 0]])
    torch.testing.assert_close(values, -keys)


def test_pack_batch_docstring_example():
    drafts = [build_draft([7, 8], [-1, 0], [0, 0], [1, 1]), Draft.empty()]
    ids, pos, mask = pack_batch(np.array([[5], [6]]), np.array([[3], [9]]), np.ones((2, 1), dtype=bool), drafts, 2,
                                torch.float32, "cpu")
    assert ids.tolist() == [[5, 7, 8], [6, 0, 0]] and pos.tolist() == [[3, 4, 5], [9, 10, 10]]
    seen = (mask[:, 0] == 0).int().tolist()
    assert seen == [[[1, 0, 0], [1, 1, 0], [1, 1, 1]], [[1, 0, 0], [1, 1, 0], [1, 0, 1]]]


# -- the real model --------------------------------------------------------------------------------------


@pytest.mark.smollm
def test_smollm_batch_greedy_identical(smollm):
    model, tok = smollm
    tok.padding_side = "left"
    texts = ["def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):",
             "Write a haiku about the sea."]
    inputs = tok(texts, padding=True, return_tensors="pt")
    pad = tok.pad_token_id if tok.pad_token_id is not None else model.generation_config.eos_token_id
    dec = LookaheadDecoder(cost_curve=CPU_CURVE)  # pinned: no calibration (minutes on a busy CPU)
    plain, ours, _ = _both(model, dict(inputs), dec, max_new_tokens=12, do_sample=False, pad_token_id=pad)
    assert ours.tolist() == plain.tolist()
    assert dec.stats.accepted > 0  # the code row copies (the slowest row sets the number of forwards)


# -- the prompt's forward in groups of similar length ---------------------------------------------------------

LINEAR = ((1, 0.01), (2, 0.02), (64, 0.64))
"""A forward's cost proportional to its tokens (no fixed part): each prompt length is best prefilled alone."""


def test_prefill_groups_docstring_example():
    cost = lambda k: 0.1 + 0.001 * np.asarray(k, dtype=float)  # noqa: E731
    groups = prefill_groups(np.array([10, 200, 12, 190]), cost)
    assert [g.tolist() for g in groups] == [[0, 2], [3, 1]]


def test_prefill_groups_only_when_they_pay():
    flat = lambda k: 0.02 + 0.0 * np.asarray(k, dtype=float)  # noqa: E731  (a GPU: any forward costs the same)
    assert prefill_groups(np.array([10, 200, 12, 190]), flat) is None
    linear = CostModel(LINEAR)
    assert prefill_groups(np.array([7, 7, 7]), linear) is None  # equally long: nothing is padded
    assert prefill_groups(np.array([9]), linear) is None
    # proportional cost: every length alone, shortest first; a margin above the saving keeps one forward
    assert [g.tolist() for g in prefill_groups(np.array([17, 10, 11, 2]), linear)] == [[3], [1], [2], [0]]
    assert prefill_groups(np.array([17, 16, 16, 16]), linear, margin=1.1) is None  # 4 x 17 = 68 vs 65 tokens


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2", "gemma", "phi3"])
def test_grouped_prefill_rows_identical_to_plain(tiny, arch):
    model = tiny(arch)
    inputs = _batch(PROMPTS)  # real lengths 17, 10, 11, 2
    dec = LookaheadDecoder(cost_curve=LINEAR)
    plain, ours, _ = _both(model, inputs, dec, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert dec.prefill_groups == [[3], [1], [2], [0]]  # the prompt went in four forwards, one per length
    assert ours.shape == plain.shape and ours.tolist() == plain.tolist()


def test_grouped_prefill_with_eos_and_padded_off(tiny):
    model = tiny("llama")
    inputs = _batch(PROMPTS)
    kw = dict(max_new_tokens=30, do_sample=False, pad_token_id=0)
    width = inputs["input_ids"].shape[1]
    eos = int(model.generate(**inputs, **kw, eos_token_id=None)[0, width + 4])
    dec = LookaheadDecoder(cost_curve=LINEAR)
    plain, ours, _ = _both(model, inputs, dec, **kw, eos_token_id=eos)
    assert dec.prefill_groups is not None and ours.tolist() == plain.tolist()
    padded = LookaheadDecoder(cost_curve=LINEAR, _tuning=Tuning(grouped_prefill=False))
    again = model.generate(**inputs, **kw, eos_token_id=eos, custom_generate=padded)
    assert padded.prefill_groups is None and again.tolist() == plain.tolist()


def test_grouped_prefill_not_for_a_sliding_window_cache(tiny):
    model = tiny("mistral")  # DynamicSlidingWindowLayer: its update keeps only the window; one padded forward
    dec = LookaheadDecoder(cost_curve=LINEAR)
    plain, ours, _ = _both(model, _batch(PROMPTS), dec, max_new_tokens=12, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    assert dec.prefill_groups is None and ours.tolist() == plain.tolist()


def test_grouped_prefill_on_the_sampled_path(tiny):
    """Sampled decoding reads the grouped prefill's logits too: with top_k=1 it must give greedy's rows."""
    model = tiny("llama")
    inputs = _batch(PROMPTS)
    greedy = model.generate(**inputs, max_new_tokens=16, do_sample=False, pad_token_id=0, eos_token_id=None)
    dec = LookaheadDecoder(cost_curve=LINEAR)
    ours = model.generate(**inputs, max_new_tokens=16, do_sample=True, top_k=1, pad_token_id=0, eos_token_id=None,
                          custom_generate=dec)
    assert dec.prefill_groups is not None and ours.tolist() == greedy.tolist()
