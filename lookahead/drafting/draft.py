"""`Draft`: one step's immutable proposal, a tree of candidate tokens after the last context token with per-node
features, plus optionally the window's rows. A merged draft is in depth-first preorder (each node's first-drafted
child right after it), and every subset keeps that order, so the accepted path is most often the step's first rows.
Example: tokens ``[5, 6, 7, 8]``, parents ``[-1, 0, 0, -1]``: ``5 -> 6``, ``5 -> 7`` and ``8``; accepting ``5, 6``
keeps rows 0 and 1."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .kernels import keep_nodes, shallowest_nodes

ORIGINS = ("trie", "window", "memory", "copy", "model", "layer-skip", "early-exit", "low-rank", "draft-model", "heads",
           "frequent", "corpus")
"""Draft sources by index (a node's ``origin``); "memory" is the shared store, "corpus" the model's own writing."""
TRIE, WINDOW, MEMORY, COPY, MODEL, LAYER_SKIP, EARLY_EXIT, LOW_RANK, DRAFT_MODEL, HEADS, FREQUENT, CORPUS = range(12)

_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY8 = np.zeros(0, dtype=np.int8)


class WindowRows(NamedTuple):
    """A step's window rows: ``tokens`` int64[m], position ``offsets`` from the last pending token int64[m],
    ``visible`` bool[m, m] (``window.py``)."""

    tokens: np.ndarray
    offsets: np.ndarray
    visible: np.ndarray


@dataclass(frozen=True)
class Draft:
    """One step's proposal; arrays are never modified (:meth:`keep` makes a new draft). ``tokens``, ``parents``
    int64[n]: the tree. ``origin`` int8[n]: index into :data:`ORIGINS`. ``match`` int64[n]: the match bucket its
    source drafted it after. ``agreement`` int64[n]: how many other sources drafted the same path. ``depth``,
    ``rank`` int64[n]: in its source's tree (a subset keeps them, and so the cells that estimated the node).
    ``window``: the window's rows, or None."""

    tokens: np.ndarray
    parents: np.ndarray
    origin: np.ndarray
    match: np.ndarray
    depth: np.ndarray
    rank: np.ndarray
    agreement: np.ndarray
    window: WindowRows | None = None

    @classmethod
    def empty(cls, window: WindowRows | None = None) -> Draft:
        return NO_DRAFT if window is None else cls(_EMPTY, _EMPTY, _EMPTY8, _EMPTY, _EMPTY, _EMPTY, _EMPTY, window)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_window_rows(self) -> int:
        return 0 if self.window is None else len(self.window.tokens)

    @property
    def rows(self) -> int:
        """New tokens this draft adds to a forward: its nodes and window rows."""
        return len(self.tokens) + self.n_window_rows

    @property
    def is_chain(self) -> bool:
        """Whether the tree is one chain (node ``i``'s parent is ``i - 1``): its mask is then causal."""
        n = len(self.depth)
        return n < 2 or int(self.depth[-1]) == n

    def keep(self, nodes) -> Draft:
        """The draft with only ``nodes`` (sorted, closed under parents). Example: parents ``[-1, -1, 0]``, keep
        ``[1]`` -> parents ``[-1]``, rank still 2 (the second of two siblings)."""
        if len(nodes) == len(self.tokens):
            return self
        if not len(nodes):
            return Draft.empty(self.window)
        ints, origin, ok = keep_nodes(self.tokens, self.parents, self.origin, self.match, self.depth, self.rank,
                                      self.agreement, np.asarray(nodes, dtype=np.int64))
        if not ok:
            raise ValueError("keep must contain every kept node's parent")
        return Draft(ints[0], ints[1], origin, ints[2], ints[3], ints[4], ints[5], self.window)

    def shallowest(self, count: int) -> Draft:
        """The draft cut to its ``count`` shallowest nodes (equal depths: the earlier first), still a tree.
        Example: parents ``[-1, 0, 1, -1]``, count 2 -> nodes ``[0, 3]``."""
        if count >= len(self.tokens):
            return self
        return self.keep(shallowest_nodes(self.depth, count))

    def without_window(self) -> Draft:
        if self.window is None:
            return self
        return Draft(self.tokens, self.parents, self.origin, self.match, self.depth, self.rank, self.agreement, None)


NO_DRAFT = Draft(_EMPTY, _EMPTY, _EMPTY8, _EMPTY, _EMPTY, _EMPTY, _EMPTY, None)
"""A plain step's draft."""
