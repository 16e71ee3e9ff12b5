"""Decoding past a sliding window: the window's layers kept whole through each step, and their masks.

A dynamic cache's sliding layer keeps the last ``window - 1`` tokens, so a step of ``q`` rows would push cached tokens
out before the verdict. As transformers' assisted decoding does, an unpadded row records the layers' past through each
step (:meth:`~SlidingWindow.start`); a batch or a padded row keeps every column (:meth:`~SlidingWindow.widen`), a
static cache gives the layers its whole length (``static.full_length_layers``). A step's 4D mask is then narrowed for
those layers to each row's window, or chunk (Llama 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import compat
from .kv import CacheNotRollbackable, GrowingLayer, cache_layers

SLIDING, CHUNKED, FULL = "sliding_attention", "chunked_attention", "full_attention"
"""The layer types (``config.layer_types``) known: a sliding layer's row at ``P`` sees keys at ``k`` with
``P - k < window``; a chunked layer's (Llama 4) those with ``k // window == P // window``; a full layer's all."""


_SLIDING_LAYER = compat.rollbackable_layer_types()[1]


def is_sliding(layer) -> bool:
    """Whether ``layer`` is a dynamic cache's sliding-window layer."""
    return isinstance(layer, _SLIDING_LAYER)


@dataclass(frozen=True)
class SlidingWindow:
    """How a call decodes past the ``window`` of its cache's sliding layers. ``layer_types``: the model's
    ``config.layer_types`` (masks per type, a dict), or None (every layer slides: one mask)."""

    window: int
    layer_types: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.window < 2:
            raise ValueError(f"SlidingWindow window={self.window!r} is invalid: must be at least 2")
        unknown = sorted(set(self.layer_types or ()) - {SLIDING, CHUNKED, FULL})
        if unknown:
            raise CacheNotRollbackable(f"the model's layer types {unknown} (layer_types) are not known to "
                                       f"LookaheadDecoder past a sliding window (only {SLIDING!r}, {CHUNKED!r} and "
                                       f"{FULL!r}). Use plain generate() for this model.")

    @classmethod
    def of(cls, model, cache) -> SlidingWindow:
        """The plan for ``model`` and its ``cache``, or :class:`~lookahead.kv.CacheNotRollbackable`."""
        layers = cache_layers(cache)
        sliding = [layer for layer in layers if is_sliding(layer)]
        if not all(hasattr(layer, "activate_past_recording") for layer in sliding):
            raise CacheNotRollbackable("this transformers version's sliding-window cache layers cannot keep their past "
                                       "entries (no activate_past_recording); LookaheadDecoder cannot roll back past "
                                       "the window. Use a newer transformers, max_length <= the window, or plain "
                                       "generate().")
        windows = {layer.sliding_window for layer in sliding}
        if len(windows) != 1:
            raise CacheNotRollbackable(f"the model's sliding layers have windows {sorted(windows)}; LookaheadDecoder "
                                       "decodes past one window only. Use plain generate() for this model.")
        types = getattr(compat.text_config(model), "layer_types", None)
        if types is None and len(sliding) < len(layers):
            raise CacheNotRollbackable("the model mixes sliding and full attention layers without naming them "
                                       "(config.layer_types), so their masks cannot be told apart; LookaheadDecoder "
                                       "cannot decode it past its window. Use plain generate() for this model.")
        return cls(windows.pop(), None if types is None else tuple(types))

    def masks(self, mask: torch.Tensor, positions: torch.Tensor, past: int):
        """One row's step: ``mask`` [1, 1, q, past + q] (additive, full attention; not changed), the rows'
        ``positions`` long[1, q], ``past`` cached tokens at positions 0 .. past - 1. The sliding layers' mask
        [1, 1, q, seen + q], ``seen = min(past, window - 1)`` (alone, or in a dict per layer type beside ``mask``).
        Example: window 4, past 5, rows at 5 and 6: columns at positions 2-6; row 5 sees 2-5, row 6 3-6."""
        seen = min(past, self.window - 1)
        rows = positions[0]  # long[q]
        columns = torch.cat([torch.arange(past - seen, past, device=rows.device), rows])  # long[seen + q]
        return self._per_type(mask, mask[..., past - seen:], columns[None, :], rows[:, None])

    def _per_type(self, full: torch.Tensor, part: torch.Tensor, columns: torch.Tensor, rows: torch.Tensor):
        """``full`` for full layers; for the others ``part`` (the columns they see, at positions ``columns``) with keys
        outside each row's (at ``rows``) window or chunk hidden; one tensor when the model names no layer types, else a
        dict. ``columns`` / ``rows`` broadcast to ``part``: [1, c] / [q, 1], or [b, 1, 1, c] / [b, 1, q, 1]."""
        neg = torch.finfo(full.dtype).min
        types = self.layer_types or (SLIDING,)
        out = {}
        if SLIDING in types:  # too far behind the row
            out[SLIDING] = part.masked_fill(columns <= rows - self.window, neg)
        if CHUNKED in types:  # in another chunk than the row's
            out[CHUNKED] = part.masked_fill(columns // self.window != rows // self.window, neg)
        if self.layer_types is None:
            return out[SLIDING]
        if FULL in types:
            out[FULL] = full
        return out

    def static_masks(self, mask: torch.Tensor, positions: torch.Tensor, past: int):
        """A static cache's step (its sliding layers hold every column): ``mask`` [1, 1, q, columns] (not changed),
        ``positions`` long[1, q] of the rows written at columns ``past .. past + q - 1`` (column ``c < past`` holds
        position ``c``). Returns ``mask`` with keys outside each row's window or chunk hidden. Example: window 4,
        past 5, rows at positions 5 and 6: the first sees columns 2-5 of what ``mask`` allows, the second 3-6."""
        columns = torch.arange(mask.shape[-1], device=positions.device)
        columns[past : past + positions.shape[1]] = positions[0]  # a step's columns hold its rows' positions
        return self._per_type(mask, mask, columns[None, :], positions[0][:, None])

    def batch_masks(self, mask: torch.Tensor, positions: torch.Tensor, cached: torch.Tensor):
        """A step on a widened cache (:meth:`widen`): ``mask`` [b, 1, q, T + q] (not changed), ``positions`` long[b, q]
        of the step's rows, ``cached`` long[b, T] of each row's cached columns (a hidden one's: any). Keys outside a
        row's window are hidden by position, as plain batched ``generate`` does."""
        columns = torch.cat([cached, positions], dim=1)  # long[b, T + q]
        return self._per_type(mask, mask, columns[:, None, None, :], positions[:, None, :, None])

    def widen(self, cache) -> None:
        """Before the first forward, each sliding layer of an empty cache replaced by one that keeps every column."""
        cache.layers[:] = [GrowingLayer(replaces=layer) if is_sliding(layer) else layer
                           for layer in cache_layers(cache)]

    @staticmethod
    def check_widenable(cache) -> None:
        """Raise :class:`~lookahead.kv.CacheNotRollbackable` when ``cache``'s sliding layers hold tokens."""
        if any(is_sliding(layer) and layer.is_initialized for layer in cache_layers(cache)):
            raise CacheNotRollbackable("the cache's sliding layers hold a window's last tokens already; a batch or a "
                                       "padded row past the window starts from an empty cache. Pass no cache, drop "
                                       "the padding, or use plain generate().")

    @staticmethod
    def start(cache) -> list:
        """Before the first forward: the sliding layers keep every entry until each step's crop; returns them."""
        layers = [layer for layer in cache_layers(cache) if is_sliding(layer)]
        for layer in layers:
            layer.activate_past_recording()
        return layers

    @staticmethod
    def restrict(layers: list) -> None:
        """After a step's entries are kept: each of the sliding ``layers`` back to its last ``window - 1`` tokens."""
        for layer in layers:
            if (layer.is_initialized and layer.get_seq_length() >= layer.sliding_window
                    and layer.keys.shape[-2] > layer.sliding_window - 1):
                layer.crop(0)  # past the window, crop(0) restricts the layer and drops nothing

    @staticmethod
    def finish(layers: list) -> None:
        """At the call's end: the sliding ``layers`` restricted and not recording, as plain ``generate`` leaves them."""
        SlidingWindow.restrict(layers)
        for layer in layers:
            layer.record_past = False
