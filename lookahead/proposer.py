"""Where drafts come from: the n-gram tries and the lookahead window.

Three stores, each node of a draft tree knows which one it came from (its *origin*):

- ``"trie"``: the request's own trie, the prompt and the output so far; cleared at every call.
- ``"memory"``: an optional trie shared across calls (``LookaheadDecoder(trie=NgramTrie(...))``).
  It learns only *output* tokens, so the n-grams of earlier answers persist while a finished
  request's prompt n-grams fade with it; its node capacity bounds its memory (LRU eviction).
- ``"window"``: n-grams grown by the Jacobi lookahead window (see ``window.py``); per call.

:class:`Proposer` owns this state and hands the decode loop one :class:`Draft` per step; after
verification it learns the emitted tokens (and the window's outputs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cache import NgramTrie

from .config import LookaheadConfig
from .tree import merge_trees, subset_tree, tree_depth_rank
from .window import LookaheadWindow

ORIGINS = ("trie", "window", "memory")
TRIE, WINDOW, MEMORY = range(3)

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class Draft:
    """One step's proposal.

    - ``tokens`` int64[n], ``parents`` int64[n]: the draft tree, breadth-first.
    - ``origin`` int8[n]: index into :data:`ORIGINS` per node.
    - ``match_of`` int64[len(ORIGINS)]: per store, its match length (how many of the context's last
      tokens its tree continues; see ``NgramTrie.propose``); :attr:`match` gives it per node.
    - ``window``: (tokens, offsets, visibility) of the window rows, or None when the window is off.
    - ``depth``, ``rank`` int64[n]: each node's cells for the acceptance estimates
      (:func:`~lookahead.tree.tree_depth_rank`) in the tree as proposed. :meth:`keep` subsets them, so
      a node keeps its proposed rank when the budget drops its siblings: the estimate that chose it
      is the one that learns from it.
    """

    tokens: np.ndarray
    parents: np.ndarray
    origin: np.ndarray
    match_of: np.ndarray
    window: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    depth: np.ndarray = field(init=False)
    rank: np.ndarray = field(init=False)

    def __post_init__(self):
        self.depth, self.rank = tree_depth_rank(self.parents)

    @property
    def n_window_rows(self) -> int:
        return 0 if self.window is None else len(self.window[0])

    @property
    def match(self) -> np.ndarray:
        """int64[n]: each node's match length, that of the store that drafted it."""
        return self.match_of[self.origin]

    def keep(self, nodes) -> None:
        """Keep only the tree nodes ``nodes`` (sorted, closed under parents; see ``subset_tree``).

        Example: parents ``[-1, -1, 0]`` (ranks ``[1, 2, 0]``), keep ``[1]`` -> parents ``[-1]``, rank
        ``[2]``: still the second of two siblings, though now drafted alone."""
        self.tokens, self.parents, self.origin = subset_tree(self.tokens, self.parents, self.origin, nodes)
        nodes = np.asarray(nodes, dtype=np.int64)
        self.depth, self.rank = self.depth[nodes], self.rank[nodes]


class Proposer:
    """Draft trees from the trie (and the window's n-gram store), and the window's Jacobi state."""

    def __init__(self, config: LookaheadConfig, trie: NgramTrie, memory: NgramTrie | None = None):
        self.config = config
        self.trie = trie
        self.memory = memory
        self.window_trie = (
            NgramTrie(max_n=config.window_ngram, capacity=max(1 << 14, 4 * config.window_ngram**2))
            if config.window_width
            else None
        )
        self.window: LookaheadWindow | None = None
        self.context: list[int] = []

    def start(self, prompt: list[int]) -> None:
        """Begin a run: the trie learns the prompt; the window starts from the prompt's tokens."""
        self.trie.clear()
        self.trie.insert(np.asarray(prompt, dtype=np.int64))
        self.context = list(prompt)
        if self.memory is not None:
            self.memory.reset_stream()  # no n-gram spans two requests
        if self.window_trie is not None:
            self.window_trie.clear()
            self.window = LookaheadWindow(self.config.window_width, self.config.window_ngram, self.context)

    def max_rows(self) -> int:
        """The most new tokens one step can feed: the last token, every store's tree, the window rows."""
        cfg = self.config
        rows = 1 + cfg.tree_nodes * (2 if self.memory is not None else 1)
        if cfg.window_width:
            levels = cfg.window_ngram - 1
            rows += cfg.window_candidates * levels + cfg.window_width * levels
        return rows

    def propose(self, room: int) -> Draft:
        """The draft of this step; ``room`` caps the depth (tokens that may still be emitted - 1)."""
        cfg = self.config
        nodes = cfg.tree_nodes
        depth = min(cfg.tree_depth, room)
        suffix = np.asarray(self.context[-cfg.max_match :], dtype=np.int64)
        trees, origins = [], []
        match_of = np.zeros(len(ORIGINS), dtype=np.int64)  # match length per origin
        if depth > 0 and nodes > 0:
            trees.append(self.trie.propose(suffix, nodes, depth, cfg.max_match, with_match=True))
            origins.append(TRIE)
            if self.memory is not None:
                trees.append(self.memory.propose(suffix, nodes, depth, min(cfg.max_match, self.memory.max_n - 1),
                                                 with_match=True))
                origins.append(MEMORY)
        if self.window is not None and depth > 0 and cfg.window_candidates > 0:
            wn = cfg.window_ngram - 1
            trees.append(self.window_trie.propose(
                suffix, cfg.window_candidates * wn, min(depth, wn), min(cfg.max_match, wn), with_match=True))
            origins.append(WINDOW)
        found = [(tree, o) for tree, o in zip(trees, origins) if len(tree[0])]
        for (_, _, length), o in found:
            match_of[o] = length
        trees, origins = [tree[:2] for tree, _ in found], [o for _, o in found]
        if len(trees) == 1:
            tokens, parents = trees[0]
            origin = np.full(len(tokens), origins[0], dtype=np.int8)
        elif trees:
            tokens, parents, origin = merge_trees(*trees, origins=origins)
        else:
            tokens, parents, origin = _EMPTY, _EMPTY, np.zeros(0, dtype=np.int8)
        window = self.window.rows() if self.window is not None else None
        return Draft(np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64), origin,
                     match_of, window)

    def learn(self, emitted: list[int], window_argmax: np.ndarray | None = None) -> None:
        """After a step: the trie learns the emitted tokens; the window advances and is harvested."""
        emitted_arr = np.asarray(emitted, dtype=np.int64)
        self.trie.insert(emitted_arr)
        if self.memory is not None:
            self.memory.insert(emitted_arr)
        self.context.extend(emitted)
        if window_argmax is not None and self.window is not None:
            for gram in self.window.advance(window_argmax, len(emitted)):
                self.window_trie.reset_stream()
                self.window_trie.insert(gram)
