"""Packing a step: its input ids, position ids and 4D attention mask.

A step's query rows are, in order: the *pending* tokens (causal among themselves; they see the whole cache), the draft
tree's nodes (node ``i`` sees the cache, the pending tokens, its ancestors and itself), and optionally the window's rows
(the cache, the pending tokens and what their layout allows; tree and window rows never see each other). Dummy nodes
(a batch's padding to one width, a static cache's bucket) see the pending tokens and themselves. Every row also sees the
cached columns that are not padding. Masks are additive: 0 where a row sees a column, the dtype's minimum elsewhere.

Example: one pending token ``p`` at position 10, tokens ``[a, b, c]``, parents ``[-1, -1, 0]``::

    rows     ids  positions   sees (new columns p a b c)
    p        p    10          1 0 0 0
    a        a    11          1 1 0 0
    b        b    11          1 0 1 0
    c        c    12          1 1 0 1
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit


def step_inputs(pending: np.ndarray, pending_pos: np.ndarray, tree_tokens: np.ndarray, tree_depth: np.ndarray,
                window=None, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, position ids) long[1, q] of one step: the nodes at the last pending position plus their depth,
    the window rows at their offsets. A plain step on a CPU returns views of ``pending`` / ``pending_pos``."""
    m = 0 if window is None else len(window[0])
    on_cpu = getattr(device, "type", device) == "cpu"
    p, n = len(pending), len(tree_tokens)
    if not m and not n and on_cpu:
        return torch.from_numpy(pending[None]), torch.from_numpy(pending_pos[None])
    both = np.empty((2, p + n + m), np.int64)  # [ids; positions]: one array, one copy to the device
    both[0, :p], both[1, :p] = pending, pending_pos
    last = pending_pos[-1]
    if n:
        both[0, p : p + n], both[1, p : p + n] = tree_tokens, last + np.asarray(tree_depth, dtype=np.int64)
    if m:
        both[0, p + n :], both[1, p + n :] = window[0], last + np.asarray(window[1], dtype=np.int64)
    if on_cpu:
        return torch.from_numpy(both[0:1]), torch.from_numpy(both[1:2])
    t = torch.from_numpy(both).to(device)
    return t[0:1], t[1:2]


