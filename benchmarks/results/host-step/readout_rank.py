"""Tried and not kept: a readout (``kernels.rows_top``) whose top k is placed by rank. Per row, the k-th largest block
maximum is found by counting (branch-free, for at most 64 blocks), every entry at least that large is gathered
without branches, and each candidate's place is the count of candidates ahead of it. Checked identical to
``rows_top`` on Gaussian rows, rows with ties, rows of -inf and a NaN; timed on 65 rows, new logits every call.

    PYTHONPATH=. python benchmarks/results/host-step/readout_rank.py
"""

import numpy as np
from numba import njit
from rows_top_speed import per_call_us  # (this script's folder is on sys.path)

from lookahead import kernels as K

B = 16
FEW = 64   # at most this many blocks: the k-th largest maximum by counting; candidates read from every entry
RANKED = 64  # at most this many candidates: placed by rank, else offered one by one

@njit(cache=False, nogil=True)
def kth_few(maxima, nb, k):
    low = np.inf
    for t in range(nb):
        x = maxima[t]
        gt = 0
        for u in range(nb):
            gt += maxima[u] > x
        low = x if (gt < k and x < low) else low
    return low

@njit(cache=False, nogil=True)
def one_new(row, k, ids, vals, maxima, low_ids, low_vals, cand, cval):
    v = row.shape[0]
    nb = maxima.shape[0]
    if K._has_nan(row) or nb < k:
        for j in range(k):
            vals[j] = -np.inf
            ids[j] = -1
        K._insert_top(row, 0, v, -np.inf, k, ids, vals, 0)
        return K._first_nan(row) if K._has_nan(row) else ids[0]
    K._block_maxima(row, maxima)
    c = 0
    if nb <= FEW:
        low = kth_few(maxima, nb, k)
        for j in range(v):
            x = row[j]
            cand[c] = j
            cval[c] = x
            c += x >= low
    else:
        for j in range(k):
            low_vals[j] = -np.inf
            low_ids[j] = -1
        K._insert_top(maxima, 0, nb, -np.inf, k, low_ids, low_vals, 0)
        low = low_vals[k - 1]
        for t in range(nb):
            if maxima[t] >= low:
                for j in range(t * B, min(t * B + B, v)):
                    x = row[j]
                    cand[c] = j
                    cval[c] = x
                    c += x >= low
    if c > RANKED:
        for j in range(k):
            vals[j] = -np.inf
            ids[j] = -1
        m = 0
        for t in range(nb):
            if maxima[t] >= low:
                m = K._insert_top(row, t * B, min(t * B + B, v), low, k, ids, vals, m)
        return ids[0]
    for i in range(c):
        x = cval[i]
        r = 0
        for j in range(c):
            y = cval[j]
            r += (y > x) | ((y == x) & (j < i))
        if r < k:
            ids[r] = cand[i]
            vals[r] = x
    return ids[0]

@njit(cache=False, nogil=True)
def rows_new(logits, argmax_rows, top_rows, k, argmax, ids, vals):
    b, q, v = logits.shape
    maxima, low_ids, low_vals = K._top_scratch(v, max(k, 1))
    cand, cval = np.empty(v + 1, np.int64), np.empty(v + 1, np.float32)
    for i in range(b):
        for j in range(argmax_rows[i]):
            row = logits[i, j]
            if k and j < top_rows[i]:
                argmax[i, j] = one_new(row, k, ids[i, j], vals[i, j], maxima, low_ids, low_vals, cand, cval)
            else:
                argmax[i, j] = K._row_argmax(row, maxima)
    return argmax

ROWS = 65  # rows per call (a 64-node step)


def outputs(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.empty((1, ROWS), np.int64), np.empty((1, ROWS, k), np.int64), np.empty((1, ROWS, k), np.float32)


def pool_of(vocab: int, scale: float) -> list[np.ndarray]:
    """20 Gaussian logit arrays, 10 rounded (ties), one with -inf halves, a row of -inf, a NaN and a row of zeros."""
    pool = [(np.random.default_rng(i).standard_normal((1, ROWS, vocab)) * scale).astype(np.float32)
            for i in range(20)]
    pool += [np.round(p * 2) / 2 for p in pool[:10]]
    x = pool[1].copy()
    x[0, :, : vocab // 2] = -np.inf
    x[0, 3, :] = -np.inf
    x[0, 4, 7] = np.nan
    x[0, 5, :] = 0.0
    return pool + [x]


def main() -> None:
    counts = np.array([ROWS])
    for k in (8, 1, 3):
        for vocab, scale in ((256, 0.16), (1000, 1.0), (49152, 3.0), (100, 1.0)):
            pool = pool_of(vocab, scale)
            times = []
            for f in (K.rows_top, rows_new):
                out = outputs(k)
                times.append(per_call_us(lambda x, f=f, out=out, k=k: f(x, counts, counts, k, *out), pool))
            same = True
            for x in pool:
                results = []
                for f in (K.rows_top, rows_new):
                    out = outputs(k)
                    f(x, counts, counts, k, *out)
                    results.append(out)
                same &= all((a == b).all() for a, b in zip(*results))
            print(f"k={k} V={vocab}: rows_top {times[0]:.1f} us, by rank {times[1]:.1f} us, identical {same}")


if __name__ == "__main__":
    main()
