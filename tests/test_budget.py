"""The draft budget: acceptance estimates, the copy belief, the per-step choice, and the policy's limits."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from lookahead import LookaheadDecoder
from lookahead import budget as K
from lookahead._tuning import Tuning
from lookahead.budget import AcceptanceStats, Budget, CopyBelief, choose_nodes
from lookahead.cost import CostModel
from lookahead.drafting import kernels as DK
from lookahead.drafting.draft import ORIGINS, Draft, WindowRows
from lookahead.drafting.trees import depth_rank, tree_depth_rank

from draft_reference import build_draft

FLAT = CostModel([(1, 0.010), (64, 0.0105)])  # a datacenter GPU: 64 tokens cost as much as one
STEEP = CostModel([(1, 0.036), (2, 0.041), (4, 0.057), (8, 0.067), (16, 0.075), (32, 0.114), (64, 0.136)])
VERY_STEEP = CostModel([(1, 0.01), (2, 0.03), (64, 1.0)])


def _draft(parents, match=1, window_rows=0) -> Draft:
    """A trie draft with tree ``parents`` (tokens 0..n-1), every node after a ``match``-token match."""
    parents = np.asarray(parents, dtype=np.int64)
    window = WindowRows(np.zeros(window_rows, np.int64), np.ones(window_rows, np.int64),
                        np.eye(window_rows, dtype=bool)) if window_rows else None
    return build_draft(np.arange(len(parents)), parents, np.zeros(len(parents), dtype=np.int8),
                       np.full(len(parents), match), window)


def _nodes(probs, cost, **kw):
    return choose_nodes(np.asarray(probs, dtype=np.float64), cost, **kw)[0]


def test_docstring_example():
    cost = CostModel([(1, 1.0), (2, 1.1), (3, 1.2), (4, 2.0)])
    assert _nodes([0.9, 0.8, 0.1], cost).tolist() == [0, 1]


def test_flat_cost_picks_large_budgets():
    probs = np.linspace(0.5, 0.05, 40)
    assert len(_nodes(probs, FLAT)) == 40


def test_steep_cost_picks_small_or_none():
    probs = np.array([0.3, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05])
    assert len(_nodes(probs, STEEP)) < len(_nodes(probs, FLAT))
    assert len(_nodes(probs, VERY_STEEP)) == 0


def test_zero_acceptance_picks_plain_steps():
    assert len(_nodes(np.zeros(12), FLAT)) == 0
    assert len(_nodes(np.zeros(12), STEEP)) == 0


def test_choice_is_a_tree_prefix():
    parents = np.array([-1, -1, 0, 2, 1])
    probs = np.array([0.9, 0.2, 0.8, 0.7, 0.1])
    keep = _nodes(probs, CostModel([(1, 1.0), (4, 1.05), (6, 3.0)]))
    # k=3: (1 + 0.9 + 0.8 + 0.7) / 1.05 = 3.24 tokens per unit beats k=4: 3.6 / 2.025 = 1.78
    assert keep.tolist() == [0, 2, 3]
    kept = build_draft(np.array([10, 11, 12, 13, 14]), parents, np.zeros(5), np.ones(5)).keep(keep)
    assert kept.tokens.tolist() == [10, 12, 13] and kept.parents.tolist() == [-1, 0, 1]


def test_keep_reindexes_and_rejects_orphans():
    draft = build_draft(np.array([5, 6, 7, 8]), np.array([-1, -1, 0, 1]), np.array([0, 1, 0, 1]), np.ones(4))
    kept = draft.keep([0, 1, 3])
    assert kept.tokens.tolist() == [5, 6, 8] and kept.parents.tolist() == [-1, -1, 1]
    assert kept.origin.tolist() == [0, 1, 1]
    ar = np.arange(4)  # the kernel's docstring example: parents [-1, -1, 0, 1], keep [0, 1, 3]
    ints, origin, ok = DK.keep_nodes(ar, np.array([-1, -1, 0, 1]), ar.astype(np.int8), ar, ar + 10, ar + 20, ar + 30,
                                    np.array([0, 1, 3]))
    assert ok and ints.tolist() == [[0, 1, 3], [-1, -1, 1], [0, 1, 3], [10, 11, 13], [20, 21, 23], [30, 31, 33]]
    assert origin.dtype == np.int8 and origin.tolist() == [0, 1, 3]
    assert not DK.keep_nodes(ar, np.array([-1, -1, 0, 1]), ar.astype(np.int8), ar, ar, ar, ar, np.array([0, 3]))[-1]
    with pytest.raises(ValueError):
        build_draft(np.array([5, 6]), np.array([-1, 0]), np.zeros(2), np.ones(2)).keep([1])


def test_a_kept_node_keeps_its_proposed_depth_and_rank():
    d = _draft([-1, -1, 0])  # ranks [1, 2, 0]: two siblings, then an only child
    assert d.depth.tolist() == [1, 1, 2] and d.rank.tolist() == [1, 2, 0]
    kept = d.keep([1])
    assert kept.parents.tolist() == [-1] and kept.depth.tolist() == [1] and kept.rank.tolist() == [2]
    assert d.parents.tolist() == [-1, -1, 0], "keep makes a new draft; the proposal is not modified"
    budget = Budget(FLAT)
    budget.record(kept, [0])  # learns in the cell it was estimated in: second sibling, not only child
    tried = budget.acceptance.tried[0, 0, 0]  # (origin trie, 1-token match, depth 1) -> per rank cell
    assert tried.tolist() == [0.0, 0.0, 1.0, 0.0]


def test_depth_rank():
    depth, rank = tree_depth_rank(np.array([-1, -1, 0, 0, 1]))
    assert depth.tolist() == [1, 1, 2, 2, 2] and rank.tolist() == [1, 2, 1, 2, 0]


def test_acceptance_stats_learn():
    acc = AcceptanceStats(len(ORIGINS), Tuning(priors=((1.0, 1.0),), decay=1.0))
    d = _draft([-1, -1, 0])
    for _ in range(20):
        acc.update(d, [0, 2])  # first child and its child are always accepted
    probs = acc.node_probabilities(d)
    assert probs[0] > 0.9 and probs[1] < 0.1 and probs[2] > 0.85
    # node 2 is only tried when node 0 was accepted: its estimate is conditional
    assert acc.tried[0, 0, 1, 0] == 20  # depth 2, an only child


def test_kernel_examples():
    depth, rank, ok = depth_rank(np.array([-1, -1, 0, 0, 1]))
    assert ok and depth.tolist() == [1, 1, 2, 2, 2] and rank.tolist() == [1, 2, 1, 2, 0]
    assert not depth_rank(np.array([-1, 1]))[2]
    keep, rate = K.choose(np.array([0.9, 0.8, 0.1]), np.array([9.0, 1.0, 1.1, 1.2, 2.0]), 0, 0.0, 1.05, 3)
    assert keep.tolist() == [0, 1] and rate == pytest.approx(2.7 / 1.2)
    keep, rate = K.choose(np.array([0.5, 0.5]), np.array([9.0, 1.0, 1.0, 1.0]), 0, 0.0, 1.05, 2)
    assert keep.tolist() == [0, 1] and rate == 2.0  # ties: the lower index first, both kept


def test_agreed_nodes_start_from_the_same_prior_and_learn_apart():
    acc = AcceptanceStats(len(ORIGINS), Tuning(decay=1.0, depth_lift=1.0))
    alone = _draft([-1, 0], 2)
    agreed = dataclasses.replace(alone, agreement=np.array([1, 2]))  # other sources drafted both nodes
    assert acc.node_probabilities(agreed).tolist() == acc.node_probabilities(alone).tolist()
    assert acc.node_probabilities(alone) == pytest.approx([0.6, 0.36])
    for _ in range(10):
        acc.update(agreed, [0, 1])  # where the sources agree, the path is accepted
        acc.update(alone, [])  # a path drafted by one source alone is not
    assert acc.node_probabilities(agreed)[1] > 0.8
    assert acc.node_probabilities(alone)[0] < 0.1
    assert acc.node_probabilities(_draft([-1, 0], 3)).tolist() == pytest.approx([2.6 / 3, (2.6 / 3) ** 2])  # untouched


def test_match_length_sets_the_prior_and_separates_the_estimates():
    acc = AcceptanceStats(len(ORIGINS), Tuning(decay=1.0, depth_lift=1.0))  # every depth borrows alike
    # before any data: the rank prior (only child: 2/3) scaled by the match bucket's factor
    assert acc.node_probabilities(_draft([-1, 0], 1)) == pytest.approx([1 / 3, 1 / 9])
    assert acc.node_probabilities(_draft([-1, 0], 0)) == pytest.approx([1 / 3, 1 / 9])  # no match: bucket 1
    assert acc.node_probabilities(_draft([-1, 0], 7)) == pytest.approx([2.6 / 3, (2.6 / 3) ** 2])  # 3 or more
    assert acc.node_probabilities(_draft([-1, 0], 2)) == pytest.approx([0.6, 0.36])
    assert acc.node_probabilities(_draft([-1, 0], 3)) == pytest.approx([2.6 / 3, (2.6 / 3) ** 2])
    for _ in range(10):
        acc.update(_draft([-1, 0], 3), [0, 1])  # long matches copy
        acc.update(_draft([-1, 0], 1), [])  # one-token matches miss
    assert acc.node_probabilities(_draft([-1, 0], 3))[1] > 0.8
    assert acc.node_probabilities(_draft([-1, 0], 1))[0] < 0.1
    unscaled = AcceptanceStats(len(ORIGINS), Tuning(match_scale=(1.0, 1.0, 1.0)))
    assert unscaled.node_probabilities(_draft([-1, 0], 1))[0] == pytest.approx(2 / 3)


def test_depth_lift_makes_a_deeper_node_likelier_to_go_on():
    # the docstring's worked example: 2-token match c = 0.6 at depth 1, 1 - 0.4 * 0.95 = 0.62 at depth 2
    acc = AcceptanceStats(len(ORIGINS), Tuning(depth_lift=0.95))
    assert acc.node_probabilities(_draft([-1, 0], 2)) == pytest.approx([0.6, 0.6 * 0.62])
    assert acc.node_probabilities(_draft([-1, 0], 1)) == pytest.approx([1 / 3, 1 / 3 * (1 - 2 / 3 * 0.95)])
    # depth cells past the last share it: depth 20 is lifted as the last cell (depth_cells 8: 0.95 ** 7)
    chain = _draft(list(range(-1, 19)), 2)  # 20 only children
    c = acc.node_probabilities(chain)
    assert c[19] / c[18] == pytest.approx(1 - 0.4 * 0.95 ** 7)
    with pytest.raises(ValueError, match="depth_lift"):
        Tuning(depth_lift=0.0)
    with pytest.raises(ValueError, match="depth_lift"):
        Tuning(depth_lift=1.5)


def test_pooled_counts_equal_the_sum_over_depths():
    acc = AcceptanceStats(len(ORIGINS))
    rng = np.random.default_rng(0)
    for _ in range(30):
        d = _draft([-1, -1, 0, 0, 2, 4, 5], match=int(rng.integers(1, 4)))
        acc.update(d, [0, 2][: int(rng.integers(0, 3))])
    assert np.allclose(acc._tried_pool, acc.tried.sum(axis=2))
    assert np.allclose(acc._accepted_pool, acc.accepted.sum(axis=2))


def test_budget_probes_when_it_would_never_draft():
    budget = Budget(VERY_STEEP, Tuning(priors=((0.0001, 10.0),), probe_every=4))
    choices = [len(budget.plan(_draft([-1, 0]))) for _ in range(8)]
    assert choices == [0, 0, 0, 1, 0, 0, 0, 1]


def test_record_tries_only_children_of_accepted_nodes():
    acc = AcceptanceStats(len(ORIGINS), Tuning(decay=1.0))
    d = _draft([-1, -1, 0, 2])
    c, hit = acc.update(d, [0])  # node 3's parent (node 2) was rejected: node 3 was never compared
    assert hit.tolist() == [True, False, False] and len(c) == 3
    assert acc.tried.sum() == 3 and acc.accepted.sum() == 1
    # priors after a 1-token match (x0.5): first of two siblings 1/3 -> 1/6, second 1/10 -> 1/20, only child
    # 2/3 -> 1/3, at depth 2 lifted by depth_lift 0.95: 1 - (1 - 1/3) * 0.95
    assert c.tolist() == pytest.approx([1 / 6, 1 / 20, 1 - 2 / 3 * 0.95])


def test_copy_belief_worked_example():
    b = CopyBelief(Tuning(belief_prior=0.9, belief_off_scale=0.3, belief_relax=0.9))
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


_SCALE_PAIR = ("Tuning accepts a match_scale without three factors; AcceptanceStats then builds a prior table of "
               "2 * len(match_scale) contexts, not 6, which the Numba kernels index past its end")


@pytest.mark.parametrize("field, value", [
    ("belief_prior", 1.0),
    ("belief_off_scale", 0.0), ("belief_relax", 1.5), ("priors", ((1.0, 0.0),)),
    ("match_scale", (1.0, 1.0)),
    ("probe_every", 0), ("learn_slope_cpu", 0.0)])
def test_tuning_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=f"Tuning.{field}="):
        Tuning(**{field: value})


CPU = CostModel([(1, 0.0816), (2, 0.1351), (4, 0.1534), (8, 0.1856), (16, 0.2158)])  # SmolLM2 on this CPU


def test_a_failed_draft_lowers_every_cell_for_a_while():
    """The belief couples the estimates: after a rejected three-token-match chain, a two-token-match
    chain (a different, still untried cell) is not drafted at once, but is again a few steps later."""
    chain3, chain4 = np.arange(-1, 8), np.arange(-1, 3)  # parents of a 9-node and a 4-node chain

    def budget(off_scale):
        b = Budget(CPU, Tuning(belief_off_scale=off_scale))
        assert len(b.plan(_draft(chain3, match=3))) == 9  # the prior trusts a long match
        b.record(_draft(chain3, match=3), [])  # its first node was rejected
        return b

    assert len(Budget(CPU).plan(_draft(chain4, match=2))) == 4  # fresh: drafted
    b = budget(0.3)
    assert len(b.plan(_draft(chain4, match=2))) == 0
    assert [len(b.plan(_draft(chain4, match=2))) for _ in range(10)][-1] == 4
    assert len(budget(0.999999).plan(_draft(chain4, match=2))) == 4  # uncoupled


def test_budget_turns_window_off_when_it_does_not_pay():
    budget = Budget(VERY_STEEP, Tuning(window_probe_every=100))
    budget.window_gain = 0.0
    assert budget.plan(_draft([], window_rows=12)).window is None
    budget = Budget(FLAT, Tuning(window_probe_every=100))
    budget.window_gain = 0.5
    assert budget.plan(_draft([], window_rows=12)).window is not None


@pytest.mark.parametrize("curve", [FLAT.points, VERY_STEEP.points])
def test_budget_keeps_greedy_exact(tiny_models, curve):
    model = tiny_models("llama")
    ids = torch.tensor([[3, 10, 11, 12, 13, 10, 11, 12, 13, 10]])
    plain = model.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None)
    dec = LookaheadDecoder(cost_curve=curve, window=3)
    ours = model.generate(ids, custom_generate=dec, max_new_tokens=40, eos_token_id=None)
    assert ours.tolist() == plain.tolist()
    assert len(dec.stats.budgets) == dec.stats.target_calls


def test_stats_record_each_steps_budget_and_acceptance(tiny_models, tmp_path):
    from lookahead.tools.plots import plot_budgets

    model = tiny_models("llama")
    ids = torch.tensor([[3, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10]])
    for dec in (LookaheadDecoder(cost_curve=FLAT.points), LookaheadDecoder(window=2, _tuning=Tuning(adaptive=False))):
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


def test_default_estimates_have_one_cell_row_per_draft_origin():
    assert Budget(FLAT).acceptance.tried.shape[0] == len(ORIGINS)  # a Budget's fresh estimates fit every store


def test_belief_log_ratio_equals_the_formula():
    assert K.belief_log_ratio(np.array([0.87, 0.5]), np.array([False, True]), 0.3) == pytest.approx(
        np.log(0.13 / (1 - 0.3 * 0.87)) + np.log(1 / 0.3))
    rng = np.random.default_rng(0)
    for _ in range(50):
        c = rng.random(int(rng.integers(0, 30)))
        c[rng.random(len(c)) < 0.1] = 1.0  # clipped to 1 - 1e-6
        hit = rng.random(len(c)) < 0.4
        clipped = np.clip(c, 1e-6, 1 - 1e-6)
        want = np.log(np.where(hit, 1 / 0.3, (1 - clipped) / (1 - 0.3 * clipped))).sum()
        assert K.belief_log_ratio(c, hit, 0.3) == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("window_rows", [0, 6])
def test_plan_with_a_node_cap_equals_cutting_to_the_most_probable_first(window_rows):
    """``Budget.plan(draft, max_nodes)`` (one pass) chooses what the policy's old two passes chose: keep the
    ``max_nodes`` most probable nodes, then plan that draft."""
    rng = np.random.default_rng(1)
    for trial in range(60):
        n = int(rng.integers(1, 40))
        parents = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, n)])
        draft = _draft(parents, match=int(rng.integers(1, 4)), window_rows=window_rows)
        cap = int(rng.integers(1, n + 3))
        one, two = Budget(FLAT), Budget(FLAT)
        for b in (one, two):  # some learning first, the same for both
            b.record(draft, [0] if trial % 2 else [])
        cut = draft
        if n > cap:
            probs = two.acceptance.node_probabilities(draft)
            cut = draft.keep(np.sort(np.argsort(-probs, kind="stable")[:cap]))
        got, want = one.plan(draft, cap), two.plan(cut)
        assert got.tokens.tolist() == want.tokens.tolist() and got.parents.tolist() == want.parents.tolist()
        assert got.n_window_rows == want.n_window_rows and len(got) <= cap


@pytest.mark.parametrize("window_rows", [0, 6])
def test_the_planned_drafts_probabilities_are_read_back_not_recomputed(window_rows):
    """``Budget.probabilities_of`` gives the probabilities ``node_probabilities`` computes for the draft ``plan``
    returned (each kept node's own), from the plan itself; any other draft's are computed."""
    rng = np.random.default_rng(2)
    for trial in range(40):
        n = int(rng.integers(1, 30))
        parents = np.array([-1] + [int(rng.integers(-1, i)) for i in range(1, n)])
        draft = _draft(parents, match=int(rng.integers(1, 4)), window_rows=window_rows)
        budget = Budget(FLAT if trial % 3 else STEEP)
        budget.record(draft, [0] if trial % 2 else [])
        planned = budget.plan(draft, int(rng.integers(1, n + 2)))
        got = budget.probabilities_of(planned)
        assert budget.probabilities_of(planned) is got  # read back: a computation would make a new array
        np.testing.assert_array_equal(got, budget.node_probabilities(planned) if len(planned) else np.zeros(0))
        other = draft.keep(np.arange(min(2, n)))  # parents come first: closed under parents
        if other is not planned:
            np.testing.assert_array_equal(budget.probabilities_of(other), budget.node_probabilities(other))


def test_choose_with_window_is_choose_twice_from_one_sort():
    order, k, rate, k_w, rate_w = K.choose_with_window(np.array([0.9, 0.8, 0.1]),
                                                       np.array([9.0, 1.0, 1.1, 1.2, 2.0, 2.1, 2.2]), 2, 1.5, 1.05, 3)
    assert order.tolist() == [0, 1, 2] and (k, k_w) == (2, 0)  # the docstring's example
    assert rate == pytest.approx(2.7 / 1.2) and rate_w == pytest.approx(2.5 / 1.2)
    rng = np.random.default_rng(2)
    for _ in range(200):
        n = int(rng.integers(0, 30))
        probs = np.round(rng.random(n), 1)  # ties
        table = np.cumsum(rng.random(n + 12)) + 1.0
        rows, gain, cap = int(rng.integers(1, 8)), float(rng.random() * 3), int(rng.integers(0, n + 2))
        order, k, rate, k_w, rate_w = K.choose_with_window(probs, table, rows, gain, 1.05, cap)
        keep, want = K.choose(probs, table, 0, 0.0, 1.05, cap)
        keep_w, want_w = K.choose(probs, table, rows, gain, 1.05, cap)
        assert np.sort(order[:k]).tolist() == keep.tolist() and rate == want
        assert np.sort(order[:k_w]).tolist() == keep_w.tolist() and rate_w == want_w
