"""Bad input is refused at once, with a message that names what is wrong, before anything expensive runs."""

from __future__ import annotations

import pytest
import torch

from lookahead import LookaheadDecoder
from lookahead.checks import check_inputs
from lookahead.cost import Calibrations


class _Spy(Calibrations):
    """A calibration registry that records whether a curve was asked for (the first expensive step)."""

    def __init__(self):
        super().__init__()
        self.asked = 0

    def get(self, *args, **kwargs):
        self.asked += 1
        return super().get(*args, **kwargs)


def _decoder():
    spy = _Spy()
    return LookaheadDecoder(_calibrations=spy), spy


def test_token_ids_outside_the_vocabulary_fail_before_calibration(tiny_models):
    model = tiny_models("llama")  # vocabulary 96
    dec, spy = _decoder()
    with pytest.raises(IndexError, match=r"token id 500 \(row 0, position 2\).*vocabulary of 96"):
        model.generate(torch.tensor([[1, 2, 500, 3]]), max_new_tokens=4, custom_generate=dec)
    assert spy.asked == 0
    with pytest.raises(IndexError, match="token id -1"):
        check_inputs(torch.tensor([[1, -1]]), None, 96)


def test_a_right_padded_batch_is_refused_with_the_fix(tiny_models):
    model = tiny_models("llama")
    dec, spy = _decoder()
    ids = torch.tensor([[5, 6, 7, 0], [5, 6, 7, 8]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    with pytest.raises(ValueError, match=r"padding on the right of row 0.*padding_side = 'left'"):
        model.generate(ids, attention_mask=mask, max_new_tokens=4, custom_generate=dec)
    assert spy.asked == 0
    # left padding decodes, as plain generate does
    left = torch.tensor([[0, 5, 6, 7], [5, 6, 7, 8]])
    left_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    plain = model.generate(left, attention_mask=left_mask, max_new_tokens=4, do_sample=False)
    ours = model.generate(left, attention_mask=left_mask, max_new_tokens=4, custom_generate=LookaheadDecoder())
    assert ours.tolist() == plain.tolist()


def test_padding_inside_a_row_is_refused_too():
    with pytest.raises(ValueError, match="right of row 1"):
        check_inputs(torch.ones(2, 4, dtype=torch.long), torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1]]), 10)


def test_a_row_with_no_visible_token_is_refused(tiny_models):
    model = tiny_models("llama")
    dec, spy = _decoder()
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(ValueError, match="row 0 of attention_mask hides every token"):
        model.generate(ids, attention_mask=torch.zeros_like(ids), max_new_tokens=4, custom_generate=dec)
    assert spy.asked == 0


def test_the_empty_prompt_says_so():
    with pytest.raises(ValueError, match="input_ids is empty"):
        check_inputs(torch.zeros((1, 0), dtype=torch.long), None, 10)


def test_a_cache_longer_than_the_input_is_refused_before_calibration(tiny_models):
    from transformers import DynamicCache

    from lookahead.compat import cache_kwarg_name

    model = tiny_models("llama")
    ids = torch.tensor([[5, 6, 7, 8]])
    name = cache_kwarg_name(model)
    cache = DynamicCache(config=model.config)
    model(ids, use_cache=True, **{name: cache})  # the cache holds all 4 tokens
    dec, spy = _decoder()
    with pytest.raises(ValueError, match="cache already holds 4 tokens but input_ids has 4"):
        model.generate(ids, max_new_tokens=4, custom_generate=dec, **{name: cache})
    assert spy.asked == 0


def test_stop_strings_without_a_tokenizer_name_the_spellings_that_work(tiny_models):
    model = tiny_models("llama")
    with pytest.raises(ValueError, match=r"LookaheadDecoder\(tokenizer=tok\).*lookahead.enable"):
        model.generate(torch.tensor([[1, 2]]), max_new_tokens=4, stop_strings=["x"], custom_generate=LookaheadDecoder())
