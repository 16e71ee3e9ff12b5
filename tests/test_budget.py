"""The hardware-aware budget: cost curves, acceptance estimates, and the per-step choice."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lookahead import LookaheadDecoder
from lookahead.budget import (
    _CURVES,
    AcceptanceStats,
    Budget,
    CopyBelief,
    CostModel,
    calibrate,
    calibration_sizes,
    choose_nodes,
    forget_calibrations,
    match_bucket,
    tried_nodes,
)
from lookahead.proposer import ORIGINS, Draft
from lookahead.tree import subset_tree, tree_depth_rank

FLAT = CostModel([(1, 0.010), (64, 0.0105)])  # a datacenter GPU: 64 tokens cost as much as one
STEEP = CostModel([(1, 0.036), (2, 0.041), (4, 0.057), (8, 0.067), (16, 0.075), (32, 0.114), (64, 0.136)])
VERY_STEEP = CostModel([(1, 0.01), (2, 0.03), (64, 1.0)])


def _draft(parents, match=1, window_rows=0) -> Draft:
    """A trie draft with tree ``parents`` (tokens 0..n-1), every node after a ``match``-token match."""
    parents = np.asarray(parents, dtype=np.int64)
    match_of = np.full(len(ORIGINS), match, dtype=np.int64)
    window = (np.zeros(window_rows), np.zeros(window_rows), None) if window_rows else None
    return Draft(np.arange(len(parents)), parents, np.zeros(len(parents), dtype=np.int8), match_of, window)


def test_docstring_example():
    cost = CostModel([(1, 1.0), (2, 1.1), (3, 1.2), (4, 2.0)])
    assert choose_nodes(np.array([0.9, 0.8, 0.1]), cost).tolist() == [0, 1]


def test_flat_cost_picks_large_budgets():
    probs = np.linspace(0.5, 0.05, 40)
    assert len(choose_nodes(probs, FLAT)) == 40


def test_steep_cost_picks_small_or_none():
    probs = np.array([0.3, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05])
    assert len(choose_nodes(probs, STEEP)) < len(choose_nodes(probs, FLAT))
    assert len(choose_nodes(probs, VERY_STEEP)) == 0


def test_zero_acceptance_picks_plain_steps():
    assert len(choose_nodes(np.zeros(12), FLAT)) == 0
    assert len(choose_nodes(np.zeros(12), STEEP)) == 0


def test_choice_is_a_tree_prefix():
    parents = np.array([-1, -1, 0, 2, 1])
    probs = np.array([0.9, 0.2, 0.8, 0.7, 0.1])
    keep = choose_nodes(probs, CostModel([(1, 1.0), (4, 1.05), (6, 3.0)]))
    # k=3: (1 + 0.9 + 0.8 + 0.7) / 1.05 = 3.24 tokens per unit beats k=4: 3.6 / 2.025 = 1.78
    assert keep.tolist() == [0, 2, 3]
    tokens, new_parents, origin = subset_tree(np.array([10, 11, 12, 13, 14]), parents, np.zeros(5), keep)
    assert tokens.tolist() == [10, 12, 13] and new_parents.tolist() == [-1, 0, 1]


def test_subset_tree_reindexes_and_rejects_orphans():
    t, p, o = subset_tree(np.array([5, 6, 7, 8]), np.array([-1, -1, 0, 1]), np.array([0, 1, 0, 1]), [0, 1, 3])
    assert t.tolist() == [5, 6, 8] and p.tolist() == [-1, -1, 1] and o.tolist() == [0, 1, 1]
    with pytest.raises(ValueError):
        subset_tree(np.array([5, 6]), np.array([-1, 0]), np.zeros(2), [1])


def test_a_kept_node_keeps_its_proposed_depth_and_rank():
    d = _draft([-1, -1, 0])  # ranks [1, 2, 0]: two siblings, then an only child
    assert d.depth.tolist() == [1, 1, 2] and d.rank.tolist() == [1, 2, 0]
    d.keep([1])
    assert d.parents.tolist() == [-1] and d.depth.tolist() == [1] and d.rank.tolist() == [2]
    budget = Budget(FLAT)
    budget.record(d, [0], 0)  # learns in the cell it was estimated in: second sibling, not only child
    tried = budget.acceptance.tried[0, 0, 0]  # (origin trie, 1-token match, depth 1) -> per rank cell
    assert tried.tolist() == [0.0, 0.0, 1.0, 0.0]


def test_cost_model_interpolates_and_extrapolates():
    c = CostModel([(1, 1.0), (3, 2.0)])
    assert c(2) == pytest.approx(1.5) and c(5) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        CostModel([(0, 1.0)])


def test_depth_rank():
    depth, rank = tree_depth_rank(np.array([-1, -1, 0, 0, 1]))
    assert depth.tolist() == [1, 1, 2, 2, 2] and rank.tolist() == [1, 2, 1, 2, 0]


def test_acceptance_stats_learn():
    acc = AcceptanceStats(priors=((1.0, 1.0),), decay=1.0)
    parents, origin = np.array([-1, -1, 0]), np.array([0, 0, 0])
    for _ in range(20):
        acc.update(parents, origin, [0, 2])  # first child and its child are always accepted
    probs = acc.node_probabilities(parents, origin)
    assert probs[0] > 0.9 and probs[1] < 0.1 and probs[2] > 0.85
    # node 2 is only tried when node 0 was accepted: its estimate is conditional
    assert acc.tried[0, 0, 1, 0] == 20  # depth 2, an only child


def test_match_length_sets_the_prior_and_separates_the_estimates():
    acc = AcceptanceStats(decay=1.0)
    chain, origin = np.array([-1, 0]), np.zeros(2, dtype=np.int64)
    # before any data: the rank prior (only child: 2/3) scaled by the match bucket's factor
    assert match_bucket([0, 1, 2, 3, 7]).tolist() == [0, 0, 1, 2, 2]
    assert acc.node_probabilities(chain, origin, match_bucket(1)) == pytest.approx([1 / 3, 1 / 9])
    assert acc.node_probabilities(chain, origin, match_bucket(2)) == pytest.approx([0.6, 0.36])
    assert acc.node_probabilities(chain, origin, match_bucket(3)) == pytest.approx([2.6 / 3, (2.6 / 3) ** 2])
    for _ in range(10):
        acc.update(chain, origin, [0, 1], match_bucket(3))  # long matches copy
        acc.update(chain, origin, [], match_bucket(1))  # one-token matches miss
    assert acc.node_probabilities(chain, origin, match_bucket(3))[1] > 0.8
    assert acc.node_probabilities(chain, origin, match_bucket(1))[0] < 0.1
    assert AcceptanceStats(context_scale=None).node_probabilities(chain, origin, 0)[0] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="context_scale"):
        AcceptanceStats(context_scale=(1.0, 1.0))


def test_budget_probes_when_it_would_never_draft():
    budget = Budget(VERY_STEEP, AcceptanceStats(priors=((0.0001, 10.0),)), probe_every=4)
    choices = [len(budget.plan(_draft([-1, 0]))[0]) for _ in range(8)]
    assert choices == [0, 0, 0, 1, 0, 0, 0, 1]


def test_tried_nodes():
    ok, tried = tried_nodes(np.array([-1, -1, 0, 2]), [0])
    assert ok.tolist() == [True, False, False, False] and tried.tolist() == [True, True, True, False]


def test_copy_belief_worked_example():
    b = CopyBelief(prior=0.9, off_scale=0.3, relax=0.9)
    assert b.belief == pytest.approx(0.9) and b.scale() == pytest.approx(0.93)
    b.update(np.array([0.87]), np.array([False]))  # log((1 - 0.87) / (1 - 0.3 * 0.87)) = -1.7378
    assert b.log_odds == pytest.approx(np.log(9) - 1.7377635, abs=1e-6)
    assert b.belief == pytest.approx(0.612886, abs=1e-6) and b.scale() == pytest.approx(0.729020, abs=1e-6)
    b.step()  # relaxes towards the prior's log-odds
    assert b.log_odds == pytest.approx(np.log(9) - 0.9 * 1.7377635, abs=1e-6)
    assert b.scale() == pytest.approx(0.757256, abs=1e-6)
    b.update(np.array([0.5, 0.5]), np.array([True, True]))  # each accepted node adds log(1 / 0.3)
    assert b.log_odds == pytest.approx(np.log(9) - 0.9 * 1.7377635 + 2 * np.log(1 / 0.3), abs=1e-6)
    for _ in range(20):
        b.update(np.array([0.9]), np.array([False]))
    assert b.log_odds == -6.0 and b.scale() == pytest.approx(0.3 + 0.7 / (1 + np.exp(6.0)))  # clipped at -limit


@pytest.mark.parametrize("field, kwargs", [("prior", {"prior": 1.0}), ("off_scale", {"off_scale": 0.0}),
                                           ("relax", {"relax": 1.5})])
def test_copy_belief_rejects_bad_values(field, kwargs):
    with pytest.raises(ValueError, match=field):
        CopyBelief(**kwargs)


CPU = CostModel([(1, 0.0816), (2, 0.1351), (4, 0.1534), (8, 0.1856), (16, 0.2158)])  # SmolLM2 on this CPU


def test_a_failed_draft_lowers_every_cell_for_a_while():
    """The belief couples the estimates: after a rejected three-token-match chain, a two-token-match
    chain (a different, still untried cell) is not drafted at once, but is again a few steps later."""
    chain3, chain4 = np.arange(-1, 8), np.arange(-1, 3)  # parents of a 9-node and a 4-node chain

    def budget(off_scale):
        b = Budget(CPU, belief=CopyBelief(off_scale=off_scale))
        keep, _ = b.plan(_draft(chain3, match=3))
        assert len(keep) == 9  # the prior trusts a long match
        b.record(_draft(chain3, match=3), [], 0)  # its first node was rejected
        return b

    assert len(Budget(CPU).plan(_draft(chain4, match=2))[0]) == 4  # fresh: drafted
    b = budget(0.3)
    assert len(b.plan(_draft(chain4, match=2))[0]) == 0
    assert [len(b.plan(_draft(chain4, match=2))[0]) for _ in range(10)][-1] == 4
    assert len(budget(0.999999).plan(_draft(chain4, match=2))[0]) == 4  # uncoupled


def test_budget_turns_window_off_when_it_does_not_pay():
    budget = Budget(VERY_STEEP, window_probe_every=100)
    budget.window_gain = 0.0
    keep, use_window = budget.plan(_draft([], window_rows=12))
    assert not use_window
    budget = Budget(FLAT, window_probe_every=100)
    budget.window_gain = 0.5
    assert budget.plan(_draft([], window_rows=12))[1]


def test_calibration_runs_once_per_model_device_dtype(tiny_models):
    model = tiny_models("llama")
    forget_calibrations()
    calls = []
    handle = model.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        dec = LookaheadDecoder()
        ids = torch.tensor([[3, 10, 11, 12, 10, 11, 12]])
        model.generate(ids, custom_generate=dec, max_new_tokens=10, eos_token_id=None)
        first = len(calls)
        assert dec.stats.cost_curve is not None and len(_CURVES) == 1
        calls.clear()
        model.generate(ids, custom_generate=LookaheadDecoder(), max_new_tokens=10, eos_token_id=None)
        assert len(calls) == dec.stats.target_calls or len(calls) < first  # no second calibration
        assert len(_CURVES) == 1
        curve = calibrate(model, None, max_rows=17)  # kept: the cache factory is not even needed
        assert curve is _CURVES[next(iter(_CURVES))]
    finally:
        handle.remove()


def test_calibration_covers_the_rows_a_step_can_feed(tiny_models):
    from cache import NgramTrie

    assert calibration_sizes(1) == (1, 2, 4, 8, 16)
    assert calibration_sizes(17) == (1, 2, 4, 8, 16, 32)
    assert calibration_sizes(33) == (1, 2, 4, 8, 16, 32, 64)
    model = tiny_models("gpt2")
    forget_calibrations()
    ids = torch.tensor([[3, 10, 11, 12, 10, 11, 12]])
    dec = LookaheadDecoder()  # 1 + 16 tree rows
    model.generate(ids, custom_generate=dec, max_new_tokens=4, eos_token_id=None)
    assert [k for k, _ in dec.stats.cost_curve] == [1, 2, 4, 8, 16, 32]
    kept = next(iter(_CURVES.values()))
    small = LookaheadDecoder(tree_nodes=4)  # needs fewer rows: the kept curve serves
    model.generate(ids, custom_generate=small, max_new_tokens=4, eos_token_id=None)
    assert list(_CURVES.values()) == [kept] and len(small.stats.cost_curve) == 6
    # a shared memory store doubles the tree, the window adds its rows: 1 + 32 + 3*3 + 4*3 = 54 rows
    big = LookaheadDecoder(trie=NgramTrie(12), window_width=4, window_ngram=4, window_candidates=3)
    assert big.proposer.max_rows() == 54
    model.generate(ids, custom_generate=big, max_new_tokens=4, eos_token_id=None)
    assert [k for k, _ in big.stats.cost_curve] == [1, 2, 4, 8, 16, 32, 64]
    assert len(_CURVES) == 1 and next(iter(_CURVES.values())) is not kept  # replaced: one per model


def test_explicit_curve_or_fixed_budget_skip_calibration(tiny_models):
    model = tiny_models("qwen2")
    forget_calibrations()
    ids = torch.tensor([[3, 10, 11, 12, 10, 11, 12]])
    dec = LookaheadDecoder(cost_curve=((1, 0.01), (64, 0.02)))
    model.generate(ids, custom_generate=dec, max_new_tokens=10, eos_token_id=None)
    assert dec.stats.cost_curve == ((1, 0.01), (64, 0.02))
    fixed = LookaheadDecoder(adaptive=False)
    model.generate(ids, custom_generate=fixed, max_new_tokens=10, eos_token_id=None)
    assert fixed.stats.cost_curve is None
    assert not _CURVES


@pytest.mark.parametrize("curve", [FLAT.points, VERY_STEEP.points])
def test_budget_keeps_greedy_exact(tiny_models, curve):
    model = tiny_models("llama")
    ids = torch.tensor([[3, 10, 11, 12, 13, 10, 11, 12, 13, 10]])
    plain = model.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None)
    dec = LookaheadDecoder(cost_curve=curve, window_width=3)
    ours = model.generate(ids, custom_generate=dec, max_new_tokens=40, eos_token_id=None)
    assert ours.tolist() == plain.tolist()
    assert len(dec.stats.budgets) == dec.stats.target_calls


def test_stats_record_each_steps_budget_and_acceptance(tiny_models, tmp_path):
    from lookahead.stats import plot_budgets

    model = tiny_models("llama")
    ids = torch.tensor([[3, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10]])
    for dec in (LookaheadDecoder(cost_curve=FLAT.points), LookaheadDecoder(adaptive=False, window_width=2)):
        model.generate(ids, custom_generate=dec, max_new_tokens=16, eos_token_id=None)
        s = dec.stats
        assert len(s.budgets) == len(s.accepted_per_step) == s.target_calls
        assert sum(s.accepted_per_step) == s.accepted
        assert all(a <= b for a, (b, _) in zip(s.accepted_per_step, s.budgets))
        assert s.as_dict()["accepted_per_step"] == s.accepted_per_step
        path = plot_budgets(s, str(tmp_path / "b.png"))
        assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_acceptance_estimates_do_not_carry_across_calls(tiny_models):
    """A reused decoder decides each call's budgets as a fresh one would (the n-gram memory is what carries)."""
    model = tiny_models("llama")
    repetitive = torch.tensor([[3, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10]])
    other = torch.tensor([[5, 20, 21, 22, 20, 21, 23, 24, 25]])
    reused = LookaheadDecoder(cost_curve=CPU.points)
    model.generate(repetitive, custom_generate=reused, max_new_tokens=24, eos_token_id=None)
    model.generate(other, custom_generate=reused, max_new_tokens=24, eos_token_id=None)
    fresh = LookaheadDecoder(cost_curve=CPU.points)
    model.generate(other, custom_generate=fresh, max_new_tokens=24, eos_token_id=None)
    assert reused.stats.budgets == fresh.stats.budgets
    assert any(n for n, _ in fresh.stats.budgets), "the check must see drafted steps"


def test_a_call_learns_on_its_own_copy_of_the_process_curve(tiny_models):
    model = tiny_models("llama")
    forget_calibrations()
    ids = torch.tensor([[3, 10, 11, 12, 10, 11, 12]])
    model.generate(ids, custom_generate=LookaheadDecoder(), max_new_tokens=4, eos_token_id=None)
    kept = next(iter(_CURVES.values()))
    before = kept.points
    budget = Budget(kept)
    budget.record(_draft([]), [], 0, rows=2, seconds=100.0)  # an absurdly slow step
    assert budget.cost(2) > before[1][1] and kept.points == before  # the call's copy moved, the kept curve did not
    model.generate(ids, custom_generate=LookaheadDecoder(), max_new_tokens=12, eos_token_id=None)
    assert kept.points == before


def test_default_estimates_have_one_cell_row_per_draft_origin():
    from lookahead.proposer import ORIGINS

    assert Budget(FLAT).acceptance.tried.shape[0] == len(ORIGINS)  # a Budget's fresh estimates fit every store
