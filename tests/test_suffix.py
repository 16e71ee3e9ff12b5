"""Tests of the suffix index (``lookahead.cache.SuffixIndex``, ``cache/suffix.py``): hand-worked cases, the
automaton's invariants, and property tests against :class:`ReferenceIndex`, a brute force that recomputes
every answer from the kept context with plain list scans (O(n^2) and more: obviously right)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lookahead.cache import SuffixIndex
from lookahead.cache import suffix as S
from lookahead.drafting.trees import depth_rank

_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


class ReferenceIndex:
    """The kept context as a list, with ``SuffixIndex``'s rebuild rule (keep the last ``capacity // 2``
    tokens when a token would exceed ``capacity``)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.context: list[int] = []
        self.rebuilds = 0

    def extend(self, tokens) -> None:
        for t in tokens:
            if len(self.context) == self.capacity:
                self.context = self.context[len(self.context) - self.capacity // 2:]
                self.rebuilds += 1
            self.context.append(int(t))

    def common_suffix(self, e: int) -> int:
        """Length of the longest common suffix of ``context[:e + 1]`` and the whole context."""
        ctx, n = self.context, len(self.context)
        k = 0
        while k <= e and ctx[e - k] == ctx[n - 1 - k]:
            k += 1
        return k

    def match(self) -> tuple[int, int]:
        """(longest suffix that also ends earlier, end of its first occurrence); (0, -1) when none."""
        n = len(self.context)
        best = max((self.common_suffix(e) for e in range(n - 1)), default=0)
        if best == 0:
            return 0, -1
        return best, min(e for e in range(n) if self.common_suffix(e) >= best)

    def candidates(self, min_match: int, max_states: int) -> list[tuple[int, int, int]]:
        """(L_c, f_c, c) for every next token c with L_c >= max(min_match, 1), by L desc, f asc, from the
        ``max_states`` largest distinct common-suffix lengths of earlier positions."""
        ctx, n = self.context, len(self.context)
        lengths = sorted({self.common_suffix(e) for e in range(n - 1)} - {0}, reverse=True)[:max_states]
        longest: dict[int, int] = {}
        for e in range(n - 1):
            k = self.common_suffix(e)
            if k in lengths:
                c = ctx[e + 1]
                longest[c] = max(longest.get(c, 0), k)
        out = []
        for c, k in longest.items():
            if k >= max(min_match, 1):
                f = min(e + 1 for e in range(n - 1) if ctx[e + 1] == c and self.common_suffix(e) >= k)
                out.append((k, f, c))
        return sorted(out, key=lambda x: (-x[0], x[1]))

    def propose(self, max_nodes, max_depth, max_branches=1, branch_depth=8, min_match=1, max_states=16):
        if max_nodes <= 0 or max_depth <= 0 or max_branches <= 0 or max_states <= 0:
            return [], [], []
        if self.match()[0] < max(min_match, 1):
            return [], [], []
        cands = self.candidates(min_match, max_states)[:max_branches]
        side = min(branch_depth, max_depth)
        lens, total = [], 0
        for b in range(len(cands)):
            want = max_depth if b == 0 else side
            lens.append(max(min(want, max_nodes - total), 0))
            total += lens[-1]
        chains = []
        for (_, f, c), m in zip(cands, lens):
            ext = self.context + [c]  # the chain's own tokens extend the context
            chain = [c][:m]
            while len(chain) < m:
                tok = ext[f + len(chain)]
                chain.append(tok)
                ext.append(tok)
            chains.append(chain)
        tokens, parents, match, last = [], [], [], [-1] * len(chains)
        for d in range(max(lens, default=0)):
            for b, chain in enumerate(chains):
                if d < len(chain):
                    tokens.append(chain[d])
                    parents.append(last[b])
                    match.append(cands[b][0])
                    last[b] = len(tokens) - 1
        return tokens, parents, match




def _check_invariants(index: SuffixIndex) -> None:
    """Array-level invariants: every state's transitions are in the hash table and in its list, sorted by
    their target's first end; links shorten; a state's FIRST is the first end of its longest string."""
    info = index._info
    n_states, n_edges, n = int(info[S.I_STATES]), int(info[S.I_EDGES]), len(index)
    states, edges, ctx = index._states, index._edges, index.tokens.tolist()
    used = int(info[S.I_TABLE])
    assert n_states <= 2 * max(n, 1) and n_edges <= max(3 * n - 4, 2 * n - 1, 0)
    listed = 0
    for s in range(n_states):
        if s:
            link = states[s, S.LINK]
            assert 0 <= link < n_states and states[link, S.LEN] < states[s, S.LEN]
            length, first = int(states[s, S.LEN]), int(states[s, S.FIRST])
            assert length - 1 <= first < n
            # the longest string of s ends at FIRST and at no earlier position
            string = ctx[first - length + 1 : first + 1]
            assert not any(ctx[e - length + 1 : e + 1] == string for e in range(length - 1, first))
        x, first = states[s, S.HEAD], -1
        while x != -1:  # listed by their target's first end, ascending (what propose relies on)
            assert states[edges[x, S.TARGET], S.FIRST] > first
            first = states[edges[x, S.TARGET], S.FIRST]
            assert edges[x, S.OWNER] == s
            assert S._lookup(edges, index._table, s, edges[x, S.TOKEN], used - 1) == x
            listed += 1
            x = edges[x, S.NEXT]
    assert listed == n_edges
    assert np.count_nonzero(index._table) == n_edges
    # the slots in use: a power of two, at most half full, at least MIN_TABLE (or the whole table); none past them
    assert used & (used - 1) == 0 and 2 * n_edges <= used <= len(index._table)
    assert used >= min(S.MIN_TABLE, len(index._table)) and not index._table[used:].any()


def _same(index: SuffixIndex, ref: ReferenceIndex, params) -> None:
    assert index.tokens.tolist() == ref.context
    assert index.rebuilds == ref.rebuilds
    assert (index.match_length, index.match_end) == ref.match()
    for p in params:
        got = index.propose(*p)
        assert all(a.dtype == np.int64 for a in got)
        assert [a.tolist() for a in got] == list(ref.propose(*p)), (p, ref.context)
        *same, depth = index.propose(*p, with_depth=True)  # the same tree, and each node's depth from its parents
        assert [a.tolist() for a in same] == [a.tolist() for a in got]
        assert depth.tolist() == depth_rank(got[1])[0].tolist()


def test_worked_example_of_the_docstring():
    index = SuffixIndex(capacity=64)
    index.extend([7, 1, 2, 3, 9, 1, 2, 4, 5, 1, 2])
    assert (index.match_length, index.match_end) == (2, 2)
    tokens, parents, match = index.propose(max_nodes=8, max_depth=6, max_branches=2, branch_depth=2)
    assert tokens.tolist() == [3, 4, 9, 5, 1, 2, 4, 5]
    assert parents.tolist() == [-1, -1, 0, 1, 2, 4, 5, 6]
    assert match.tolist() == [2] * 8
    assert index.propose(max_nodes=8, max_depth=6, max_branches=2, branch_depth=2, with_depth=True)[3].tolist() == [
        1, 1, 2, 2, 3, 4, 5, 6]
    # one branch: the first occurrence's continuation, running on into its own draft
    assert index.propose(12, 12)[0].tolist() == [3, 9, 1, 2, 4, 5, 1, 2, 3, 9, 1, 2]


def test_a_long_match_copies_deep():
    text = list(range(100, 160))
    index = SuffixIndex(capacity=1024)
    index.extend(text + [1, 2] + text[:40])
    assert index.match_length == 40
    tokens, parents, match = index.propose(max_nodes=32, max_depth=32)
    assert tokens.tolist() == text[40:60] + [1, 2] + text[:10]
    assert parents.tolist() == list(range(-1, 31))
    assert set(match.tolist()) == {40}
    assert index.propose(32, 32, min_match=41)[0].tolist() == []


def test_no_match_no_draft_and_empty():
    index = SuffixIndex(capacity=16)
    assert index.propose(8, 8)[0].tolist() == [] and index.match_length == 0 and index.match_end == -1
    index.extend([1, 2, 3])
    assert index.propose(8, 8)[0].tolist() == []
    index.extend([])
    assert len(index) == 3
    index.clear()
    assert len(index) == 0 and index.match_length == 0


def test_repeated_token_runs_periodically():
    index = SuffixIndex(capacity=64)
    index.extend([5] * 10)
    assert (index.match_length, index.match_end) == (9, 8)
    assert index.propose(6, 6)[0].tolist() == [5] * 6


def test_capacity_rebuilds_over_the_last_half():
    index, ref = SuffixIndex(capacity=8), ReferenceIndex(8)
    seq = [1, 2, 3, 4, 1, 2, 3, 4, 9, 1, 2]
    index.extend(seq)
    ref.extend(seq)
    assert index.rebuilds == 1 and index.dropped == 4 and index.tokens.tolist() == [1, 2, 3, 4, 9, 1, 2]
    _same(index, ref, [(8, 8, 2, 2, 1, 16)])


def test_pickles_small_and_exact():
    import copy
    import pickle

    index = SuffixIndex(capacity=1 << 16)
    assert len(pickle.dumps(index)) < 2_000
    small = SuffixIndex(capacity=8)
    small.extend([1, 2, 3, 4, 1, 2, 3, 4, 9, 1, 2])  # rebuilt once
    twin = copy.deepcopy(small)
    n_states, n_edges = int(small._info[S.I_STATES]), int(small._info[S.I_EDGES])
    np.testing.assert_array_equal(small._info, twin._info)
    np.testing.assert_array_equal(small._states[:n_states], twin._states[:n_states])  # rows in use
    np.testing.assert_array_equal(small._edges[:n_edges], twin._edges[:n_edges])
    np.testing.assert_array_equal(small._table, twin._table)
    assert twin.tokens.tolist() == small.tokens.tolist()
    twin.extend([3])
    small.extend([3])
    assert [a.tolist() for a in twin.propose(8, 8, 2)] == [a.tolist() for a in small.propose(8, 8, 2)]


@pytest.mark.parametrize("bad", [[-1], [2**31], [1.5]])
def test_invalid_tokens_are_refused_and_nothing_is_appended(bad):
    index = SuffixIndex(capacity=16)
    index.extend([1, 2])
    with pytest.raises(ValueError, match="token"):
        index.extend(np.array(bad))
    assert index.tokens.tolist() == [1, 2]


@pytest.mark.parametrize("capacity", [3, 1.5, True, 2**29])
def test_invalid_capacity(capacity):
    with pytest.raises(ValueError, match="capacity"):
        SuffixIndex(capacity=capacity)


def test_any_integer_dtype_and_layout():
    index = SuffixIndex(capacity=32)
    index.extend(np.array([1, 2, 1, 2, 1], dtype=np.int32))
    index.extend(np.array([9, 2, 9, 2], dtype=np.int64)[::2])
    assert index.tokens.tolist() == [1, 2, 1, 2, 1, 9, 9]


_params = st.tuples(st.integers(0, 12), st.integers(0, 12), st.integers(0, 5), st.integers(0, 6),
                    st.integers(0, 4), st.integers(0, 4))


@settings(max_examples=300, **_SETTINGS)
@given(vocab=st.integers(1, 5), capacity=st.integers(4, 48),
       chunks=st.lists(st.lists(st.integers(0, 4), max_size=9), max_size=14),
       params=st.lists(_params, min_size=1, max_size=3))
def test_matches_the_brute_force(vocab, capacity, chunks, params):
    """After every chunk: the kept context, match length and end, and every proposal equal the brute force's."""
    index, ref = SuffixIndex(capacity=capacity), ReferenceIndex(capacity)
    for chunk in chunks:
        chunk = [t % vocab for t in chunk]
        index.extend(chunk)
        ref.extend(chunk)
        _same(index, ref, params)
    _check_invariants(index)


@settings(max_examples=40, **_SETTINGS)
@given(seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 40))
def test_long_sequences_match_the_brute_force(seed, vocab):
    """Longer streams with copies of earlier stretches (what drafting sees), checked every few tokens."""
    rng = np.random.default_rng(seed)
    seq: list[int] = []
    while len(seq) < 300:
        if seq and rng.random() < 0.5:
            start = int(rng.integers(0, len(seq)))
            seq += seq[start : start + int(rng.integers(1, 40))]
        else:
            seq += rng.integers(0, vocab, int(rng.integers(1, 10))).tolist()
    capacity = int(rng.integers(16, 400))
    index, ref = SuffixIndex(capacity=capacity), ReferenceIndex(capacity)
    i = 0
    while i < len(seq):
        step = int(rng.integers(1, 8))
        index.extend(seq[i : i + step])
        ref.extend(seq[i : i + step])
        i += step
        _same(index, ref, [(48, 32, 4, 8, 2, 16), (16, 40, 1, 8, 1, 16), (24, 12, 6, 4, 1, 3)])
    _check_invariants(index)


