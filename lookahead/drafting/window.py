"""The Jacobi lookahead window (Fu et al., "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding", 2024): fresh n-grams grown in the forward that verifies the drafts.

It keeps up to ``N - 1`` levels (``N``: ``window_ngram``) of ``W`` (``window_width``) guessed tokens. With the root
(the last emitted token) at position ``P``, level ``l`` (0 = oldest), column ``j`` sits at ``P + 1 + l + j`` and sees
the context, the root, the level-0 tokens of earlier columns and its own column's earlier levels; its argmax guesses
position ``P + 2 + l + j``. Each step the top level's outputs become the newest level (the oldest dropped once
``N - 1`` exist), each column of a full window yields the n-gram ``(level_0[j], ..., level_{N-2}[j], output[j])``,
and after ``a`` emitted tokens every level slides ``a - 1`` columns left, new columns drawn from the context.

Example, W=3, N=3, levels ``[[5, 6, 7], [8, 9, 4]]``, outputs ``[1, 2, 3]``: 3-grams ``(5, 8, 1), (6, 9, 2),
(7, 4, 3)``; new levels ``[[8, 9, 4], [1, 2, 3]]``, after 2 emitted tokens ``[[9, 4, x], [2, 3, y]]``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..cache import NgramTrie
from .draft import WINDOW, WindowRows
from .sources import DraftSource, Proposal


def window_layout(levels: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """(``offsets`` int64[L*W] from the root's position, ``visible`` bool[L*W, L*W]) of ``levels`` x ``width``
    tokens, level-major (row ``l * width + j``). Example, levels=2, width=2: offsets ``[1, 2, 2, 3]``; visible rows
    ``[1,0,0,0], [1,1,0,0], [1,0,1,0], [1,1,0,1]``."""
    level, column = np.divmod(np.arange(levels * width, dtype=np.int64), width)
    earlier = (level[None, :] == 0) & (column[None, :] < column[:, None])  # level-0 tokens of earlier columns
    own = (column[None, :] == column[:, None]) & (level[None, :] <= level[:, None])  # own column, itself included
    return 1 + level + column, earlier | own


@njit(cache=True)
def window_step(levels, out, ngram, shift, draws, cursor):
    """One Jacobi step of the window (the module docstring): levels int64[L, W] and the top level's outputs
    int64[W] -> (new levels int64[L', W], harvested n-grams int64[W, N] ([0, N] while filling), the next unread index
    of ``draws``); the new right-hand columns after a ``shift`` take ``draws[cursor:]`` row-major. Example: that
    docstring's with shift 1, draws ``[20, 21]``, cursor 0 -> levels ``[[9, 4, 20], [2, 3, 21]]``, cursor 2."""
    n_levels, width = levels.shape
    full = n_levels == ngram - 1
    kept = n_levels - 1 if full else n_levels  # old levels that stay, below the outputs
    first = n_levels - kept
    grams = np.empty((width if full else 0, ngram), np.int64)
    if full:
        grams[:, :n_levels] = levels.T
        grams[:, n_levels] = out
    new = np.empty((kept + 1, width), np.int64)
    new[:kept, : width - shift] = levels[first:, shift:]
    new[kept, : width - shift] = out[shift:]
    for lev in range(kept + 1):
        new[lev, width - shift :] = draws[cursor : cursor + shift]
        cursor += shift
    return new, grams, cursor


class LookaheadWindow:
    """The window's state: up to ``N - 1`` levels of ``W`` guessed tokens. Fresh guesses come from the context
    through a NumPy generator seeded per call, ``draws`` at a time, leaving torch's random stream untouched."""

    def __init__(self, width: int, ngram: int, context, seed: int = 0, draws: int = 256):
        """``context``: token ids (a sequence or int array); the fresh guesses are drawn from its last 1024."""
        if width < 1 or ngram < 2:
            raise ValueError(f"window needs width >= 1 and ngram >= 2; got width={width}, ngram={ngram}")
        self.width, self.ngram = width, ngram
        self._rng, self.draws = np.random.default_rng(seed), draws
        self._pool = np.asarray(context[-1024:], dtype=np.int64)
        self._draws, self._cursor = np.zeros(0, dtype=np.int64), 0  # fresh guesses drawn ahead, the next unread
        self._ahead(width)
        self.levels, self._cursor = self._draws[:width][None], width  # int64[n_levels, W]; starts with one level
        self._layouts: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # window_layout per level count, made once

    def _ahead(self, k: int) -> None:
        """At least ``k`` unread guesses (tokens of the context drawn uniformly) in ``_draws``."""
        if self._cursor + k > len(self._draws):
            drawn = self._pool[self._rng.integers(0, len(self._pool), size=max(k, self.draws))]
            self._draws, self._cursor = np.concatenate([self._draws[self._cursor:], drawn]), 0

    def rows(self) -> WindowRows:
        """This step's rows: tokens, position offsets, visibility (:func:`window_layout`)."""
        levels = len(self.levels)
        layout = self._layouts.get(levels)
        if layout is None:  # the same arrays every step (read, never written, by the step's packing)
            layout = self._layouts[levels] = window_layout(levels, self.width)
        return WindowRows(self.levels.reshape(-1), *layout)

    def advance(self, argmax: np.ndarray, emitted: int) -> np.ndarray:
        """One Jacobi step from ``argmax`` int[L*W] (the target's, per row in :meth:`rows` order) and ``emitted``
        (accepted + 1; the window slides ``emitted - 1``): the harvested n-grams int64[W, N] ([0, N] while filling)."""
        n_levels = len(self.levels)
        out = np.ascontiguousarray(
            np.asarray(argmax, dtype=np.int64)[(n_levels - 1) * self.width : n_levels * self.width])
        shift = min(max(emitted - 1, 0), self.width)
        self._ahead(shift * min(n_levels + 1, self.ngram - 1))
        self.levels, grams, self._cursor = window_step(self.levels, out, self.ngram, shift, self._draws, self._cursor)
        return grams


class WindowSource(DraftSource):
    """The Jacobi lookahead window as a source: its rows join each forward (:meth:`rows`), and the n-grams it
    harvests are drafted (``W``, ``N``, ``G``: ``width``, ``ngram``, ``candidates``)."""

    origin = WINDOW

    def __init__(self, width: int, ngram: int, candidates: int, max_match: int, draws: int = 256):
        self.width, self.ngram, self.candidates, self.draws = width, ngram, candidates, draws
        self.max_match = min(max_match, ngram - 1)
        self.trie = NgramTrie(max_n=ngram, capacity=max(1 << 14, 4 * ngram**2))
        self.window: LookaheadWindow | None = None
        self.max_nodes, self.max_depth = candidates * (ngram - 1), ngram - 1

    def start(self, prompt: np.ndarray, model=None) -> None:
        self.trie.clear()
        self.window = LookaheadWindow(self.width, self.ngram, prompt, draws=self.draws)

    def propose(self, context: np.ndarray, max_nodes: int, max_depth: int) -> Proposal | None:
        if not self.candidates:
            return None
        tokens, parents, match = self.trie.propose(context, self.max_nodes, min(max_depth, self.max_depth),
                                                   self.max_match, with_match=True)
        return Proposal(tokens, parents, match) if len(tokens) else None

    def rows(self) -> WindowRows:
        return self.window.rows()

    def advance(self, argmax: np.ndarray, n_emitted: int) -> None:
        """One Jacobi step; the harvested n-grams enter the window's trie, each a stream of its own."""
        self.trie.insert_rows(self.window.advance(argmax, n_emitted))
