"""DecodeStats.explain: the exact sentences for each case, from hand-built statistics (no model)."""

from __future__ import annotations

import pytest

from lookahead.stats import DecodeStats

HEAD = "{} tokens in {} model calls ({} tokens per call; plain generate makes one call per token)."
STEEP = ((1, 0.010), (2, 0.017), (16, 0.024))  # 2 tokens: 1.7x, 16 tokens: 2.4x
FLAT = ((1, 0.010), (2, 0.010), (256, 0.0102))  # a GPU's: 2 and 16 tokens cost about one


def stats(plain: int, drafted: list[tuple[int, int]], cost_curve=STEEP) -> DecodeStats:
    """``plain`` plain steps, then one drafting step per (draft nodes, accepted); every step emits
    its accepted tokens plus one, so new_tokens = steps + accepted."""
    budgets = [(0, 0)] * plain + [(n, 0) for n, _ in drafted]
    accepted = [0] * plain + [a for _, a in drafted]
    return DecodeStats(target_calls=len(budgets), new_tokens=len(budgets) + sum(accepted), budgets=budgets,
                       accepted_per_step=accepted, cost_curve=cost_curve)


def test_nothing_generated():
    assert DecodeStats().explain() == "Nothing was generated: the decoder made no model call."


def test_busy_cpu_kept_most_steps_plain():
    s = stats(48, [(5, 2), (5, 1)])
    assert s.explain() == (
        HEAD.format(53, 50, "1.06") + " Drafting did not pay on this machine: verifying even 2 tokens costs 1.7x "
        "a 1-token forward and 16 tokens 2.4x, so the budget kept 48 of 50 steps plain; the other 2 accepted "
        "3 of their 10 drafted tokens.")


def test_busy_cpu_every_step_plain():
    s = stats(4, [])
    assert s.explain() == (
        HEAD.format(4, 4, "1.00") + " Drafting did not pay on this machine: verifying even 2 tokens costs 1.7x "
        "a 1-token forward and 16 tokens 2.4x, so the budget kept 4 of 4 steps plain.")


def test_cost_ratios_interpolate_and_extrapolate_like_the_cost_model():
    # 2 lies between the measured 1 and 4: 10 + 9 / 3 = 13 ms; 16 lies beyond the last point, 8:
    # 23 ms + 8 tokens * the last segment's 1 ms per token = 31 ms
    s = stats(3, [], cost_curve=((1, 0.010), (4, 0.019), (8, 0.023)))
    assert s.explain() == (
        HEAD.format(3, 3, "1.00") + " Drafting did not pay on this machine: verifying even 2 tokens costs 1.3x "
        "a 1-token forward and 16 tokens 3.1x, so the budget kept 3 of 3 steps plain.")


LONG_DEAR = ((1, 0.010), (2, 0.010), (16, 0.024))  # a short draft is free, 16 tokens cost 2.4x


def test_a_cheap_short_draft_is_never_named_as_the_reason_drafting_did_not_pay():
    """The contradiction newcomers read: "Drafting did not pay on this machine: verifying 2 tokens costs 1.0x
    a 1-token forward". Where a short draft costs nothing, the reason steps were plain is the text."""
    s = stats(9, [(4, 0)], cost_curve=LONG_DEAR)
    text = s.explain()
    assert text == (
        HEAD.format(10, 10, "1.00") + " Verifying a short draft is cheap on this machine (verifying 2 tokens "
        "costs 1.0x a 1-token forward, though 16 tokens cost 2.4x), yet the prompt and output offered little "
        "to copy: 9 of 10 steps were plain; the other 1 accepted 0 of their 4 drafted tokens.")
    assert "did not pay" not in text


def test_drafting_paid_with_a_cheap_short_draft_blames_the_text_for_the_plain_steps():
    s = stats(6, [(8, 6), (8, 5), (8, 4), (8, 3)], cost_curve=LONG_DEAR)
    assert s.explain().endswith("; the other 6 steps were plain: the text offered nothing likely to be "
                                "accepted there.")


def test_a_provisional_curve_is_said():
    s = stats(4, [])
    assert not s.explain().endswith("measured again.")
    s.cost_provisional = True
    assert s.explain().endswith(
        " The cost curve was measured while other work slowed the machine (provisional): the budget's choices "
        "may be off until it is measured again.")
    assert s.as_dict()["cost_provisional"] is True
    fixed = stats(4, [], cost_curve=None)
    fixed.cost_provisional = True  # a fixed budget priced nothing: nothing to say about a curve
    assert "provisional" not in fixed.explain()