@pytest.mark.parametrize("capacity", [64, 1 << 12])  # 64: rebuilt over its last half again and again
def test_unwritten_memory_is_never_read(capacity):
    """A new index leaves its tokens, states and edges unwritten: each is written as it is made. With garbage in
    every one of them, an index extends, proposes, rebuilds and clears exactly as a clean one."""
    rng = np.random.default_rng(capacity)
    dirty, clean = SuffixIndex(capacity), SuffixIndex(capacity)
    for arr in (clean._tokens, clean._states, clean._edges):
        arr[...] = 0
    for arr in (dirty._tokens, dirty._states, dirty._edges):
        arr[...] = rng.integers(-3, 2 * capacity, arr.shape)
    dirty._states[0] = clean._states[0]  # the root, which a new index writes
    for step in range(40):
        part = rng.integers(0, 12, int(rng.integers(1, 40)))
        dirty.extend(part)
        clean.extend(part)
        assert dirty.tokens.tolist() == clean.tokens.tolist() and dirty.rebuilds == clean.rebuilds
        for args in ((16, 8, 2), (6, 12, 1), (30, 6, 3)):
            assert [a.tolist() for a in dirty.propose(*args)] == [b.tolist() for b in clean.propose(*args)]
        if step == 20:
            dirty.clear()
            clean.clear()
    if capacity == 64:
        assert clean.rebuilds > 0


