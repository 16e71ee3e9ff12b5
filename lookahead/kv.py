"""KV-cache bookkeeping: keep the accepted path's entries and drop the rest, a layer that grows in place, and handing a
cache back as transformers made it.

After a step the cache holds ``base`` old entries followed by ``n_new`` entries of the step's rows. ``keep`` lists, in
order, which of those stay; they move to the front of the step's region and the rest is cropped. Example: base 10,
n_new 5, keep ``[0, 2, 4]``: entries 12 and 14 move to 11 and 12, then the cache is cropped to 13 entries.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import Cache, DynamicCache
from transformers.cache_utils import DynamicLayer

from . import compat
from ._tuning import DEFAULT
from .compat import crop_cache
from .packing import MASK_BITS


class CacheNotRollbackable(ValueError):
    """The model's cache cannot drop entries, so rejected drafts could not be undone."""


def cache_layers(cache: Cache) -> list:
    """The layers of a transformers ``Cache`` that hold per-token keys/values."""
    return list(getattr(cache, "layers", []))


def check_rollbackable(cache: Cache) -> None:
    """Raise :class:`CacheNotRollbackable` unless every layer can be cropped and gathered."""
    layers = cache_layers(cache)
    if not layers:
        raise CacheNotRollbackable(f"{type(cache).__name__} exposes no per-layer keys/values; LookaheadDecoder needs a "
                                   "cache whose entries can be dropped (e.g. DynamicCache). Use plain generate() for "
                                   "this model.")
    for layer in layers:
        if not getattr(layer, "is_croppable", False) or not hasattr(layer, "keys"):
            raise CacheNotRollbackable(f"the model's cache layer {type(layer).__name__} cannot roll back rejected "
                                       "draft tokens (static, quantized, sliding-window past its window, or recurrent "
                                       "state). LookaheadDecoder cannot decode this model exactly; use plain "
                                       "generate() for it.")


def keep_entries(cache: Cache, n_new: int, keep: list[int]) -> None:
    """Of the step's last ``n_new`` entries keep those at ``keep`` (increasing), in place."""
    moves = column_moves(keep)
    if moves:
        layers = kv_layers(cache)
        move_kept(layers, [layer.keys.shape[-2] - n_new for layer in layers], keep, moves)
    crop_cache(cache, n_new - len(keep))


def column_moves(keep: list[int]) -> list[tuple[int, int, int]]:
    """The slice copies, ``(to, from, count)`` per run of consecutive misplaced columns, that put a step's kept columns
    ``keep`` (increasing) at the front of its region. Example: ``[0, 1, 2, 9, 10]`` -> ``[(3, 9, 2)]``;
    ``[0, 2, 5]`` -> ``[(1, 2, 1), (2, 5, 1)]``; ``[0, 1]`` -> ``[]``."""
    moves: list[tuple[int, int, int]] = []
    for to, src in enumerate(keep):
        if src == to:
            continue
        if moves and moves[-1][1] + moves[-1][2] == src and moves[-1][0] + moves[-1][2] == to:
            moves[-1] = (moves[-1][0], moves[-1][1], moves[-1][2] + 1)
        else:
            moves.append((to, src, 1))
    return moves


def move_kept(layers: list, firsts: list[int], keep: list[int], moves: list | None = None) -> None:
    """Move one row's kept step columns ``keep`` (increasing) to the front of each layer's step region (from column
    ``firsts[i]`` of ``layers[i]``), in place: a slice copy per run (:func:`column_moves`) up to
    ``DEFAULT.max_moves`` runs, else one gather per tensor; the caller crops the rest."""
    moves = column_moves(keep) if moves is None else moves
    if not moves:
        return
    gather = len(moves) > DEFAULT.max_moves
    order = np.asarray(keep, dtype=np.int64) if gather else None
    src = None
    for layer, first in zip(layers, firsts):
        for t in (layer.keys, layer.values):
            host = host_view(t)  # NumPy copies skip torch's per-op dispatch
            if not gather:
                for to, frm, count in moves:  # left to right: each run reads right of all written before it
                    a, b = first + to, first + frm
                    if host is not None:  # NumPy reads an overlapping source before it writes
                        host[:, :, a : a + count] = host[:, :, b : b + count]
                    else:
                        piece = t[:, :, b : b + count]
                        t[:, :, a : a + count].copy_(piece.clone() if b - a < count else piece)
            elif host is not None:
                host[:, :, first : first + len(keep)] = host[:, :, first + order]  # the gather is a copy
            else:
                if src is None or src.device != t.device:
                    src = torch.from_numpy(order).to(t.device)
                t[:, :, first : first + len(keep)] = t[:, :, first:][:, :, src]  # the source is read before written


_NUMPY_FLOATS = (torch.float32, torch.float16, torch.float64)


def host_view(t: torch.Tensor) -> np.ndarray | None:
    """``t`` on a CPU as a NumPy array sharing its memory (bf16 as same-width integers: copying the bits copies the
    values); None otherwise (another device, gradients, not a float)."""
    if not t.is_cpu or t.requires_grad or t.layout != torch.strided:
        return None
    if t.dtype in _NUMPY_FLOATS:
        return t.numpy()
    bits = MASK_BITS.get(t.element_size()) if t.dtype.is_floating_point else None
    return None if bits is None else t.view(bits).numpy()


