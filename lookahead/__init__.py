"""lookahead: draft-model-free speculative decoding for Hugging Face transformers.

    from lookahead import LookaheadDecoder
    out = model.generate(**inputs, max_new_tokens=256, custom_generate=LookaheadDecoder())

gives exactly the tokens of plain greedy ``generate``, in fewer forward passes of the model
wherever the text repeats itself. Or, for one model or text-generation pipeline:

    import lookahead
    lookahead.enable(model)                      # then: generate(..., assistant=LookaheadDecoder())
    lookahead.enable(pipe, default=LookaheadDecoder())   # existing pipe(...) calls use it
"""

from .config import LookaheadConfig
from .decoder import LookaheadDecoder
from .integration import disable, enable, is_enabled
from .stats import DecodeStats

__all__ = ["LookaheadConfig", "LookaheadDecoder", "DecodeStats", "enable", "disable", "is_enabled"]
__version__ = "0.1.0"
