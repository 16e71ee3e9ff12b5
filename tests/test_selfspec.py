"""Draft passes (layer skip, early exit, low rank, a draft model) and the stochastic-draft acceptance rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from lookahead import LookaheadDecoder
from lookahead._tuning import DEFAULT, Tuning
from lookahead.cost import CostModel, set_cost_curve
from lookahead.passes import DraftPassSource, draft_source, self_drafter
from lookahead.passes.drafters import (
    LayerStack,
    calibrate,
    causal_mask,
    layer_importance,
    low_rank_drafter,
    modelled_speed,
    skip_set,
)
from lookahead.verify import Verdict
from lookahead.verify.sampled import sample_token

from sampling_reference import residual_distribution, speculative_accept, speculative_verify_chain
from tiny import tiny_model

FLAT = ((1, 0.010), (2, 0.010), (256, 0.0102))
ALONE = dict(tree_nodes=0, copy_nodes=0, recycle_k=0)  # the draft pass is the only source
SELF_ARCHS = ["llama", "qwen2", "mistral", "phi3"]
KINDS = ["layer-skip", "early-exit", "low-rank"]


def _draft_pass(decoder):
    """The decoder's draft-pass source (the priced one)."""
    return next(s for s in decoder.policy.sources if s.priced)


def _decoder(draft, **tuning):
    """A decoder drafting with ``draft=`` and these ``Tuning`` fields."""
    return LookaheadDecoder(draft=draft, _tuning=Tuning(**tuning))


# ------------------------------------------------------------------ the rule for drafts sampled from q

V = 4
_rng = np.random.default_rng(0)
P1 = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
P2 = torch.tensor(_rng.dirichlet(np.ones(V), size=V))  # p(second | first)
Q1 = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)  # the proposer's own, far from p
Q2 = torch.tensor(_rng.dirichlet(np.ones(V), size=V))
BONUS = torch.full((V,), 1 / V, dtype=torch.float64)


def _rule_with(accept, residual):
    """A chain verifier built from an acceptance test and a residual (to compare wrong rules with the right one)."""

    def verify(p_rows, q_rows, draft, u_accept, u_sample):
        nodes, tokens = [], []
        for i, x in enumerate(draft):
            if not accept(p_rows[i], q_rows[i], x, u_accept[i]):
                tokens.append(sample_token(residual(p_rows[i], q_rows[i], x), u_sample[i]))
                return Verdict(nodes, tokens)
            nodes.append(i)
            tokens.append(x)
        tokens.append(sample_token(p_rows[len(draft)], u_sample[len(draft)]))
        return Verdict(nodes, tokens)

    return verify


def _zeroed(p, q, x):
    r = p.clone()
    r[x] = 0
    return r


RULES = {
    "speculative": (speculative_verify_chain, True),
    # the decoder's point-mass rule (accept with p(x), residual p without x) is exact for ANY draft chosen
    # independently of the verification's uniforms, a sampled one too: it only accepts less often
    "point-mass": (_rule_with(lambda p, q, x, u: u < float(p[x]), _zeroed), True),
    # wrong: accept with p(x) alone, but the speculative residual max(p - q, 0)
    "p-alone": (_rule_with(lambda p, q, x, u: u < float(p[x]), lambda p, q, x: residual_distribution(p, q)), False),
    # wrong: the right acceptance test, but resampling from p itself
    "resample-p": (_rule_with(speculative_accept, lambda p, q, x: p), False),
}


def _emitted_pairs(rule, n: int, seed: int = 1):
    """Counts [V, V] of the first two tokens emitted after a 2-token chain sampled from q (a one-token
    verdict is completed by sampling the second token from p, as the next step would), and the first
    draft token's acceptance rate."""
    rng = np.random.default_rng(seed)
    counts, accepted = np.zeros((V, V)), 0
    for _ in range(n):
        u = rng.random(8)
        x1 = sample_token(Q1, u[0])
        x2 = sample_token(Q2[x1], u[1])
        verdict = rule(torch.stack([P1, P2[x1], BONUS]), torch.stack([Q1, Q2[x1]]), [x1, x2], u[2:4].tolist(),
                       u[4:7].tolist())
        t = verdict.tokens
        second = t[1] if len(t) > 1 else sample_token(P2[t[0]], u[7])
        counts[t[0], second] += 1
        accepted += bool(verdict.nodes)
    return counts, accepted / n


