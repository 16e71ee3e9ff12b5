"""Tests of the n-gram trie (``lookahead.cache``, the repository's ``cache/`` folder): exact hand-worked cases, and
property tests against the pygtrie reference in ``trie_reference.py``."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lookahead.cache import NgramTrie
from lookahead.cache import kernels as K
from lookahead.cache import trie as T

from trie_reference import ReferenceTrie  # pytest puts tests/ (no __init__.py) on sys.path


def _eq(got, tokens, parents):
    t, p = got
    assert t.dtype == np.int64 and p.dtype == np.int32
    assert t.tolist() == tokens
    assert p.tolist() == parents


def _trie(max_n, stream_parts, capacity=None):
    trie = NgramTrie(max_n=max_n, capacity=capacity or 4 * max_n * max_n * 4)
    for i, part in enumerate(stream_parts):
        if i:
            trie.reset_stream()
        trie.insert(part)
    return trie


def _written(trie: NgramTrie) -> tuple[np.ndarray, np.ndarray]:
    """Copies of the trie's ``nodes`` and ``stats`` with the rows above ``S_HIGH`` written as a new trie's, which is
    what they count as (``kernels.S_HIGH``): the arrays as the kernels see them."""
    nodes, stats = trie._nodes.copy(), trie._stats.copy()
    high = int(trie._state[K.S_HIGH])
    K.fresh_rows(nodes, stats, trie.capacity, high + 1, trie.capacity)
    return nodes, stats


def _check_invariants(trie: NgramTrie) -> None:
    """The array-level invariants the kernels rely on (see ``cache/kernels.py``)."""
    written_nodes, written_stats = _written(trie)
    nodes, stats = written_nodes.tolist(), written_stats.tolist()
    table, state = trie._table, trie._state.tolist()
    cap = trie.capacity
    assert 0 <= state[K.S_HIGH] <= cap
    live = [v for v in range(1, cap + 1) if nodes[v][K.TOKEN] >= 0]
    assert len(live) == state[K.S_N_LIVE] == len(trie)
    # the hash table holds exactly the live nodes, in the slots in use (a power of two, at most half full, at least
    # MIN_TABLE or the whole table), where each one's lookup finds it
    assert sorted(table[table != 0].tolist()) == live
    used = trie._used
    assert used & (used - 1) == 0 and 2 * len(live) <= used <= len(table) and not table[used:].any()
    assert used >= min(T.MIN_TABLE, len(table)) and trie._tview.shape == (used,)
    assert all(K.find_child(trie._nodes, trie._tview, nodes[v][K.PARENT], nodes[v][K.TOKEN]) == v for v in live)
    # free list
    free, v = 0, state[K.S_FREE_HEAD]
    while v != 0:
        assert nodes[v][K.TOKEN] == -1
        free += 1
        v = nodes[v][K.NEXT_SIBLING]
    assert free == cap - len(live)
    # sorted, doubly linked child lists with count groups and child sums
    groups_used = set()
    n_listed = 0
    for v in [0] + live:
        kids, prev, c = [], 0, nodes[v][K.FIRST_CHILD]
        while c != 0:
            assert nodes[c][K.PARENT] == v and nodes[c][K.PREV_SIBLING] == prev and nodes[c][K.TOKEN] >= 0
            kids.append(c)
            prev, c = c, nodes[c][K.NEXT_SIBLING]
        assert nodes[v][K.LAST_CHILD] == prev
        n_listed += len(kids)
        assert stats[v][K.CHILD_SUM] == sum(stats[k][K.COUNT] for k in kids)
        keys = [(-stats[k][K.COUNT], -stats[k][K.LAST_USED]) for k in kids]
        assert keys == sorted(keys)
        for i, k in enumerate(kids):
            g = nodes[k][K.GROUP]
            if i > 0 and stats[kids[i - 1]][K.COUNT] == stats[k][K.COUNT]:
                assert g == nodes[kids[i - 1]][K.GROUP]
            else:
                assert g not in groups_used and nodes[g][K.GROUP_HEAD] == k
                groups_used.add(g)
    assert n_listed == len(live)  # every live node is in its parent's list
    free_groups, g = 0, state[K.S_GROUP_FREE]
    while g != 0:
        assert g not in groups_used
        free_groups += 1
        g = nodes[g][K.GROUP_HEAD]
    assert free_groups + len(groups_used) == cap


# -- hand-worked cases -------------------------------------------------------------------------


def test_docstring_example():
    trie = NgramTrie(max_n=4, capacity=64)
    trie.insert([1, 2, 3, 1, 2, 4, 1, 2, 3])
    assert trie.step == 9
    ng = trie.ngrams()
    assert ng[(1, 2)] == (3, 8)
    assert ng[(1, 2, 3)] == (2, 9)
    assert ng[(1, 2, 4)] == (1, 6)
    assert ng[(1, 2, 3, 1)] == (1, 4)
    assert ng[(1, 2, 4, 1)] == (1, 7)
    assert len(trie) == len(ng) == 21
    _eq(trie.propose([5, 1, 2], max_nodes=8, max_depth=8), [3, 4, 1, 1], [-1, -1, 0, 1])
    _eq(trie.propose([5, 1, 2], max_nodes=2, max_depth=8), [3, 1], [-1, 0])
    _eq(trie.propose([5, 1, 2], max_nodes=8, max_depth=1), [3, 4], [-1, -1])


def test_package_docstring_example():
    import doctest

    import lookahead.cache as cache

    result = doctest.testmod(cache)
    assert result.failed == 0 and result.attempted >= 5


def test_counts_and_last_used():
    trie = NgramTrie(max_n=3, capacity=36)
    trie.insert([7, 7, 7])
    assert trie.ngrams() == {(7,): (3, 3), (7, 7): (2, 3), (7, 7, 7): (1, 3)}
    trie.insert(np.array([8], np.int32))
    assert trie.ngrams()[(7, 7, 8)] == (1, 4)
    assert trie.ngrams()[(7, 8)] == (1, 4)
    assert trie.step == 4 and len(trie) == 6


def test_tie_equal_counts_most_recent_first():
    trie = _trie(2, [[1, 2], [1, 3], [1, 4]])
    _eq(trie.propose([1], 8, 8), [4, 3, 2], [-1, -1, -1])


def test_higher_count_beats_recency():
    trie = _trie(2, [[1, 2, 1, 2, 1, 3]])
    _eq(trie.propose([1], 8, 8), [2, 3], [-1, -1])


def test_tie_equal_score_shallower_first():
    # children of (1,): 9 (count 1, step 2) and 2 (count 1, step 4); (1, 2, 3) has score 1/2 * 1/1.
    # After 2 is taken, 9 (depth 1, step 2) and 3 (depth 2, step 5) tie on score: 9 wins on depth.
    trie = _trie(3, [[1, 9], [1, 2, 3]])
    _eq(trie.propose([7, 1], 2, 8), [2, 9], [-1, -1])
    _eq(trie.propose([7, 1], 3, 8), [2, 9, 3], [-1, -1, 0])


def test_best_first_goes_deep_on_high_score():
    # (1,): 2 has count 3, 5 has count 1 -> 2 scores 3/4, its only child 3 scores 3/4 > 1/4.
    trie = _trie(3, [[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 5]])
    _eq(trie.propose([1], 2, 8), [2, 3], [-1, 0])
    _eq(trie.propose([1], 3, 8), [2, 5, 3], [-1, -1, 0])


def test_fallback_to_shorter_suffix():
    trie = _trie(3, [[4, 2], [2, 7]])
    # (4, 2) exists but has no children; (2,) has child 7
    _eq(trie.propose([4, 2], 8, 8), [7], [-1])
    # (6, 2) does not exist at all
    _eq(trie.propose([6, 2], 8, 8), [7], [-1])
    # nothing matches
    _eq(trie.propose([99], 8, 8), [], [])
    _eq(trie.propose([], 8, 8), [], [])
    # the leaf (2, 7) is a match for nobody
    _eq(trie.propose([2, 7], 8, 8), [], [])


def test_depth_and_node_limits():
    trie = _trie(6, [[1, 2, 3, 4, 5, 6]])
    _eq(trie.propose([1], 8, 3), [2, 3, 4], [-1, 0, 1])
    _eq(trie.propose([1], 2, 8), [2, 3], [-1, 0])
    _eq(trie.propose([1], 8, 8), [2, 3, 4, 5, 6], [-1, 0, 1, 2, 3])  # depth <= max_n - 1
    _eq(trie.propose([1, 2], 8, 8), [3, 4, 5, 6], [-1, 0, 1, 2])  # depth <= max_n - 2
    _eq(trie.propose([1], 8, 10**30), [2, 3, 4, 5, 6], [-1, 0, 1, 2, 3])
    _eq(trie.propose([1], 0, 8), [], [])
    _eq(trie.propose([1], 8, 0), [], [])


def test_max_match():
    trie = _trie(3, [[1, 2, 3], [2, 4]])
    _eq(trie.propose([1, 2], 8, 8), [3], [-1])
    _eq(trie.propose([1, 2], 8, 8, max_match=2), [3], [-1])
    _eq(trie.propose([1, 2], 8, 8, max_match=1), [4, 3], [-1, -1])
    _eq(trie.propose([1, 2], 8, 8, max_match=0), [4, 3], [-1, -1])  # clipped to 1
    _eq(trie.propose([1, 2], 8, 8, max_match=99), [3], [-1])  # clipped to max_n - 1


def test_match_length():
    trie = _trie(4, [[1, 2, 3], [2, 4], [7, 2, 5]])
    assert trie.propose([1, 2], 8, 8, with_match=True)[2] == 2  # "1 2" -> 3
    assert trie.propose([9, 2], 8, 8, with_match=True)[2] == 1  # only "2" is known
    assert trie.propose([1, 2], 8, 8, max_match=1, with_match=True)[2] == 1
    assert trie.propose([3], 8, 8, with_match=True)[2] == 0  # a leaf: no tree
    assert trie.propose([1, 2], 0, 8, with_match=True)[2] == 0  # an empty tree has no match
    tokens, parents, match = trie.propose([7, 2], 8, 8, with_match=True)
    assert (tokens.tolist(), parents.tolist(), match) == ([5], [-1], 2)


def test_reset_stream_blocks_spanning_ngrams():
    trie = _trie(3, [[1, 2], [3, 4]])
    assert trie.ngrams() == {
        (1,): (1, 1), (1, 2): (1, 2), (2,): (1, 2),
        (3,): (1, 3), (3, 4): (1, 4), (4,): (1, 4),
    }
    _eq(trie.propose([2], 8, 8), [], [])
    trie.reset_stream()
    trie.reset_stream()
    trie.insert([2, 3])
    assert trie.ngrams()[(2, 3)] == (1, 6)
    assert (1, 2, 3) not in trie.ngrams()


def test_propose_is_read_only_and_clear():
    trie = _trie(4, [[1, 2, 3, 1, 2, 4, 1, 2, 3]])
    before = trie.ngrams()
    for ctx in ([1], [1, 2], [2, 3], [9, 9, 1, 2]):
        trie.propose(ctx, 16, 8)
    assert trie.ngrams() == before
    trie.clear()
    assert len(trie) == 0 and trie.step == 0 and trie.ngrams() == {}
    trie.insert([5, 6])
    assert trie.ngrams() == {(5,): (1, 1), (5, 6): (1, 2), (6,): (1, 2)}  # no span from before clear


def test_input_types():
    trie = NgramTrie(max_n=3, capacity=64)
    trie.insert([])
    trie.insert(np.array([], np.int64))
    assert trie.step == 0
    trie.insert((1, 2))
    trie.insert(np.array([3], np.uint8))
    trie.insert(np.arange(10, dtype=np.int64)[4:9:2])  # non-contiguous view: 4, 6, 8
    trie.insert(np.array([2**31 - 1], np.uint64))
    ro = np.array([5, 5], np.int64)
    ro.flags.writeable = False
    trie.insert(ro)
    trie.insert(np.array([5], ">i8"))  # big-endian
    assert trie.step == 10
    assert (1, 2, 3) in trie.ngrams() and (4, 6, 8) in trie.ngrams() and (8, 2**31 - 1, 5) in trie.ngrams()
    assert trie.ngrams()[(5, 5, 5)] == (1, 10)
    trie2 = _trie(3, [[1, 2, 3]])
    _eq(trie2.propose(np.array([1, 2], np.int32), 4, 4), [3], [-1])
    _eq(trie2.propose((9, 9, 9, 9, 1), 4, 4), [2, 3], [-1, 0])  # only the last max_match tokens matter
    _eq(trie2.propose(np.array([-1, 7, 1]), 4, 4), [2, 3], [-1, 0])  # ... and the only ones checked


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(max_n=1), "max_n"),
        (dict(max_n=2.5), "max_n"),
        (dict(max_n=3, capacity=35), "capacity"),
        (dict(max_n=8, capacity=255), "capacity"),
        (dict(max_n=3, capacity=None), "capacity"),
    ],
)
def test_constructor_validation(kwargs, field):
    with pytest.raises(ValueError, match=field) as err:
        NgramTrie(**kwargs)
    assert repr(list(kwargs.values())[-1]) in str(err.value)


@pytest.mark.parametrize(
    "tokens",
    [[1, -2], np.array([1.0, 2.0]), np.array([True]), [[1, 2]], [2**31], np.array([2**63], np.uint64), ["a"]],
)
def test_insert_validation(tokens):
    trie = NgramTrie(max_n=3, capacity=64)
    trie.insert([1])
    with pytest.raises(ValueError, match="tokens"):
        trie.insert(tokens)
    assert trie.step == 1 and len(trie) == 1  # nothing half-inserted


def test_propose_validation():
    trie = _trie(3, [[1, 2, 3]])
    with pytest.raises(ValueError, match="context"):
        trie.propose([1, -1], 4, 4)
    with pytest.raises(ValueError, match="context"):
        trie.propose([1.5], 4, 4)
    with pytest.raises(ValueError, match="max_nodes"):
        trie.propose([1], -1, 4)
    with pytest.raises(ValueError, match="max_depth"):
        trie.propose([1], 4, -1)
    with pytest.raises(TypeError):
        trie.propose([1], 4.0, 4)


def test_kth_smallest_matches_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 10, 100, 1000):
        for hi in (2, 5, 10**6):
            a = rng.integers(0, hi, n).astype(np.int64)
            for k in {0, n // 4, n // 2, n - 1}:
                assert K.kth_smallest(a.copy(), n, k) == np.partition(a, k)[k]
    a = np.arange(1000, dtype=np.int64)
    assert K.kth_smallest(a.copy(), 1000, 249) == 249
    assert K.kth_smallest(a[::-1].copy(), 1000, 249) == 249


def test_eviction_keeps_recent_and_bounded():
    max_n, cap = 3, 36
    trie, ref = NgramTrie(max_n, cap), ReferenceTrie(max_n, cap)
    rng = np.random.default_rng(1)
    stream = rng.integers(0, 50, 2000)
    for i in range(0, len(stream), 7):
        trie.insert(stream[i:i + 7])
        ref.insert(stream[i:i + 7])
        assert len(trie) <= cap
        assert trie.ngrams() == ref.ngrams()
        _check_invariants(trie)
    assert trie.n_evictions > 10
    # the last max_n tokens' n-grams always survive
    ng = trie.ngrams()
    tail = [int(x) for x in stream[-max_n:]]
    for i in range(max_n):
        assert tuple(tail[i:]) in ng


def test_memory_is_fixed():
    trie = NgramTrie(max_n=4, capacity=64)
    arrays = [trie._nodes, trie._stats, trie._table, trie._state]
    trie.insert(np.arange(500) % 37)
    trie.clear()
    trie.insert(np.arange(500) % 23)
    assert all(a is b for a, b in zip([trie._nodes, trie._stats, trie._table, trie._state], arrays, strict=True))


# -- property tests against the reference -------------------------------------------------------

_propose_args = st.tuples(
    st.lists(st.integers(0, 6), max_size=7),  # context (6 is never inserted below: a miss)
    st.integers(0, 12),  # max_nodes
    st.integers(0, 6),  # max_depth
    st.one_of(st.none(), st.integers(-1, 7)),  # max_match
)


def _ops(vocab: int, max_chunk: int, max_ops: int):
    insert = st.tuples(st.just("insert"), st.lists(st.integers(0, vocab - 1), max_size=max_chunk))
    return st.lists(
        st.one_of(insert, insert, insert, st.tuples(st.just("reset"), st.none()),
                  st.tuples(st.just("propose"), _propose_args)),
        max_size=max_ops,
    )


def _run(max_n, capacity, ops, check_every_op):
    trie, ref = NgramTrie(max_n, capacity), ReferenceTrie(max_n, capacity)
    for kind, arg in ops:
        if kind == "insert":
            trie.insert(arg)
            ref.insert(arg)
            tail = ref._stream[-trie.max_n:]  # a context that matches long
            got, want = trie.propose(tail, 10, 8, with_match=True), ref.propose(tail, 10, 8, with_match=True)
            assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist(), (tail, got, want)
            assert got[2] == want[2], (tail, got, want)
        elif kind == "reset":
            trie.reset_stream()
            ref.reset_stream()
        else:
            ctx, max_nodes, max_depth, max_match = arg
            got = trie.propose(ctx, max_nodes, max_depth, max_match, with_match=True)
            want = ref.propose(ctx, max_nodes, max_depth, max_match, with_match=True)
            assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist(), (arg, got, want)
            assert got[2] == want[2], (arg, got, want)
        assert len(trie) <= capacity
        assert len(trie) == len(ref) and trie.step == ref.step
        if check_every_op:
            assert trie.ngrams() == ref.ngrams()
            if trie.capacity <= 256:
                _check_invariants(trie)
    assert trie.ngrams() == ref.ngrams()
    _check_invariants(trie)
    return trie, ref


_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


@settings(max_examples=300, **_SETTINGS)
@given(max_n=st.integers(2, 5), ops=_ops(vocab=6, max_chunk=12, max_ops=25))
def test_matches_reference(max_n, ops):
    trie, _ = _run(max_n, 1 << 11, ops, check_every_op=True)
    assert trie.n_evictions == 0  # <= 300 tokens


@settings(max_examples=60, **_SETTINGS)
@given(
    capacity=st.integers(36, 60),
    ops=_ops(vocab=6, max_chunk=60, max_ops=40),
    seed=st.integers(0, 2**32 - 1),
)
def test_matches_reference_under_eviction(capacity, ops, seed):
    # prepend a long random stream so that evictions are certain, then the random operations
    rng = np.random.default_rng(seed)
    lead = [("insert", rng.integers(0, 6, 150).tolist()), ("reset", None), ("insert", rng.integers(0, 3, 50).tolist())]
    trie, _ = _run(3, capacity, lead + ops, check_every_op=False)
    assert trie.n_evictions > 0


@settings(max_examples=40, **_SETTINGS)
@given(max_n=st.integers(2, 4), seed=st.integers(0, 2**32 - 1))
def test_matches_reference_at_minimum_capacity(max_n, seed):
    # capacity exactly 4 * max_n**2, the tightest the eviction guarantee allows
    rng = np.random.default_rng(seed)
    ops = []
    for _ in range(30):
        ops.append(("insert", rng.integers(0, int(rng.integers(2, 20)), int(rng.integers(1, 30))).tolist()))
        if rng.random() < 0.3:
            ops.append(("reset", None))
        ctx = rng.integers(0, 8, int(rng.integers(0, 6))).tolist()
        ops.append(("propose", (ctx, int(rng.integers(1, 10)), int(rng.integers(1, 6)), None)))
    trie, _ = _run(max_n, 4 * max_n * max_n, ops, check_every_op=True)
    assert trie.n_evictions > 0



@pytest.mark.parametrize("seed", [0, 1])
def test_table_in_use_grows_then_becomes_whole_before_evictions(seed):
    """A capacity whose table is larger than ``MIN_TABLE``: the slots in use double as nodes are made, and turn into
    the whole table before the first eviction (which borrows all of it), matching the reference throughout."""
    rng = np.random.default_rng(seed)
    ops = []
    for _ in range(100):
        ops.append(("insert", rng.integers(0, 40, int(rng.integers(1, 40))).tolist()))
        ops.append(("propose", (rng.integers(0, 40, 3).tolist(), 12, 4, None)))
    trie = NgramTrie(3, 2000)  # 4096 slots in all
    sizes = []
    for kind, arg in ops[:30]:  # 15 inserts
        if kind == "insert":
            trie.insert(arg)
            sizes.append(trie._used)
            _check_invariants(trie)
    assert sizes[0] == T.MIN_TABLE < sizes[-1] < len(trie._table) and trie.n_evictions == 0
    trie, _ = _run(3, 2000, ops, check_every_op=False)
    assert trie.n_evictions > 0 and trie._used == len(trie._table)


@pytest.mark.parametrize("capacity, tokens", [(1 << 12, 300), (1 << 12, 3000), (256, 2000)])
def test_clear_leaves_a_new_tries_arrays(capacity, tokens):
    """``clear`` writes the root's row and the state, and zeroes the live nodes' hash entries (all of the table past
    a quarter of the capacity): the arrays are then a new trie's as the kernels read them (the rows above ``S_HIGH``
    count as a new trie's), and it behaves as one."""
    rng = np.random.default_rng(capacity + tokens)
    trie = NgramTrie(max_n=6, capacity=capacity)
    new = NgramTrie(max_n=6, capacity=capacity)
    for _ in range(2):
        trie.insert(rng.integers(0, 50, tokens))
        trie.clear()
        fresh = K.empty_arrays(6, capacity)
        # (no open path)
        assert np.array_equal(trie._state[:K.S_OPEN], fresh[3][:K.S_OPEN]) and trie._state[K.S_HIGH] == 0
        for got, want in zip(_written(trie) + (trie._table,), _written(new) + (fresh[2],)):
            assert np.array_equal(got, want)
        assert trie._used == min(T.MIN_TABLE, len(trie._table))  # the table in use is a new trie's again
    seq = rng.integers(0, 50, 200)
    again = NgramTrie(max_n=6, capacity=capacity)
    again.insert(rng.integers(0, 50, tokens))
    again.clear()
    again.insert(seq)
    new.insert(seq)
    assert [a.tolist() for a in again.propose(seq[-3:], 16, 6)] == [b.tolist() for b in new.propose(seq[-3:], 16, 6)]


