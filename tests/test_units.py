"""Unit tests with hand-written inputs and exact expected outputs: packing, verification, KV compaction."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import DynamicCache, LogitsProcessorList

from lookahead import kv
from lookahead._tuning import DEFAULT
from lookahead.compat import cache_kwarg_name
from lookahead.drafting.trees import tree_depth_rank
from lookahead.kv import column_moves, keep_entries
from lookahead.verify.sampled import children_lists, greedy_verify_argmax, verify
from lookahead.whole_step import pack_step

MAX_MOVES = DEFAULT.max_moves

# --- tree packing ---------------------------------------------------------------------------


def test_depths_and_visibility():
    parents = np.array([-1, -1, 0, 2, 1])
    assert tree_depth_rank(parents)[0].tolist() == [1, 1, 2, 3, 2]
    _, _, mask = pack_step(np.array([1]), np.array([0]), np.arange(5), parents, None, 0, torch.float32)
    assert (mask[0, 0, 1:, 1:] == 0).int().tolist() == [  # among the nodes: itself and its ancestors
        [1, 0, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 0, 1, 1, 0],
        [0, 1, 0, 0, 1],
    ]


def test_depths_reject_non_parent_first():
    with pytest.raises(ValueError, match="parent-first"):
        tree_depth_rank(np.array([1, -1]))


def test_pack_step_docstring_example():
    pending = torch.tensor([[50]])
    pending_pos = torch.tensor([[10]])
    ids, pos, mask = pack_step(pending, pending_pos, np.array([7, 8, 9]), np.array([-1, -1, 0]), None, 2,
                               torch.float32)
    assert ids.tolist() == [[50, 7, 8, 9]]
    assert pos.tolist() == [[10, 11, 11, 12]]
    assert mask.shape == (1, 1, 4, 6)
    seen = (mask[0, 0] == 0).int().tolist()
    assert seen == [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 0, 1, 0],
        [1, 1, 1, 1, 0, 1],
    ]
    assert mask.min().item() == torch.finfo(torch.float32).min


def test_pack_step_prefill_with_padding_and_tree():
    pending = torch.tensor([[0, 5, 6]])  # first token is padding
    pending_pos = torch.tensor([[0, 0, 1]])
    col_visible = torch.tensor([False, True, True])
    ids, pos, mask = pack_step(pending, pending_pos, np.array([4]), np.array([-1]), col_visible, 0, torch.float64)
    assert ids.tolist() == [[0, 5, 6, 4]]
    assert pos.tolist() == [[0, 0, 1, 2]]
    assert (mask[0, 0] == 0).int().tolist() == [
        [0, 0, 0, 0],
        [0, 1, 0, 0],
        [0, 1, 1, 0],
        [0, 1, 1, 1],
    ]


@pytest.mark.parametrize("dtype, padded", [(torch.float32, False), (torch.bfloat16, True)])
def test_step_mask_steps_equal_pack_step(dtype, padded):
    """``StepMask.step`` (one kernel call into buffers kept across steps) gives each step of a decode what
    ``pack_step`` builds anew: ids, positions and mask, for random trees with and without window rows, while the
    context grows; a step larger than the buffer's rows takes the general path, and the next one the buffers again."""
    from lookahead.drafting.draft import WindowRows
    from lookahead.packing import StepMask

    rng = np.random.default_rng(0)
    col_visible = np.ones(200, bool)
    if padded:
        col_visible[[0, 1, 5]] = False
    steps = StepMask(12, 200, dtype, "cpu", col_visible if padded else None)
    past = 8
    for step in range(30):
        n = int(rng.integers(0, 12)) if step != 7 else 20  # step 7: more rows than the buffer has
        parents = np.array([int(rng.integers(-1, i)) for i in range(n)], np.int64)
        tokens = rng.integers(0, 100, n).astype(np.int64)
        depth, _ = tree_depth_rank(parents)
        window = None
        if step % 3 == 0:
            m = int(rng.integers(1, 4))
            window = WindowRows(rng.integers(0, 100, m).astype(np.int64), np.arange(1, m + 1, dtype=np.int64),
                                np.tril(np.ones((m, m), bool)))
        pending, pending_pos = np.array([int(rng.integers(0, 100))]), np.array([past + 3])
        ids, pos, mask = steps.step(past, pending, pending_pos, tokens, depth, parents, window)
        want = pack_step(pending, pending_pos, tokens, parents, col_visible[: past + 1] if padded else None, past,
                         dtype, window, "cpu", depth)
        assert torch.equal(ids, want[0]) and torch.equal(pos, want[1])
        assert torch.equal(mask, want[2].to(dtype)), step
        past += int(rng.integers(1, 4))