@pytest.mark.parametrize("name", list(RULES))
def test_sampled_draft_rule_chi_square(name):
    rule, exact = RULES[name]
    n = 8000
    counts, rate = _emitted_pairs(rule, n)
    expected = (P1[:, None] * P2).numpy() * n  # the target's own joint distribution of two tokens
    p_value = chisquare(counts.ravel(), expected.ravel()).pvalue
    if exact:
        assert p_value > 1e-3, (name, p_value)
    else:
        assert p_value < 1e-8, (name, p_value)
    if name == "speculative":  # accepts with sum(min(p, q)) = 0.6, the point-mass rule with sum(q p) = 0.2
        assert abs(rate - float(torch.minimum(P1, Q1).sum())) < 0.03
    if name == "point-mass":
        assert abs(rate - float((P1 * Q1).sum())) < 0.03


def test_residual_and_accept_examples():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.6, 0.2])
    assert residual_distribution(p, q).tolist() == [1.0, 0.0, 0.0]
    assert residual_distribution(p, p).tolist() == pytest.approx(p.tolist())  # no mass left: p itself
    assert speculative_accept(p, q, 1, 0.49) and not speculative_accept(p, q, 1, 0.51)
    assert speculative_accept(p, q, 0, 0.999)  # p(x) >= q(x): always
    verdict = speculative_verify_chain(torch.stack([p, p]), q[None], [1], [0.7], [0.5, 0.5])
    assert (verdict.nodes, verdict.tokens) == ([], [0])


# --------------------------------------------------------------------------------------- the drafters


def test_causal_mask_example():
    m = causal_mask(1, 2, torch.float32, "cpu")[0, 0]
    assert (m == 0).tolist() == [[True, True, False], [True, True, True]]
    assert causal_mask(5, 1, torch.float32, "cpu") is None


