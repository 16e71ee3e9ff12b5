"""Per-call statistics of the decoder."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .drafting.draft import ORIGINS



@dataclass
class DecodeStats:
    """What one ``generate`` call with the decoder did.

    - ``target_calls``: forward passes of the target model (the prompt's prefill included).
    - ``new_tokens``: tokens emitted.
    - ``budgets``: per step, (draft nodes verified, window rows run): the budget the step chose.
    - ``accepted_per_step``: per step, the draft tokens it accepted (beside ``budgets``).
    - ``drafted`` / ``accepted``: draft-tree tokens verified / accepted, summed over steps, and
      ``accepted_hist``: accepted draft tokens per step -> number of steps (all three read from the
      two lists above).
    - ``drafted_by_origin`` / ``accepted_by_origin``: the same split by where the draft came from:
      ``"trie"`` (n-grams of the prompt and output) or ``"window"`` (n-grams the lookahead window made).
    - ``cost_curve``: the forward-time curve ((k, seconds), ...) the budget used, if adaptive.
    - ``cost_steps``: that curve is read as steps (a measured one: ``CostModel.steps``, k rows priced at the
      smallest measured size of at least k).
    - ``cost_provisional``: that curve was measured while other work slowed the machine
      (``CostModel.provisional``, see ``cost.calibrate_curve``): the best estimate at hand, not saved
      for later processes and measured again later in this one; the budget's choices may be off.
    - ``time_*``: seconds spent drafting (the policy: propose, budget, limits) and packing, in the
      model's forward, verifying (on a GPU this includes waiting for the forward to finish) and in
      bookkeeping (emitting, stopping criteria, KV cache, learning); ``time_calibration``: measuring
      the cost curve at the call's start (0 when it was known already).
    - ``step_nodes``: the most draft tokens a step of the call could verify (``LookaheadConfig.step_nodes``, an
      ``"auto"`` one as the call's cost curve resolved it).
    - ``linear_layout``: how the call's steps computed the model's linear layers on a CPU (``lookahead.cpu``), in
      words, e.g. ``"2-4 rows transposed, 5-64 rows oneDNN"``; ``"nn.Linear"`` when no step computed them otherwise.
    - ``time_compile``: seconds a static cache's steps spent compiling their graphs (their first runs).
    - ``corpus``: the draft corpus the call drafted from (``corpus.DraftCorpus``'s repr, e.g. ``"DraftCorpus(515
      streams, 80979 tokens, target=LlamaForCausalLM)"``; one given, or the one ``corpus="auto"`` found), else None.
    """

    target_calls: int = 0
    new_tokens: int = 0
    _drafted_by_origin: Counter = field(default_factory=Counter, repr=False)
    _accepted_by_origin: Counter = field(default_factory=Counter, repr=False)
    _untallied: list = field(default_factory=list, repr=False)
    """Drafted steps' (origin int8[n], accepted nodes) not yet counted into the two counters: a step stores them,
    and the counters count them when read (a step's own host work stays a list append)."""
    budgets: list = field(default_factory=list)
    accepted_per_step: list = field(default_factory=list)
    cost_curve: tuple | None = None
    cost_steps: bool = False
    cost_provisional: bool = False
    time_propose: float = 0.0
    time_forward: float = 0.0
    time_verify: float = 0.0
    time_bookkeeping: float = 0.0
    time_calibration: float = 0.0
    step_nodes: int = 0
    linear_layout: str = "nn.Linear"
    time_compile: float = 0.0
    corpus: str | None = None

    def record_step(self, draft, accepted: list[int], emitted: int, t_propose: float, t_forward: float,
                    t_verify: float, t_bookkeeping: float) -> None:
        """Count one step: ``draft`` as verified, its ``accepted`` nodes, ``emitted`` tokens, phase times."""
        n = len(draft.tokens)
        self.budgets.append((n, draft.n_window_rows))
        self.accepted_per_step.append(len(accepted))
        if n:
            self._untallied.append((draft.origin, accepted))
        self.new_tokens += emitted
        self.time_propose += t_propose
        self.time_forward += t_forward
        self.time_verify += t_verify
        self.time_bookkeeping += t_bookkeeping

    def _tally(self) -> None:
        """Count the stored steps' nodes by origin into the two counters."""
        drafted, accepted = self._drafted_by_origin, self._accepted_by_origin
        for origin, nodes in self._untallied:
            for o, count in enumerate(np.bincount(origin).tolist()):
                if count:
                    drafted[ORIGINS[o]] += count
            for o in origin[nodes].tolist():
                accepted[ORIGINS[o]] += 1
        self._untallied = []

    @property
    def drafted_by_origin(self) -> Counter:
        """Draft-tree tokens verified, by origin (a counter the caller may update)."""
        if self._untallied:
            self._tally()
        return self._drafted_by_origin

    @property
    def accepted_by_origin(self) -> Counter:
        """Draft-tree tokens accepted, by origin (a counter the caller may update)."""
        if self._untallied:
            self._tally()
        return self._accepted_by_origin

    @property
    def drafted(self) -> int:
        return sum(b[0] for b in self.budgets)

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_step)

    @property
    def accepted_hist(self) -> Counter:
        return Counter(self.accepted_per_step)

    @property
    def tokens_per_call(self) -> float:
        """New tokens per target-model call (1.0 for plain decoding)."""
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / drafted tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    def as_dict(self) -> dict:
        return {
            "target_calls": self.target_calls,
            "new_tokens": self.new_tokens,
            "tokens_per_call": round(self.tokens_per_call, 4),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "accepted_hist": {int(k): int(v) for k, v in sorted(self.accepted_hist.items())},
            "drafted_by_origin": dict(self.drafted_by_origin),
            "accepted_by_origin": dict(self.accepted_by_origin),
            "budgets": [list(b) for b in self.budgets],
            "accepted_per_step": list(self.accepted_per_step),
            "cost_curve": [list(p) for p in self.cost_curve] if self.cost_curve else None,
            "cost_steps": self.cost_steps,
            "cost_provisional": self.cost_provisional,
            "time_propose": self.time_propose,
            "time_forward": self.time_forward,
            "time_verify": self.time_verify,
            "time_bookkeeping": self.time_bookkeeping,
            "time_calibration": self.time_calibration,
            "step_nodes": self.step_nodes,
            "time_compile": self.time_compile,
            "linear_layout": self.linear_layout,
            "corpus": self.corpus,
        }

    def explain(self) -> str:
        """What the decoder did and why, in two plain sentences a newcomer can read (``explain.explain``)."""
        from .explain import explain

        return explain(self)

    def __str__(self) -> str:
        return (
            f"{self.new_tokens} tokens in {self.target_calls} target calls "
            f"({self.tokens_per_call:.2f} tokens/call), {self.accepted}/{self.drafted} draft tokens accepted; "
            f"time: propose {self.time_propose:.3f}s, forward {self.time_forward:.3f}s, "
            f"verify {self.time_verify:.3f}s, bookkeeping {self.time_bookkeeping:.3f}s"
        )
