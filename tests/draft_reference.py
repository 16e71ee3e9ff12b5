"""A plain-Python reference of merging draft trees, for the tests of ``drafting.sources.merge_proposals`` (Numba),
and :func:`build_draft`, a draft of one tree as given."""

from __future__ import annotations

import numpy as np

from lookahead.drafting.draft import Draft
from lookahead.drafting.trees import tree_depth_rank


def build_draft(tokens, parents, origin, match, window=None) -> Draft:
    """A draft of one proposed tree in its own order (depth and rank computed, no agreement)."""
    parents = np.asarray(parents, dtype=np.int64)
    depth, rank = tree_depth_rank(parents)
    return Draft(np.asarray(tokens, dtype=np.int64), parents, np.asarray(origin, dtype=np.int8),
                 np.asarray(match, dtype=np.int64), depth, rank, np.zeros(len(parents), dtype=np.int64), window)


def merge_trees(
    *trees: tuple[np.ndarray, np.ndarray], origins: list[int] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Union of draft trees with the same root; shared paths appear once.

    Each tree is (tokens int[n], parents int[n]), parent-first (``parents[i] < i``). Returns (tokens,
    parents, origin, agreement) in depth-first preorder, siblings in the order first drafted; ``origin[i]`` is
    ``origins[t]`` (default ``t``) for the first tree ``t`` that holds node ``i``, ``agreement[i]`` the
    number of other trees that hold it.

    Example: first = tokens ``[5, 6]``, parents ``[-1, 0]``; second = tokens ``[5, 7, 8]``,
    parents ``[-1, 0, -1]`` -> tokens ``[5, 6, 7, 8]``, parents ``[-1, 0, 0, -1]``,
    origin ``[0, 0, 1, 1]``, agreement ``[1, 0, 0, 0]``.
    """
    tokens: list[int] = []
    parents: list[int] = []
    origin: list[int] = []
    holders: list[set[int]] = []  # per node: the trees that hold it
    index: dict[tuple[int, int], int] = {}  # (parent index, token) -> node index
    origins = list(range(len(trees))) if origins is None else origins
    for t, (o, (toks, pars)) in enumerate(zip(origins, trees)):
        local: list[int] = []  # this tree's node -> merged index
        for tok, par in zip(np.asarray(toks).tolist(), np.asarray(pars).tolist()):
            mp = local[par] if par >= 0 else -1
            key = (mp, tok)
            if key not in index:
                index[key] = len(tokens)
                tokens.append(tok)
                parents.append(mp)
                origin.append(o)
                holders.append(set())
            holders[index[key]].add(t)
            local.append(index[key])
    children: list[list[int]] = [[] for _ in range(len(tokens) + 1)]  # per node (+1; 0: the root), first drafted first
    for i, par in enumerate(parents):
        children[par + 1].append(i)
    order: list[int] = []

    def visit(node: int) -> None:  # preorder: a node, then each child's subtree in turn
        for child in children[node + 1]:
            order.append(child)
            visit(child)

    visit(-1)
    new_index = {old: new for new, old in enumerate(order)}
    return (
        np.asarray([tokens[i] for i in order], dtype=np.int64),
        np.asarray([new_index[parents[i]] if parents[i] >= 0 else -1 for i in order], dtype=np.int64),
        np.asarray([origin[i] for i in order], dtype=np.int8),
        np.asarray([len(holders[i]) - 1 for i in order], dtype=np.int64),
    )