@pytest.mark.parametrize("arch", SELF_ARCHS)
def test_layer_stack_of_every_layer_is_the_target(arch):
    """The wrapper runs the target's own modules as its forward does: same logits, prefill and cached."""
    model = tiny_model(arch, layers=3)
    stack = LayerStack(model, list(model.model.layers))  # early exit after every layer
    ids = torch.randint(3, 96, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(input_ids=ids).logits[0]  # [12, V]
    cache = stack.new_cache()
    first = stack.forward(ids[:, :10], 0, cache, all_rows=True)
    step = stack.forward(ids[:, 10:12], 10, cache, all_rows=True)
    torch.testing.assert_close(torch.cat([first, step]), ref.float(), rtol=1e-6, atol=1e-6)


def test_low_rank_is_a_new_tree_and_leaves_the_target_alone():
    model = tiny_model("llama", layers=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    kinds = {n: type(m) for n, m in model.named_modules()}
    stack = low_rank_drafter(model, 0.25)
    assert {n: type(m) for n, m in model.named_modules()} == kinds
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(a is not b for a, b in zip(stack.layers, model.model.layers))
    assert stack.layers[0].input_layernorm.weight is model.model.layers[0].input_layernorm.weight  # not copied
    full = LayerStack(model, list(model.model.layers)).linear_params()
    assert stack.linear_params() < 0.6 * full


def test_skip_set_and_importance():
    assert skip_set(np.array([0.9, 0.1, 0.5, 0.2, 1.0]), 0.6) == (0, 2, 4)
    h = [torch.ones(1, 3, 4), torch.ones(1, 3, 4), -torch.ones(1, 3, 4), torch.ones(1, 3, 4)]
    assert layer_importance(h).tolist() == pytest.approx([0.0, 2.0, 1.0])
    assert modelled_speed(0.8, 0.5) == pytest.approx(1.22)


def test_calibration_reports_candidates():
    model = tiny_model("llama", layers=4)
    ids = torch.randint(3, 96, (1, 24), generator=torch.Generator().manual_seed(0))
    choice, stack = calibrate(model, "early-exit", ids, sizes=(1.0, 0.5))
    assert [c[0] for c in choice["candidates"]] == [1.0, 0.5]
    assert choice["candidates"][0][1] == 1.0 and choice["candidates"][0][2] == pytest.approx(1.0)  # all layers agree
    assert choice["size"] in (1.0, 0.5) and len(stack.layers) == len(choice["layers"])


# ----------------------------------------------------------------------------- exact in the decoder


def _prompt(n=20, seed=0):
    return torch.randint(3, 96, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def deep_models():
    """4-layer tiny models (a skipped layer out of 2 leaves too little), on the flat curve."""
    cache = {}

    def get(arch):
        if arch not in cache:
            cache[arch] = tiny_model(arch, layers=4)
            set_cost_curve(cache[arch], FLAT)
        return cache[arch]

    return get


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", SELF_ARCHS)
def test_self_draft_greedy_identical(deep_models, arch, kind):
    model = deep_models(arch)
    ids = _prompt()
    ref = model.generate(ids, max_new_tokens=32, do_sample=False)
    # a given size: no calibration, whose agreement on a random model would turn the source off (hopeless)
    alone = _decoder(kind, self_draft_size=0.5, draft_cost=0.3, **ALONE)
    merged = _decoder(kind, self_draft_size=0.5, draft_cost=0.3, draft_branches=2)
    for decoder in (alone, merged):
        out = model.generate(ids, max_new_tokens=32, do_sample=False, custom_generate=decoder)
        assert torch.equal(out, ref), (arch, kind)
    report = _draft_pass(alone).stats
    assert report["forwards"] > 0 and report["tried"] > 0
    assert alone.stats.drafted_by_origin[kind] > 0


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma"])
def test_draft_model_greedy_identical(deep_models, arch):
    """Any causal LM with the vocabulary drafts: here the target itself (every draft accepted) and a
    1-layer model of another architecture (few accepted)."""
    model = deep_models(arch)
    ids = _prompt()
    ref = model.generate(ids, max_new_tokens=32, do_sample=False)
    for draft in (model, tiny_model("qwen2", layers=1, seed=7)):
        decoder = _decoder(draft, draft_cost=0.1, **ALONE)
        out = model.generate(ids, max_new_tokens=32, do_sample=False, custom_generate=decoder)
        assert torch.equal(out, ref)
        if draft is model:
            assert decoder.stats.target_calls <= 8  # 6 drafted + 1 per call, and the prefill


def test_draft_model_built_from_the_target(deep_models):
    """``draft=`` may be a function of the target (the bench builds a truncated copy that way)."""
    model = deep_models("llama")
    ids = _prompt()
    ref = model.generate(ids, max_new_tokens=20, do_sample=False)
    seen = []
    decoder = _decoder(lambda target: seen.append(target) or target, draft_cost=0.1, **ALONE)
    out = model.generate(ids, max_new_tokens=20, do_sample=False, custom_generate=decoder)
    assert torch.equal(out, ref) and seen == [model]


@pytest.mark.parametrize("kind", ["early-exit", "draft-model"])
def test_sampled_is_the_same_text_as_without_drafts(deep_models, kind):
    """Sampling: for a seed, the decoder's text does not depend on what was drafted (``verify.py``), so a draft
    pass must give exactly the text the decoder gives with no drafts at all (itself tested against generate)."""
    model = deep_models("llama")
    ids = _prompt()
    kw = dict(max_new_tokens=32, min_new_tokens=32, do_sample=True, temperature=0.1, top_k=20)
    torch.manual_seed(3)
    ref = model.generate(ids, custom_generate=LookaheadDecoder(_tuning=Tuning(**ALONE)), **kw)
    decoder = _decoder(model if kind == "draft-model" else kind, self_draft_size=1.0, draft_cost=0.1, **ALONE)
    torch.manual_seed(3)
    out = model.generate(ids, custom_generate=decoder, **kw)
    assert torch.equal(out, ref)
    assert sum(decoder.stats.accepted_per_step) > 0


# ----------------------------------------------------------------------------------------- pricing


def test_priced_depth():
    src = DraftPassSource("early-exit", depth=6, cost=0.5)
    flat, steep = CostModel(FLAT), CostModel([(1, 0.01), (2, 0.03), (64, 0.3)])
    src._acc, src._tried = 95.0, 100.0  # a ~ 0.93
    assert src.priced_depth(6, flat) == 4  # (1 + a + ... + a^d) / (1 + d / 2) is largest at d = 4
    src.ratio = 0.05
    assert src.priced_depth(6, flat) == 6
    src.ratio = 0.5
    assert src.priced_depth(6, None) == 6  # no budget: as configured
    assert src.priced_depth(6, steep) == 0  # a verified token costs two forwards: never pays
    depths = [src.priced_depth(6, steep) for _ in range(15)]
    assert depths[-1] == 2 and set(depths[:-1]) == {0}  # a probe after 16 idle steps
    src._acc, src._tried = 10.0, 100.0  # a ~ 0.12: not worth a draft forward of half a target one
    assert src.priced_depth(6, flat) == 0


def test_stays_off_where_it_does_not_pay():
    model = tiny_model("llama", layers=4)
    set_cost_curve(model, ((1, 0.01), (2, 0.03), (64, 0.3)))  # a steep CPU-like curve
    ids = _prompt()
    ref = model.generate(ids, max_new_tokens=24, do_sample=False)
    decoder = _decoder("layer-skip", draft_cost=0.5, **ALONE)
    out = model.generate(ids, max_new_tokens=24, do_sample=False, custom_generate=decoder)
    assert torch.equal(out, ref)
    report = _draft_pass(decoder).stats
    assert report["drafting_steps"] <= 1 and report["forwards"] <= 2  # at most one depth-2 probe in 24 steps


# ---------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("arch", ["gpt2", "gemma"])
def test_self_draft_refuses_other_layouts(arch):
    model = tiny_model(arch)
    set_cost_curve(model, FLAT)
    with pytest.raises(ValueError, match="Llama-family"):
        model.generate(_prompt(), max_new_tokens=4, custom_generate=LookaheadDecoder(draft="early-exit"))


def test_draft_model_refusals():
    model = tiny_model("llama")
    set_cost_curve(model, FLAT)
    other = tiny_model("llama", vocab=128)
    with pytest.raises(ValueError, match="vocabulary of 128"):
        model.generate(_prompt(), max_new_tokens=4, custom_generate=LookaheadDecoder(draft=other))
    with pytest.raises(ValueError, match="draft must be"):
        LookaheadDecoder(draft="small-model")
    with pytest.raises(ValueError, match="encoder-decoder"):
        LookaheadDecoder(draft=_EncoderDecoder())


class _EncoderDecoder(torch.nn.Module):
    config = type("Config", (), {"vocab_size": 96, "is_encoder_decoder": True})()


def test_tuning_fields():
    assert LookaheadDecoder().draft is None  # every draft pass off by default
    assert not any(s.priced for s in LookaheadDecoder().policy.sources)
    with pytest.raises(ValueError, match="draft must be"):
        LookaheadDecoder(draft="skip")
    for bad in (dict(self_draft_size=1.5), dict(draft_depth=0), dict(draft_branches=9), dict(draft_cost=101.0)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            _decoder("early-exit", **bad)
    for bad in (dict(draft_cost=-1.0), dict(draft_cost="0.5")):  # refused by Tuning itself
        with pytest.raises(ValueError, match=next(iter(bad))):
            Tuning(**bad)
    src = draft_source("low-rank", Tuning(draft_depth=3, draft_branches=2, draft_cost=0.2, self_draft_size=0.25))
    assert (src.origin, src.max_depth, src.max_nodes, src.ratio, src.size) == (7, 3, 6, 0.2, 0.25)


def test_drafter_without_size_uses_a_short_prompt_default():
    model = tiny_model("llama", layers=4)
    stack, info = self_drafter(model, "early-exit", 0.0, np.arange(3, 7))
    assert info["size"] == 0.625 and len(stack.layers) == 2  # the middle candidate: no calibration on 4 tokens
    again, _ = self_drafter(model, "early-exit", 0.5, np.arange(3, 30))
    assert len(again.layers) == 2
    assert self_drafter(model, "early-exit", 0.0, np.arange(3, 30))[0] is stack  # built once per model and size
    calibrated, info = self_drafter(model, "layer-skip", 0.0, np.arange(3, 30))
    assert len(info["candidates"]) == 3 and len(calibrated.layers) == len(info["layers"])


def test_source_cache_follows_the_accepted_prefix():
    """The drafter's cache holds exactly the context's tokens it has seen: the accepted part of a chain stays,
    the rest is cropped; the next proposal continues from the context (here a drafter that is the target)."""
    model = tiny_model("llama", layers=2)
    src = DraftPassSource("early-exit", depth=4, cost=0.1, size=1.0)  # every layer: the target itself
    src.start(np.arange(3, 13), model)
    chain = src.propose(None, 4, 4).tokens.tolist()
    assert src.cached == list(range(3, 13)) + chain[:3]
    wrong = (chain[2] + 1) % 96
    src.learn(np.array([chain[0], chain[1], wrong]))  # two accepted, then a correction
    assert src.cached == list(range(3, 13)) + chain[:2] and src.cache.get_seq_length() == 12
    assert (src.stats["tried"], src.stats["accepted"]) == (3, 2)
    src.learn(np.array([7]))  # a step it did not draft: nothing to crop
    nxt = src.propose(None, 4, 4).tokens.tolist()
    with torch.no_grad():
        ids = torch.tensor([list(range(3, 13)) + chain[:2] + [wrong, 7]])
        assert nxt[0] == int(model(input_ids=ids).logits[0, -1].argmax())


def test_a_calibration_that_cannot_pay_turns_the_source_off_without_probes():
    src = DraftPassSource("early-exit", depth=6, cost=0.5)
    src.hopeless = True  # as start() sets it from a calibrated agreement
    src._acc, src._tried = 95.0, 100.0
    assert [src.priced_depth(6, CostModel(FLAT)) for _ in range(40)] == [0] * 40  # not even a probe
    assert src.priced_depth(6, None) == 6  # adaptive=False: drafted as configured
    # SmolLM2's early exit after 22 of 30 layers: agreement 0.27 at 0.76 of a target forward
    assert modelled_speed(0.27, 0.76) < DEFAULT.margin <= modelled_speed(0.9, 0.3)
