"""KV-cache bookkeeping: keep the accepted path's entries, drop everything else.

After a step the cache holds ``base`` old entries followed by ``n_new`` entries of this step's
rows (pending tokens, draft nodes, window rows). ``keep`` lists, in order, which of those
``n_new`` entries stay; they are gathered to the front of the step's region and the rest is
cropped. No recomputation.

Worked example: base=10, n_new=5 (pending p, nodes a b c d), keep=[0, 2, 4] (p, b, d):
entries 12 and 14 are copied to 11 and 12, then the cache is cropped to 13 entries.
"""

from __future__ import annotations

import torch
from transformers import Cache

from .compat import crop_cache


class CacheNotRollbackable(ValueError):
    """The model's cache cannot drop entries, so rejected drafts could not be undone."""


def cache_layers(cache: Cache) -> list:
    """The layers of a transformers ``Cache`` that hold per-token keys/values."""
    return list(getattr(cache, "layers", []))


def check_rollbackable(cache: Cache) -> None:
    """Raise :class:`CacheNotRollbackable` unless every layer can be cropped and gathered."""
    layers = cache_layers(cache)
    if not layers:
        raise CacheNotRollbackable(
            f"{type(cache).__name__} exposes no per-layer keys/values; LookaheadDecoder needs a cache whose "
            "entries can be dropped (e.g. DynamicCache). Use plain generate() for this model."
        )
    for layer in layers:
        croppable = getattr(layer, "is_croppable", False)
        if not croppable or not hasattr(layer, "keys"):
            raise CacheNotRollbackable(
                f"the model's cache layer {type(layer).__name__} cannot roll back rejected draft tokens "
                "(static, quantized, sliding-window past its window, or recurrent state). LookaheadDecoder "
                "cannot decode this model exactly; use plain generate() for it."
            )


def keep_entries(cache: Cache, n_new: int, keep: list[int]) -> None:
    """Of the step's last ``n_new`` entries, keep the ``k``-th for ``k`` in ``keep`` (in order), drop the others of the step.

    Mutates ``cache`` (the decoder's own cache). ``keep`` must be increasing.
    """
    n_keep = len(keep)
    if keep != list(range(n_keep)):  # not a plain prefix: gather first
        for layer in cache_layers(cache):
            if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
                continue  # e.g. layers that share another layer's KV
            src = torch.tensor(keep, dtype=torch.long, device=layer.keys.device)
            start = layer.keys.shape[-2] - n_new  # layer-local index of the step's first entry
            idx = src + start
            layer.keys[..., start : start + n_keep, :] = layer.keys.index_select(-2, idx)
            layer.values[..., start : start + n_keep, :] = layer.values.index_select(-2, idx)
    crop_cache(cache, n_new - n_keep)  # a negative count crops on every transformers version
