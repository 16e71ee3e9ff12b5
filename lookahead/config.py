"""`LookaheadConfig`: the decoder's public value settings, validated once.

Terms used across the package:

- *context*: the prompt plus every token emitted so far.
- *pending tokens*: emitted tokens not yet in the KV cache (the prompt, then the last emitted token).
- *draft tree*: token ids plus parent indices, parents first (``parents[i] < i``; -1: the context's last token).
- *step*: one target forward over the pending tokens, the draft tree and the window's rows, then verification.
"""

from __future__ import annotations

from dataclasses import dataclass

FLAT_CURVE = ((1, 0.010), (2, 0.010), (256, 0.0102))
"""``cost_curve="flat"``: verifying 256 tokens costs about what one does."""


def _bad(field: str, value, why: str) -> ValueError:
    return ValueError(f"LookaheadConfig.{field}={value!r} is invalid: {why}")


def _count(field: str, value, most: int) -> None:
    if value != "auto" and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most):
        raise _bad(field, value, f"must be 'auto' or an int in [0, {most}]")


@dataclass(frozen=True)
class LookaheadConfig:
    """The decoder's value settings (``LookaheadDecoder(config=...)`` or its keywords); the defaults suit every
    device. Example: ``LookaheadDecoder(LookaheadConfig(max_draft_tokens=16, window=0))``.

    - ``max_draft_tokens``: the most draft tokens a step verifies (``"auto"``: by the cost curve; 0: plain
      decoding). Lower it only to bound a step's memory or time.
    - ``window``: columns of the Jacobi lookahead window, which grows fresh n-grams (``"auto"``: on where extra
      rows are nearly free; 0: off). Set it to force the window on or off.
    - ``cost_curve``: ``((k, seconds), ...)``, what a step of ``k`` tokens costs, which the budget prices drafts
      with (None: measured per model and machine; ``"flat"``: as on a GPU). Give one for load-independent runs.
    """

    max_draft_tokens: int | str = "auto"
    window: int | str = "auto"
    cost_curve: tuple | str | None = None

    def __post_init__(self) -> None:
        _count("max_draft_tokens", self.max_draft_tokens, 1024)
        _count("window", self.window, 128)
        curve = self.cost_curve
        if curve is None:
            return
        if isinstance(curve, str):
            if curve != "flat":
                raise _bad("cost_curve", curve, "must be None, 'flat' or ((k, seconds), ...)")
            object.__setattr__(self, "cost_curve", FLAT_CURVE)
            return
        try:
            points = tuple((int(k), float(t)) for k, t in curve)
        except (TypeError, ValueError):
            raise _bad("cost_curve", curve, "must be None, 'flat' or ((k, seconds), ...)") from None
        if not points or any(k < 1 or t <= 0 for k, t in points):
            raise _bad("cost_curve", curve, "needs points with k >= 1 and seconds > 0")
        object.__setattr__(self, "cost_curve", points)

    def step_nodes(self, tuning) -> tuple[int, int]:
        """(the most draft nodes a step verifies until the cost curve says more pay, the most it may verify)."""
        if self.max_draft_tokens == "auto":
            return tuning.step_nodes_auto
        return self.max_draft_tokens, self.max_draft_tokens

    def window_columns(self, tuning) -> int:
        """The window's columns W when it runs (``"auto"``: the tuning's), 0 when off."""
        return tuning.window_auto_width if self.window == "auto" else self.window
