"""Token bans: processors that only forbid tokens at some lengths are applied to each row's top-k on the host.

``min_new_tokens``, ``min_length``, ``suppress_tokens`` and ``begin_suppress_tokens`` make ``generate`` build
processors that set some tokens' scores to -inf; for a greedy verdict the processed argmax is then the first
allowed token of the row's top-k, so the decoder does not run them on every verified row. Exactness is checked
against plain ``generate``, where the ban decides the output (EOS is the model's argmax).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.generation import logits_process as lp

from lookahead import LookaheadDecoder
from lookahead import verify as K
from lookahead._tuning import Tuning
from lookahead.compat import token_bans

FIXED = Tuning(adaptive=False)  # no budget: every step verifies the whole (shallowest-cut) draft

REPETITIVE = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]


def test_token_bans_docstring_example():
    rules = token_bans([lp.MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=5, min_new_tokens=3,
                                                             eos_token_id=2)])
    assert len(rules) == 1 and rules[0][0].tolist() == [2] and rules[0][1:] == (0, 8)
    assert token_bans([]) == ()
    assert token_bans([lp.TemperatureLogitsWarper(0.7)]) is None  # any other kind: scores must be computed
    rules = token_bans([lp.SuppressTokensAtBeginLogitsProcessor([4, 3], begin_index=9)])
    assert rules[0][0].tolist() == [3, 4] and rules[0][1:] == (9, 10)


def test_apply_bans_takes_the_first_allowed_token_and_says_when_it_cannot():
    ids = np.array([[[2, 7, 5], [7, 2, 5]]])
    vals = np.array([[[3.0, 2.0, 1.0], [3.0, 2.0, 1.0]]], dtype=np.float32)
    argmax = np.array([[2, 7]])
    ban = (np.array([2]), np.array([0, 1]), np.array([0]), np.array([8]))
    assert K.apply_bans(argmax, ids, vals, np.array([2]), np.array([[6, 8]]), *ban)
    assert argmax.tolist() == [[7, 7]]  # row 0 at length 6: 2 banned; row 1 at length 8: nothing banned
    argmax = np.array([[2, 7]])  # every candidate banned: the caller must process the scores
    assert not K.apply_bans(argmax, np.array([[[2, 2, 2], [7, 2, 5]]]), vals, np.array([1]), np.array([[6, 8]]), *ban)
    argmax = np.array([[4, 7]])  # argmax is not the top-1 (a NaN row): undecidable
    assert not K.apply_bans(argmax, ids, vals, np.array([1]), np.array([[6, 8]]), *ban)


def _row(argmax_of_rows, vocab=10):
    """float32[1, q, vocab] logits whose row ``i`` has 3 at ``argmax_of_rows[i]``, 2 at the next id and 0 elsewhere:
    a row's top-2 is (its argmax, the next id)."""
    q = len(argmax_of_rows)
    logits = np.zeros((1, q, vocab), np.float32)
    for i, a in enumerate(argmax_of_rows):
        logits[0, i, a] = 3.0
        logits[0, i, (a + 1) % vocab] = 2.0
    return logits


def _greedy_row(logits, rows, k, tokens, parents, length, ban):
    q = logits.shape[1]
    tokens, parents = np.array(tokens, np.int64), np.array(parents, np.int64)
    depth = np.zeros(len(tokens), np.int64)
    for j, p in enumerate(parents):
        depth[j] = 1 if p < 0 else depth[p] + 1
    argmax, ids, vals = np.empty((1, q), np.int64), np.empty((1, q, k), np.int64), np.empty((1, q, k), np.float32)
    decided, nodes, out = K.greedy_row(logits, rows, k, tokens, parents, depth, length, *ban, argmax, ids, vals)
    return decided, nodes.tolist(), out.tolist(), argmax[0, :rows].tolist(), ids[0, : len(tokens) + 1].tolist()