def test_a_measured_curve_is_explained_as_it_was_read():
    plain = dict(target_calls=4, new_tokens=4, budgets=[(0, 0)] * 4, accepted_per_step=[0] * 4,
                 cost_curve=((1, 0.010), (2, 0.008), (16, 0.024)))
    tail = (" 16 tokens cost 2.4x), yet the prompt and output offered little to copy: 4 of 4 steps were plain.")
    measured = DecodeStats(**plain, cost_steps=True)  # 2 rows cost less than one: read as measured
    assert measured.explain().endswith("(verifying 2 tokens costs 0.8x a 1-token forward, though" + tail)
    assert measured.as_dict()["cost_steps"] is True
    assert DecodeStats(**plain).explain().endswith("(verifying 2 tokens costs 1.0x a 1-token forward, though" + tail)


def test_drafting_paid_the_rest_too_costly():
    s = stats(6, [(8, 6), (8, 5), (8, 4), (8, 3)])
    assert s.explain() == (
        HEAD.format(28, 10, "2.80") + " 4 of 10 steps verified a draft and 18 of 32 drafted tokens were accepted "
        "(56%); the other 6 steps were plain: there a draft was too unlikely to be worth its cost (on this "
        "machine verifying even 2 tokens costs 1.7x a 1-token forward and 16 tokens 2.4x).")


def test_drafting_paid_on_a_flat_curve():
    s = stats(2, [(4, 4), (4, 2)], cost_curve=FLAT)
    assert s.explain() == (
        HEAD.format(10, 4, "2.50") + " 2 of 4 steps verified a draft and 6 of 8 drafted tokens were accepted "
        "(75%); the other 2 steps were plain: the text offered nothing likely to be accepted there.")


def test_drafting_paid_every_step():
    s = stats(0, [(4, 3), (4, 1)])
    assert s.explain() == (
        HEAD.format(6, 2, "3.00") + " 2 of 2 steps verified a draft and 4 of 8 drafted tokens were accepted "
        "(50%).")


def test_flat_curve_little_to_copy():
    s = stats(9, [(4, 0)], cost_curve=FLAT)
    assert s.explain() == (
        HEAD.format(10, 10, "1.00") + " Verifying extra tokens is cheap on this machine (verifying 2 tokens costs "
        "1.0x a 1-token forward and 16 tokens 1.0x), yet the prompt and output offered little to copy: 9 of 10 "
        "steps were plain; the other 1 accepted 0 of their 4 drafted tokens.")


def test_drafted_but_little_accepted():
    s = stats(2, [(8, 1), (8, 0), (8, 0), (8, 0), (8, 0), (8, 0), (8, 0), (8, 0)], cost_curve=FLAT)
    assert s.explain() == (
        HEAD.format(11, 10, "1.10") + " 8 of 10 steps verified a draft, but the text did not repeat much: "
        "1 of 64 drafted tokens were accepted (2%).")


def test_fixed_budget_paid():
    s = stats(1, [(6, 4), (6, 2)], cost_curve=None)
    assert s.explain() == (
        HEAD.format(9, 3, "3.00") + " No cost curve priced the drafts (a fixed budget), so every step verified the whole "
        "draft tree the n-gram store proposed: 2 of 3 steps had one, and 6 of 12 drafted tokens were accepted "
        "(50%).")


def test_fixed_budget_little_accepted():
    s = stats(0, [(16, 1), (16, 0), (16, 0), (16, 0)], cost_curve=None)
    assert s.explain() == (
        HEAD.format(5, 4, "1.25") + " No cost curve priced the drafts (a fixed budget), so every step verified the whole "
        "draft tree the n-gram store proposed: 4 of 4 steps had one, and 1 of 64 drafted tokens were accepted "
        "(2%).")


def test_fixed_budget_nothing_to_copy():
    s = stats(5, [], cost_curve=None)
    assert s.explain() == (
        HEAD.format(5, 5, "1.00") + " No cost curve priced the drafts (a fixed budget), so every step would have verified "
        "the whole draft tree, but the prompt and output offered nothing to copy: no step had one.")


@pytest.mark.parametrize("window_rows, plain", [(0, "kept 3 of 3 steps plain."),
                                                 (6, "kept 2 of 3 steps plain; the other 1 accepted 0 of their "
                                                     "0 drafted tokens.")])
def test_a_step_that_ran_window_rows_is_not_plain(window_rows, plain):
    s = DecodeStats(target_calls=3, new_tokens=3, budgets=[(0, 0), (0, 0), (0, window_rows)],
                    accepted_per_step=[0, 0, 0], cost_curve=STEEP)
    assert s.explain().endswith(plain)


def test_str_keeps_its_content():
    s = stats(1, [(4, 2)])
    assert str(s).startswith("4 tokens in 2 target calls (2.00 tokens/call), 2/4 draft tokens accepted; time:")
