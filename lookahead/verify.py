"""The exact-acceptance core: which drafted tokens would the target model itself have produced.

Pure functions over tensors; no model inside. Every proposer (trie, window) goes through here.

Greedy rule: walk down the draft tree from the root; at each node take the argmax ``x`` of the
target's *processed* logits there (the user's logits processors applied with that node's own
prefix); if a child of the node carries ``x``, accept it and continue from it; otherwise emit
``x`` (the correction, or the bonus token when a leaf was accepted) and stop.

Sampling rule (drafts are deterministic, so the draft distribution q is a point mass): at each
node on the path, with processed distribution p, draw ``y ~ p`` by inverse CDF (vocabulary order)
from a uniform ``u`` that belongs to the emitted *position*; if a drafted child carries ``y``,
accept it and continue, else emit ``y`` and stop. This is multi-candidate rejection sampling:
the first drafted child x1 is accepted with probability p(x1); given it was rejected, x2 with
p(x2) / (1 - p(x1)), i.e. p with x1 zeroed and renormalised; and when all m children are
rejected, ``y`` is distributed as the final residual p with x1..xm zeroed. So every emitted token
has exactly the target's distribution. Because ``u`` belongs to the position and not to the
draft, the sampled text for a given seed is the same whatever was drafted: the tree, the budget
and the hardware change only the speed.

Worked example (greedy): tree tokens ``[5, 7, 9]``, parents ``[-1, -1, 0]``; argmax of the rows
(root, node0, node1, node2) = ``[5, 9, 3, 4]``. The root's argmax 5 is node 0's token: accept
node 0. Node 0's argmax 9 is node 2's token: accept node 2. Node 2's argmax 4 matches no child:
emit 4. Result: accepted nodes ``[0, 2]``, emitted tokens ``[5, 9, 4]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .kernels import greedy_walk


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


def greedy_verify_argmax(argmax, tree_tokens, tree_parents) -> Verdict:
    """Greedy walk given the argmax of every row (rows: root, then node 0..n-1); lists or int64 arrays.

    Example: argmax ``[5, 9, 3, 4]``, tokens ``[5, 7, 9]``, parents ``[-1, -1, 0]`` -> nodes ``[0, 2]``,
    tokens ``[5, 9, 4]``."""
    nodes, tokens = greedy_walk(np.asarray(argmax, dtype=np.int64), np.asarray(tree_tokens, dtype=np.int64),
                                np.asarray(tree_parents, dtype=np.int64))
    return Verdict(nodes.tolist(), tokens.tolist())


def verify(
    logits: torch.Tensor,
    tree_tokens: list[int],
    tree_parents: list[int],
    prefix: torch.Tensor,
    logits_processor=None,
    do_sample: bool = False,
    keep_scores: bool = False,
    keep_raw: bool = False,
    uniforms: list[float] | None = None,
) -> Verdict:
    """The one verification entry point: greedy or sampled, same arguments (see the module docstring).

    ``uniforms``: for sampling, one uniform per position this step can emit (tree depth + 1).
    """
    if do_sample:
        if uniforms is None:
            uniforms = torch.rand(len(tree_tokens) + 1).tolist()
        return sample_verify(logits, tree_tokens, tree_parents, prefix, uniforms, logits_processor, keep_scores,
                             keep_raw)
    return greedy_verify(logits, tree_tokens, tree_parents, prefix, logits_processor, keep_scores, keep_raw)


class PositionUniforms:
    """``u_t ~ U[0, 1)`` for every emitted position ``t`` of one call, from one seed.

    The seed is drawn from torch's default CPU generator when the call starts, so
    ``torch.manual_seed`` makes a sampled run repeatable.
    """

    def __init__(self, seed: int | None = None):
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        self._rng = np.random.default_rng(seed)
        self._u = np.zeros(0)

    def take(self, start: int, n: int) -> list[float]:
        """The uniforms of positions ``start .. start + n - 1``."""
        while len(self._u) < start + n:
            self._u = np.concatenate([self._u, self._rng.random(max(1024, n))])
        return self._u[start : start + n].tolist()


def sample_token(probs: torch.Tensor, u: float) -> int:
    """Inverse-CDF draw from ``probs`` float[V] (unnormalised is fine) with uniform ``u``.

    Example: probs ``[0.2, 0.0, 0.5, 0.3]``: u=0.1 -> 0, u=0.2 -> 2 (token 1 has no mass), u=0.95 -> 3.
    """
    cdf = probs.double().cumsum(0)
    idx = torch.searchsorted(cdf, cdf[-1:] * u, right=True)
    return int(idx.clamp_max(len(probs) - 1))


def _choose_sampled(scores: torch.Tensor, kids: dict[int, int], u: float) -> tuple[int, int]:
    """(emitted token, accepted child or -1) at one node: y ~ p, accepted if a child carries it."""
    y = sample_token(torch.softmax(scores, dim=-1)[0], u)
    return y, kids.get(y, -1)


def _choose_greedy(scores: torch.Tensor, kids: dict[int, int], u: float | None = None) -> tuple[int, int]:
    """(emitted token, accepted child or -1) at one node: the argmax, accepted if it was drafted."""
    x = int(scores.argmax(-1))
    return x, kids.get(x, -1)


def _walk(logits, tree_tokens, tree_parents, prefix, logits_processor, choose, keep_scores, keep_raw,
          uniforms=None) -> Verdict:
    """Walk down the tree from the root, processing only the rows on the walked path.

    The processors see ``prefix`` plus the path so far, as views of one buffer written token by token;
    a row's logits are copied before processing only when the raw logits are kept (a processor may
    work in place, and each row is processed once)."""
    children = children_lists(tree_tokens, tree_parents)
    row, nodes, tokens = 0, [], []
    scores_out = [] if keep_scores else None
    raw_out = [] if keep_raw else None
    length = prefix.shape[1]
    if logits_processor:  # [1, L + deepest path]: the prefix, then the accepted path's tokens
        path_ids = torch.empty((1, length + len(tree_tokens) + 1), dtype=prefix.dtype, device=prefix.device)
        path_ids[:, :length] = prefix
    while True:
        raw = logits[row : row + 1]  # [1, V]
        if logits_processor:
            scores = logits_processor(path_ids[:, : length + len(nodes)], raw.clone() if keep_raw else raw)
        else:
            scores = raw
        if keep_scores:
            scores_out.append(scores)
        if keep_raw:
            raw_out.append(raw)
        x, child = choose(scores, children[row], None if uniforms is None else uniforms[len(tokens)])
        tokens.append(x)
        if child < 0:
            return Verdict(nodes, tokens, scores_out, raw_out)
        if logits_processor:
            path_ids[0, length + len(nodes)] = x
        nodes.append(child)
        row = child + 1


def sample_verify(
    logits: torch.Tensor,
    tree_tokens: list[int],
    tree_parents: list[int],
    prefix: torch.Tensor,
    uniforms: list[float],
    logits_processor=None,
    keep_scores: bool = False,
    keep_raw: bool = False,
) -> Verdict:
    """Exact sampling verification of a draft tree (arguments as :func:`greedy_verify`).

    ``uniforms[i]``: the uniform of the i-th position this step emits. The processors run lazily,
    only at nodes on the walked path, each with its own prefix.
    """
    return _walk(logits, tree_tokens, tree_parents, prefix, logits_processor, _choose_sampled, keep_scores,
                 keep_raw, uniforms)


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
