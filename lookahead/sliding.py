"""One row decoded past a sliding window: the window's layers kept whole through each step, and their masks.

A sliding-window layer of a dynamic cache (transformers' ``DynamicSlidingWindowLayer``) keeps the keys and values
of the last ``window - 1`` tokens. A step that verifies ``q`` rows would push up to ``q`` cached tokens out before the
verdict, and a rejected row's entries could not be undone. transformers' own way out, used by its assisted
decoding, is the layer's *past recording* (``activate_past_recording``): an update keeps every entry until the next
``crop``, which drops the rejected ones and restricts the layer to its window again. :class:`SlidingWindow` turns it
on for the call (:meth:`~SlidingWindow.start`), restricts the layers after each step (:meth:`~SlidingWindow.restrict`;
a step that drops rows crops them first) and turns it off when the call ends, the layers restricted
(:meth:`~SlidingWindow.finish`): the cache the call returns is one plain ``generate`` could continue.

**Masks.** A step whose draft is one chain passes no mask: the model builds its own, a sliding one for those
layers. A step with a tree (or the lookahead window's rows) passes its own additive 4D mask over every column
(``tree.py``). A sliding layer sees only the keys of the last ``seen = min(past, window - 1)`` cached tokens and the
step's ``q`` rows, and a row at position ``P`` attends to a key at position ``k`` only if ``P - k < window``. So its
mask is the full mask's last ``seen + q`` columns, with every column at a position ``window`` or more before the row's
own hidden (:meth:`SlidingWindow.masks`). Llama 4's chunked layers work the same way, a row seeing only the keys of
its own chunk of ``window`` positions. Models that tell their layers apart (``config.layer_types``) take the masks
per layer type, a dict; a model without ``layer_types`` slides in every layer (Mistral) and takes the sliding one.

On a static cache (``static.py``) the sliding layers are given the cache's whole length instead, so that a step's
entries can be dropped as in every other layer, and their mask is the full one with the out-of-window columns hidden
(:meth:`SlidingWindow.static_masks`). A batch (``batch.py``) does the same on its dynamic cache
(:meth:`SlidingWindow.widen`): its rows keep different numbers of columns (holes), so a window's last columns are
not every row's last tokens; the masks hide keys by each row's positions (:meth:`SlidingWindow.batch_masks`). So does
one row with padding, whose columns are not its positions.

Worked example: window 4, 5 tokens cached (positions 0-4), a step of the pending token (position 5) and a node
under it (position 6). The sliding layers see positions 2, 3, 4, then 5 and 6 (``seen`` = 3). The pending row sees
2-5; the node sees 3-6, so its mask row hides position 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import compat

from .kv import CacheNotRollbackable, GrowingLayer, cache_layers

SLIDING, CHUNKED, FULL = "sliding_attention", "chunked_attention", "full_attention"
"""The layer types (``config.layer_types``) whose masks :meth:`SlidingWindow.masks` makes: a sliding layer's row at
position ``P`` sees the keys at positions ``k`` with ``P - k < window``; a chunked layer's (Llama 4) those in its own
chunk of ``window`` positions, ``k // window == P // window``; a full layer's all of them."""


_SLIDING_LAYER = compat.rollbackable_layer_types()[1]


def is_sliding(layer) -> bool:
    """Whether a cache layer is a dynamic cache's sliding-window layer (its entries past the window dropped)."""
    return isinstance(layer, _SLIDING_LAYER)


