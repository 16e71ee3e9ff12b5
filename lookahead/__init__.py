"""lookahead: draft-model-free speculative decoding for Hugging Face transformers.

    from lookahead import LookaheadDecoder
    out = model.generate(**inputs, max_new_tokens=256, custom_generate=LookaheadDecoder())

gives exactly plain ``generate``'s greedy tokens (or its sampling distribution) in fewer forwards wherever the text
repeats itself. Or, for one model or text-generation pipeline:

    import lookahead
    lookahead.enable(model)                              # then: generate(..., lookahead=True)
    lookahead.enable(pipe, default=LookaheadDecoder())   # existing pipe(...) calls use it
"""

from __future__ import annotations

import importlib

__version__ = "0.2.0"

# imported on first use: `python -m lookahead --help` answers without loading torch and transformers
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
