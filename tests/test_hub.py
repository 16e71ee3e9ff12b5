"""``custom_generate=lookahead.hub.FOLDER``: transformers loads the decoder from a local folder (no network) and
returns plain ``generate``'s tokens, with streamers, stop strings, batches, settings and sampling."""

from __future__ import annotations

import os

import pytest
import torch
import transformers.dynamic_module_utils as dynamic_modules
from transformers.generation.streamers import BaseStreamer

import lookahead.hub
from lookahead import LookaheadDecoder
from lookahead.config import FLAT_CURVE

HUB = dict(custom_generate=lookahead.hub.FOLDER, trust_remote_code=True)


@pytest.fixture(autouse=True)
def _modules_folder(tmp_path, monkeypatch):
    """transformers copies a loaded generate.py into its modules folder: one of the test's, not the user's."""
    monkeypatch.setattr(dynamic_modules, "HF_MODULES_CACHE", str(tmp_path / "modules"))


class Collect(BaseStreamer):
    def __init__(self):
        self.tokens, self.ended = [], False

    def put(self, value):
        self.tokens += value.reshape(-1).tolist()

    def end(self):
        self.ended = True


def test_the_folder_holds_what_transformers_loads():
    folder = os.path.join(lookahead.hub.FOLDER, "custom_generate")
    assert sorted(os.listdir(folder)) >= ["generate.py", "requirements.txt"]
    with open(os.path.join(folder, "requirements.txt")) as f:
        assert f.read().split()[0].startswith("lookahead")


@pytest.mark.parametrize("arch", ["llama", "mistral", "gpt2"])
def test_greedy_is_plain_with_a_streamer(tiny_models, arch):
    model = tiny_models(arch)
    ids = torch.tensor([[3, 4, 5, 6, 3, 4, 5, 6, 3, 4, 5]])
    plain_stream, ours_stream = Collect(), Collect()
    plain = model.generate(ids, max_new_tokens=40, do_sample=False, streamer=plain_stream)
    ours = model.generate(ids, max_new_tokens=40, do_sample=False, streamer=ours_stream, cost_curve=FLAT_CURVE, **HUB)
    assert ours.tolist() == plain.tolist()
    assert ours_stream.tokens == plain_stream.tokens and ours_stream.ended


def test_settings_pass_as_generate_arguments_and_a_decoder_reports(tiny_models):
    model = tiny_models("llama")
    ids = torch.tensor([[7, 8, 9, 7, 8, 9, 7, 8, 9, 7]])
    plain = model.generate(ids, max_new_tokens=30, do_sample=False)
    decoder = LookaheadDecoder(cost_curve=FLAT_CURVE)
    assert model.generate(ids, max_new_tokens=30, do_sample=False, decoder=decoder, **HUB).tolist() == plain.tolist()
    assert decoder.stats.new_tokens == 30 and decoder.stats.target_calls < 30
    off = model.generate(ids, max_new_tokens=30, do_sample=False, max_draft_tokens=0, **HUB)
    assert off.tolist() == plain.tolist()
    with pytest.raises(ValueError, match="max_draft_tokens"):
        model.generate(ids, max_new_tokens=4, max_draft_tokens=-1, **HUB)
    with pytest.raises(ValueError, match=r"\['window'\]"):
        model.generate(ids, max_new_tokens=4, decoder=decoder, window=2, **HUB)
    with pytest.raises(TypeError, match="decoder must be a LookaheadDecoder"):
        model.generate(ids, max_new_tokens=4, decoder="fast", **HUB)


def test_a_batch_is_plain(tiny_models):
    model = tiny_models("qwen2")
    ids = torch.tensor([[0, 0, 5, 6, 5, 6, 5, 6], [9, 8, 7, 9, 8, 7, 9, 8]])
    mask = (torch.arange(8) >= torch.tensor([[2], [0]])).long()
    kw = dict(attention_mask=mask, max_new_tokens=24, do_sample=False)
    assert model.generate(ids, **kw, **HUB).tolist() == model.generate(ids, **kw).tolist()


def test_sampling_draws_what_the_callable_spelling_draws(tiny_models):
    """The folder runs the same decoder as ``custom_generate=LookaheadDecoder()``: one seed, one draw (that draw's
    distribution is plain sampling's: ``test_sampling.py``)."""
    model = tiny_models("llama")
    ids = torch.tensor([[3, 4, 5, 3, 4, 5, 3, 4]])
    kw = dict(max_new_tokens=24, do_sample=True, top_k=20, temperature=1.3)
    torch.manual_seed(11)
    callable_spelling = model.generate(ids, **kw, custom_generate=LookaheadDecoder(cost_curve=FLAT_CURVE))
    torch.manual_seed(11)
    folder = model.generate(ids, **kw, cost_curve=FLAT_CURVE, **HUB)
    assert folder.tolist() == callable_spelling.tolist()


def test_the_folder_runs_only_with_trust_remote_code(tiny_models):
    model = tiny_models("llama")
    with pytest.raises(ValueError, match="trust_remote_code"):
        model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2, custom_generate=lookahead.hub.FOLDER)


@pytest.mark.smollm
def test_stop_strings_and_a_text_streamer_on_smollm(smollm):
    from transformers import TextStreamer

    from lookahead.tools.demo import chat_inputs

    class Text(TextStreamer):
        def __init__(self, tok):
            super().__init__(tok, skip_prompt=True)
            self.text = ""

        def on_finalized_text(self, text, stream_end=False):
            self.text += text

    model, tok = smollm
    inputs = chat_inputs(tok, "Write a Python function that reverses a string, with a docstring.")
    full = model.generate(**inputs, max_new_tokens=48, do_sample=False)
    words = tok.decode(full[0, inputs["input_ids"].shape[1]:]).split()
    kw = dict(max_new_tokens=48, do_sample=False, stop_strings=[words[len(words) // 2]], tokenizer=tok)
    plain_text, ours_text = Text(tok), Text(tok)
    plain = model.generate(**inputs, **kw, streamer=plain_text)
    ours = model.generate(**inputs, **kw, streamer=ours_text, **HUB)
    assert plain.shape[1] < full.shape[1], "the stop string must stop plain generate early"
    assert ours.tolist() == plain.tolist()
    assert ours_text.text == plain_text.text
    decoder = LookaheadDecoder()  # a decoder without a tokenizer takes generate's for the call, and keeps none
    assert model.generate(**inputs, **kw, decoder=decoder, **HUB).tolist() == plain.tolist()
    assert decoder.tokenizer is None
