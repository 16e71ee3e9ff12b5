"""Per-call statistics of the decoder."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields

import numpy as np

from .drafting.draft import ORIGINS


@dataclass
class DecodeStats:
    """What one ``generate`` call with the decoder did.

    - ``target_calls``: target-model forwards (the prompt's included); ``new_tokens``: tokens emitted.
    - ``budgets``: per step, (draft nodes verified, window rows run); ``accepted_per_step``: draft tokens accepted.
    - ``drafted``, ``accepted``, ``accepted_hist`` (accepted per step -> steps): read from those two lists.
    - ``drafted_by_origin`` / ``accepted_by_origin``: the same by draft source (``drafting.draft.ORIGINS``).
    - ``cost_curve``: the ((k, seconds), ...) the budget priced with; ``cost_steps``: read as steps
      (``CostModel.steps``); ``cost_provisional``: measured under load, so the budget's choices may be off.
    - ``time_propose``, ``time_forward``, ``time_verify`` (on a GPU, waiting for the forward too),
      ``time_bookkeeping`` (emit, stop, KV, learn): seconds per phase; ``time_calibration``: measuring the cost
      curve (0 when known); ``time_compile``: compiling a static cache's step graphs.
    - ``step_nodes``: the most draft tokens a step could verify (``LookaheadConfig.step_nodes``, resolved).
    - ``linear_layout``: how the steps computed linear layers on a CPU, in words (``"nn.Linear"``: as usual).
    - ``corpus``: the repr of the ``DraftCorpus`` drafted from, or None.
    - ``plain_reason``: why the call decoded as plain ``generate`` does (None: it did not).
    """

    target_calls: int = 0
    new_tokens: int = 0
    _drafted_by_origin: Counter = field(default_factory=Counter, repr=False)
    _accepted_by_origin: Counter = field(default_factory=Counter, repr=False)
    _untallied: list = field(default_factory=list, repr=False)  # steps' (origin int8[n], nodes), counted when read
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
    time_compile: float = 0.0
    linear_layout: str = "nn.Linear"
    corpus: str | None = None
    plain_reason: str | None = None

    def record_step(self, draft, accepted: list[int], emitted: int, t_propose: float, t_forward: float,
                    t_verify: float, t_bookkeeping: float) -> None:
        """Count one step: ``draft`` verified, its ``accepted`` nodes, ``emitted`` tokens, phase times."""
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

    def _tally(self) -> tuple[Counter, Counter]:
        drafted, accepted = self._drafted_by_origin, self._accepted_by_origin
        for origin, nodes in self._untallied:
            drafted.update({ORIGINS[o]: count for o, count in enumerate(np.bincount(origin).tolist()) if count})
            accepted.update(ORIGINS[o] for o in origin[nodes].tolist())
        self._untallied = []
        return drafted, accepted

    @property
    def drafted_by_origin(self) -> Counter:
        """Draft-tree tokens verified, by origin (a counter the caller may update)."""
        return self._tally()[0]

    @property
    def accepted_by_origin(self) -> Counter:
        """Draft-tree tokens accepted, by origin (a counter the caller may update)."""
        return self._tally()[1]

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
        """Every statistic, the read ones included, as JSON-ready values."""
        out = {"target_calls": self.target_calls, "new_tokens": self.new_tokens,
               "tokens_per_call": round(self.tokens_per_call, 4), "drafted": self.drafted, "accepted": self.accepted,
               "acceptance_rate": round(self.acceptance_rate, 4),
               "accepted_hist": {int(k): int(v) for k, v in sorted(self.accepted_hist.items())},
               "drafted_by_origin": dict(self.drafted_by_origin), "accepted_by_origin": dict(self.accepted_by_origin)}
        out.update((f.name, getattr(self, f.name)) for f in fields(self) if f.repr and f.name not in out)
        out.update(budgets=[list(b) for b in self.budgets], accepted_per_step=list(self.accepted_per_step),
                   cost_curve=[list(p) for p in self.cost_curve] if self.cost_curve else None)
        return out

    def explain(self) -> str:
        """What the decoder did and why, in two plain sentences."""
        from .explain import explain

        return explain(self)

    def __str__(self) -> str:
        return (
            f"{self.new_tokens} tokens in {self.target_calls} target calls "
            f"({self.tokens_per_call:.2f} tokens/call), {self.accepted}/{self.drafted} draft tokens accepted; "
            f"time: propose {self.time_propose:.3f}s, forward {self.time_forward:.3f}s, "
            f"verify {self.time_verify:.3f}s, bookkeeping {self.time_bookkeeping:.3f}s"
        )
