"""Loading the bundled model (``lookahead/tools/models.py``): quietly (no progress-bar spam, the caller's
transformers settings left as they were), and from its converted copy in the user's cache after the first
load (bit-identical weights, the same tokenizer behaviour, made again whenever it does not fit)."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers import modeling_gguf_pytorch_utils as gguf_utils
from transformers.utils import logging as hf_logging

from lookahead.tools import models


@pytest.fixture
def hf_settings():
    """Restore transformers' progress-bar switch and verbosity after the test, whatever it does."""
    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    yield
    (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()
    hf_logging.set_verbosity(verbosity)


@pytest.fixture
def fake_gguf_load(monkeypatch):
    """``load_smollm2`` without the model: the loaders draw the GGUF de-quantisation bar as transformers
    does (its module's ``tqdm``), and record the progress-bar switch they saw."""
    seen = []

    def from_pretrained(folder, gguf_file, **kwargs):
        seen.append(hf_logging.is_progress_bar_enabled())
        for _ in gguf_utils.tqdm(range(272), desc="Converting and de-quantizing GGUF tensors..."):
            pass
        return _FakeModel()

    monkeypatch.setattr(models, "smollm2_location", lambda: ("/nowhere", "fake.gguf"))
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", from_pretrained)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", from_pretrained)
    return seen


class _FakeModel:
    def eval(self):
        return self


@pytest.mark.parametrize("bars_before", [True, False])
def test_load_is_quiet_and_restores_the_callers_settings(hf_settings, fake_gguf_load, capfd, bars_before):
    (hf_logging.enable_progress_bar if bars_before else hf_logging.disable_progress_bar)()
    hf_logging.set_verbosity_info()
    original_tqdm = gguf_utils.tqdm
    models.load_smollm2(cache=False)
    assert fake_gguf_load == [False, False]  # bars off while the tokenizer and the model load
    assert "de-quantizing" not in capfd.readouterr().err  # the GGUF bar is not drawn at all
    assert hf_logging.is_progress_bar_enabled() is bars_before  # re-enabled only if it was on
    assert hf_logging.get_verbosity() == hf_logging.INFO
    assert gguf_utils.tqdm is original_tqdm


def test_settings_are_restored_when_the_load_fails(hf_settings, monkeypatch):
    hf_logging.disable_progress_bar()
    original_tqdm = gguf_utils.tqdm

    def broken(*args, **kwargs):
        raise OSError("disk on fire")

    monkeypatch.setattr(models, "smollm2_location", lambda: ("/nowhere", "fake.gguf"))
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", broken)
    with pytest.raises(OSError, match="disk on fire"):
        models.load_smollm2(cache=False)
    assert not hf_logging.is_progress_bar_enabled() and gguf_utils.tqdm is original_tqdm


def test_the_gguf_bar_is_what_transformers_draws_outside(hf_settings, capfd):
    """The fake above is faithful: outside ``quiet_loading`` the same call draws the bar even with
    transformers' progress bars disabled (what the bundled model's load printed)."""
    hf_logging.disable_progress_bar()
    for _ in gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):
        pass
    assert "de-quantizing" in capfd.readouterr().err


@pytest.mark.smollm
def test_real_load_prints_nothing_and_keeps_bars_disabled(hf_settings, capfd):
    """The real ~20 s load (once): nothing on stdout or stderr, and progress bars the user disabled stay
    disabled."""
    try:
        models.smollm2_location()
    except RuntimeError as err:
        pytest.skip(f"SmolLM2 not installed ({err})")
    hf_logging.disable_progress_bar()
    model, tok = models.load_smollm2()
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert not hf_logging.is_progress_bar_enabled()
    assert tok.decode(tok("def f(x):").input_ids) == "def f(x):"


# --- the converted-weights cache ---------------------------------------------------------------------------


