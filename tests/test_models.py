"""Loading the bundled model quietly (``lookahead/models.py``): no progress-bar spam, the caller's
transformers settings (progress bars, verbosity) left as they were."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers import modeling_gguf_pytorch_utils as gguf_utils
from transformers.utils import logging as hf_logging

from lookahead import models


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
    models.load_smollm2()
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
        models.load_smollm2()
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
