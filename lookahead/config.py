"""`LookaheadConfig`: every knob of the decoder, validated once.

Terms used across the package (defined here once):

- *context*: the prompt plus every token emitted so far.
- *pending tokens*: emitted tokens whose keys/values are not in the KV cache yet (the whole
  prompt before the first step, then the last emitted token).
- *draft tree*: candidate continuations of the context, as token ids plus parent indices in
  breadth-first order (parent -1 means "child of the last context token").
- *step*: one forward pass of the target model over pending tokens + draft tree (+ window rows),
  followed by exact verification.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


def _bad(field: str, value, why: str) -> ValueError:
    return ValueError(f"LookaheadConfig.{field}={value!r} is invalid: {why}")


@dataclass(frozen=True)
class LookaheadConfig:
    """Settings of :class:`~lookahead.LookaheadDecoder`.

    Draft tree (from the n-gram trie of the prompt and output):

    - ``ngram_size``: longest n-gram the trie stores (``max_n``). A match of ``L`` context tokens
      can draft at most ``ngram_size - L`` tokens deep.
    - ``max_match``: longest context suffix looked up in the trie (longer first, shorter as fallback).
    - ``tree_nodes``: most draft tokens each n-gram store (the request's trie, and the shared one if
      any) proposes per step.
    - ``tree_depth``: most draft tokens on one branch.
    - ``trie_capacity``: node capacity of the trie; least-recently-used n-grams are evicted past it.

    Jacobi lookahead window (Fu et al. 2024; see ``window.py``), which grows n-grams that have not
    occurred yet, in the same forward pass:

    - ``window_width`` (the paper's W): columns of the window; 0 turns the window off.
    - ``window_ngram`` (N): n-gram size; the window keeps N - 1 levels of W guesses.
    - ``window_candidates`` (G): window n-grams verified per step (at most G * (N - 1) draft tokens).

    Budget (see ``budget.py``):

    - ``adaptive``: choose per step how many draft nodes to verify and whether to run the window,
      from the measured cost of a forward pass and online acceptance rates (``tree_nodes`` and the
      window settings are then upper bounds). ``False`` always verifies the full proposal.
    - ``cost_curve``: ``((k, seconds), ...)``, the forward time for ``k`` new tokens; given, it
      replaces the calibration (a few forwards on first use per model, device and dtype).

    Example::

        LookaheadConfig(tree_nodes=8, tree_depth=6)   # a smaller tree for a slow CPU
    """

    ngram_size: int = 12
    max_match: int = 3
    tree_nodes: int = 16
    tree_depth: int = 10
    trie_capacity: int = 1 << 18
    window_width: int = 0
    window_ngram: int = 4
    window_candidates: int = 4
    adaptive: bool = True
    cost_curve: tuple | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ("bool", bool) and not isinstance(value, bool):
                raise _bad(f.name, value, "must be a bool")
            if f.type in ("int", int) and (not isinstance(value, int) or isinstance(value, bool)):
                raise _bad(f.name, value, "must be an int")
        if self.ngram_size < 2:
            raise _bad("ngram_size", self.ngram_size, "must be >= 2")
        if not 1 <= self.max_match <= self.ngram_size - 1:
            raise _bad("max_match", self.max_match, f"must be in [1, ngram_size - 1 = {self.ngram_size - 1}]")
        if self.tree_nodes < 0:
            raise _bad("tree_nodes", self.tree_nodes, "must be >= 0 (0 turns the draft tree off)")
        if self.tree_depth < 0:
            raise _bad("tree_depth", self.tree_depth, "must be >= 0 (0 turns the draft tree off)")
        if self.window_width < 0:
            raise _bad("window_width", self.window_width, "must be >= 0 (0 turns the window off)")
        if self.window_ngram < 2:
            raise _bad("window_ngram", self.window_ngram, "must be >= 2")
        if self.window_candidates < 0:
            raise _bad("window_candidates", self.window_candidates, "must be >= 0")
        if self.cost_curve is not None:
            try:
                points = tuple((int(k), float(t)) for k, t in self.cost_curve)
            except (TypeError, ValueError):
                raise _bad("cost_curve", self.cost_curve, "must be ((k, seconds), ...)") from None
            if not points or any(k < 1 or t <= 0 for k, t in points):
                raise _bad("cost_curve", self.cost_curve, "needs points with k >= 1 and seconds > 0")
            object.__setattr__(self, "cost_curve", points)
        min_capacity = 4 * self.ngram_size * self.ngram_size
        if self.trie_capacity < min_capacity:
            raise _bad("trie_capacity", self.trie_capacity, f"must be >= 4 * ngram_size**2 = {min_capacity}")