@pytest.mark.parametrize("capacity", [64, 300, 4096])  # 64 and 300: evicting
def test_rows_above_the_high_water_mark_are_never_read(capacity):
    """A new trie writes only its root's row: every row above ``S_HIGH`` counts as a new trie's, whatever it holds.
    Filled with garbage there (as a reused or never-written allocation is), a trie inserts, proposes, evicts, clears
    and pickles exactly as one whose rows all hold a new trie's values."""
    rng = np.random.default_rng(capacity)
    dirty, clean = NgramTrie(max_n=4, capacity=capacity), NgramTrie(max_n=4, capacity=capacity)
    K.fresh_rows(clean._nodes, clean._stats, capacity, 1, capacity)

    def soil():  # garbage in every row above the high-water mark
        high = int(dirty._state[K.S_HIGH])
        dirty._nodes[high + 1:] = rng.integers(-5, capacity + 5, dirty._nodes[high + 1:].shape)
        dirty._stats[high + 1:] = rng.integers(-5, 1000, dirty._stats[high + 1:].shape)

    for round_ in range(6):
        soil()
        for _ in range(8):
            part = rng.integers(0, 30, int(rng.integers(1, 60)))
            dirty.insert(part)
            clean.insert(part)
            ctx = rng.integers(0, 30, 3)
            assert [a.tolist() for a in dirty.propose(ctx, 12, 4)] == [b.tolist() for b in clean.propose(ctx, 12, 4)]
        assert dirty.ngrams() == clean.ngrams() and dirty.max_token() == clean.max_token()
        assert dirty.n_evictions == clean.n_evictions
        _check_invariants(dirty)
        copied = pickle.loads(pickle.dumps(dirty))
        assert copied.ngrams() == clean.ngrams()
        _check_invariants(copied)
        if round_ == 3:
            dirty.clear()
            clean.clear()
    if capacity == 64:
        assert clean.n_evictions > 0


