"""Exact sampling: the decoder's samples follow the target's processed distribution exactly.

The exact distribution of the next two tokens is enumerated with plain forward passes and the
same processors plain ``generate`` uses; many samples drawn with the decoder are compared with it
by a chi-square test at a strict level. A deliberately wrong acceptance rule fails the same check,
so the check can fail. Seeds are fixed: the test is deterministic.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import lookahead.verify.sampled as verify_mod
from lookahead import LookaheadDecoder
from lookahead._tuning import Tuning

from tiny import peaky_llama

VOCAB = 16
# "2 2" is followed by 7, 12 and 3 in the prompt, so the trie drafts three siblings after the last
# "2 2" -- tokens this model ranks high, so acceptance and rejection both happen often.
PROMPT = [1, 2, 2, 7, 2, 2, 12, 2, 2, 3, 2, 2]
N_SAMPLES = 1500
LEVEL = 1e-4  # the exact rule fails this only once in 10,000 seeds; the wrong rule fails it by far
SMALL = Tuning(trie_capacity=4096)
FULL_TREE = Tuning(trie_capacity=4096, adaptive=False)  # no budget: every step verifies the whole draft


@pytest.fixture(scope="module")
def model():
    return peaky_llama(VOCAB)


SETTINGS = {
    "temperature": dict(temperature=0.7),
    "top-k+top-p+penalty": dict(temperature=0.9, top_k=8, top_p=0.95, repetition_penalty=1.1),
}


def _processors(kw) -> LogitsProcessorList:
    """The processors plain generate builds for these settings, in generate's order."""
    procs = LogitsProcessorList()
    if "repetition_penalty" in kw:
        procs.append(RepetitionPenaltyLogitsProcessor(kw["repetition_penalty"]))
    procs.append(TemperatureLogitsWarper(kw["temperature"]))
    if "top_k" in kw:
        procs.append(TopKLogitsWarper(kw["top_k"]))
    if "top_p" in kw:
        procs.append(TopPLogitsWarper(kw["top_p"]))
    return procs


def _exact_two_token_distribution(model, kw) -> np.ndarray:
    """P(a, b) for the next two tokens, float[V, V], by enumeration."""
    procs = _processors(kw)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        p1 = torch.softmax(procs(ids, model(ids).logits[:, -1].float()), -1)[0]
        both = torch.cat([ids.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], 1)  # [V, L+1]
        logits2 = model(both).logits[:, -1].float()
        p2 = torch.stack([torch.softmax(procs(both[a : a + 1], logits2[a : a + 1]), -1)[0] for a in range(VOCAB)])
    return (p1[:, None] * p2).double().numpy()


def _draw(model, kw, n, dec=None) -> tuple[np.ndarray, int, int]:
    counts = np.zeros((VOCAB, VOCAB))
    # the full tree every step: this tests the acceptance rule, not the budget's choices
    dec = dec or LookaheadDecoder(_tuning=FULL_TREE)
    ids = torch.tensor([PROMPT])
    drafted = accepted = 0
    for _ in range(n):
        out = model.generate(ids, custom_generate=dec, do_sample=True, max_new_tokens=2, eos_token_id=None,
                             pad_token_id=0, **kw)
        a, b = out[0, len(PROMPT):].tolist()
        counts[a, b] += 1
        drafted += dec.stats.drafted
        accepted += dec.stats.accepted
    return counts, drafted, accepted


