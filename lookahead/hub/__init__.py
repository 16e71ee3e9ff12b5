"""The decoder as a transformers ``custom_generate`` folder: ``FOLDER`` holds ``custom_generate/generate.py`` and
``requirements.txt``, so transformers loads the decoder itself::

    import lookahead.hub
    out = model.generate(**inputs, max_new_tokens=256, custom_generate=lookahead.hub.FOLDER, trust_remote_code=True)

In this spelling ``generate`` hands the decoder every argument, ``tokenizer=`` and ``streamer=`` included. Published
as a Hub repository (``hf upload <user>/lookahead FOLDER .``), ``custom_generate="<user>/lookahead"`` finds it.
"""

from __future__ import annotations

import os

FOLDER = os.path.dirname(os.path.abspath(__file__))
"""The folder to pass as ``custom_generate=`` (it holds ``custom_generate/generate.py``)."""

SETTINGS = ("max_draft_tokens", "window", "cost_curve", "store", "corpus", "heads", "draft")
"""The decoder's settings, taken as keyword arguments of ``generate``."""


def generate(model, *args, decoder=None, **kwargs):
    """What transformers runs for ``model.generate(..., custom_generate=FOLDER, trust_remote_code=True)``, with
    ``model`` for ``self``. The decoder's settings (:data:`SETTINGS`) pass as keyword arguments, e.g.
    ``max_draft_tokens=16``, or a whole ``decoder=LookaheadDecoder(...)`` (to read its ``stats`` after the call);
    without one each call decodes with a new decoder."""
    from ..decoder import LookaheadDecoder

    settings = {name: kwargs.pop(name) for name in SETTINGS if name in kwargs}
    if decoder is None:
        decoder = LookaheadDecoder(tokenizer=kwargs.get("tokenizer"), **settings)
    elif not isinstance(decoder, LookaheadDecoder):
        raise TypeError(f"decoder must be a LookaheadDecoder, got {type(decoder).__name__}")
    elif settings:
        raise ValueError(f"pass the settings {sorted(settings)} to the LookaheadDecoder given as decoder=, not to "
                         "generate()")
    elif decoder.tokenizer is None and kwargs.get("tokenizer") is not None:  # this call's tokenizer, for this call
        decoder.tokenizer = kwargs["tokenizer"]
        try:
            return model.generate(*args, custom_generate=decoder, **kwargs)
        finally:
            decoder.tokenizer = None
    return model.generate(*args, custom_generate=decoder, **kwargs)