def test_greedy_row_reads_bans_and_walks_in_one_call():
    none = (np.zeros(0, np.int64),) * 4
    # root argmax 5 -> node 0 (5), its row's argmax 9: no child 9 -> emits [5, 9]; row 3 is a window row
    logits = _row([5, 9, 4, 7])
    assert _greedy_row(logits, 4, 2, [5, 7], [-1, -1], 20, none) == (
        True, [0], [5, 9], [5, 9, 4, 7], [[5, 6], [9, 0], [4, 5]])
    # the same rows with id 9 banned while the length is below 22: node 0's row (length 21) emits its second, 0
    ban = (np.array([9]), np.array([0, 1]), np.array([0]), np.array([22]))
    assert _greedy_row(logits, 4, 2, [5, 7], [-1, -1], 20, ban)[:4] == (True, [0], [5, 0], [5, 0, 4, 7])
    # at length 21 the root row is 21 long and node 0's 22: the ban holds for neither of 5 / 9
    assert _greedy_row(logits, 4, 2, [5, 7], [-1, -1], 21, ban)[:3] == (True, [0], [5, 9])
    # a chain the rows agree with: 5 -> 9 -> 4 accepted, then the bonus token 7
    assert _greedy_row(logits, 4, 2, [5, 9, 4], [-1, 0, 1], 20, none)[:3] == (True, [0, 1, 2], [5, 9, 4, 7])
    # the root's top-2 both banned: undecided, the caller processes the scores
    ban = (np.array([5, 6]), np.array([0, 2]), np.array([0]), np.array([100]))
    assert _greedy_row(logits, 4, 2, [5, 7], [-1, -1], 20, ban)[:3] == (False, [], [])


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_min_new_tokens_with_eos_likely_is_exact_on_the_fast_path(tiny_models, arch, monkeypatch):
    model = tiny_models(arch)
    ids = torch.tensor([REPETITIVE])
    # the token the model emits first is declared EOS: min_new_tokens alone keeps it from ending at once
    first = int(model.generate(ids, max_new_tokens=1, do_sample=False, eos_token_id=None)[0, -1])
    kw = dict(max_new_tokens=24, min_new_tokens=12, do_sample=False, eos_token_id=first, pad_token_id=0)
    plain = model.generate(ids, **kw)
    runs = []  # calls of the min-new-tokens processor itself
    real = lp.MinNewTokensLengthLogitsProcessor.__call__
    monkeypatch.setattr(lp.MinNewTokensLengthLogitsProcessor, "__call__",
                        lambda self, i, s: runs.append(i.shape[-1]) or real(self, i, s))
    called = []
    spy = lp.LogitsProcessorList([_Spy(called)])
    dec = LookaheadDecoder(_tuning=FIXED)
    ours = model.generate(ids, **kw, custom_generate=dec)
    assert ours.tolist() == plain.tolist()
    assert not runs  # the bans were applied to the rows' top-k; the processor never ran
    assert dec.stats.target_calls < ours.shape[1] - ids.shape[1] or ours.shape[1] - ids.shape[1] <= 2
    # with a processor of another kind beside it, every verified row is processed: still exact
    again = model.generate(ids, **kw, logits_processor=spy, custom_generate=LookaheadDecoder(_tuning=FIXED))
    assert again.tolist() == model.generate(ids, **kw, logits_processor=lp.LogitsProcessorList([_Spy([])])).tolist()
    assert called


class _Spy(lp.LogitsProcessor):
    """A processor of another kind (it changes nothing): its presence turns the fast path off."""

    def __init__(self, calls: list):
        self.calls = calls

    def __call__(self, input_ids, scores):
        self.calls.append(input_ids.shape[-1])
        return scores


def test_suppress_tokens_and_begin_suppress_tokens_are_exact(tiny_models):
    model = tiny_models("llama")
    ids = torch.tensor([REPETITIVE])
    top = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None)[0, len(REPETITIVE):].tolist()
    for kw in (dict(suppress_tokens=top[:2]), dict(begin_suppress_tokens=top[:1]),
               dict(suppress_tokens=top[1:3], min_length=len(REPETITIVE) + 4, eos_token_id=top[0])):
        plain = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=0, **kw)
        ours = model.generate(ids, max_new_tokens=16, pad_token_id=0, custom_generate=LookaheadDecoder(), **kw)
        assert ours.tolist() == plain.tolist(), kw


def test_bans_in_a_batch_are_exact(tiny_models):
    model = tiny_models("qwen2")
    ids = torch.tensor([REPETITIVE, REPETITIVE[::-1]])
    first = model.generate(ids, max_new_tokens=1, do_sample=False, eos_token_id=None)[:, -1].tolist()
    kw = dict(max_new_tokens=20, min_new_tokens=8, do_sample=False, eos_token_id=first[0], pad_token_id=0)
    plain = model.generate(ids, **kw)
    ours = model.generate(ids, **kw, custom_generate=LookaheadDecoder(_tuning=FIXED))
    assert ours.tolist() == plain.tolist()