def _pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit; cells expected below 5 are pooled into one."""
    n = counts.sum()
    expected = probs.ravel() * n
    observed = counts.ravel()
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 1e-12:
        obs, exp = obs[:-1], exp[:-1]
    exp = exp * obs.sum() / exp.sum()
    return float(chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_sampled_distribution_is_exact(model, name):
    kw = SETTINGS[name]
    torch.manual_seed(2024)
    counts, drafted, accepted = _draw(model, kw, N_SAMPLES)
    assert 0 < accepted < drafted, "the test must exercise both acceptance and rejection"
    p = _pvalue(counts, _exact_two_token_distribution(model, kw))
    assert p > LEVEL, f"{name}: samples do not follow the target distribution (p={p:.2e})"


def test_sampling_with_a_corpus_is_exact(model):
    """Drafts from a corpus of the model's writing (``corpus.DraftCorpus``) beside the prompt's: the same check."""
    from lookahead.corpus import DraftCorpus

    corpus = DraftCorpus.from_streams([[2, 2, 5, 2], [2, 2, 9, 1], [2, 2, 7, 7], [2, 2, 4], [2, 2, 12, 12]], model)
    dec = LookaheadDecoder(_tuning=FULL_TREE, corpus=corpus)
    kw = SETTINGS["temperature"]
    torch.manual_seed(7)
    counts, drafted, accepted = _draw(model, kw, N_SAMPLES, dec)
    assert 0 < accepted < drafted
    assert dec.stats.drafted_by_origin["corpus"] > 0
    p = _pvalue(counts, _exact_two_token_distribution(model, kw))
    assert p > LEVEL, f"samples with a corpus do not follow the target distribution (p={p:.2e})"


_exact_choose = verify_mod._choose_sampled


def _accept_top3(scores, kids, u):
    """Wrong: accept a drafted child whenever it is among the top-3 tokens."""
    if kids:
        top = scores[0].topk(3).indices.tolist()
        for x, child in kids.items():
            if x in top:
                return x, child
    return _exact_choose(scores, {}, u)


def _no_residual(scores, kids, u):
    """Wrong (a classic bug): on rejection, sample afresh from p itself instead of the residual."""
    x, child = _exact_choose(scores, kids, u)
    if child >= 0:
        return x, child
    return _exact_choose(scores, {}, float(torch.rand(())))[0], -1


@pytest.mark.parametrize("wrong", [_accept_top3, _no_residual])
def test_wrong_rule_fails_the_same_check(model, monkeypatch, wrong):
    kw = SETTINGS["temperature"]
    monkeypatch.setattr(verify_mod, "_choose_sampled", wrong)
    torch.manual_seed(2024)
    counts, _, _ = _draw(model, kw, N_SAMPLES)
    p = _pvalue(counts, _exact_two_token_distribution(model, kw))
    assert p < LEVEL, f"the check did not catch a wrong acceptance rule (p={p:.2e})"


def test_seeded_runs_repeat(model):
    dec = LookaheadDecoder(_tuning=SMALL)
    ids = torch.tensor([PROMPT])
    outs = []
    for _ in range(2):
        torch.manual_seed(99)
        outs.append(model.generate(ids, custom_generate=dec, do_sample=True, temperature=0.8, max_new_tokens=30,
                                   eos_token_id=None, pad_token_id=0).tolist())
    assert outs[0] == outs[1]


def test_sample_token_docstring_example():
    probs = torch.tensor([0.2, 0.0, 0.5, 0.3])
    assert [verify_mod.sample_token(probs, u) for u in (0.1, 0.2, 0.95, 0.0)] == [0, 2, 3, 0]


@pytest.mark.parametrize("settings", [dict(_tuning=FULL_TREE),
                                      dict(_tuning=Tuning(trie_capacity=4096, adaptive=False, tree_nodes=0)),
                                      dict(_tuning=SMALL, window=3),
                                      dict(_tuning=Tuning(trie_capacity=4096, tree_nodes=2, tree_depth=1))])
def test_sampled_text_does_not_depend_on_drafts(model, settings):
    """The uniforms belong to positions, so any tree, budget or window gives the same text per seed."""
    ids = torch.tensor([PROMPT])
    outs = []
    for dec in (LookaheadDecoder(_tuning=SMALL), LookaheadDecoder(**settings)):
        torch.manual_seed(123)
        outs.append(model.generate(ids, custom_generate=dec, do_sample=True, temperature=0.9, max_new_tokens=25,
                                   eos_token_id=None, pad_token_id=0).tolist())
    assert outs[0] == outs[1]


def test_trie_drafts_siblings_for_this_prompt(model):
    """Guards the premise above: multi-candidate rejection sampling is what gets tested."""
    dec = LookaheadDecoder(_tuning=SMALL)
    dec.trie.insert(np.array(PROMPT))
    tokens, parents = dec.trie.propose(np.array(PROMPT[-3:]), 12, 2, 3)
    assert sorted(tokens[parents == -1].tolist()) == [3, 7, 12]
