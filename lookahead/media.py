"""Images (video, audio) a multimodal model's call hands the decoder: the checks and the prompt's forward."""

from __future__ import annotations

import torch
from transformers.cache_utils import StaticLayer

from .checks import MEDIA_KWARG, MEDIA_TYPE_KWARGS, given
from .kv import cache_layers


def check_media(model, input_ids: torch.Tensor, model_kwargs: dict, cache, static: bool, windowed: bool) -> None:
    """Before any forward: raise ValueError for a call with media features that the decoder would not decode as plain
    ``generate`` does (``windowed``: the model has a sliding window shorter than the call)."""
    mask = model_kwargs.get("attention_mask")
    positions = model_kwargs.get("position_ids")
    names = [f"{kind}_token_{suffix}" for kind in ("image", "video", "audio") for suffix in ("id", "index")]
    placeholders = {int(v) for v in (getattr(model.config, n, None) for n in names) if isinstance(v, int)}
    types = [k for k in MEDIA_TYPE_KWARGS if given(model_kwargs.get(k))]
    why = None
    if static and any(type(layer) is not StaticLayer for layer in cache_layers(cache)):
        why = ("decodes images on a static cache of full-attention layers only (a sliding layer's prompt forward would "
               "need the decoder's own masks); drop cache_implementation='static'")
    elif cache.get_seq_length():
        why = "decodes images from an empty cache (their features belong to the prompt's first forward)"
    elif positions is not None and positions.dim() != 2 and not bool((positions == positions[:1]).all()):
        why = (f"takes one position per token; this call's positions have {positions.shape[0]} sections that differ "
               "(multimodal RoPE)")
    elif input_ids.shape[0] > 1:
        if types:
            why = (f"decodes a batch with images without {types[0]} (its 4D masks would override the attention they "
                   "ask for); call generate once per prompt")
    elif windowed and mask is not None and not bool((mask == 1).all()):
        why = ("decodes one padded row with images only where no sliding window is shorter than the call (its sliding "
               "layers' prompt columns would have to be widened after the prompt's forward); drop the padding")
    elif input_ids.shape[1] < 2 or int(input_ids[0, -1]) in placeholders:
        why = "needs a prompt that ends in a text token after its images (a chat template's assistant turn does)"
    else:
        is_media = torch.isin(input_ids[0], torch.tensor(sorted(placeholders), dtype=input_ids.dtype,
                                                         device=input_ids.device))
        typed = [k for k in types if not torch.equal(model_kwargs[k][0] != 0, is_media)]
        if typed:
            why = (f"reads {typed[0]} only where they mark the image placeholders (Gemma 3's); these mark other "
                   "tokens (a prefix-LM's types, PaliGemma's, which its text steps would also need)")
    if why is not None:
        raise ValueError(f"LookaheadDecoder {why}. Use plain generate() for this call.")


def prefill_media(model, input_ids: torch.Tensor, model_kwargs: dict, cache, cache_kwarg: str, stats) -> None:
    """The prompt's forward with the media features and token types for every token but the last, into ``cache``;
    the decode loop continues it with text-only steps. Example: LLaVA's ``[bos, <image> x 576, "Describe", "it",
    ":"]`` runs all but ``":"`` here; the first step forwards ``":"`` and its drafts."""
    mask = model_kwargs.get("attention_mask")
    positions = model_kwargs.get("position_ids")
    model(input_ids=input_ids[:, :-1], attention_mask=None if mask is None else mask[:, :-1],
          position_ids=None if positions is None else positions[..., :-1], use_cache=True,
          **{k: model_kwargs[k][:, :-1] for k in MEDIA_TYPE_KWARGS if given(model_kwargs.get(k))},
          **{cache_kwarg: cache, MEDIA_KWARG: model_kwargs[MEDIA_KWARG]})
    stats.target_calls += 1
