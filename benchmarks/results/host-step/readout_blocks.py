"""The readout of a step's rows (``kernels.rows_top``: argmax and top k of each) as it is now against the version
before it (kept here, around the insertion both share). Now: for k > 1 the k-th largest block maximum is counted
for up to 24 blocks, the entries of the blocks that reach it are gathered without branches and placed by counting;
k = 1 runs the earlier algorithm. Before: both inserted one by one, with branches on the values that new logits
make unpredictable. 65 rows, new logits at every call (a pool of arrays, round robin), microseconds per call: the
least of three interleaved rounds.

    PYTHONPATH=. python benchmarks/results/host-step/readout_blocks.py
"""
import numpy as np
from numba import njit
from rows_top_speed import per_call_us  # (this script's folder is on sys.path)

from lookahead import kernels as K

ROWS = 65


@njit(cache=False, nogil=True)
def _one_top_before(row, k, ids, vals, maxima, low_ids, low_vals):
    v = row.shape[0]
    nb = maxima.shape[0]
    for j in range(k):
        vals[j] = -np.inf
        ids[j] = -1
    if K._has_nan(row):
        K._insert_top(row, 0, v, -np.inf, k, ids, vals, 0)
        return K._first_nan(row)
    K._block_maxima(row, maxima)
    low = -np.inf
    if nb >= k:
        K._insert_top(maxima, 0, nb, -np.inf, k, low_ids, low_vals, 0)
        low = low_vals[k - 1]
    m = 0
    for t in range(nb):
        if maxima[t] >= low:
            m = K._insert_top(row, t * K._BLOCK, min(t * K._BLOCK + K._BLOCK, v), low, k, ids, vals, m)
    return ids[0]


@njit(cache=False, nogil=True)
def rows_top_before(logits, argmax_rows, top_rows, k, argmax, ids, vals):
    b, q, v = logits.shape
    maxima = np.empty((v + K._BLOCK - 1) // K._BLOCK, np.float32)
    low_ids, low_vals = np.empty(k, np.int64), np.empty(k, np.float32)
    for i in range(b):
        for j in range(argmax_rows[i]):
            argmax[i, j] = _one_top_before(logits[i, j], k, ids[i, j], vals[i, j], maxima, low_ids, low_vals)
    return argmax


def main():
    print("| k | V | before, us | now, us | same output |")
    print("|---|---|---|---|---|")
    for k in (8, 3, 1):
        for vocab in (100, 256, 1000, 4096, 32000, 49152, 151936):
            scale = 0.16 if vocab <= 256 else 3.0  # the tiny random model's logit spread, a real model's
            pool = [(np.random.default_rng(i).standard_normal((1, ROWS, vocab)) * scale).astype(np.float32)
                    for i in range(40 if vocab < 40000 else 8)]
            c = np.array([ROWS])
            out = [(np.empty((1, ROWS), np.int64), np.empty((1, ROWS, k), np.int64), np.empty((1, ROWS, k), np.float32))
                   for _ in range(2)]
            before, now = [], []
            for _ in range(3):  # interleaved rounds; the least of each (a shared machine only adds time)
                before.append(per_call_us(lambda x, c=c, k=k, o=out[0]: rows_top_before(x, c, c, k, *o), pool))
                now.append(per_call_us(lambda x, c=c, k=k, o=out[1]: K.rows_top(x, c, c, k, *o), pool))
            same = all(np.array_equal(a, b) for a, b in zip(out[0], out[1]))
            print(f"| {k} | {vocab} | {min(before):.1f} | {min(now):.1f} | {same} |")


if __name__ == "__main__":
    main()
