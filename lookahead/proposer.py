"""Where drafts come from: the n-gram trie of the prompt and output, and the lookahead window.

:class:`Proposer` owns the proposers' state for one decoding run and hands the decode loop one
:class:`Draft` per step; after verification it learns the emitted tokens (and the window's
outputs). Window n-grams live in their own store (``window_trie``) so that the main trie's counts
describe only text that really occurred (they persist across requests), and so that every draft
node knows its origin.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cache import NgramTrie

from .config import LookaheadConfig
from .tree import merge_trees
from .window import LookaheadWindow

ORIGINS = ("trie", "window")

_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass
class Draft:
    """One step's proposal.

    - ``tokens`` int64[n], ``parents`` int64[n]: the draft tree, breadth-first.
    - ``origin`` int8[n]: index into :data:`ORIGINS` per node.
    - ``window``: (tokens, offsets, visibility) of the window rows, or None when the window is off.
    """

    tokens: np.ndarray
    parents: np.ndarray
    origin: np.ndarray
    window: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def n_window_rows(self) -> int:
        return 0 if self.window is None else len(self.window[0])


class Proposer:
    """Draft trees from the trie (and the window's n-gram store), and the window's Jacobi state."""

    def __init__(self, config: LookaheadConfig, trie: NgramTrie):
        self.config = config
        self.trie = trie
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
        if self.window_trie is not None:
            self.window_trie.clear()
            self.window = LookaheadWindow(self.config.window_width, self.config.window_ngram, self.context)

    def propose(self, room: int) -> Draft:
        """The draft of this step; ``room`` caps the depth (tokens that may still be emitted - 1)."""
        cfg = self.config
        nodes = cfg.tree_nodes
        depth = min(cfg.tree_depth, room)
        suffix = np.asarray(self.context[-cfg.max_match :], dtype=np.int64)
        if depth > 0 and nodes > 0:
            tokens, parents = self.trie.propose(suffix, nodes, depth, cfg.max_match)
        else:
            tokens, parents = _EMPTY, _EMPTY
        origin = np.zeros(len(tokens), dtype=np.int8)
        window = None
        if self.window is not None:
            if depth > 0 and cfg.window_candidates > 0:
                wn = cfg.window_ngram - 1
                w_tokens, w_parents = self.window_trie.propose(
                    suffix, cfg.window_candidates * wn, min(depth, wn), min(cfg.max_match, wn)
                )
                if len(w_tokens):
                    tokens, parents, origin = merge_trees((tokens, parents), (w_tokens, w_parents))
            window = self.window.rows()
        return Draft(np.asarray(tokens, dtype=np.int64), np.asarray(parents, dtype=np.int64), origin, window)

    def learn(self, emitted: list[int], window_argmax: np.ndarray | None = None) -> None:
        """After a step: the trie learns the emitted tokens; the window advances and is harvested."""
        self.trie.insert(np.asarray(emitted, dtype=np.int64))
        self.context.extend(emitted)
        if window_argmax is not None and self.window is not None:
            for gram in self.window.advance(window_argmax, len(emitted)):
                self.window_trie.reset_stream()
                self.window_trie.insert(gram)