def kv_layers(cache: Cache) -> list:
    """The cache layers holding keys/values (layers sharing another's KV, or never written, are skipped)."""
    return [layer for layer in cache_layers(cache)
            if getattr(layer, "is_initialized", True) and layer.keys is not None and layer.keys.numel()]


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` whose keys/values live in a buffer with spare columns, written in place. Example: a 5-token
    prompt, then one token per step: the first update allocates 5 + 64 columns, the 65th step copies them into 134."""

    grow: int = DEFAULT.grow_columns
    replaces = None  # the layer it stands in for (a sliding one a widened cache keeps whole), or None: a plain one
    _storage: tuple[torch.Tensor, torch.Tensor] | None = None  # (keys, values) [b, heads, capacity, head_dim]
    _layout: tuple = ()  # per buffer (b, heads, head_dim, strides): its views' shapes, made without reading it
    _length: int | None = None  # the entries' length while they are the buffers' first columns; None: see _entries
    _entries: tuple = (None, None)  # (keys, values): tensors assigned from outside, or the last views made
    _made: int = -1  # the length ``_entries``' views were made for (-1: ``_entries`` came from outside)

    def __init__(self, replaces=None):
        super().__init__()
        self.replaces = replaces

    def _read(self, i: int):
        if self._length is not None and self._made != self._length:
            self._entries, self._made = self._views(self._length), self._length
        return self._entries[i]

    def _assign(self, i: int, tensor) -> None:
        entries = (self._read(0), self._read(1))  # the other one stays what it read before
        self._entries = (tensor, entries[1]) if i == 0 else (entries[0], tensor)
        self._length, self._made = None, -1

    keys = property(lambda self: self._read(0), lambda self, t: self._assign(0, t))
    values = property(lambda self: self._read(1), lambda self, t: self._assign(1, t))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, m = self._length, key_states.shape[-2]
        if n is None or not self._fits(key_states, value_states, n + m):
            n = self.get_seq_length()
            old = (self.keys, self.values)
            self._storage = tuple(new.new_empty((*new.shape[:2], n + m + self.grow, new.shape[3]))
                                  for new in (key_states, value_states))
            self._layout = tuple((b.shape[0], b.shape[1], b.shape[3], b.stride()) for b in self._storage)
            if n:  # grow, or adopt entries assigned from outside: one copy
                self._storage[0][:, :, :n] = old[0]
                self._storage[1][:, :, :n] = old[1]
        (keys, values), ((kb, kh, kd, ks), (vb, vh, vd, vs)) = self._storage, self._layout
        keys.as_strided((kb, kh, m, kd), ks, n * ks[2]).copy_(key_states)  # [:, :, n : n + m], a cheaper view
        values.as_strided((vb, vh, m, vd), vs, n * vs[2]).copy_(value_states)
        self._length = self._made = n + m
        self._entries = self._views(n + m)
        return self._entries

    def _views(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The buffers' first ``n`` columns."""
        (keys, values), ((kb, kh, kd, ks), (vb, vh, vd, vs)) = self._storage, self._layout
        return keys.as_strided((kb, kh, n, kd), ks), values.as_strided((vb, vh, n, vd), vs)

    def _fits(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int) -> bool:
        """Whether the buffers (holding the current entries) take ``length`` columns of these states."""
        for buffer, new in zip(self._storage, (key_states, value_states)):
            have, add = buffer.shape, new.shape
            if (have[2] < length or have[0] != add[0] or have[1] != add[1] or have[3] != add[3]
                    or buffer.dtype != new.dtype or buffer.device != new.device):
                return False
        return True

    def get_seq_length(self) -> int:
        return self._length if self._length is not None else super().get_seq_length()

    def crop(self, tokens_to_remove: int) -> None:
        if self._length is not None and tokens_to_remove < 0:  # a shorter length; views when read
            self._length = max(self._length + tokens_to_remove, 0)
            return
        super().crop(tokens_to_remove)

    def reset(self) -> None:
        self._storage, self._length, self._entries, self._made = None, None, (None, None), -1
        super().reset()


def grow_in_place(cache: Cache) -> Cache:
    """``cache``, its empty plain ``DynamicLayer``s turned into :class:`GrowingLayer`s in place."""
    layers = getattr(cache, "layers", None)
    if layers:
        layers[:] = [GrowingLayer() if type(layer) is DynamicLayer and not layer.is_initialized else layer
                     for layer in layers]
    return cache


PLAIN_LAYERS = (DynamicLayer, GrowingLayer)


def new_cache(model) -> DynamicCache:
    """A ``DynamicCache`` for ``model`` of :class:`GrowingLayer`s (:func:`grow_in_place`)."""
    return grow_in_place(DynamicCache(config=model.config))


def settle(cache) -> None:
    """At a call's end, ``cache`` as transformers made it: a :class:`GrowingLayer` becomes a ``DynamicLayer`` with the
    same entries; a layer standing in for a sliding one (``replaces``) gives it back, holding its window's last
    entries (``compat.refill_sliding``)."""
    layers = getattr(cache, "layers", None)
    for i, layer in enumerate(layers or ()):
        original = getattr(layer, "replaces", None)
        if original is not None:
            compat.refill_sliding(original, layer)
            layers[i] = original
        elif type(layer) is GrowingLayer:
            plain = DynamicLayer()
            if layer.is_initialized and layer.keys is not None:
                plain.lazy_initialization(layer.keys, layer.values)
                plain.keys, plain.values = layer.keys, layer.values
            layers[i] = plain