def test_pack_step_without_tree_is_a_plain_step():
    ids, pos, mask = pack_step(torch.tensor([[3]]), torch.tensor([[4]]), np.zeros(0, np.int64),
                               np.zeros(0, np.int64), None, 4, torch.float32)
    assert ids.tolist() == [[3]] and pos.tolist() == [[4]]
    assert (mask == 0).all() and mask.shape == (1, 1, 1, 5)


# --- greedy verification --------------------------------------------------------------------


def test_children_lists():
    assert children_lists([5, 7, 9], [-1, -1, 0]) == [{5: 0, 7: 1}, {9: 2}, {}, {}]


def test_greedy_docstring_example():
    v = greedy_verify_argmax([5, 9, 3, 4], [5, 7, 9], [-1, -1, 0])
    assert v.nodes == [0, 2] and v.tokens == [5, 9, 4]


def test_greedy_rejects_at_root():
    v = greedy_verify_argmax([6, 9, 3, 4], [5, 7, 9], [-1, -1, 0])
    assert v.nodes == [] and v.tokens == [6]


def test_greedy_takes_second_branch():
    v = greedy_verify_argmax([7, 0, 2, 1], [5, 7, 9], [-1, -1, 0])
    assert v.nodes == [1] and v.tokens == [7, 2]


def _onehot_logits(argmaxes, vocab=12):
    logits = torch.zeros(len(argmaxes), vocab)
    for r, a in enumerate(argmaxes):
        logits[r, a] = 5.0
        logits[r, (a + 1) % vocab] = 4.0  # runner-up
    return logits


def test_greedy_verify_tensor_path_matches_host_walk():
    logits = _onehot_logits([5, 9, 3, 4])
    v = verify(logits, [5, 7, 9], [-1, -1, 0], torch.tensor([[1, 2]]))
    assert v.nodes == [0, 2] and v.tokens == [5, 9, 4]


class _Ban:
    """A logits processor that bans token ``tok`` once the prefix is longer than ``after``."""

    def __init__(self, tok, after):
        self.tok, self.after, self.seen = tok, after, []

    def __call__(self, input_ids, scores):
        self.seen.append(input_ids[0].tolist())
        if input_ids.shape[1] > self.after:
            scores = scores.clone()
            scores[:, self.tok] = -float("inf")
        return scores


def test_greedy_verify_applies_processors_lazily_with_each_prefix():
    logits = _onehot_logits([5, 9, 3, 4])
    ban = _Ban(9, after=2)  # from prefix length 3 on, token 9 is banned: node 0's argmax becomes 10
    v = verify(logits, [5, 7, 9], [-1, -1, 0], torch.tensor([[1, 2]]), LogitsProcessorList([ban]),
                      keep_scores=True)
    assert v.nodes == [0] and v.tokens == [5, 10]
    assert ban.seen == [[1, 2], [1, 2, 5]]  # only the walked path, each with its own prefix
    assert len(v.scores) == 2 and v.scores[1][0, 9] == -float("inf")


# --- KV compaction --------------------------------------------------------------------------


def _cache_with(values: list[list[float]], dtype=torch.float32):
    """A 1-layer DynamicCache whose keys/values at position i equal values[i]."""
    cache = DynamicCache()
    t = torch.tensor(values, dtype=dtype)[None, None]  # [1, 1, seq, dim]
    cache.update(t, t + 100, 0)
    return cache


