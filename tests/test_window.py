"""The Jacobi lookahead window: layout, harvesting, sliding, and that it really contributes drafts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lookahead import LookaheadDecoder
from lookahead._tuning import Tuning
from lookahead.drafting.window import LookaheadWindow, window_layout, window_step
from lookahead.whole_step import pack_step

from tiny import TINY_ARCHS

NO_REPEAT = [3, 41, 7, 88, 19, 64, 2, 53, 30, 77, 9]


def test_layout_docstring_example():
    offsets, visible = window_layout(2, 2)
    assert offsets.tolist() == [1, 2, 2, 3]
    assert visible.astype(int).tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]


def test_layout_three_levels_width_three():
    offsets, visible = window_layout(3, 3)
    # rows: (0,0) (0,1) (0,2) (1,0) (1,1) (1,2) (2,0) (2,1) (2,2)
    assert offsets.tolist() == [1, 2, 3, 2, 3, 4, 3, 4, 5]
    # (2,1) sees level-0 column 0, then its own column's levels 0 and 1, then itself
    assert np.flatnonzero(visible[7]).tolist() == [0, 1, 4, 7]
    # every row's visible rows sit at consecutive positions 1..offset: a causal guessed prefix
    for r in range(9):
        assert sorted(offsets[visible[r]].tolist()) == list(range(1, offsets[r] + 1))


def harvest_ngrams(levels: np.ndarray, outputs: np.ndarray) -> np.ndarray:
    """The reference harvest (the module docstring's): int64[W, N] from levels int[N-1, W] and outputs int[W]."""
    return np.concatenate([np.asarray(levels, dtype=np.int64), np.asarray(outputs, dtype=np.int64)[None]]).T


def test_harvest_docstring_example():
    _, grams, _ = window_step(np.array([[5, 6, 7], [8, 9, 4]]), np.array([1, 2, 3]), 3, 0, np.zeros(0, np.int64), 0)
    assert grams.tolist() == harvest_ngrams(np.array([[5, 6, 7], [8, 9, 4]]), np.array([1, 2, 3])).tolist()
    assert grams.tolist() == [[5, 8, 1], [6, 9, 2], [7, 4, 3]]


def test_window_fill_then_harvest_then_slide():
    win = LookaheadWindow(3, 3, [10, 11, 12, 13])
    assert len(win.levels) == 1
    first = win.levels.copy()
    grams = win.advance(np.array([5, 6, 7]), emitted=1)  # filling: no harvest, a level is added
    assert grams.shape == (0, 3) and len(win.levels) == 2  # full: N - 1 levels
    assert win.levels.tolist() == [first[0].tolist(), [5, 6, 7]]
    grams = win.advance(np.array([0, 0, 0, 1, 2, 3]), emitted=1)  # full: harvest, shift levels up
    assert grams.tolist() == [[first[0, 0], 5, 1], [first[0, 1], 6, 2], [first[0, 2], 7, 3]]
    assert win.levels.tolist() == [[5, 6, 7], [1, 2, 3]]
    win.advance(np.array([0, 0, 0, 8, 9, 4]), emitted=2)  # 2 tokens emitted: slide one column left
    assert win.levels[:, :2].tolist() == [[2, 3], [9, 4]]
    assert set(win.levels[:, 2].tolist()) <= {10, 11, 12, 13}  # fresh guesses come from the context


def test_pack_step_with_tree_and_window_never_see_each_other():
    offsets, visible = window_layout(2, 2)
    tokens = np.array([60, 61, 62, 63])
    ids, pos, mask = pack_step(torch.tensor([[50]]), torch.tensor([[9]]), np.array([7, 8]), np.array([-1, 0]),
                               None, 1, torch.float32, (tokens, offsets, visible))
    assert ids.tolist() == [[50, 7, 8, 60, 61, 62, 63]]
    assert pos.tolist() == [[9, 10, 11, 10, 11, 11, 12]]
    seen = (mask[0, 0] == 0).int().numpy()
    assert seen.shape == (7, 8)
    assert seen[:, :2].all()  # everyone sees the cached token and the pending token
    # rows: pending, tree 7, tree 8, window x4; columns: cached, pending, tree 7, tree 8, window x4
    assert not seen[1:3, 4:].any() and not seen[3:, 2:4].any()  # tree and window are separate
    assert seen[1:3, 2:4].tolist() == [[1, 0], [1, 1]]
    assert seen[3:, 4:].tolist() == visible.astype(int).tolist()


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_equivalence_with_window(tiny_models, arch):
    model = tiny_models(arch)
    ids = torch.tensor([NO_REPEAT])
    plain = model.generate(ids, do_sample=False, max_new_tokens=48, eos_token_id=None)
    dec = LookaheadDecoder(window=4, _tuning=Tuning(window_ngram=4, window_candidates=3))
    ours = model.generate(ids, custom_generate=dec, max_new_tokens=48, eos_token_id=None)
    assert ours.tolist() == plain.tolist()
    assert dec.stats.target_calls < dec.stats.new_tokens


def test_window_contributes_accepted_drafts(tiny_models):
    """On a prompt without repetition, some accepted drafts come from window-made n-grams."""
    model = tiny_models("llama")
    dec = LookaheadDecoder(window=4, _tuning=Tuning(window_ngram=4, window_candidates=4))
    model.generate(torch.tensor([NO_REPEAT]), custom_generate=dec, max_new_tokens=60, eos_token_id=None)
    assert dec.stats.accepted_by_origin["window"] > 0
    assert dec.stats.drafted_by_origin["window"] >= dec.stats.accepted_by_origin["window"]
    off = LookaheadDecoder(window=0)
    model.generate(torch.tensor([NO_REPEAT]), custom_generate=off, max_new_tokens=60, eos_token_id=None)
    assert off.stats.drafted_by_origin["window"] == 0
    assert dec.stats.target_calls < off.stats.target_calls


def test_window_with_sampling_is_reproducible(tiny_models):
    model = tiny_models("qwen2")
    dec = LookaheadDecoder(window=3, _tuning=Tuning(window_ngram=3))
    outs = []
    for _ in range(2):
        torch.manual_seed(5)
        outs.append(model.generate(torch.tensor([NO_REPEAT]), custom_generate=dec, do_sample=True, max_new_tokens=30,
                                   eos_token_id=None).tolist())
    assert outs[0] == outs[1]


def test_window_step_equals_the_numpy_steps_it_replaces():
    """``drafting.window.window_step`` (one call per step) against harvest, concatenations and fresh columns in
    NumPy."""
    rng = np.random.default_rng(0)
    lv, grams, cursor = window_step(np.array([[5, 6, 7], [8, 9, 4]]), np.array([1, 2, 3]), 3, 1,
                                      np.array([20, 21]), 0)  # the docstring's example
    assert lv.tolist() == [[9, 4, 20], [2, 3, 21]] and grams.tolist() == [[5, 8, 1], [6, 9, 2], [7, 4, 3]]
    assert cursor == 2
    for _ in range(300):
        ngram, width = int(rng.integers(2, 6)), int(rng.integers(1, 9))
        n_levels = int(rng.integers(1, ngram))
        levels, out = rng.integers(0, 50, (n_levels, width)), rng.integers(0, 50, width)
        shift = int(rng.integers(0, width + 1))
        draws, cursor = rng.integers(0, 50, 64), int(rng.integers(0, 10))
        if n_levels == ngram - 1:
            want_grams, want = harvest_ngrams(levels, out), np.concatenate([levels[1:], out[None]])
        else:
            want_grams, want = np.zeros((0, ngram), np.int64), np.concatenate([levels, out[None]])
        need = shift * len(want)
        if shift:
            want = np.concatenate([want[:, shift:], draws[cursor : cursor + need].reshape(len(want), shift)], axis=1)
        got, grams, after = window_step(levels, out, ngram, shift, draws, cursor)
        assert got.tolist() == want.tolist() and grams.tolist() == want_grams.tolist() and after == cursor + need
        assert grams.shape == want_grams.shape


def test_window_fresh_guesses_are_drawn_ahead_deterministically():
    a, b = LookaheadWindow(4, 3, list(range(100, 140))), LookaheadWindow(4, 3, list(range(100, 140)))
    for step in range(200):  # past several refills of the drawn-ahead guesses
        out = np.arange(len(a.levels) * 4) + step
        a.advance(out, emitted=5)  # a slide of all 4 columns: every guess fresh
        b.advance(out, emitted=5)
        assert a.levels.tolist() == b.levels.tolist()
        assert set(a.levels.ravel().tolist()) <= set(range(100, 140))
