"""``verify.rows_top``: every row's argmax (exactly torch's) and top-k in one pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lookahead.verify import rows_top


def run(logits, k):
    """The argmax and top ``k`` of every row of ``logits`` [r, V], as one batch row of ``rows_top``."""
    arr = np.asarray(logits, dtype=np.float32)[None]
    r = arr.shape[1]
    counts = np.array([r], np.int64)
    argmax, ids, vals = np.empty((1, r), np.int64), np.empty((1, r, k), np.int64), np.empty((1, r, k), np.float32)
    rows_top(arr, counts, counts, k, argmax, ids, vals)
    return argmax[0].tolist(), ids[0].tolist(), vals[0].tolist()


def test_hand_worked_rows():
    assert run([[1.0, 5.0, 5.0, 2.0]], 2) == ([1], [[1, 2]], [[5.0, 5.0]])
    assert run([[3.0, 1.0, 2.0]], 3) == ([0], [[0, 2, 1]], [[3.0, 2.0, 1.0]])
    inf = float("inf")
    assert run([[-inf, -inf, -inf]], 2) == ([0], [[0, 1]], [[-inf, -inf]])  # all masked: the first, as argmax
    assert run([[2.0, 1.0]], 4) == ([0], [[0, 1, -1, -1]], [[2.0, 1.0, -inf, -inf]])  # k beyond the vocabulary


def test_a_nan_is_the_argmax_as_torch_says():
    row = np.arange(200, dtype=np.float32)  # the NaN sits in a block that the maximum alone would skip
    row[70] = np.nan
    row[150] = np.nan
    arg, ids, _ = run([row], 3)
    assert arg == [int(torch.tensor(row).argmax())] == [70]
    assert ids == [[199, 198, 197]]


def test_later_blocks_and_ties_across_them():
    row = np.zeros(1000, np.float32)
    row[[10, 300, 900]] = 7.0  # a three-way tie for the maximum, in three blocks
    row[500] = 6.0
    arg, ids, vals = run([row], 4)
    assert arg == [10] and ids == [[10, 300, 900, 500]] and vals == [[7.0, 7.0, 7.0, 6.0]]


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 5), vocab=st.integers(1, 300), k=st.integers(1, 9), seed=st.integers(0, 2**31 - 1),
       levels=st.integers(2, 50))
def test_matches_torch(rows, vocab, k, seed, levels):
    gen = np.random.default_rng(seed)
    logits = gen.integers(0, levels, size=(rows, vocab)).astype(np.float32)  # few levels: many ties
    logits[gen.random((rows, vocab)) < 0.05] = -np.inf
    arg, ids, vals = run(logits, k)
    t = torch.from_numpy(logits)
    assert arg == t.argmax(-1).tolist()
    kk = min(k, vocab)
    expected = t.topk(kk, -1).values.numpy()
    assert np.array_equal(np.array(vals)[:, :kk], expected)  # the same values, largest first
    for r in range(rows):  # ids: the earliest index among equal values first
        order = sorted(range(vocab), key=lambda j: (-logits[r, j], j))[:kk]
        assert ids[r][:kk] == order


@settings(max_examples=60, deadline=None)
@given(vocab=st.integers(385, 4000), k=st.integers(1, 9), seed=st.integers(0, 2**31 - 1),
       levels=st.integers(2, 400), masked=st.sampled_from([0.05, 0.99, 1.0]))
def test_long_rows_and_many_candidates_match_torch(vocab, k, seed, levels, masked):
    """More than ``verify.RANKED_MAXIMA`` block maxima (so they are inserted, not ranked), and rows nearly or all
    masked: more than ``verify.RANKED`` candidates tie at the bound (inserted too)."""
    gen = np.random.default_rng(seed)
    logits = gen.integers(0, levels, size=(2, vocab)).astype(np.float32)
    logits[gen.random((2, vocab)) < masked] = -np.inf
    arg, ids, vals = run(logits, k)
    t = torch.from_numpy(logits)
    assert arg == t.argmax(-1).tolist()
    assert np.array_equal(np.array(vals), t.topk(k, -1).values.numpy())
    for r in range(2):
        assert ids[r] == sorted(range(vocab), key=lambda j: (-logits[r, j], j))[:k]


@pytest.mark.parametrize("vocab", [64, 49152])
def test_random_rows_like_a_model(vocab):
    logits = torch.randn(8, vocab, generator=torch.Generator().manual_seed(vocab)) * 3
    arg, ids, _ = run(logits.numpy(), 8)
    assert arg == logits.argmax(-1).tolist()
    assert ids == logits.topk(8, -1).indices.tolist()


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 6), top=st.integers(0, 6), vocab=st.integers(1, 300), seed=st.integers(0, 2**31 - 1),
       levels=st.integers(1, 40))
def test_rows_past_the_top_rows_get_torchs_argmax(rows, top, vocab, seed, levels):
    """Rows read for their argmax alone (a step's window rows): ties, -inf, signed zeros and NaN as torch has them."""
    gen = np.random.default_rng(seed)
    logits = (gen.integers(0, levels, size=(rows, vocab)) - levels // 2).astype(np.float32)  # zeros among them
    logits[gen.random((rows, vocab)) < 0.05] = -np.inf
    logits[gen.random((rows, vocab)) < 0.05] = -0.0
    logits[gen.random((rows, vocab)) < 0.01] = np.nan
    arr, top = logits[None], min(top, rows)
    argmax = np.empty((1, rows), np.int64)
    rows_top(arr, np.array([rows]), np.array([top]), 3, argmax, np.empty((1, rows, 3), np.int64),
             np.empty((1, rows, 3), np.float32))
    assert argmax[0].tolist() == torch.from_numpy(logits).argmax(-1).tolist()
