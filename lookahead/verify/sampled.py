"""The acceptance rule of ``lookahead.verify`` where processed scores or sampling decide: a walk down the tree that
processes only the rows on the accepted path. Greedy rows whose processors are token bans come here only when their
top-k cannot decide.
"""

from __future__ import annotations

import numpy as np
import torch

from . import Verdict, greedy_walk


def processed_verdict(verifier, logits: torch.Tensor, draft, rows, i: int) -> Verdict:
    """Row ``i``'s verdict from its processed scores (sampled, kept as ``verifier`` says): ``logits``
    float[1 + n (+ more), V]; ``rows`` as ``Verifier.verify`` takes them."""
    n = len(draft)
    uniforms = rows.uniforms(i, n + 1) if verifier.sampling else None
    return verify(logits[: n + 1], draft.tokens.tolist(), draft.parents.tolist(), rows.prefix(i),
                  rows.processors(i), do_sample=verifier.sampling, keep_scores=verifier.keep_scores,
                  keep_raw=verifier.keep_raw, uniforms=uniforms)


def children_lists(tree_tokens: list[int], tree_parents: list[int]) -> list[dict[int, int]]:
    """Per row (0 = root, i+1 = node i): token -> child node index. Example: tokens ``[5, 7, 9]``, parents
    ``[-1, -1, 0]`` -> ``[{5: 0, 7: 1}, {9: 2}, {}, {}]``."""
    children: list[dict[int, int]] = [{} for _ in range(len(tree_tokens) + 1)]
    for i, (tok, par) in enumerate(zip(tree_tokens, tree_parents)):
        children[par + 1].setdefault(int(tok), i)
    return children


class PositionUniforms:
    """``u_t ~ U[0, 1)`` for every emitted position ``t`` of one call, from one seed (by default drawn from torch's CPU
    generator, so ``torch.manual_seed`` makes a sampled run repeatable)."""

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
    """Inverse-CDF draw from ``probs`` float[V] (unnormalised is fine) with uniform ``u``. Example: probs
    ``[0.2, 0.0, 0.5, 0.3]``: u=0.1 -> 0, u=0.2 -> 2 (token 1 has no mass), u=0.95 -> 3."""
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
    """Walk down the tree, processing only the rows on the path (with ``prefix`` plus the path so far); a row is cloned
    first only when raw logits are kept (a processor may work in place)."""
    children = children_lists(tree_tokens, tree_parents)
    row, nodes, tokens = 0, [], []
    scores_out, raw_out = ([] if keep_scores else None), ([] if keep_raw else None)
    length = prefix.shape[1]
    if logits_processor:  # [1, L + deepest path]: the prefix, then the accepted path's tokens
        path_ids = torch.empty((1, length + len(tree_tokens) + 1), dtype=prefix.dtype, device=prefix.device)
        path_ids[:, :length] = prefix
    while True:
        raw = scores = logits[row : row + 1]  # [1, V]
        if logits_processor:
            scores = logits_processor(path_ids[:, : length + len(nodes)], raw.clone() if keep_raw else raw)
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


def verify(logits: torch.Tensor, tree_tokens: list[int], tree_parents: list[int], prefix: torch.Tensor,
           logits_processor=None, do_sample: bool = False, keep_scores: bool = False, keep_raw: bool = False,
           uniforms: list[float] | None = None) -> Verdict:
    """One row's verdict, greedy or sampled: ``logits`` float[n + 1, V] (row 0 the root, row ``i + 1`` node ``i``),
    ``prefix`` long[1, L] its context; processors run only on the walked path; ``uniforms``: one per emittable
    position."""
    if do_sample and uniforms is None:
        uniforms = torch.rand(len(tree_tokens) + 1).tolist()
    return _walk(logits, tree_tokens, tree_parents, prefix, logits_processor,
                 _choose_sampled if do_sample else _choose_greedy, keep_scores, keep_raw, uniforms)


def greedy_verify_argmax(argmax, tree_tokens, tree_parents) -> Verdict:
    """:func:`verify`'s greedy verdict without processors, given every row's argmax (root, then nodes 0..n-1): lists
    or int64 arrays (``verify.greedy_walk``)."""
    nodes, tokens = greedy_walk(*(np.asarray(a, dtype=np.int64) for a in (argmax, tree_tokens, tree_parents)))
    return Verdict(nodes.tolist(), tokens.tolist())
