"""Greedy equivalence over a sweep: random tiny models, prompts, lengths, padding, EOS and decoder settings.

Each example builds a tiny random model (float64, so no near-ties), runs plain greedy ``generate`` and
``LookaheadDecoder`` on the same input and requires the same tokens. Deterministic
(``derandomize=True``) and sized to take about a minute on two cores.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead._tuning import Tuning
from lookahead.cache import NgramTrie

from tiny import tiny_model

ARCHS = ("llama", "qwen2", "mistral", "gpt2", "phi3", "gemma")
COST_CURVE = ((1, 1.0), (4, 1.2), (16, 2.0), (64, 5.0))  # skips calibration: most examples build a new model


def _model(arch: str, vocab: int, hidden: int, layers: int, seed: int):
    return tiny_model(arch, vocab, hidden, layers, max_positions=160, seed=seed)


@st.composite
def _configs(draw) -> tuple[LookaheadConfig, Tuning]:
    """(the config, the tuning) of one decoder."""
    ngram = draw(st.integers(2, 8))
    tuning = Tuning(
        ngram_size=ngram,
        max_match=draw(st.integers(1, ngram - 1)),
        tree_nodes=draw(st.sampled_from([0, 1, 3, 8, 16])),
        tree_depth=draw(st.integers(0, 8)),
        trie_capacity=draw(st.sampled_from([4 * ngram * ngram, 1 << 12])),
        window_ngram=draw(st.integers(2, 5)),
        window_candidates=draw(st.integers(0, 4)),
        adaptive=draw(st.booleans()),
    )
    return LookaheadConfig(window=draw(st.sampled_from([0, 0, 2, 5])), cost_curve=COST_CURVE), tuning


@st.composite
def _cases(draw):
    vocab = draw(st.sampled_from([12, 32, 96]))
    alphabet = draw(st.integers(2, vocab))
    period = draw(st.integers(1, 8))
    unit = draw(st.lists(st.integers(1, alphabet - 1), min_size=period, max_size=period))
    length = draw(st.integers(1, 30))
    noise = draw(st.lists(st.tuples(st.integers(0, 29), st.integers(1, vocab - 1)), max_size=4))
    prompt = (unit * (length // period + 1))[:length]
    for i, tok in noise:
        if i < length:
            prompt[i] = tok
    return dict(
        arch=draw(st.sampled_from(ARCHS)),
        vocab=vocab,
        hidden=draw(st.sampled_from([16, 32])),
        layers=draw(st.integers(1, 2)),
        seed=draw(st.integers(0, 2**16)),
        prompt=prompt,
        pad=draw(st.sampled_from([0, 0, 0, 2])),
        max_new=draw(st.integers(1, 48)),
        eos=draw(st.sampled_from(["none", "none", "from_output", "model"])),
        eos_at=draw(st.integers(0, 47)),
        memory=draw(st.sampled_from(["none", "none", "output", "noise"])),
        memory_n=draw(st.integers(2, 6)),
        config=draw(_configs()),
    )


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=_cases())
def test_sweep_greedy_equivalence(case):
    model = _model(case["arch"], case["vocab"], case["hidden"], case["layers"], case["seed"])
    prompt = case["prompt"]
    ids = torch.tensor([[0] * case["pad"] + prompt])
    mask = torch.tensor([[0] * case["pad"] + [1] * len(prompt)])
    kw = dict(attention_mask=mask, max_new_tokens=case["max_new"])
    free = model.generate(ids, do_sample=False, eos_token_id=None, **kw)[0, ids.shape[1]:].tolist()
    if case["eos"] == "none":
        kw["eos_token_id"] = None
    elif case["eos"] == "from_output":  # stop somewhere inside the output (maybe inside an accepted draft)
        kw["eos_token_id"] = free[min(case["eos_at"], len(free) - 1)]
    plain = model.generate(ids, do_sample=False, **kw)

    memory = None
    if case["memory"] != "none":
        memory = NgramTrie(max_n=case["memory_n"], capacity=4 * case["memory_n"] ** 2 * 4)
        rng = np.random.default_rng(case["seed"])
        stored = free if case["memory"] == "output" else rng.integers(0, case["vocab"], 60).tolist()
        memory.insert(stored)
    config, tuning = case["config"]
    decoder = LookaheadDecoder(config, store=memory, _tuning=tuning)
    ours = model.generate(ids, custom_generate=decoder, **kw)
    assert ours.tolist() == plain.tolist(), case
    n_new = plain.shape[1] - ids.shape[1]
    assert decoder.stats.new_tokens == n_new
    assert 1 <= decoder.stats.target_calls <= n_new
    event("drafts accepted" if decoder.stats.accepted else "no draft accepted")
    event("stopped at EOS" if n_new < case["max_new"] else "ran to max_new_tokens")
