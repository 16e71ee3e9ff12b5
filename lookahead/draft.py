"""`Draft`: one step's finished proposal, immutable, as the decode loop and the budget see it.

A draft is a tree of candidate tokens after the last context token (``parents[i] < i``, -1 for a
child of the root), with per-node features that say where each node came from, plus optionally the
lookahead window's rows. Terms are defined in ``config.py``.

Node order: a merged draft (``proposer.merge_proposals``) is in depth-first preorder, each node's
first-drafted child right after it, and every subset :meth:`Draft.keep` makes keeps that order. Why: the
sources draft their likeliest continuation first, so the accepted path is most often nodes ``0, 1, ...,
a - 1``, the step's first rows, and their KV entries are already where they must end up: no compaction
(``kv_cache.keep_rows_entries``). On recorded SmolLM2 outputs the accepted path was the first rows in 68% of
the steps that accepted a node on a flat cost curve (breadth-first: 46%), 88% on a bf16 CPU step curve (81%).

Example: tokens ``[5, 6, 7, 8]``, parents ``[-1, 0, 0, -1]``: ``5 -> 6``, ``5 -> 7`` and ``8``; accepting
``5, 6`` keeps rows 0 and 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import kernels as K
from .tree import tree_depth_rank

ORIGINS = ("trie", "window", "memory", "copy", "model", "layer-skip", "early-exit", "low-rank", "draft-model", "heads",
           "frequent", "corpus")
"""Draft sources by index (a node's ``origin``): the request's trie, the window's n-grams, the shared store,
the longest-match copy of the context (``cache.SuffixIndex``), the model's own earlier predictions
(``recycle.py``), the draft passes of ``selfspec.py`` (the target with layers skipped, its first layers
then its head, its low-rank approximation, a user's draft model), trained draft heads over the model's
hidden state (``heads.py``), the context's most frequent tokens, drafted on a step no other source drafts
for (``proposer.FrequentSource``), and the model's own writing (``corpus.py``, read-only)."""
TRIE, WINDOW, MEMORY, COPY, MODEL = range(5)
LAYER_SKIP, EARLY_EXIT, LOW_RANK, DRAFT_MODEL, HEADS, FREQUENT, CORPUS = range(5, 12)

_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY8 = np.zeros(0, dtype=np.int8)


class WindowRows(NamedTuple):
    """The window rows of a step: ``tokens`` int64[m], position ``offsets`` from the last pending token
    int64[m], ``visible`` bool[m, m] (see ``window.py``)."""

    tokens: np.ndarray
    offsets: np.ndarray
    visible: np.ndarray


@dataclass(frozen=True)
class Draft:
    """One step's proposal (arrays are never modified; :meth:`keep` makes a new draft).

    - ``tokens`` int64[n], ``parents`` int64[n]: the draft tree, parent-first (depth-first once merged).
    - ``origin`` int8[n]: index into :data:`ORIGINS` per node.
    - ``match`` int64[n]: per node, how many context tokens its source matched before drafting it.
    - ``agreement`` int64[n]: per node of a merged draft, how many other sources drafted the same path
      (its *agreement*; 0 in a single source's tree). The acceptance estimates learn agreed nodes in cells of
      their own (``acceptance.CONTEXTS``), so that where sources agree the budget learns how much likelier
      the path is (``benchmarks/results/agreement.md``).
    - ``depth``, ``rank`` int64[n]: each node's depth (1 = child of the root) and sibling rank (0 for an
      only child, else 1 + its place among its siblings) in the tree *as proposed* by its own source
      (siblings another source adds do not demote an only child): :meth:`keep` subsets them, so a node
      keeps the cells that estimated it when the budget drops its siblings.
    - ``window``: the window's rows, or None.
    """

    tokens: np.ndarray
    parents: np.ndarray
    origin: np.ndarray
    match: np.ndarray
    depth: np.ndarray
    rank: np.ndarray
    agreement: np.ndarray
    window: WindowRows | None = None

    @classmethod
    def build(cls, tokens, parents, origin, match, window: WindowRows | None = None, rank=None) -> Draft:
        """A draft from a proposed tree, computing depth, and rank unless given (a merged tree's nodes keep
        the rank they had in the tree of the source that drafted them)."""
        parents = np.asarray(parents, dtype=np.int64)
        depth, own_rank = tree_depth_rank(parents)
        return cls(np.asarray(tokens, dtype=np.int64), parents, np.asarray(origin, dtype=np.int8),
                   np.asarray(match, dtype=np.int64), depth, own_rank if rank is None else np.asarray(rank),
                   np.zeros(len(parents), dtype=np.int64), window)

    @classmethod
    def empty(cls, window: WindowRows | None = None) -> Draft:
        return _NO_DRAFT if window is None else cls(_EMPTY, _EMPTY, _EMPTY8, _EMPTY, _EMPTY, _EMPTY, _EMPTY, window)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_window_rows(self) -> int:
        return 0 if self.window is None else len(self.window.tokens)

    @property
    def rows(self) -> int:
        """New tokens this draft adds to a forward: its nodes and window rows."""
        return len(self.tokens) + self.n_window_rows

    def keep(self, nodes) -> Draft:
        """The draft with only the tree nodes ``nodes`` (sorted, closed under parents; see ``kernels.keep_nodes``),
        in their order.

        Example: parents ``[-1, -1, 0]`` (ranks ``[1, 2, 0]``), keep ``[1]`` -> parents ``[-1]``, rank
        ``[2]``: still the second of two siblings, though now drafted alone."""
        if len(nodes) == len(self.tokens):
            return self
        if not len(nodes):
            return Draft.empty(self.window)
        ints, origin, ok = K.keep_nodes(self.tokens, self.parents, self.origin, self.match, self.depth, self.rank,
                                        self.agreement, np.asarray(nodes, dtype=np.int64))
        if not ok:
            raise ValueError("keep must contain every kept node's parent")
        return Draft(ints[0], ints[1], origin, ints[2], ints[3], ints[4], ints[5], self.window)

    def shallowest(self, count: int) -> Draft:
        """The draft cut to its ``count`` shallowest nodes (equal depths: the earlier first), still a tree:
        a cut that has no estimates to choose by keeps the tree's breadth rather than one deep path.

        Example: parents ``[-1, 0, 1, -1]`` (depths ``[1, 2, 3, 1]``), count 2 -> nodes ``[0, 3]``."""
        if count >= len(self.tokens):
            return self
        return self.keep(K.shallowest_nodes(self.depth, count))

    def without_window(self) -> Draft:
        if self.window is None:
            return self
        return Draft(self.tokens, self.parents, self.origin, self.match, self.depth, self.rank, self.agreement, None)


_NO_DRAFT = Draft(_EMPTY, _EMPTY, _EMPTY8, _EMPTY, _EMPTY, _EMPTY, _EMPTY, None)  # a plain step's (immutable) draft
