"""Reference rules for drafts *sampled* from a proposer's own distribution q (speculative sampling, Leviathan
et al. 2023 / Chen et al. 2023), for the tests: the decoder verifies deterministic drafts with its point-mass
rule (``lookahead.verify``), and ``tests/test_selfspec.py`` checks that rule against these on sampled chains.
"""

from __future__ import annotations

import torch

from lookahead.verify import Verdict
from lookahead.verify.sampled import sample_token


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``norm(max(p - q, 0))`` float[V] (float64), the distribution to sample from after a rejection; ``p``
    itself where ``p <= q`` everywhere (then a rejection has probability 0).

    Example: p ``[0.5, 0.3, 0.2]``, q ``[0.2, 0.6, 0.2]`` -> ``[1, 0, 0]``.
    """
    r = (p.double() - q.double()).clamp_min(0.0)  # [V]
    total = r.sum()
    return r / total if float(total) > 0 else p.double() / p.double().sum()


def speculative_accept(p: torch.Tensor, q: torch.Tensor, x: int, u: float) -> bool:
    """Accept the sampled draft ``x ~ q`` iff ``u < min(1, p(x) / q(x))`` (``u ~ U[0, 1)``).

    Example: p ``[0.5, 0.3, 0.2]``, q ``[0.2, 0.6, 0.2]``, x = 1: accepted with probability 0.3 / 0.6 = 0.5.
    """
    px, qx = float(p[x]), float(q[x])
    return qx <= 0.0 or u * qx < px


def speculative_verify_chain(p_rows: torch.Tensor, q_rows: torch.Tensor, draft: list[int], u_accept: list[float],
                             u_sample: list[float]) -> Verdict:
    """Exact verification of a chain ``draft`` (n tokens) whose token ``i`` was *sampled* from ``q_rows[i]``.

    - ``p_rows``: float[n + 1, V], the target's processed probabilities at the root (row 0) and after each draft
      token (row i + 1: after draft[:i + 1]).
    - ``q_rows``: float[n, V], the proposer's distribution each draft token was sampled from.
    - ``u_accept``: n uniforms (one per draft token); ``u_sample``: n + 1 uniforms (one per position).

    Walk: accept ``draft[i]`` with probability ``min(1, p_i(x) / q_i(x))``; at the first rejection emit a sample
    of ``norm(max(p_i - q_i, 0))`` and stop; when all n are accepted, emit a sample of ``p_n`` (the bonus token).
    Every emitted token then has exactly the target's distribution (the accepted mass ``min(p, q)`` plus the
    rejected mass ``(1 - sum min(p, q)) * residual`` sums to ``p``).

    Worked example: p_0 ``[0.5, 0.3, 0.2]``, q_0 ``[0.2, 0.6, 0.2]``, draft ``[1]``, u_accept ``[0.7]``:
    0.7 >= 0.3 / 0.6, rejected; the residual is ``[1, 0, 0]``, so token 0 is emitted: nodes ``[]``, tokens ``[0]``.
    """
    nodes, tokens = [], []
    for i, x in enumerate(draft):
        if not speculative_accept(p_rows[i], q_rows[i], x, u_accept[i]):
            tokens.append(sample_token(residual_distribution(p_rows[i], q_rows[i]), u_sample[i]))
            return Verdict(nodes, tokens)
        nodes.append(i)
        tokens.append(int(x))
    tokens.append(sample_token(p_rows[len(draft)].double(), u_sample[len(draft)]))
    return Verdict(nodes, tokens)
