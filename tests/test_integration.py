"""The HF-ecosystem spellings: custom_generate=, enable() + assistant= / lookahead=, pipelines, streamers."""

from __future__ import annotations

import copy
import threading
import warnings

import pytest
import torch
from transformers import TextIteratorStreamer, TextStreamer

import lookahead
from lookahead import LookaheadDecoder

from tiny import TINY_ARCHS

REPETITIVE = [3, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11]
PROMPT_TEXT = " ".join(f"w{i}" for i in REPETITIVE)
N_NEW = 24


@pytest.fixture(scope="module")
def tok():
    """A word-level tokenizer over the tiny models' 96 ids: "<pad>" 0, "<unk>" 1, "<s>" 2, "w3".."w95"."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "<s>": 2, **{f"w{i}": i for i in range(3, 96)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>")
    assert tokenizer(PROMPT_TEXT).input_ids == REPETITIVE
    return tokenizer


@pytest.fixture
def llama(tiny_models):
    model = tiny_models("llama")
    yield model
    lookahead.disable(model)  # the session's model goes back as it came, whatever the test did


def _pipe(model, tok):
    from transformers import pipeline

    return pipeline("text-generation", model=model, tokenizer=tok)


def _snapshot(model):
    return dict(vars(model)), model.generation_config.to_dict(), type(model).generate


def _assert_unchanged(model, snapshot):
    attrs, gen_config, cls_generate = snapshot
    assert vars(model).keys() == attrs.keys()
    assert all(vars(model)[k] is v for k, v in attrs.items())
    assert model.generation_config.to_dict() == gen_config
    assert type(model).generate is cls_generate
    assert model.generate.__func__ is cls_generate  # the class's bound method shows through again


def _ids():
    return torch.tensor([REPETITIVE])


# -- every spelling == plain greedy, and disable() leaves the instance as it was -------------------------


SPELLINGS = ["custom_generate", "assistant", "lookahead_true", "default"]


def _generate(model, spelling, **kw):
    """Generate with ``spelling``; returns (output, the decoder that ran)."""
    dec = LookaheadDecoder()
    if spelling == "custom_generate":
        return model.generate(_ids(), custom_generate=dec, **kw), dec
    if spelling == "assistant":
        lookahead.enable(model)
        return model.generate(_ids(), assistant=dec, **kw), dec
    if spelling == "lookahead_true":
        lookahead.enable(model, default=dec)
        return model.generate(_ids(), lookahead=True, **kw), dec
    if spelling == "default":
        lookahead.enable(model, default=dec)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="lookahead:")  # no fallback to plain generate
            return model.generate(_ids(), **kw), dec
    raise KeyError(spelling)


@pytest.mark.parametrize("arch", TINY_ARCHS)
@pytest.mark.parametrize("spelling", SPELLINGS)
def test_spelling_gives_plain_greedy_tokens(tiny_models, arch, spelling):
    model = tiny_models(arch)
    snapshot = _snapshot(model)
    kw = dict(max_new_tokens=N_NEW, eos_token_id=None)
    plain = model.generate(_ids(), do_sample=False, **kw)
    try:
        ours, dec = _generate(model, spelling, **kw)
    finally:
        lookahead.disable(model)
    assert ours.tolist() == plain.tolist()
    assert dec.stats.new_tokens == N_NEW and dec.stats.target_calls < N_NEW  # it was the decoder that ran
    _assert_unchanged(model, snapshot)


@pytest.mark.parametrize("spelling", ["pipeline_flag", "pipeline_default", "pipeline_assistant"])
def test_pipeline_spelling_gives_plain_greedy_tokens(llama, tok, spelling):
    snapshot = _snapshot(llama)
    pipe = _pipe(llama, tok)
    kw = dict(max_new_tokens=N_NEW, do_sample=False, return_tensors=True)
    plain = pipe(PROMPT_TEXT, **kw)
    dec = LookaheadDecoder()
    if spelling == "pipeline_flag":
        lookahead.enable(pipe, default=dec)
        ours = pipe(PROMPT_TEXT, lookahead=True, **kw)
    elif spelling == "pipeline_default":
        assert lookahead.enable(pipe, default=dec) is pipe
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="lookahead:")
            ours = pipe(PROMPT_TEXT, **kw)
    else:
        lookahead.enable(pipe)
        ours = pipe(PROMPT_TEXT, assistant=dec, **kw)
    assert lookahead.is_enabled(pipe) and lookahead.is_enabled(llama)
    lookahead.disable(pipe)
    assert not lookahead.is_enabled(pipe)
    ids = ours[0]["generated_token_ids"]
    assert list(ids) == list(plain[0]["generated_token_ids"])
    assert len(ids) == len(REPETITIVE) + N_NEW
    assert dec.stats.new_tokens == N_NEW and dec.stats.target_calls < N_NEW
    _assert_unchanged(llama, snapshot)
    assert pipe(PROMPT_TEXT, **kw) == plain  # after disable the plain pipeline is back


def test_enable_is_idempotent_reversible_and_per_instance(tiny_models, llama):
    other = copy.deepcopy(llama)
    cls_generate = type(llama).generate
    lookahead.enable(llama)
    wrapper = vars(llama)["generate"]
    dec = LookaheadDecoder()
    assert lookahead.enable(llama, default=dec) is llama
    assert vars(llama)["generate"] is wrapper  # not stacked
    assert llama.generate.default is dec and llama.generate.decoder is dec
    lookahead.enable(llama)  # the last call's default wins
    assert llama.generate.default is None and isinstance(llama.generate.decoder, LookaheadDecoder)
    assert type(llama).generate is cls_generate and "generate" not in vars(other)
    with pytest.raises(ValueError, match=r"not used by the model: \[.lookahead.\]"):
        other.generate(_ids(), max_new_tokens=2, lookahead=True)  # not enabled: generate's own error
    lookahead.disable(llama)
    lookahead.disable(llama)
    assert "generate" not in vars(llama) and not lookahead.is_enabled(llama)


def test_deepcopy_of_enabled_model_is_enabled_on_the_copy(llama):
    lookahead.enable(llama, default=LookaheadDecoder())
    twin = copy.deepcopy(llama)
    assert twin.generate.model is twin and twin.generate.default is not llama.generate.default
    out = twin.generate(_ids(), max_new_tokens=8, eos_token_id=None)
    assert out.tolist() == llama.generate(_ids(), max_new_tokens=8, eos_token_id=None).tolist()


# -- the flags' rules ------------------------------------------------------------------------------


def test_lookahead_false_and_other_methods_run_plain_generate(llama):
    dec = LookaheadDecoder()
    lookahead.enable(llama, default=dec)
    plain_kw = dict(max_new_tokens=12, eos_token_id=None, do_sample=False)
    plain = type(llama).generate(llama, _ids(), **plain_kw)
    assert llama.generate(_ids(), lookahead=False, **plain_kw).tolist() == plain.tolist()
    assert dec.stats.new_tokens == 0
    # assistant_model= keeps its HF meaning (assisted decoding with a draft model); the default steps aside
    draft = copy.deepcopy(llama)
    lookahead.disable(draft)
    with pytest.warns(UserWarning, match="assistant_model="):
        assisted = llama.generate(_ids(), assistant_model=draft, **plain_kw)
    assert assisted.tolist() == plain.tolist() and dec.stats.new_tokens == 0
    with pytest.warns(UserWarning, match=r"decodes with the method it asks for \(prompt_lookup_num_tokens=\)"):
        pld = llama.generate(_ids(), prompt_lookup_num_tokens=3, **plain_kw)
    assert pld.tolist() == plain.tolist() and dec.stats.new_tokens == 0


def test_custom_generate_decoder_on_an_enabled_model_runs_that_decoder_without_a_warning(llama):
    """An enabled model's default steps aside for a decoder the call names itself, silently: no warning
    that the call "runs plain generate()" (it does not), and that decoder, not the default, decodes it."""
    default, own = LookaheadDecoder(), LookaheadDecoder()
    lookahead.enable(llama, default=default)
    kw = dict(max_new_tokens=12, eos_token_id=None, do_sample=False)
    plain = type(llama).generate(llama, _ids(), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = llama.generate(_ids(), custom_generate=own, **kw)
    assert out.tolist() == plain.tolist()
    assert own.stats.new_tokens == 12 and default.stats.new_tokens == 0


def test_default_falls_back_for_what_the_decoder_refuses_but_explicit_flags_raise(llama):
    lookahead.enable(llama, default=LookaheadDecoder())
    kw = dict(max_new_tokens=6, eos_token_id=None, num_beams=2, do_sample=False)
    beams = type(llama).generate(llama, _ids(), **kw)
    with pytest.warns(UserWarning, match="num_beams"):
        assert llama.generate(_ids(), **kw).tolist() == beams.tolist()
    batch = torch.tensor([REPETITIVE, REPETITIVE])
    with pytest.warns(UserWarning, match="batch size > 1"):  # batches decode; their scores do not
        llama.generate(batch, max_new_tokens=4, do_sample=False, return_dict_in_generate=True, output_scores=True)
    with pytest.raises(ValueError, match="num_beams"):
        llama.generate(_ids(), lookahead=True, **kw)
    with pytest.raises(ValueError, match="num_beams"):
        llama.generate(_ids(), assistant=LookaheadDecoder(), **kw)


def test_flag_misuse_is_refused_clearly(llama):
    lookahead.enable(llama)
    with pytest.raises(TypeError, match="assistant_model="):
        llama.generate(_ids(), assistant=copy.deepcopy(llama), max_new_tokens=2)
    with pytest.raises(TypeError, match="True or False"):
        llama.generate(_ids(), lookahead=LookaheadDecoder(), max_new_tokens=2)
    with pytest.raises(ValueError, match="not both"):
        llama.generate(_ids(), assistant=LookaheadDecoder(), lookahead=True, max_new_tokens=2)
    with pytest.raises(ValueError, match="custom_generate="):
        llama.generate(_ids(), lookahead=True, custom_generate=LookaheadDecoder(), max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt_lookup_num_tokens="):
        llama.generate(_ids(), assistant=LookaheadDecoder(), prompt_lookup_num_tokens=3, max_new_tokens=2)
    with pytest.raises(TypeError, match="default="):
        lookahead.enable(llama, default=True)


def test_enable_refuses_what_is_neither_a_model_nor_a_text_generation_pipeline(tok):
    import transformers as tf
    from transformers import pipeline

    cfg = tf.LlamaConfig(vocab_size=96, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    base = tf.LlamaModel(cfg).eval()  # no language-model head: cannot generate
    for thing in (object(), "gpt2", torch.nn.Linear(2, 2), base,
                  pipeline("feature-extraction", model=base, tokenizer=tok)):
        with pytest.raises(TypeError, match="generating model or a text-generation pipeline"):
            lookahead.enable(thing)
        with pytest.raises(TypeError):
            lookahead.disable(thing)
    t5 = tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=96, d_model=16, d_ff=32, num_layers=1,
                                                   num_heads=2, d_kv=8))
    with pytest.raises(TypeError, match="encoder-decoder"):
        lookahead.enable(t5)


def test_enable_refuses_to_stack_on_an_instance_generate(llama):
    llama.generate = lambda *a, **k: None  # what a Hub custom_generate with trust_remote_code installs
    try:
        with pytest.raises(ValueError, match="already replaced"):
            lookahead.enable(llama)
    finally:
        del llama.generate


# -- generation_config defaults ---------------------------------------------------------------------


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_model_generation_config_defaults_are_respected(tiny_models, spelling):
    """max_new_tokens, eos ids and pad id come from model.generation_config when the call omits them."""
    model = copy.deepcopy(tiny_models("gpt2"))
    free = model.generate(_ids(), do_sample=False, max_new_tokens=30, eos_token_id=None)[0, len(REPETITIVE):]
    first_seen = {t: free.tolist().index(t) for t in free.tolist()}
    eos, at = max(first_seen.items(), key=lambda kv: kv[1])  # the token that shows up last
    assert at > 13
    model.generation_config.pad_token_id = 5
    model.generation_config.eos_token_id = [95, eos]
    for max_new, length in ((13, 13), (30, at + 1)):  # first the length rules, then the EOS stops it
        model.generation_config.max_new_tokens = max_new
        plain = model.generate(_ids(), do_sample=False)
        ours, dec = _generate(model, spelling)
        lookahead.disable(model)
        assert ours.tolist() == plain.tolist()
        assert ours.shape[1] == len(REPETITIVE) + length and dec.stats.new_tokens == length


# -- streamers --------------------------------------------------------------------------------------


class _Recorder:
    """A streamer that records each put() and end()."""

    def __init__(self):
        self.puts: list[list[int]] = []
        self.ends = 0

    def put(self, value):
        assert self.ends == 0, "put after end"
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ends += 1


class _TextCollector(TextStreamer):
    def __init__(self, tokenizer, **kw):
        super().__init__(tokenizer, **kw)
        self.text = ""

    def on_finalized_text(self, text: str, stream_end: bool = False):
        self.text += text


def _stream(model, tok, spelling, streamer, **kw):
    dec = LookaheadDecoder()
    kw = dict(max_new_tokens=N_NEW, eos_token_id=None, do_sample=False, **kw)
    if spelling == "custom_generate":  # no enable(): the decoder finds generate()'s streamer itself
        return model.generate(_ids(), custom_generate=dec, streamer=streamer, **kw)
    if spelling == "custom_generate_enabled":
        lookahead.enable(model)
        return model.generate(_ids(), custom_generate=dec, streamer=streamer, **kw)
    if spelling == "assistant":
        lookahead.enable(model)
        return model.generate(_ids(), assistant=dec, streamer=streamer, **kw)
    if spelling == "lookahead_true":
        lookahead.enable(model)
        return model.generate(_ids(), lookahead=True, streamer=streamer, **kw)
    if spelling == "default":
        lookahead.enable(model, default=dec)
        return model.generate(_ids(), streamer=streamer, **kw)
    pipe = _pipe(model, tok)
    kw.pop("eos_token_id")
    if spelling == "pipeline_flag":
        lookahead.enable(pipe)
        out = pipe(PROMPT_TEXT, lookahead=True, streamer=streamer, return_tensors=True, **kw)
    elif spelling == "pipeline_default":
        lookahead.enable(pipe, default=dec)
        out = pipe(PROMPT_TEXT, streamer=streamer, return_tensors=True, **kw)
    else:
        raise KeyError(spelling)
    return torch.tensor([out[0]["generated_token_ids"]])


STREAM_SPELLINGS = SPELLINGS + ["custom_generate_enabled", "pipeline_flag", "pipeline_default"]


@pytest.mark.parametrize("spelling", STREAM_SPELLINGS)
def test_streamer_gets_prompt_once_then_every_token_block_by_block(llama, tok, spelling):
    rec = _Recorder()
    out = _stream(llama, tok, spelling, rec)
    plain = llama.generate(_ids(), do_sample=False, max_new_tokens=N_NEW, eos_token_id=None)
    assert out.tolist() == plain.tolist()
    assert rec.puts[0] == REPETITIVE  # the prompt, once
    streamed = [t for block in rec.puts[1:] for t in block]
    assert streamed == plain[0, len(REPETITIVE):].tolist()
    assert max(len(b) for b in rec.puts[1:]) > 1  # accepted drafts arrive as blocks
    assert rec.ends == 1


@pytest.mark.parametrize("spelling", STREAM_SPELLINGS)
def test_text_streamer_receives_exactly_the_final_text(llama, tok, spelling):
    streamer = _TextCollector(tok)
    out = _stream(llama, tok, spelling, streamer)
    assert streamer.text == tok.decode(out[0].tolist())
    skipping = _TextCollector(tok, skip_prompt=True)
    lookahead.disable(llama)
    out = _stream(llama, tok, spelling, skipping)
    assert skipping.text == tok.decode(out[0, len(REPETITIVE):].tolist())


@pytest.mark.parametrize("spelling", ["custom_generate", "assistant", "pipeline_default"])
def test_text_iterator_streamer_does_not_hang(llama, tok, spelling):
    streamer = TextIteratorStreamer(tok, skip_prompt=True, timeout=30)
    result = {}

    def run():
        result["out"] = _stream(llama, tok, spelling, streamer)

    worker = threading.Thread(target=run)
    worker.start()
    text = "".join(streamer)  # raises queue.Empty after 30 s if end() never comes
    worker.join()
    assert text == tok.decode(result["out"][0, len(REPETITIVE):].tolist())


# -- scores / logits ------------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("processors", [{}, {"repetition_penalty": 1.2}])
def test_scores_and_logits_match_plain_generate(llama, spelling, processors):
    kw = dict(max_new_tokens=20, eos_token_id=None, return_dict_in_generate=True, output_scores=True,
              output_logits=True, **processors)
    plain = llama.generate(_ids(), do_sample=False, **kw)
    ours, dec = _generate(llama, spelling, **kw)
    assert type(ours) is type(plain)
    assert ours.sequences.tolist() == plain.sequences.tolist()
    assert dec.stats.new_tokens == 20
    if not processors:  # (the penalty makes this tiny model's output unrepetitive: nothing to accept)
        assert dec.stats.target_calls < 20  # several tokens per step: per-token entries from one forward
    assert len(ours.scores) == len(plain.scores) == len(ours.logits) == len(plain.logits) == 20
    for a, b in zip(ours.scores, plain.scores, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    for a, b in zip(ours.logits, plain.logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
