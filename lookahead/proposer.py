"""Draft sources: where draft trees come from, behind one interface.

A *source* proposes a tree after the context and learns the tokens the decoder emits:

- ``start(prompt)``: a call begins with this prompt (int64[L]).
- ``propose(context, max_nodes, max_depth) -> Proposal | None``: a tree continuing ``context``.
- ``learn(emitted)``: the step emitted these tokens (int64[k]).

Each node of a merged draft knows which source drafted it (its *origin*, see ``draft.ORIGINS``):

- :class:`TrieSource` over the request's own trie (``"trie"``): the prompt and the output so far;
  cleared at every call.
- :class:`TrieSource` over a shared store (``"memory"``, ``LookaheadDecoder(trie=NgramTrie(...))``):
  it learns only *output* tokens, so the n-grams of earlier answers persist while a finished
  request's prompt n-grams fade with it; its node capacity bounds its memory (LRU eviction).
- :class:`WindowSource` (``"window"``): n-grams grown by the Jacobi lookahead window (``window.py``),
  which also contributes the window's own rows to each forward.

:func:`merge_proposals` unites the sources' trees into one :class:`~lookahead.draft.Draft`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cache import NgramTrie
from .draft import MEMORY, TRIE, WINDOW, Draft, WindowRows
from .tree import merge_trees
from .window import LookaheadWindow


@dataclass(frozen=True)
class Proposal:
    """One source's tree: ``tokens`` int64[n], ``parents`` int64[n] (breadth-first), and ``match``:
    how many context tokens the source matched to draft it (a feature of every node)."""

    tokens: np.ndarray
    parents: np.ndarray
    match: int


class TrieSource:
    """Drafts from an n-gram trie (``NgramTrie.propose``), matching up to ``max_match`` context tokens.

    ``per_request=True`` (the request's trie): ``start`` clears it and inserts the prompt.
    ``per_request=False`` (a shared store): ``start`` only begins a new stream (no n-gram spans two
    requests), and the prompt is not learned.
    """

    def __init__(self, trie: NgramTrie, origin: int, max_match: int, per_request: bool):
        self.trie, self.origin, self.per_request = trie, origin, per_request
        self.max_match = min(max_match, trie.max_n - 1)

    def start(self, prompt: np.ndarray) -> None:
        if self.per_request:
            self.trie.clear()
            self.trie.insert(prompt)
        else:
            self.trie.reset_stream()

    def propose(self, context: np.ndarray, max_nodes: int, max_depth: int) -> Proposal | None:
        if max_nodes <= 0:
            return None
        tokens, parents, match = self.trie.propose(context, max_nodes, max_depth, self.max_match, with_match=True)
        return Proposal(tokens, parents, match) if len(tokens) else None

    def learn(self, emitted: np.ndarray) -> None:
        self.trie.insert(emitted)


class WindowSource:
    """The Jacobi lookahead window: its rows join each forward, and the n-grams it harvests are drafted.

    ``W``, ``N``, ``G`` are ``LookaheadConfig.window_width``, ``window_ngram``, ``window_candidates``.
    """

    origin = WINDOW

    def __init__(self, width: int, ngram: int, candidates: int, max_match: int):
        self.width, self.ngram, self.candidates = width, ngram, candidates
        self.max_match = min(max_match, ngram - 1)
        self.trie = NgramTrie(max_n=ngram, capacity=max(1 << 14, 4 * ngram**2))
        self.window: LookaheadWindow | None = None

    @property
    def max_rows(self) -> int:
        """Window rows plus the most drafted nodes per step."""
        return (self.candidates + self.width) * (self.ngram - 1)

    def start(self, prompt: np.ndarray) -> None:
        self.trie.clear()
        self.window = LookaheadWindow(self.width, self.ngram, prompt.tolist())

    def propose(self, context: np.ndarray, max_nodes: int, max_depth: int) -> Proposal | None:
        levels = self.ngram - 1
        if not self.candidates:
            return None
        tokens, parents, match = self.trie.propose(context, self.candidates * levels, min(max_depth, levels),
                                                   self.max_match, with_match=True)
        return Proposal(tokens, parents, match) if len(tokens) else None

    def rows(self) -> WindowRows:
        return WindowRows(*self.window.rows())

    def learn(self, emitted: np.ndarray) -> None:
        """The window learns from its own rows' outputs (:meth:`advance`), not from emitted tokens."""

    def advance(self, argmax: np.ndarray, n_emitted: int) -> None:
        """One Jacobi step from the window rows' argmax; the harvested n-grams enter the window's trie."""
        for gram in self.window.advance(argmax, n_emitted):
            self.trie.reset_stream()
            self.trie.insert(gram)


def make_sources(config, trie: NgramTrie, memory: NgramTrie | None) -> list:
    """The sources a :class:`~lookahead.config.LookaheadConfig` asks for, in merge order."""
    sources: list = [TrieSource(trie, TRIE, config.max_match, per_request=True)]
    if memory is not None:
        sources.append(TrieSource(memory, MEMORY, config.max_match, per_request=False))
    if config.window_width:
        sources.append(WindowSource(config.window_width, config.window_ngram, config.window_candidates,
                                    config.max_match))
    return sources


def merge_proposals(proposals: list[tuple[int, Proposal]], window: WindowRows | None = None) -> Draft:
    """One draft from ``(origin, proposal)`` pairs; a path drafted by several sources appears once,
    with the origin (and match) of the first source that drafted it."""
    if not proposals:
        return Draft.empty(window)
    if len(proposals) == 1:
        origin, p = proposals[0]
        return Draft.build(p.tokens, p.parents, np.full(len(p.tokens), origin, dtype=np.int8),
                           np.full(len(p.tokens), p.match, dtype=np.int64), window)
    tokens, parents, origin = merge_trees(*[(p.tokens, p.parents) for _, p in proposals],
                                          origins=[o for o, _ in proposals])
    match_of = np.zeros(max(o for o, _ in proposals) + 1, dtype=np.int64)
    for o, p in proposals:
        match_of[o] = p.match
    return Draft.build(tokens, parents, origin, match_of[origin], window)
