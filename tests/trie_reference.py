"""Reference n-gram trie on pygtrie: the rules of ``lookahead.cache.NgramTrie`` written out plainly.

Slow on purpose (whole-trie scans, sorted lists); the tests compare the Numba trie against it.
Keys are tuples of token ids; each value is ``[count, last_used]``.
"""

from __future__ import annotations

import heapq

import numpy as np
import pygtrie


class ReferenceTrie:
    def __init__(self, max_n: int = 8, capacity: int = 1 << 20):
        if max_n < 2:
            raise ValueError(f"max_n: must be >= 2, got {max_n}")
        if capacity < 4 * max_n * max_n:
            raise ValueError(f"capacity: must be >= 4 * max_n**2, got {capacity}")
        self.max_n = max_n
        self.capacity = capacity
        self.clear()

    # -- state ---------------------------------------------------------------------------------
    def clear(self) -> None:
        self._trie = pygtrie.Trie()
        self._stream: list[int] = []
        self.step = 0

    def reset_stream(self) -> None:
        self._stream = []

    def __len__(self) -> int:
        return len(self._trie)

    def ngrams(self) -> dict[tuple[int, ...], tuple[int, int]]:
        return {tuple(k): (v[0], v[1]) for k, v in self._trie.items()}

    # -- insert --------------------------------------------------------------------------------
    def insert(self, tokens) -> None:
        for tok in tokens:
            tok = int(tok)
            if tok < 0:
                raise ValueError(f"tokens: negative token id {tok}")
            if self.capacity - len(self._trie) < self.max_n:
                self._evict()
            self.step += 1
            self._stream.append(tok)
            j = len(self._stream)
            for i in range(max(0, j - self.max_n), j):  # every n-gram ending at this token
                key = tuple(self._stream[i:j])
                if key in self._trie:
                    self._trie[key][0] += 1
                    self._trie[key][1] = self.step
                else:
                    self._trie[key] = [1, self.step]

    def _evict(self) -> None:
        # One stream only: here the open path was used at the last step, so it is never doomed,
        # and this threshold always frees enough. (With several threads' streams the Numba trie
        # also keeps the open path and may raise the threshold; tests/test_robustness.py.)
        limit = self.step - 2 * self.max_n
        last_used = sorted(v[1] for v in self._trie.values())
        threshold = min(last_used[self.capacity // 4 - 1], limit)
        doomed = [
            key
            for key in self._trie.keys()
            if max(v[1] for v in self._trie.values(prefix=key)) <= threshold  # whole subtree old
        ]
        for key in doomed:
            del self._trie[key]
        if self.capacity - len(self._trie) < self.max_n:
            raise RuntimeError("eviction freed too little")

    # -- propose -------------------------------------------------------------------------------
    def _children(self, key: tuple[int, ...]) -> list[tuple[tuple[int, ...], int, int]]:
        return [
            (tuple(k), v[0], v[1]) for k, v in self._trie.items(prefix=key) if len(k) == len(key) + 1
        ]

    def propose(self, context, max_nodes: int, max_depth: int, max_match: int | None = None, *,
                with_match: bool = False):
        tokens, parents, match = self._propose(context, max_nodes, max_depth, max_match)
        return (tokens, parents, match) if with_match else (tokens, parents)

    def _propose(self, context, max_nodes: int, max_depth: int, max_match: int | None):
        empty = (np.empty(0, np.int64), np.empty(0, np.int32), 0)
        mm = self.max_n - 1 if max_match is None else min(max(max_match, 1), self.max_n - 1)
        ctx = [int(x) for x in context]
        match = None
        for length in range(min(mm, len(ctx)), 0, -1):
            key = tuple(ctx[len(ctx) - length:])
            if key in self._trie and self._children(key):
                match = key
                break
        if match is None or max_nodes == 0 or max_depth == 0:
            return empty
        depth_limit = min(max_depth, self.max_n - len(match))

        heap: list = []

        def push_children(key, score, depth, parent_sel):
            kids = self._children(key)
            total = sum(c for _, c, _ in kids)
            for k, c, lu in kids:
                s = score * c / total
                heapq.heappush(heap, (-s, depth, -lu, k, parent_sel))

        push_children(match, 1.0, 1, -1)
        selected = []  # (key, depth, parent selection index, count, last_used)
        while heap and len(selected) < max_nodes:
            neg_score, depth, neg_lu, key, parent_sel = heapq.heappop(heap)
            selected.append((key, depth, parent_sel, self._trie[key][0], -neg_lu))
            if depth < depth_limit:
                push_children(key, -neg_score, depth + 1, len(selected) - 1)

        # breadth-first: by depth, then parent's output index, then (count desc, last_used desc)
        out_index: dict[int, int] = {}
        order: list[int] = []
        for depth in range(1, depth_limit + 1):
            level = [i for i, s in enumerate(selected) if s[1] == depth]
            level.sort(key=lambda i: (out_index.get(selected[i][2], -1), -selected[i][3], -selected[i][4]))
            for i in level:
                out_index[i] = len(order)
                order.append(i)
        tokens = np.array([selected[i][0][-1] for i in order], np.int64)
        parents = np.array([out_index[selected[i][2]] if selected[i][2] >= 0 else -1 for i in order], np.int32)
        return tokens, parents, (len(match) if len(tokens) else 0)