@dataclass(frozen=True)
class SlidingWindow:
    """How a call of one row decodes past the ``window`` of its cache's sliding layers (see the module docstring).
    ``layer_types``: the model's ``config.layer_types`` (the masks go per type, a dict), or None (every layer slides:
    one mask)."""

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
        :class:`~lookahead.kv_cache.CacheNotRollbackable` for a model whose layers it cannot tell apart, or whose
        layer types it does not know."""
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
        """The attention masks of a step, from its full-attention ``mask`` [1, 1, q, past + q] (additive: 0 or the
        dtype's minimum; not changed), its rows' ``positions`` long[1, q] and the ``past`` tokens cached before it
        (at positions 0 .. past - 1): the sliding layers' mask [1, 1, q, seen + q], a new tensor (alone, or in a dict
        per layer type beside ``mask``)."""
        seen = min(past, self.window - 1)
        rows = positions[0]  # long[q]
        columns = torch.cat([torch.arange(past - seen, past, device=rows.device), rows])  # long[seen + q]
        return self._per_type(mask, mask[..., past - seen:], columns[None, :], rows[:, None])

    def _per_type(self, full: torch.Tensor, part: torch.Tensor, columns: torch.Tensor, rows: torch.Tensor):
        """The masks per layer type: ``full`` for full layers; ``part`` (the columns those layers see, at positions
        ``columns``) with each row's (at positions ``rows``) keys outside its window or chunk hidden for the others:
        one tensor when the model does not name its layer types (every layer slides), else a dict. ``columns`` and
        ``rows`` are shaped to broadcast to ``part``'s last two dimensions: [1, c] and [q, 1], or for a batch
        [b, 1, 1, c] and [b, 1, q, 1]."""
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
        """The masks of a step on a static cache whose sliding layers hold every column, as its full ones do
        (``static.full_length_layers``): ``mask`` [1, 1, q, columns] over all of them (not changed), ``positions``
        long[1, q] of the step's rows, written at columns ``past .. past + q - 1`` after ``past`` cached ones (column
        ``c < past`` holds position ``c``). The sliding (or chunked) layers' mask is ``mask`` with each row's keys
        outside its window (or chunk) hidden, a new tensor (alone, or in a dict per layer type beside ``mask``).

        Example: window 4, past 5, a row at position 5 and a node under it at 6 (columns 5 and 6): the row sees
        columns 2-5 of what ``mask`` lets it see, the node 3-6."""
        columns = torch.arange(mask.shape[-1], device=positions.device)
        q = positions.shape[1]
        columns[past : past + q] = positions[0]  # a step's columns hold its rows' positions (a node's: by depth)
        return self._per_type(mask, mask, columns[None, :], positions[0][:, None])

    def batch_masks(self, mask: torch.Tensor, positions: torch.Tensor, cached: torch.Tensor):
        """The masks of a batched step whose cache's sliding layers hold every column, as its full ones do
        (:meth:`widen`): ``mask`` [b, 1, q, T + q] (padding and holes hidden; not changed), ``positions`` long[b, q]
        of the step's rows (its columns' too), ``cached`` long[b, T] of each row's cached columns (a hidden
        column's: any). The sliding (or chunked) layers' mask is ``mask`` with each row's keys outside its window (or
        chunk) hidden, by position: a row's padding and holes do not count (plain batched ``generate``'s window is
        over its columns, whose distance within a left-padded row is the positions')."""
        columns = torch.cat([cached, positions], dim=1)  # long[b, T + q]
        return self._per_type(mask, mask, columns[:, None, None, :], positions[:, None, :, None])

    def widen(self, cache) -> None:
        """A batch's cache (or a padded row's), before its first forward: each sliding layer replaced by a plain one,
        which keeps every column (a batch's rows keep different numbers of columns, so a window's last columns are
        not every row's last tokens); :meth:`batch_masks` masks them by the window. The layers must be empty: the
        call's set-up checked it (:meth:`check_widenable`, before any forward)."""
        cache.layers[:] = [GrowingLayer(replaces=layer) if is_sliding(layer) else layer for layer in cache_layers(cache)]

    @staticmethod
    def check_widenable(cache) -> None:
        """Raise :class:`~lookahead.kv_cache.CacheNotRollbackable` when ``cache``'s sliding layers hold tokens already
        (:meth:`widen` needs them empty: their earlier columns are gone)."""
        if any(is_sliding(layer) and layer.is_initialized for layer in cache_layers(cache)):
            raise CacheNotRollbackable("the cache's sliding layers hold a window's last tokens already; a batch or a "
                                       "padded row past the window starts from an empty cache. Pass no cache, drop "
                                       "the padding, or use plain generate().")

    @staticmethod
    def start(cache) -> list:
        """Keep every entry of the sliding layers until each step's crop (before the call's first forward); returns
        those layers, which :meth:`restrict` and :meth:`finish` take (found once, not at every step)."""
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
                layer.crop(0)  # (past the window a sliding layer's crop(0) restricts it; it drops nothing)

    @staticmethod
    def finish(layers: list) -> None:
        """The call ended: the sliding ``layers`` restricted and recording no more, as plain ``generate`` leaves
        them."""
        SlidingWindow.restrict(layers)
        for layer in layers:
            layer.record_past = False