def test_clear_leaves_the_table_empty_whatever_was_indexed():
    """``clear`` zeroes only the entries of the edges made (or the whole table past an eighth of it): either way
    the table is empty after it, and the index then proposes as a new one."""
    rng = np.random.default_rng(3)
    for tokens in (50, 20000):
        index = SuffixIndex(1 << 12)
        index.extend(rng.integers(0, 30, tokens))
        index.clear()
        assert not index._table.any()
        fresh = SuffixIndex(1 << 12)
        seq = rng.integers(0, 30, 300)
        index.extend(seq)
        fresh.extend(seq)
        assert [a.tolist() for a in index.propose(16, 8, 2)] == [b.tolist() for b in fresh.propose(16, 8, 2)]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(2, 6), branches=st.integers(1, 4))
def test_bucketed_proposal_is_the_proposal_with_its_followed_context_bucketed(seed, vocab, branches):
    """``propose_buckets``: ``propose``'s tokens and parents, each node's match replaced by 1 + how many of the
    edges the context it follows once its ancestors are accepted (match + depth - 1) reaches; an edge itself
    counts as reached (``searchsorted(side="right")``)."""
    index = SuffixIndex(64)
    index.extend(np.random.default_rng(seed).integers(0, vocab, 48))
    edges = np.array([4, 16])
    tokens, parents, match, depth = index.propose(24, 12, branches, 4, with_depth=True)
    b_tokens, b_parents, buckets = index.propose_buckets(24, 12, branches, 4, edges)
    assert b_tokens.tolist() == tokens.tolist() and b_parents.tolist() == parents.tolist()
    assert buckets.tolist() == (1 + edges.searchsorted(match + depth - 1, side="right")).tolist()
    assert index.propose_buckets(0, 12, branches, 4, edges)[0].tolist() == []
