"""lookahead: draft-model-free speculative decoding for Hugging Face transformers.

    from lookahead import LookaheadDecoder
    out = model.generate(**inputs, max_new_tokens=256, custom_generate=LookaheadDecoder())

gives exactly the tokens of plain greedy ``generate``, in fewer forward passes of the model
wherever the text repeats itself.
"""

from .config import LookaheadConfig
from .decoder import LookaheadDecoder
from .stats import DecodeStats

__all__ = ["LookaheadConfig", "LookaheadDecoder", "DecodeStats"]
__version__ = "0.1.0"
