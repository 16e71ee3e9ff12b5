"""Tree packing: the input ids, position ids and 4D attention mask of one step.

One step's query rows are, in order:

1. the *pending* tokens (causal among themselves; they see the whole KV cache),
2. the *draft tree* nodes in breadth-first order: node ``i`` sees the KV cache, all pending
   tokens and exactly its own ancestors (and itself) in the tree.

Worked example: one pending token ``p`` at position 10, draft tree tokens ``[a, b, c]`` with
parents ``[-1, -1, 0]`` (``a`` and ``b`` follow ``p``; ``c`` follows ``a``)::

    rows     ids  positions   sees (new columns p a b c)
    p        p    10          1 0 0 0
    a        a    11          1 1 0 0
    b        b    11          1 0 1 0
    c        c    12          1 1 0 1

Every row also sees the cached columns that are not padding.
"""

from __future__ import annotations

import numpy as np
import torch


def tree_depths(parents: np.ndarray) -> np.ndarray:
    """Depth of each node (children of the root have depth 1).

    ``parents``: int[n], breadth-first (``parents[i] < i``), -1 for children of the root.
    Returns int64[n]. Example: ``tree_depths([-1, -1, 0, 2]) -> [1, 1, 2, 3]``.
    """
    parents = np.asarray(parents, dtype=np.int64)
    depth = np.zeros(len(parents), dtype=np.int64)
    for i, p in enumerate(parents):
        if p >= i:
            raise ValueError(f"parents must be breadth-first (parents[i] < i); got parents[{i}]={p}")
        depth[i] = 1 if p < 0 else depth[p] + 1
    return depth


def tree_visibility(parents: np.ndarray) -> np.ndarray:
    """bool[n, n]: ``vis[i, j]`` is True iff node ``j`` is node ``i`` or one of its ancestors.

    Example: ``parents=[-1, -1, 0]`` gives rows ``[1,0,0], [0,1,0], [1,0,1]``.
    """
    parents = np.asarray(parents, dtype=np.int64)
    n = len(parents)
    vis = np.eye(n, dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            vis[i] |= vis[p]
    return vis


def pack_step(
    pending: torch.Tensor,
    pending_pos: torch.Tensor,
    tree_tokens: np.ndarray,
    tree_parents: np.ndarray,
    col_visible: torch.Tensor | None,
    past_len: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Build the model inputs of one step.

    - ``pending``: long[1, p] on the model's device; ``pending_pos``: long[1, p] their positions.
    - ``tree_tokens``: int[n]; ``tree_parents``: int[n] (host arrays from the trie).
    - ``col_visible``: bool[past_len + p], False for padding among the cached and pending tokens,
      or None when there is no padding.
    - Returns ``input_ids`` long[1, p+n], ``position_ids`` long[1, p+n] and an additive float
      ``mask`` [1, 1, p+n, past_len+p+n] (0 where visible, dtype's min elsewhere), all on the
      device of ``pending``.
    """
    device = pending.device
    p = pending.shape[1]
    n = len(tree_tokens)
    q = p + n
    # new-columns block, built on the host (tiny) and copied once
    block = np.zeros((q, q), dtype=bool)
    block[:p, :p] = np.tril(np.ones((p, p), dtype=bool))
    if n:
        block[p:, :p] = True
        block[p:, p:] = tree_visibility(tree_parents)
    visible = torch.from_numpy(block).to(device, non_blocking=True)  # [q, q]
    if past_len:
        visible = torch.cat([torch.ones(q, past_len, dtype=torch.bool, device=device), visible], dim=1)
    if col_visible is not None:  # padding columns are never seen
        visible[:, : past_len + p] &= col_visible[None, :]
    # visible: [q, past_len + q]
    mask = torch.zeros(visible.shape, dtype=dtype, device=device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    if n:
        ids = torch.cat([pending, torch.from_numpy(np.asarray(tree_tokens, dtype=np.int64)).to(device)[None]], 1)
        depth = torch.from_numpy(tree_depths(tree_parents)).to(device)
        pos = torch.cat([pending_pos, pending_pos[:, -1:] + depth[None]], dim=1)
    else:
        ids, pos = pending, pending_pos
    return ids, pos, mask[None, None]
