"""A step packed whole: its ids, positions and full mask built anew, by ``packing``'s rules (``packing.StepMask``
writes only a step's block into a buffer kept across steps): a prompt's step with a tree, window rows or padding,
and every batched step (``batch.fill_batch_masks``)."""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from .drafting.trees import tree_depth_rank
from .packing import step_block, step_inputs


def pack_step(pending: np.ndarray, pending_pos: np.ndarray, tree_tokens: np.ndarray, tree_parents: np.ndarray,
              col_visible: np.ndarray | None, past_len: int, dtype: torch.dtype,
              window: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None, device: torch.device | str = "cpu",
              tree_depth: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(``input_ids`` long[1, q], ``position_ids`` long[1, q], additive ``mask`` of ``dtype`` [1, 1, q, past_len + q])
    of one step, q = p + n + m. ``pending`` int[p] at ``pending_pos``; the tree's ``tree_tokens`` / ``tree_parents``
    / ``tree_depth`` int[n] (computed when None); ``col_visible`` bool[past_len + p], False for padding, or None;
    ``window``: (tokens int[m], offsets from the last pending position int[m], visibility bool[m, m]) or None."""
    pending = np.asarray(pending, dtype=np.int64).reshape(-1)
    pending_pos = np.asarray(pending_pos, dtype=np.int64).reshape(-1)
    p, n = len(pending), len(tree_tokens)
    m = 0 if window is None else len(window[0])
    q = p + n + m
    host_dtype = np.float64 if dtype == torch.float64 else np.float32  # holds the dtype's min exactly
    mask = np.empty((q, past_len + q), dtype=host_dtype)
    fill_step_mask(mask, p, np.asarray(tree_parents, dtype=np.int64),
                   np.asarray(window[2], dtype=bool) if m else np.zeros((0, 0), dtype=bool),
                   np.zeros(0, dtype=bool) if col_visible is None else np.asarray(col_visible, dtype=bool),
                   float(torch.finfo(dtype).min))
    depth = tree_depth_rank(tree_parents)[0] if tree_depth is None else tree_depth
    ids, pos = step_inputs(pending, pending_pos, tree_tokens, depth, window, device)
    return ids, pos, torch.from_numpy(mask[None, None]).to(device, dtype)


@njit(cache=True)
def fill_step_mask(mask, p, parents, window_visible, col_visible, neg):
    """One step's additive mask ``mask`` float[q, past_len + q], q = p + n + m, in place. ``parents``:
    parent-first; ``window_visible`` bool[m, m]; ``col_visible`` bool[past_len + p] (empty: no padding)."""
    q = mask.shape[0]
    past = mask.shape[1] - q
    mask[:, :past] = 0.0
    step_block(mask, past, p, parents, window_visible, neg)
    if len(col_visible):
        for j in range(past + p):
            if not col_visible[j]:
                mask[:, j] = neg
