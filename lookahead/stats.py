"""Per-call statistics of the decoder."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class DecodeStats:
    """What one ``generate`` call with the decoder did.

    - ``target_calls``: forward passes of the target model (the prompt's prefill included).
    - ``new_tokens``: tokens emitted.
    - ``drafted``: draft-tree tokens verified, summed over steps.
    - ``accepted``: draft tokens accepted, summed over steps.
    - ``accepted_hist``: accepted draft tokens per step -> number of steps.
    - ``drafted_by_origin`` / ``accepted_by_origin``: the same split by where the draft came from:
      ``"trie"`` (n-grams of the prompt and output) or ``"window"`` (n-grams the lookahead window made).
    - ``budgets``: per step, (draft nodes verified, window rows run): the budget the step chose.
    - ``cost_curve``: the forward-time curve ((k, seconds), ...) the budget used, if adaptive.
    - ``time_*``: seconds spent proposing drafts, in the model's forward, verifying (on a GPU this
      includes waiting for the forward to finish) and in bookkeeping (KV cache, trie, stopping).
    """

    target_calls: int = 0
    new_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_hist: Counter = field(default_factory=Counter)
    drafted_by_origin: Counter = field(default_factory=Counter)
    accepted_by_origin: Counter = field(default_factory=Counter)
    budgets: list = field(default_factory=list)
    cost_curve: tuple | None = None
    time_propose: float = 0.0
    time_forward: float = 0.0
    time_verify: float = 0.0
    time_bookkeeping: float = 0.0

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
            "cost_curve": [list(p) for p in self.cost_curve] if self.cost_curve else None,
            "time_propose": self.time_propose,
            "time_forward": self.time_forward,
            "time_verify": self.time_verify,
            "time_bookkeeping": self.time_bookkeeping,
        }

    def __str__(self) -> str:
        return (
            f"{self.new_tokens} tokens in {self.target_calls} target calls "
            f"({self.tokens_per_call:.2f} tokens/call), {self.accepted}/{self.drafted} draft tokens accepted; "
            f"time: propose {self.time_propose:.3f}s, forward {self.time_forward:.3f}s, "
            f"verify {self.time_verify:.3f}s, bookkeeping {self.time_bookkeeping:.3f}s"
        )
