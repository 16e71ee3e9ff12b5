"""A batch's verification (``lookahead.batch``): every live row's verdict from one forward's logits."""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from . import Verdict, Verifier, apply_bans, cut_tops, greedy_verdict, row_lengths, walk_tree
from .sampled import processed_verdict


class BatchVerifier(Verifier):
    """:class:`Verifier` for several rows."""

    def verify(self, logits: torch.Tensor, drafts: list, rows, k: int):
        """(per row its verdict, None for a finished row; None; the top-``k`` (ids, logits) [b, 1 + w, k] of every
        row's root and nodes, None when ``k`` is 0) from ``logits`` [b, q, V] (row ``i``: its root, then its
        nodes); ``rows`` in the cache's order. One row: :meth:`Verifier.verify`."""
        if len(drafts) == 1:
            return super().verify(logits, drafts, rows, k)
        width = max(k, self.ban_width)  # the top-k read per verified row
        done = [rows.is_done(i) for i in range(len(drafts))]
        counts = np.array([0 if gone else len(d) + 1 for d, gone in zip(drafts, done)], dtype=np.int64)
        argmax, tops = self.read_rows(logits, counts if self.argmax_verdicts else None, counts, width)
        live = [i for i, gone in enumerate(done) if not gone]
        verdicts: list[Verdict | None] = [None] * len(drafts)
        if self.argmax_verdicts and (self.bans is None or apply_bans(argmax, *tops, counts,
                                                                     row_lengths(rows, drafts), *self.bans)):
            for i, v in zip(live, greedy_verdicts(argmax[live], [drafts[i] for i in live])):
                verdicts[i] = v
        else:
            for i in live:
                verdicts[i] = processed_verdict(self, logits[i], drafts[i], rows, i)
        return verdicts, None, cut_tops(tops, k)


def greedy_verdicts(argmax: np.ndarray, drafts) -> list[Verdict]:
    """Every row's greedy verdict from its rows' argmax int64[b, q] (row ``i``: its root, then its nodes)."""
    if len(drafts) == 1:
        return [greedy_verdict(argmax[0], drafts[0])]
    counts = np.array([len(d) for d in drafts], dtype=np.int64)  # the trees, padded to the widest
    w = max(int(counts.max()) if len(counts) else 0, 1)
    tokens, parents = np.zeros((len(drafts), w), np.int64), np.full((len(drafts), w), -2, np.int64)
    for i, d in enumerate(drafts):
        tokens[i, : len(d)] = d.tokens
        parents[i, : len(d)] = d.parents
    nodes, accepted, emitted = greedy_walks(argmax, tokens, parents, counts)
    return [Verdict(nodes[i, :a].tolist(), emitted[i, : a + 1].tolist()) for i, a in enumerate(accepted.tolist())]


@njit(cache=True, nogil=True)
def greedy_walks(argmax, tokens, parents, counts):
    """:func:`greedy_walk` over a batch: row ``i``'s tree is ``tokens[i, :counts[i]]`` / ``parents[i, :counts[i]]``
    (int64[b, w]), its argmax ``argmax[i, :1 + counts[i]]``. Returns (nodes int64[b, w], accepted int64[b], emitted
    int64[b, w + 1]): row ``i`` accepts ``nodes[i, :accepted[i]]`` and emits ``emitted[i, :accepted[i] + 1]``."""
    b, w = tokens.shape
    nodes = np.empty((b, w), np.int64)
    accepted = np.zeros(b, np.int64)
    emitted = np.empty((b, w + 1), np.int64)
    for i in range(b):
        accepted[i] = walk_tree(argmax[i], tokens[i], parents[i], counts[i], nodes[i], emitted[i])
    return nodes, accepted, emitted
