"""lookahead: draft-model-free speculative decoding for Hugging Face transformers.

    from lookahead import LookaheadDecoder
    out = model.generate(**inputs, max_new_tokens=256, custom_generate=LookaheadDecoder())

gives exactly the tokens of plain greedy ``generate``, in fewer forward passes of the model
wherever the text repeats itself. Or, for one model or text-generation pipeline:

    import lookahead
    lookahead.enable(model)                      # then: generate(..., assistant=LookaheadDecoder())
    lookahead.enable(pipe, default=LookaheadDecoder())   # existing pipe(...) calls use it
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Imported on first use, so that `python -m lookahead --help` and argument errors answer at once
# instead of first loading torch, transformers and the Numba kernels.
_EXPORTS = {
    "LookaheadConfig": ".config",
    "LookaheadDecoder": ".decoder",
    "DecodeStats": ".stats",
    "NgramTrie": ".cache",
    "enable": ".integration",
    "disable": ".integration",
    "is_enabled": ".integration",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lookahead' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
