"""The host readout of a step's logits (``kernels.rows_top``: every row's argmax and top 8) against torch's
``argmax`` plus ``topk``, on 65 rows of 256 and of 49152 logits. Each call reads new logits (a pool of 40 arrays,
round robin): the same array again and again lets the branch predictor learn its comparisons, which no decode
does, and made the kernel look about twice as fast as it is in a decode.

Run from the repository root: ``PYTHONPATH=. python benchmarks/results/host-step/rows_top_speed.py``
"""
import time

import numpy as np
import torch

from lookahead import kernels as K

ROWS, K_TOP, CALLS = 65, 8, 200


def per_call_us(f, pool) -> float:
    f(pool[0])
    total = 0.0
    for r in range(CALLS):
        x = pool[r % len(pool)]
        t = time.perf_counter()
        f(x)
        total += time.perf_counter() - t
    return total / CALLS * 1e6


def main():
    torch.set_num_threads(1)
    for vocab, scale in ((256, 0.16), (49152, 3.0)):  # the tiny random model's logit spread, a real model's
        pool = [(np.random.default_rng(i).standard_normal((1, ROWS, vocab)) * scale).astype(np.float32)
                for i in range(40)]
        argmax, counts = np.empty((1, ROWS), np.int64), np.array([ROWS])
        ids, vals = np.empty((1, ROWS, K_TOP), np.int64), np.empty((1, ROWS, K_TOP), np.float32)
        ours = per_call_us(lambda x, c=counts, a=argmax, i=ids, v=vals: K.rows_top(x, c, c, K_TOP, a, i, v), pool)
        tensors = [torch.from_numpy(x) for x in pool]
        theirs = per_call_us(lambda t: (t.argmax(-1), t.topk(K_TOP, -1)), tensors)
        print(f"{ROWS} rows x {vocab} logits: rows_top {ours:7.1f} us, torch argmax + topk {theirs:7.1f} us")


if __name__ == "__main__":
    main()
