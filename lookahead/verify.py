"""The exact-acceptance core: which drafted tokens would the target model itself have produced.

Pure functions over tensors; no model inside. Every proposer (trie, window) goes through here.

Greedy rule: walk down the draft tree from the root; at each node take the argmax ``x`` of the
target's *processed* logits there (the user's logits processors applied with that node's own
prefix); if a child of the node carries ``x``, accept it and continue from it; otherwise emit
``x`` (the correction, or the bonus token when a leaf was accepted) and stop.

Worked example: tree tokens ``[5, 7, 9]``, parents ``[-1, -1, 0]``; argmax of the rows
(root, node0, node1, node2) = ``[5, 9, 3, 4]``. The root's argmax 5 is node 0's token: accept
node 0. Node 0's argmax 9 is node 2's token: accept node 2. Node 2's argmax 4 matches no child:
emit 4. Result: accepted nodes ``[0, 2]``, emitted tokens ``[5, 9, 4]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Verdict:
    """Outcome of verifying one step.

    - ``nodes``: indices of the accepted draft nodes, root to leaf.
    - ``tokens``: emitted tokens: the accepted nodes' tokens followed by one more token.
    - ``scores``: the processed scores float[1, V] at each emitted position (only when asked for).
    - ``raw``: the unprocessed logits float[1, V] at each emitted position (only when asked for).
    """

    nodes: list[int]
    tokens: list[int]
    scores: list[torch.Tensor] | None = None
    raw: list[torch.Tensor] | None = None


def children_lists(tree_tokens: list[int], tree_parents: list[int]) -> list[dict[int, int]]:
    """For each row (0 = root, i+1 = node i): a dict token -> child node index.

    Example: tokens ``[5, 7, 9]``, parents ``[-1, -1, 0]`` -> ``[{5: 0, 7: 1}, {9: 2}, {}, {}]``.
    """
    children: list[dict[int, int]] = [{} for _ in range(len(tree_tokens) + 1)]
    for i, (tok, par) in enumerate(zip(tree_tokens, tree_parents)):
        children[par + 1].setdefault(int(tok), i)
    return children


def greedy_verify_argmax(argmax: list[int], tree_tokens: list[int], tree_parents: list[int]) -> Verdict:
    """Greedy walk given the argmax of every row (rows: root, then node 0..n-1)."""
    children = children_lists(tree_tokens, tree_parents)
    row, nodes, tokens = 0, [], []
    while True:
        x = argmax[row]
        tokens.append(x)
        child = children[row].get(x)
        if child is None:
            return Verdict(nodes, tokens)
        nodes.append(child)
        row = child + 1


def greedy_verify(
    logits: torch.Tensor,
    tree_tokens: list[int],
    tree_parents: list[int],
    prefix: torch.Tensor,
    logits_processor=None,
    keep_scores: bool = False,
    keep_raw: bool = False,
) -> Verdict:
    """Greedy verification of a draft tree.

    - ``logits``: float[n+1, V], row 0 = the root (the last context token), row i+1 = node i.
    - ``prefix``: long[1, L], the context; the processors see ``prefix`` plus the path to the node.
    - ``logits_processor``: a ``LogitsProcessorList`` (or None / empty). With processors the walk is
      lazy: only rows on the walked path are processed, each with its own prefix.
    """
    if not logits_processor and not keep_scores and not keep_raw:
        # one host round trip for the whole tree
        return greedy_verify_argmax(logits.argmax(-1).tolist(), tree_tokens, tree_parents)
    children = children_lists(tree_tokens, tree_parents)
    row, nodes, tokens = 0, [], []
    scores_out = [] if keep_scores else None
    raw_out = [] if keep_raw else None
    ids = prefix
    while True:
        raw = logits[row : row + 1]  # [1, V]
        scores = logits_processor(ids, raw.clone()) if logits_processor else raw
        if keep_scores:
            scores_out.append(scores)
        if keep_raw:
            raw_out.append(raw)
        x = int(scores.argmax(-1))
        tokens.append(x)
        child = children[row].get(x)
        if child is None:
            return Verdict(nodes, tokens, scores_out, raw_out)
        nodes.append(child)
        row = child + 1
        ids = torch.cat([ids, ids.new_full((1, 1), x)], dim=1)
