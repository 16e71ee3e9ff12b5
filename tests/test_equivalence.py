"""Headline: greedy LookaheadDecoder output == plain greedy generate, token for token."""

from __future__ import annotations

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from lookahead import LookaheadDecoder

from tiny import TINY_ARCHS

REPETITIVE = [3, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11]
NO_REPEAT = [3, 41, 7, 88, 19, 64, 2, 53, 30, 77, 9]


def _both(model, prompt, **kw):
    ids = torch.tensor([prompt])
    plain = model.generate(ids, do_sample=False, **kw)
    dec = LookaheadDecoder()
    ours = model.generate(ids, custom_generate=dec, **kw)
    return plain, ours, dec.stats


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_repetitive_prompt_same_tokens_fewer_calls(tiny_models, arch):
    model = tiny_models(arch)
    plain, ours, stats = _both(model, REPETITIVE, max_new_tokens=48, eos_token_id=None)
    assert ours.tolist() == plain.tolist()
    assert ours.shape[1] == len(REPETITIVE) + 48  # ran to full length
    assert stats.new_tokens == 48
    assert stats.target_calls < stats.new_tokens  # drafts were really accepted


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_prompt_without_repetition_same_tokens(tiny_models, arch):
    model = tiny_models(arch)
    plain, ours, stats = _both(model, NO_REPEAT, max_new_tokens=40, eos_token_id=None)
    assert ours.tolist() == plain.tolist()
    assert stats.target_calls <= stats.new_tokens


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_eos_inside_accepted_block(tiny_models, arch):
    model = tiny_models(arch)
    ids = torch.tensor([REPETITIVE])
    free = model.generate(ids, do_sample=False, max_new_tokens=48, eos_token_id=None)[0, len(REPETITIVE):]
    # pick as EOS a token that the free run emits late, so that it is reached inside a drafted block
    dec = LookaheadDecoder()
    model.generate(ids, custom_generate=dec, max_new_tokens=48, eos_token_id=None)
    eos = int(free[20])
    first = free.tolist().index(eos)
    plain, ours, stats = _both(model, REPETITIVE, max_new_tokens=48, eos_token_id=eos)
    assert ours.tolist() == plain.tolist()
    assert ours.shape[1] == len(REPETITIVE) + first + 1  # nothing after the EOS
    assert stats.new_tokens == first + 1


def test_several_eos_ids(tiny_models):
    model = tiny_models("qwen2")
    ids = torch.tensor([REPETITIVE])
    free = model.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None)[0, len(REPETITIVE):].tolist()
    eos = [free[30], free[12]]
    plain, ours, _ = _both(model, REPETITIVE, max_new_tokens=40, eos_token_id=eos)
    assert ours.tolist() == plain.tolist()
    assert ours.shape[1] < len(REPETITIVE) + 40


class _StopOnToken(StoppingCriteria):
    """Stops when the last token is ``token`` (a user-written criterion)."""

    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kw):
        return input_ids[:, -1] == self.token


def test_user_stopping_criteria_token_by_token(tiny_models):
    model = tiny_models("mistral")
    ids = torch.tensor([REPETITIVE])
    free = model.generate(ids, do_sample=False, max_new_tokens=40, eos_token_id=None)[0, len(REPETITIVE):].tolist()
    stop = StoppingCriteriaList([_StopOnToken(free[25])])
    plain, ours, _ = _both(model, REPETITIVE, max_new_tokens=40, eos_token_id=None, stopping_criteria=stop)
    assert ours.tolist() == plain.tolist()
    assert ours.shape[1] == len(REPETITIVE) + free.index(free[25]) + 1


def test_max_length_honoured(tiny_models):
    model = tiny_models("llama")
    plain, ours, _ = _both(model, REPETITIVE, max_length=len(REPETITIVE) + 17, eos_token_id=None)
    assert ours.tolist() == plain.tolist()
    assert ours.shape[1] == len(REPETITIVE) + 17


