"""One row decoded past a sliding window: the window's layers kept whole through each step, and their masks.

A dynamic cache's sliding-window layer (``DynamicSlidingWindowLayer``) keeps the last ``window - 1`` tokens, so a step
of ``q`` rows would push up to ``q`` cached tokens out before the verdict, and a rejected row could not be undone. As
transformers' assisted decoding does, :class:`SlidingWindow` turns on the layers' *past recording* for the call
(:meth:`~SlidingWindow.start`: an update keeps every entry until the next ``crop``), restricts them to the window after
each step (:meth:`~SlidingWindow.restrict`) and turns it off at the end (:meth:`~SlidingWindow.finish`), so the returned
cache is one plain ``generate`` could continue.

**Masks.** A chain step passes no mask (the model builds its own sliding one). A step with a tree or window rows passes
its own additive 4D mask (``packing.py``); a sliding layer sees the keys of the last ``seen = min(past, window - 1)``
cached tokens and the step's ``q`` rows, a row at position ``P`` only those at ``k`` with ``P - k < window``, so its
mask is the full mask's last ``seen + q`` columns with the out-of-window ones hidden (:meth:`SlidingWindow.masks`).
Llama 4's chunked layers see their own chunk of ``window`` positions instead. Masks go per layer type (a dict) when the
model names them (``config.layer_types``), else every layer slides (Mistral) and takes one mask.

A static cache (``static.py``) gives its sliding layers the whole length, so their mask is the full one with
out-of-window columns hidden (:meth:`SlidingWindow.static_masks`). A batch, or one row with padding, widens its dynamic
cache the same way (:meth:`SlidingWindow.widen`); its columns are not its positions, so the masks hide keys by each
row's positions (:meth:`SlidingWindow.batch_masks`).

Worked example: window 4, 5 tokens cached (positions 0-4), a step of the pending token (position 5) and a node under it
(position 6). The sliding layers see positions 2, 3, 4, then 5 and 6 (``seen`` = 3). The pending row sees 2-5; the node
sees 3-6, so its mask row hides position 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import compat
from .kv import CacheNotRollbackable, GrowingLayer, cache_layers

SLIDING, CHUNKED, FULL = "sliding_attention", "chunked_attention", "full_attention"
"""The layer types (``config.layer_types``) :meth:`SlidingWindow.masks` knows: a sliding layer's row at ``P`` sees keys
at ``k`` with ``P - k < window``; a chunked layer's (Llama 4) those with ``k // window == P // window``; a full layer's
all."""


_SLIDING_LAYER = compat.rollbackable_layer_types()[1]


def is_sliding(layer) -> bool:
    """Whether ``layer`` is a dynamic cache's sliding-window layer."""
    return isinstance(layer, _SLIDING_LAYER)


@dataclass(frozen=True)
class SlidingWindow:
    """How a call of one row decodes past the ``window`` of its cache's sliding layers. ``layer_types``: the model's
    ``config.layer_types`` (masks per type, a dict), or None (every layer slides: one mask)."""

    window: int
    layer_types: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.window < 2:
            raise ValueError(f"SlidingWindow window={self.window!r} is invalid: must be at least 2")
        unknown = sorted(set(self.layer_types or ()) - {SLIDING, CHUNKED, FULL})
        if unknown:
            raise ValueError(f"SlidingWindow layer_types holds {unknown}: only {SLIDING!r}, {CHUNKED!r} and {FULL!r} "
                             "are known")

    @classmethod
    def of(cls, model, cache) -> SlidingWindow:
        """The plan for ``model`` and its ``cache``, whose sliding layers must share one window; raises
        :class:`~lookahead.kv.CacheNotRollbackable` when the layers cannot be told apart or their types are unknown."""
        sliding = [layer for layer in cache_layers(cache) if is_sliding(layer)]
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
        if types is None and not all(is_sliding(layer) for layer in cache_layers(cache)):
            raise CacheNotRollbackable("the model mixes sliding and full attention layers without naming them "
                                       "(config.layer_types), so their masks cannot be told apart; LookaheadDecoder "
                                       "cannot decode it past its window. Use plain generate() for this model.")
        unknown = sorted(set(types or ()) - {SLIDING, CHUNKED, FULL})
        if unknown:
            raise CacheNotRollbackable(f"the model's layer types {unknown} are not known to LookaheadDecoder past a "
                                       "sliding window. Use plain generate() for this model.")
        return cls(windows.pop(), None if types is None else tuple(types))

    def masks(self, mask: torch.Tensor, positions: torch.Tensor, past: int):
        """A step's masks from its full-attention ``mask`` [1, 1, q, past + q] (additive; not changed), its rows'
        ``positions`` long[1, q] and ``past`` cached tokens at positions 0 .. past - 1: the sliding layers' new mask
        [1, 1, q, seen + q] (alone, or in a dict per layer type beside ``mask``)."""
        seen = min(past, self.window - 1)
        rows = positions[0]  # long[q]
        columns = torch.cat([torch.arange(past - seen, past, device=rows.device), rows])  # long[seen + q]
        return self._per_type(mask, mask[..., past - seen:], columns[None, :], rows[:, None])

    def _per_type(self, full: torch.Tensor, part: torch.Tensor, columns: torch.Tensor, rows: torch.Tensor):
        """The masks per layer type: ``full`` for full layers; for the others ``part`` (the columns they see, at
        positions ``columns``) with keys outside each row's (at ``rows``) window or chunk hidden. One tensor when the
        model names no layer types, else a dict. ``columns`` / ``rows`` broadcast to ``part``'s last two dimensions:
        [1, c] / [q, 1], or for a batch [b, 1, 1, c] / [b, 1, q, 1]."""
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
        """A step's masks on a static cache whose sliding layers hold every column (``static.full_length_layers``):
        ``mask`` [1, 1, q, columns] (not changed), ``positions`` long[1, q] of the rows written at columns
        ``past .. past + q - 1`` (column ``c < past`` holds position ``c``). Returns ``mask`` with keys outside each
        row's window or chunk hidden, as :meth:`masks` does. Example: window 4, past 5, rows at positions 5 and 6: the
        first sees columns 2-5 of what ``mask`` allows, the second 3-6."""
        columns = torch.arange(mask.shape[-1], device=positions.device)
        q = positions.shape[1]
        columns[past : past + q] = positions[0]  # a step's columns hold its rows' positions (a node's: by depth)
        return self._per_type(mask, mask, columns[None, :], positions[0][:, None])

    def batch_masks(self, mask: torch.Tensor, positions: torch.Tensor, cached: torch.Tensor):
        """A batched step's masks on a widened cache (:meth:`widen`): ``mask`` [b, 1, q, T + q] (padding and holes
        hidden; not changed), ``positions`` long[b, q] of the step's rows and columns, ``cached`` long[b, T] of each
        row's cached columns (a hidden one's: any). Keys outside a row's window are hidden by position, as plain batched
        ``generate`` does."""
        columns = torch.cat([cached, positions], dim=1)  # long[b, T + q]
        return self._per_type(mask, mask, columns[:, None, None, :], positions[:, None, :, None])

    def widen(self, cache) -> None:
        """Replace each sliding layer of a batch's (or padded row's) empty cache by a plain one that keeps every column,
        before the first forward (:meth:`check_widenable`); :meth:`batch_masks` masks them by the window."""
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
        """Make the sliding layers keep every entry until each step's crop (before the first forward); returns them."""
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