def test_keep_entries_gathers_then_crops():
    cache = _cache_with([[0.0], [1.0], [2.0], [3.0], [4.0], [5.0], [6.0]])  # 2 old + 5 new
    keep_entries(cache, n_new=5, keep=[0, 2, 4])
    keys = cache.layers[0].keys[0, 0, :, 0].tolist()
    assert keys == [0.0, 1.0, 2.0, 4.0, 6.0]
    assert cache.layers[0].values[0, 0, :, 0].tolist() == [100.0, 101.0, 102.0, 104.0, 106.0]
    assert cache.get_seq_length() == 5


def test_keep_entries_prefix_only_crops():
    cache = _cache_with([[0.0], [1.0], [2.0], [3.0]])
    keep_entries(cache, n_new=3, keep=[0, 1])
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [0.0, 1.0, 2.0]


def test_column_moves_are_runs_of_displaced_columns():
    assert column_moves([0, 1, 2, 9, 10]) == [(3, 9, 2)]
    assert column_moves([0, 2, 5]) == [(1, 2, 1), (2, 5, 1)]
    assert column_moves([0, 1]) == [] and column_moves([]) == []
    assert column_moves([0, 2, 3, 4, 5]) == [(1, 2, 4)]  # overlaps its destination
    assert column_moves([3, 4, 8]) == [(0, 3, 2), (2, 8, 1)]


@pytest.mark.parametrize("dtype, copies", [(torch.float32, "numpy"), (torch.bfloat16, "numpy"),
                                           (torch.float32, "torch")])
def test_keep_entries_equals_a_gather_for_any_kept_columns(dtype, copies, monkeypatch):
    """Every kept set (one run, overlapping runs, scattered ones past MAX_MOVES): the gather's result, with the
    copies a CPU makes (on NumPy views; bf16 as its bits) and those of other devices (torch's)."""
    if copies == "torch":
        monkeypatch.setattr(kv, "host_view", lambda t: None)
    rng = np.random.default_rng(0)
    kinds = set()
    for _ in range(300):
        old, new = int(rng.integers(0, 4)), int(rng.integers(1, 12))
        keep = sorted(rng.choice(new, int(rng.integers(1, new + 1)), replace=False).tolist())
        kinds.add(min(len(column_moves(keep)), MAX_MOVES + 1))
        values = rng.normal(size=(old + new, 2)).tolist()
        cache = _cache_with(values, dtype)
        want = torch.tensor(values, dtype=dtype)[list(range(old)) + [old + k for k in keep]]
        keep_entries(cache, n_new=new, keep=keep)
        assert torch.equal(cache.layers[0].keys[0, 0], want)
        assert torch.equal(cache.layers[0].values[0, 0], want + 100)
    assert kinds == {0, 1, 2, 3}  # no move, one run, two, a gather


def test_compacted_cache_matches_plain_decoding(tiny_models):
    """Forward a tree, keep one branch: the cache equals the cache of decoding that branch plainly."""
    model = tiny_models("llama")
    prompt = torch.tensor([[3, 10, 11, 12]])
    tree_tokens, tree_parents = np.array([20, 30, 31, 32]), np.array([-1, -1, 1, 2])  # branch 30,31,32
    cache = DynamicCache(config=model.config)
    pos = torch.arange(4)[None]
    ids, tpos, mask = pack_step(prompt, pos, tree_tokens, tree_parents, None, 0, model.dtype)
    kw = cache_kwarg_name(model)  # `cache` on 5.24, `past_key_values` on 5.17 (which ignores `cache=`)
    model(input_ids=ids, position_ids=tpos, attention_mask=mask, use_cache=True, **{kw: cache})
    keep_entries(cache, n_new=8, keep=[0, 1, 2, 3, 5, 6, 7])

    ref = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([[3, 10, 11, 12, 30, 31, 32]]), use_cache=True, **{kw: ref})
    assert cache.get_seq_length() == ref.get_seq_length() == 7
    for a, b in zip(cache.layers, ref.layers):
        torch.testing.assert_close(a.keys, b.keys, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(a.values, b.values, rtol=1e-9, atol=1e-9)