def test_insert_rows_docstring_example():
    trie = NgramTrie(3, 64)
    trie.insert_rows(np.array([[1, 2], [2, 3]]))
    grams = trie.ngrams()
    assert (1, 2) in grams and (2, 3) in grams and (2, 2) not in grams
    with pytest.raises(ValueError, match="2-D"):
        trie.insert_rows([1, 2])
    with pytest.raises(ValueError, match="int32"):
        trie.insert_rows([[1, -2]])
    trie.insert_rows(np.zeros((0, 3), np.int64))  # nothing to insert
    assert trie.ngrams() == grams


@settings(max_examples=80, **_SETTINGS)
@given(max_n=st.integers(2, 5), capacity=st.sampled_from([100, 1 << 11]), seed=st.integers(0, 2**32 - 1),
       shape=st.tuples(st.integers(1, 12), st.integers(1, 6)))
def test_insert_rows_equals_a_reset_and_an_insert_per_row(max_n, capacity, seed, shape):
    """One kernel call for the window's harvest: the same arrays (so the same proposals) as the loop it replaces,
    after a stream that was open before, and with the last row's stream still open after."""
    rng = np.random.default_rng(seed)
    lead = rng.integers(0, 7, int(rng.integers(0, 40)))
    capacity = max(capacity, 4 * max_n * max_n)
    batched, looped = NgramTrie(max_n, capacity), NgramTrie(max_n, capacity)
    for _ in range(3):
        rows = rng.integers(0, 7, shape)
        tail = rng.integers(0, 7, 3)
        for t in (batched, looped):
            t.insert(lead)
        batched.insert_rows(rows)
        for row in rows:
            looped.reset_stream()
            looped.insert(row)
        for t in (batched, looped):
            t.insert(tail)
        assert batched.ngrams() == looped.ngrams()
        assert batched.step == looped.step and batched.n_evictions == looped.n_evictions
        for a, b in zip(_written(batched) + (batched._state,), _written(looped) + (looped._state,)):
            assert np.array_equal(a, b)
        # the same entries; the hash table's prefix in use may differ in size (one insert_rows grows it once for all
        # its rows, the loop row by row), and so may where an entry sits in it
        assert sorted(batched._table[batched._table != 0]) == sorted(looped._table[looped._table != 0])
        _check_invariants(batched)