_NO_WINDOW = np.zeros((0, 0), dtype=bool)
_NO_IDS = np.zeros(0, dtype=np.int64)
_NO_COLUMNS = np.zeros(0, dtype=bool)
MASK_BITS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class StepMask:
    """One row's step masks in a buffer [1, 1, rows, columns] of the model's dtype (0 and the dtype's minimum, written
    as same-width integers: bf16 has no NumPy type): each step writes its own ``q x q`` block (on a GPU built on the
    host and copied in). Example: ``StepMask(64, 512, torch.float32, "cpu")(past=100, pending=1,
    parents=array([-1, 0]))`` -> a [1, 1, 3, 103] view: every row sees the 100 cached columns; rows p, a, b see
    ``p``, ``p a``, ``p a b``."""

    def __init__(self, rows: int, columns: int, dtype: torch.dtype, device, col_visible: np.ndarray | None = None):
        self.dtype, self.device = dtype, torch.device(device)
        self.col_visible = _NO_COLUMNS if col_visible is None else np.asarray(col_visible, dtype=bool)
        self.bits = MASK_BITS[torch.finfo(dtype).bits // 8]
        self.neg = int(torch.tensor(torch.finfo(dtype).min, dtype=dtype).view(self.bits).item())
        self.buffer = torch.zeros((1, 1, rows, columns), dtype=dtype, device=self.device)
        self._hide(slice(None), 0, columns)
        self._host = self._host_view()
        self.clean = 0  # columns before this are in the invariant state (visible, but padding)
        self.rows_used = 0
        self._inputs: torch.Tensor | None = None  # [2, rows] on a CPU: a step's ids and positions (:meth:`step`)

    def _host_view(self) -> np.ndarray | None:
        return self.buffer[0, 0].view(self.bits).numpy() if self.device.type == "cpu" else None

    def _hide(self, rows: slice, start: int, stop: int) -> None:
        """Hide the padding among columns ``start .. stop - 1`` from the buffer's ``rows``."""
        pad = np.flatnonzero(~self.col_visible[start:stop]) + start
        if len(pad):
            self.buffer[:, :, rows, torch.from_numpy(pad).to(self.device)] = torch.finfo(self.dtype).min

    def __call__(self, past: int, pending: int, parents: np.ndarray, window_visible: np.ndarray | None = None
                 ) -> torch.Tensor:
        """The mask [1, 1, q, past + q] of a step of ``pending`` tokens, the tree ``parents`` and the window rows'
        visibility after ``past`` cached tokens: a view valid until the next call."""
        window = _NO_WINDOW if window_visible is None else window_visible
        q = pending + len(parents) + window.shape[0]
        if q > self.buffer.shape[2] or past + q > self.buffer.shape[3]:
            self._grow(q, past + q)
        clean = min(self.clean, past)
        if self._host is not None:
            fill_step_block(self._host, past, pending, parents, window, self.col_visible, self.neg, clean,
                            self.rows_used)
        else:
            self._fill_on_device(past, pending, parents, window, clean, q)
        return self._written(past, q)

    def _written(self, past: int, q: int) -> torch.Tensor:
        """Record a written block; returns the mask [1, 1, q, past + q]."""
        self.clean, self.rows_used = past, max(self.rows_used, q)
        return self.buffer.as_strided((1, 1, q, past + q), self.buffer.stride())  # [:, :, :q, :past + q], cheaper

    def step(self, past: int, pending: np.ndarray, pending_pos: np.ndarray, tokens: np.ndarray, depth: np.ndarray,
             parents: np.ndarray, window: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None):
        """:func:`step_inputs` and :meth:`__call__` of a step; on a CPU one kernel call into buffers kept across steps
        (views valid until the next call). ``window``: a ``draft.WindowRows`` or None."""
        q = len(pending) + len(tokens) + (0 if window is None else len(window[0]))
        host = self._host
        if host is None or q > host.shape[0] or past + q > host.shape[1]:
            mask = self(past, len(pending), parents, None if window is None else window[2])
            return (*step_inputs(pending, pending_pos, tokens, depth, window, self.device), mask)
        if self._inputs is None or self._inputs.shape[1] < host.shape[0]:  # new, or the mask's rows grew
            self._inputs = torch.empty((2, host.shape[0]), dtype=torch.long)
            self._inputs_host = self._inputs.numpy()
        w_tokens, w_offsets, w_visible = (_NO_IDS, _NO_IDS, _NO_WINDOW) if window is None else window
        fill_step(host, self._inputs_host, past, pending, pending_pos, tokens, depth, parents, w_tokens, w_offsets,
                  w_visible, self.col_visible, self.neg, min(self.clean, past), self.rows_used)
        inputs, width = self._inputs, self._inputs.shape[1]
        return (inputs.as_strided((1, q), (width, 1)), inputs.as_strided((1, q), (width, 1), width),
                self._written(past, q))

    def _fill_on_device(self, past, pending, parents, window, clean, q) -> None:
        block = np.empty((q, q), dtype=np.dtype(f"int{torch.finfo(self.dtype).bits}"))
        fill_step_block(block, 0, pending, parents, window, _NO_COLUMNS, self.neg, 0, 0)
        buf = self.buffer[0, 0].view(self.bits)
        if past > clean and self.rows_used:
            buf[: self.rows_used, clean:past] = 0
            pad = np.flatnonzero(~self.col_visible[clean:past]) + clean if len(self.col_visible) else ()
            if len(pad):
                buf[:, torch.from_numpy(np.asarray(pad)).to(self.device)] = self.neg
        buf[:q, past : past + q].copy_(torch.from_numpy(block), non_blocking=True)

    def _grow(self, rows: int, columns: int) -> None:
        old = self.buffer
        old_rows, old_cols = old.shape[2], old.shape[3]
        self.buffer = torch.zeros((1, 1, max(rows, old_rows), max(columns, 2 * old_cols)), dtype=self.dtype,
                                  device=self.device)
        self.buffer[:, :, :old_rows, :old_cols] = old
        self._hide(slice(None), old_cols, self.buffer.shape[3])
        if rows > old_rows and old_cols:  # new rows: visible cached columns, padding hidden
            self._hide(slice(old_rows, None), 0, old_cols)
        self._host = self._host_view()


# -- kernels ----------------------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def step_block(mask, past, p, parents, window_visible, neg):
    """The step's own block ``mask[:q, past:past + q]``, by the module docstring's rules."""
    n = len(parents)
    m = window_visible.shape[0]
    q = p + n + m
    for r in range(q):
        for c in range(past, past + q):
            mask[r, c] = neg
    for i in range(p):
        for j in range(i + 1):
            mask[i, past + j] = 0
    for i in range(n):
        row = p + i
        for j in range(p):
            mask[row, past + j] = 0
        a = i
        while a >= 0:  # itself and its ancestors
            mask[row, past + p + a] = 0
            a = parents[a]
    for i in range(m):
        row = p + n + i
        for j in range(p):
            mask[row, past + j] = 0
        for j in range(m):
            if window_visible[i, j]:
                mask[row, past + p + n + j] = 0


@njit(cache=True)
def fill_step_block(mask, past, p, parents, window_visible, col_visible, neg, clean_from, rows_used):
    """One step's mask in a buffer ``mask`` [rows, columns] (any integer or float view): columns ``clean_from .. past
    - 1`` (the last step's block, now cached) of the first ``rows_used`` rows visible again but for padding, then
    the block ``mask[:q, past:past + q]``."""
    for r in range(rows_used):
        for c in range(clean_from, past):
            mask[r, c] = neg if (len(col_visible) and not col_visible[c]) else 0
    step_block(mask, past, p, parents, window_visible, neg)


@njit(cache=True)
def fill_step(mask, inputs, past, pending, pending_pos, tokens, depth, parents, window_tokens, window_offsets,
              window_visible, col_visible, neg, clean_from, rows_used):
    """:func:`fill_step_block` plus the ids (``inputs[0]``) and positions (``inputs[1]``) :func:`step_inputs` makes.
    Example: pending ``[7]`` at 9, tokens ``[5, 6]`` of depths ``[1, 2]`` -> ``inputs[:, :3]`` =
    ``[[7, 5, 6], [9, 10, 11]]``."""
    p = pending.shape[0]
    n = tokens.shape[0]
    fill_step_block(mask, past, p, parents, window_visible, col_visible, neg, clean_from, rows_used)
    last = pending_pos[p - 1]
    for i in range(p):
        inputs[0, i] = pending[i]
        inputs[1, i] = pending_pos[i]
    for j in range(n):
        inputs[0, p + j] = tokens[j]
        inputs[1, p + j] = last + depth[j]
    for j in range(window_tokens.shape[0]):
        inputs[0, p + n + j] = window_tokens[j]
        inputs[1, p + n + j] = last + window_offsets[j]