def _tiny_pair():
    """A tiny random llama and a one-character-per-token tokenizer with a chat template: what the GGUF loaders
    return in the tests below."""
    import torch
    import transformers as tf
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers import models as tok_models

    vocab = {"<eos>": 0, **{chr(c): c - 31 for c in range(32, 127)}}
    t = Tokenizer(tok_models.WordLevel(vocab, unk_token="<eos>"))
    t.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    t.decoder = decoders.Fuse()
    tok = tf.PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<eos>", pad_token="<eos>")
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    cfg = tf.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(3)
    return tf.LlamaForCausalLM(cfg).eval(), tok


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A GGUF file that is a placeholder: its loaders return the tiny pair and count their calls."""
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "tiny.Q4_1.gguf").write_bytes(b"GGUF placeholder")
    monkeypatch.setattr(models, "smollm2_location", lambda: (str(folder), "tiny.Q4_1.gguf"))
    monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path / "cache"))
    model, tok = _tiny_pair()
    conversions = []
    monkeypatch.setattr(models, "_from_gguf", lambda f, n: conversions.append(n) or (tok, model))
    return folder / "tiny.Q4_1.gguf", model, tok, conversions


def _same_tokenizer(a, b) -> None:
    texts = ["def f(x):\n    return x", "  two  spaces, <eos> and a tab\t!", ""]
    for text in texts:
        assert a(text).input_ids == b(text).input_ids
        assert a.decode(a(text).input_ids) == b.decode(b(text).input_ids)
    chat = [{"role": "user", "content": "hi"}]
    assert a.apply_chat_template(chat, tokenize=False) == b.apply_chat_template(chat, tokenize=False)
    assert (a.eos_token_id, a.pad_token_id) == (b.eos_token_id, b.pad_token_id)


def _same_weights(a, b) -> None:
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_first_load_keeps_the_converted_weights_and_later_loads_use_them(fake_gguf, caplog):
    import logging

    import torch

    gguf, original, tok, conversions = fake_gguf
    with caplog.at_level(logging.INFO, logger="lookahead"):
        first, first_tok = models.load_smollm2()
    assert conversions == ["tiny.Q4_1.gguf"] and "from its GGUF file, once" in caplog.text
    folder = models.converted_folder(str(gguf))
    assert models.is_converted(folder, models.weights_key(str(gguf)))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lookahead"):
        second, second_tok = models.load_smollm2()
    assert conversions == ["tiny.Q4_1.gguf"] and "from its converted weights" in caplog.text
    for model in (first, second):
        _same_weights(model, original)
        assert getattr(model.config, "quantization_config", None) is None
    _same_tokenizer(second_tok, tok)
    half, _ = models.load_smollm2(dtype=torch.bfloat16)
    _same_weights(half, original.to(torch.bfloat16))


def test_a_copy_that_does_not_fit_is_made_again(fake_gguf, caplog):
    import logging
    import os

    gguf, original, _, conversions = fake_gguf
    models.load_smollm2()
    old = models.converted_folder(str(gguf))
    os.utime(gguf, ns=(1, 1))  # the file changed (a reinstall): another key, another folder
    models.load_smollm2()
    new = models.converted_folder(str(gguf))
    assert len(conversions) == 2 and new != old and not os.path.exists(old) and os.path.isdir(new)
    with open(os.path.join(new, "lookahead-weights.json"), "w") as f:
        f.write("{}")  # a marker of another key
    models.load_smollm2()
    assert len(conversions) == 3
    with open(os.path.join(new, "model.safetensors"), "wb") as f:
        f.write(b"not safetensors")  # a damaged copy
    with caplog.at_level(logging.WARNING, logger="lookahead"):
        model, _ = models.load_smollm2()
    assert len(conversions) == 4 and "do not load" in caplog.text
    _same_weights(model, original)
    assert sorted(os.listdir(os.path.dirname(new))) == [os.path.basename(new)]  # no temporary folder left


def test_nothing_is_kept_when_asked_not_to(fake_gguf, monkeypatch, tmp_path):
    gguf, _, _, conversions = fake_gguf
    models.load_smollm2(cache=False)
    monkeypatch.setenv("LOOKAHEAD_PERSIST", "off")
    models.load_smollm2()
    assert len(conversions) == 2 and not (tmp_path / "cache").exists()


@pytest.mark.smollm
def test_the_real_converted_copy_is_bit_identical(hf_settings):
    """The bundled GGUF model de-quantised directly against the copy a later load reads: the same weights,
    configs and tokenizer behaviour. (About 30 s: one direct conversion beside the session's cached one.)"""
    try:
        folder, name = models.smollm2_location()
    except RuntimeError as err:
        pytest.skip(f"SmolLM2 not installed ({err})")
    with models.quiet_loading():
        direct_tok, direct = models._from_gguf(folder, name)
    models._special_tokens_from_model(direct_tok, direct)
    models.load_smollm2()  # converts once in the test run's cache folder (or finds the copy already there)
    cached, cached_tok = models.load_smollm2()
    assert cached.config.name_or_path == models.converted_folder(f"{folder}/{name}")  # really the copy
    _same_weights(cached, direct)
    assert cached.generation_config.to_dict() == direct.generation_config.to_dict()
    assert cached.lm_head.weight.data_ptr() == cached.model.embed_tokens.weight.data_ptr()  # still tied
    _same_tokenizer(cached_tok, direct_tok)
    text = "Add a docstring:\n```python\ndef total(self):\n    return sum(self.items.values())\n```"
    chat = [{"role": "user", "content": text}]
    assert (cached_tok.apply_chat_template(chat, add_generation_prompt=True)
            == direct_tok.apply_chat_template(chat, add_generation_prompt=True))
