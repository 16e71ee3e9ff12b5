"""The exact-acceptance core: which drafted tokens would the target model itself have produced.

Pure functions over tensors; no model inside. Every proposer (trie, window) goes through here.

Greedy rule: walk down the draft tree from the root; at each node take the argmax ``x`` of the
target's *processed* logits there (the user's logits processors applied with that node's own
prefix); if a child of the node carries ``x``, accept it and continue from it; otherwise emit
``x`` (the correction, or the bonus token when a leaf was accepted) and stop.

Sampling rule (drafts are deterministic, so the draft distribution q is a point mass): at a node
with processed distribution p, try its drafted children x1..xm in order; accept xj with
probability p_j(xj), where p_1 = p and p_{j+1} = p_j with xj zeroed and renormalised; continue
from an accepted child. If all are rejected, emit a token sampled from the final residual p_{m+1};
at a node without children, emit a token sampled from p (the bonus token). This equals sampling
y ~ p once and descending into the child carrying y if there is one, so every emitted token has
exactly the target's distribution. Since p_j(xj) = p(xj) / (1 - p(x1) - ... - p(x_{j-1})), the
accept/reject decisions need only the children's probabilities, gathered in one host round trip.

Worked example (greedy): tree tokens ``[5, 7, 9]``, parents ``[-1, -1, 0]``; argmax of the rows
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


def verify(
    logits: torch.Tensor,
    tree_tokens: list[int],
    tree_parents: list[int],
    prefix: torch.Tensor,
    logits_processor=None,
    do_sample: bool = False,
    keep_scores: bool = False,
    keep_raw: bool = False,
) -> Verdict:
    """The one verification entry point: greedy or sampled, same arguments (see the module docstring)."""
    if do_sample:
        return sample_verify(logits, tree_tokens, tree_parents, prefix, logits_processor, keep_scores, keep_raw)
    return greedy_verify(logits, tree_tokens, tree_parents, prefix, logits_processor, keep_scores, keep_raw)


def accept_among_children(p_children: list[float], uniforms: list[float], total: float = 1.0) -> int:
    """Index of the accepted child, or -1 when all are rejected (multi-candidate rejection sampling).

    ``p_children[j]`` is p(x_j) under the node's processed distribution, ``uniforms[j]`` ~ U[0, 1).
    Child j is accepted iff ``u_j < p(x_j) / (total - sum_{i<j} p(x_i))``; ``total`` is the sum of p
    as computed (1 up to rounding), so a child holding all the mass is accepted with certainty.

    Example: p = [0.5, 0.3], u = [0.7, 0.5]: child 0 rejected (0.7 >= 0.5); child 1 has
    p_2(x_2) = 0.3 / 0.5 = 0.6 > 0.5: accepted -> 1.
    """
    rest = total
    for j, (pj, u) in enumerate(zip(p_children, uniforms)):
        if rest <= 0.0:
            break
        if u * rest < pj:  # u < pj / rest, without dividing
            return j
        rest -= pj
    return -1


def _choose_sampled(scores: torch.Tensor, kids: dict[int, int]) -> tuple[int, int]:
    """(emitted token, accepted child or -1) at one node, by multi-candidate rejection sampling."""
    probs = torch.softmax(scores, dim=-1)[0]  # [V]
    if not kids:
        return int(torch.multinomial(probs, 1)), -1  # the bonus token
    cand = list(kids)  # drafted tokens, in tree order
    cand_idx = torch.tensor(cand, device=probs.device)
    *p_cand, total = torch.cat([probs[cand_idx], probs.sum()[None]]).tolist()
    j = accept_among_children(p_cand, torch.rand(len(cand)).tolist(), total)
    if j < 0:  # all rejected: sample from the residual
        residual = probs.clone()
        residual[cand_idx] = 0.0
        if float(residual.sum()) > 0.0:
            return int(torch.multinomial(residual, 1)), -1  # multinomial normalises
        j = max(range(len(cand)), key=p_cand.__getitem__)  # only rounding rejected the child holding all mass
    return cand[j], kids[cand[j]]


def _choose_greedy(scores: torch.Tensor, kids: dict[int, int]) -> tuple[int, int]:
    """(emitted token, accepted child or -1) at one node: the argmax, accepted if it was drafted."""
    x = int(scores.argmax(-1))
    return x, kids.get(x, -1)


def _walk(logits, tree_tokens, tree_parents, prefix, logits_processor, choose, keep_scores, keep_raw) -> Verdict:
    """Walk down the tree from the root, processing only the rows on the walked path."""
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
        x, child = choose(scores, children[row])
        tokens.append(x)
        if child < 0:
            return Verdict(nodes, tokens, scores_out, raw_out)
        nodes.append(child)
        row = child + 1
        ids = torch.cat([ids, ids.new_full((1, 1), x)], dim=1)


def sample_verify(
    logits: torch.Tensor,
    tree_tokens: list[int],
    tree_parents: list[int],
    prefix: torch.Tensor,
    logits_processor=None,
    keep_scores: bool = False,
    keep_raw: bool = False,
) -> Verdict:
    """Exact rejection-sampling verification of a draft tree (arguments as :func:`greedy_verify`).

    Randomness comes from torch's default generators (``torch.manual_seed`` makes runs repeatable).
    The processors run lazily, only at nodes on the walked path, each with its own prefix.
    """
    return _walk(logits, tree_tokens, tree_parents, prefix, logits_processor, _choose_sampled, keep_scores,
                 keep_raw)


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
    return _walk(logits, tree_tokens, tree_parents, prefix, logits_processor, _choose_greedy, keep_scores,
                 keep_raw)
