"""``DecodeStats.explain``: what a call did and why, in two plain sentences (three when the curve was provisional)."""

from __future__ import annotations

from ._tuning import DEFAULT
from .cost import CostModel


def explain(stats) -> str:
    """Tokens per model call, then why, in the first case that applies: a fixed budget (no cost curve); drafting paid
    (``Tuning.explain_paid`` tokens per call); most steps *plain* (no draft token verified, no window row run) and a
    2-token step dear (``Tuning.explain_costly[0]``); most steps plain otherwise; else the acceptance rate. Example::

        DecodeStats(target_calls=4, new_tokens=4, budgets=[(0, 0)] * 4, accepted_per_step=[0] * 4,
                    cost_curve=((1, .010), (2, .017), (16, .024))).explain()
        # -> "4 tokens in 4 model calls (1.00 tokens per call; plain generate makes one call per
        #     token). Drafting did not pay on this machine: verifying even 2 tokens costs 1.7x a
        #     1-token forward and 16 tokens 2.4x, so the budget kept 4 of 4 steps plain."
    """
    steps = len(stats.budgets)
    if stats.plain_reason:
        return (f"{stats.new_tokens} tokens in {stats.target_calls} model calls: this call decoded as plain "
                f"generate() does, because {stats.plain_reason}.")
    if not stats.target_calls or not steps:
        return "Nothing was generated: the decoder made no model call."
    head = (f"{stats.new_tokens} tokens in {stats.target_calls} model calls ({stats.tokens_per_call:.2f} tokens "
            "per call; plain generate makes one call per token).")
    plain = sum(1 for nodes, rows in stats.budgets if not nodes and not rows)
    drafting = steps - plain
    accepted = f"{stats.accepted} of {stats.drafted} drafted tokens were accepted ({stats.acceptance_rate:.0%})"
    paid = stats.tokens_per_call >= DEFAULT.explain_paid
    if stats.cost_curve is None:
        if not drafting:
            return (f"{head} No cost curve priced the drafts (a fixed budget), so every step would have "
                    "verified the whole draft tree, but the prompt and output offered nothing to copy: no step "
                    "had one.")
        return (f"{head} No cost curve priced the drafts (a fixed budget), so every step verified the whole "
                f"draft tree the n-gram store proposed: {drafting} of {steps} steps had one, and {accepted}"
                + ("." if paid else ": the text did not repeat much."))
    return f"{head} {_why_adaptive(stats, plain, drafting, accepted, paid)}" + (
        " The cost curve was measured while other work slowed the machine (provisional): the budget's "
        "choices may be off until it is measured again." if stats.cost_provisional else "")


def _why_adaptive(stats, plain: int, drafting: int, accepted: str, paid: bool) -> str:
    """explain()'s second sentence for an adaptive budget."""
    steps = plain + drafting
    curve = CostModel(stats.cost_curve, steps=stats.cost_steps)
    r2, r16 = (float(curve(k) / curve(1)) for k in (2, 16))
    short_dear = r2 >= DEFAULT.explain_costly[0]
    dear = f"verifying even 2 tokens costs {r2:.1f}x a 1-token forward and 16 tokens {r16:.1f}x"
    if paid:
        why = f"{drafting} of {steps} steps verified a draft and {accepted}"
        if plain:
            why += f"; the other {plain} steps were plain: " + (
                f"there a draft was too unlikely to be worth its cost (on this machine {dear})" if short_dear
                else "the text offered nothing likely to be accepted there")
        return f"{why}."
    if 2 * plain > steps:
        others = (f"; the other {drafting} accepted {stats.accepted} of their {stats.drafted} drafted tokens"
                  if drafting else "")
        if short_dear:
            return (f"Drafting did not pay on this machine: {dear}, so the budget kept {plain} of {steps} "
                    f"steps plain{others}.")
        long_cheap = r16 < DEFAULT.explain_costly[1]
        cheap = f"verifying 2 tokens costs {r2:.1f}x a 1-token forward" + (
            f" and 16 tokens {r16:.1f}x" if long_cheap else f", though 16 tokens cost {r16:.1f}x")
        what = "extra tokens" if long_cheap else "a short draft"
        return (f"Verifying {what} is cheap on this machine ({cheap}), yet the prompt and output offered "
                f"little to copy: {plain} of {steps} steps were plain{others}.")
    return f"{drafting} of {steps} steps verified a draft, but the text did not repeat much: {accepted}."

