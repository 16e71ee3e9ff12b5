"""A plain-Python reference of merging draft trees, for the tests of ``proposer.merge_proposals`` (Numba)."""

from __future__ import annotations

import numpy as np


def merge_trees(
    *trees: tuple[np.ndarray, np.ndarray], origins: list[int] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Union of draft trees with the same root; shared paths appear once.

    Each tree is (tokens int[n], parents int[n]) in breadth-first order. Returns (tokens, parents,
    origin) in breadth-first order; ``origin[i]`` is ``origins[t]`` (default ``t``) for the first
    tree ``t`` that holds node ``i``.

    Example: first = tokens ``[5, 6]``, parents ``[-1, 0]``; second = tokens ``[5, 7, 8]``,
    parents ``[-1, 0, -1]`` -> tokens ``[5, 8, 6, 7]``, parents ``[-1, -1, 0, 0]``,
    origin ``[0, 1, 0, 1]``.
    """
    tokens: list[int] = []
    parents: list[int] = []
    origin: list[int] = []
    depth: list[int] = []
    index: dict[tuple[int, int], int] = {}  # (parent index, token) -> node index
    origins = list(range(len(trees))) if origins is None else origins
    for o, (toks, pars) in zip(origins, trees):
        local: list[int] = []  # this tree's node -> merged index
        for tok, par in zip(np.asarray(toks).tolist(), np.asarray(pars).tolist()):
            mp = local[par] if par >= 0 else -1
            key = (mp, tok)
            if key not in index:
                index[key] = len(tokens)
                tokens.append(tok)
                parents.append(mp)
                origin.append(o)
                depth.append(1 if mp < 0 else depth[mp] + 1)
            local.append(index[key])
    order = sorted(range(len(tokens)), key=lambda i: (depth[i], i))  # stable: breadth-first again
    new_index = {old: new for new, old in enumerate(order)}
    return (
        np.asarray([tokens[i] for i in order], dtype=np.int64),
        np.asarray([new_index[parents[i]] if parents[i] >= 0 else -1 for i in order], dtype=np.int64),
        np.asarray([origin[i] for i in order], dtype=np.int8),
    )