def test_return_dict_in_generate(tiny_models):
    model = tiny_models("llama")
    ids = torch.tensor([REPETITIVE])
    kw = dict(max_new_tokens=20, eos_token_id=None, return_dict_in_generate=True, output_scores=True,
              output_logits=True)
    plain = model.generate(ids, do_sample=False, **kw)
    ours = model.generate(ids, custom_generate=LookaheadDecoder(), **kw)
    assert type(ours).__name__ == "GenerateDecoderOnlyOutput"
    assert ours.sequences.tolist() == plain.sequences.tolist()
    assert len(ours.scores) == len(plain.scores) == 20
    for a, b in zip(ours.scores, plain.scores):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    for a, b in zip(ours.logits, plain.logits):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_logits_processors_applied_per_node(tiny_models):
    """repetition_penalty and no_repeat_ngram change the argmax; the decoder must see them per node."""
    model = tiny_models("llama")
    kw = dict(max_new_tokens=40, eos_token_id=None, repetition_penalty=1.3, no_repeat_ngram_size=3)
    plain, ours, _ = _both(model, REPETITIVE, **kw)
    assert ours.tolist() == plain.tolist()


def test_left_padded_and_all_ones_attention_mask(tiny_models):
    model = tiny_models("llama")
    ids = torch.tensor([[0, 0, 0] + REPETITIVE])
    mask = torch.tensor([[0, 0, 0] + [1] * len(REPETITIVE)])
    for m in (mask, torch.ones_like(ids)):
        plain = model.generate(ids, attention_mask=m, do_sample=False, max_new_tokens=30, eos_token_id=None)
        ours = model.generate(ids, attention_mask=m, custom_generate=LookaheadDecoder(), max_new_tokens=30,
                              eos_token_id=None)
        assert ours.tolist() == plain.tolist()


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(num_beams=2), "num_beams"),
        (dict(num_beams=2, do_sample=True), "num_beams"),
        (dict(penalty_alpha=0.6, top_k=4), r"contrastive search \(penalty_alpha and top_k > 1\)"),
        (dict(dola_layers="high"), r"DoLa decoding \(dola_layers\)"),
        (dict(force_words_ids=[[5]]), r"constrained beam search \(force_words_ids"),
        (dict(prompt_lookup_num_tokens=3), "prompt_lookup_num_tokens"),
        (dict(assistant_model="tiny"), r"assistant_model= \(assisted decoding\)"),
    ],
)
def test_unsupported_modes_are_refused(tiny_models, kw, match):
    """Flags that ask generate for another decoding method are refused, not dropped: with a callable
    custom_generate, generate picks no method itself (and does not hand assistant_model= to it at all)."""
    model = tiny_models("llama")
    if kw.get("assistant_model") == "tiny":
        kw = dict(kw, assistant_model=tiny_models("qwen2"))
    with pytest.raises(ValueError, match=match):
        model.generate(torch.tensor([REPETITIVE]), custom_generate=LookaheadDecoder(), max_new_tokens=5, **kw)


def test_flags_plain_generate_decodes_greedily_are_kept(tiny_models):
    """penalty_alpha with top_k=1 is greedy search in plain generate (not contrastive search): decoded, the same."""
    model = tiny_models("llama")
    kw = dict(penalty_alpha=0.6, top_k=1, max_new_tokens=20, eos_token_id=None)
    plain = model.generate(torch.tensor([REPETITIVE]), **kw)
    ours = model.generate(torch.tensor([REPETITIVE]), custom_generate=LookaheadDecoder(), **kw)
    assert ours.tolist() == plain.tolist()


def test_batch_size_above_one_is_decoded_row_by_row(tiny_models):
    """Batches decode row by row exactly (``batch.Padded``, tests/test_batch.py); what they cannot do is refused."""
    model = tiny_models("llama")
    batch = torch.tensor([REPETITIVE, REPETITIVE[3:] + [3, 10, 11]])
    plain = model.generate(batch, max_new_tokens=5, do_sample=False, eos_token_id=None, pad_token_id=0)
    ours = model.generate(batch, custom_generate=LookaheadDecoder(), max_new_tokens=5, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    assert ours.tolist() == plain.tolist()
    with pytest.raises(ValueError, match="batch size > 1"):
        model.generate(batch, custom_generate=LookaheadDecoder(), max_new_tokens=5, return_dict_in_generate=True,
                       output_scores=True)
