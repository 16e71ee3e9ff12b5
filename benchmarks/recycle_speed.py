"""Speed of the model-prediction table (``lookahead.recycle.SuccessorTable``): one step's update and proposal.

    python -m benchmarks.recycle_speed [--steps 3000]

A Zipf-distributed token stream over a 49152-token vocabulary (SmolLM2's) feeds the table 64 rows per
step (a step verifying 63 draft nodes), then a proposal of 48 nodes, 12 deep, is drawn after each
position. Times in microseconds, Python calls included; the first call of each kernel (loading it from
Numba's cache) is left out.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from lookahead.recycle import SuccessorTable


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3000)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    vocab, rows, k = 49152, 64, 8
    stream = (rng.zipf(1.2, rows * args.steps + 1) % vocab).astype(np.int64)
    ids = rng.integers(0, vocab, (rows, k))
    logits = np.sort(rng.normal(size=(rows, k)).astype(np.float32), 1)[:, ::-1].copy()
    table = SuccessorTable(k)
    table.update(stream[1:rows + 1], stream[:rows], ids, logits)  # load the kernels
    table.propose(int(stream[0]), int(stream[1]), 48, 12)
    t0 = time.perf_counter()
    for s in range(args.steps):
        table.update(stream[s * rows + 1:(s + 1) * rows + 1], stream[s * rows:(s + 1) * rows], ids, logits)
    update = (time.perf_counter() - t0) / args.steps * 1e6
    t0 = time.perf_counter()
    nodes = 0
    for s in range(args.steps):
        nodes += len(table.propose(int(stream[s]), int(stream[s + 1]), 48, 12)[0])
    propose = (time.perf_counter() - t0) / args.steps * 1e6
    print(f"update, 64 rows: {update:.1f} us per step ({update / rows:.2f} us per row); {len(table)} keys")
    print(f"propose, 48 nodes 12 deep: {propose:.1f} us per call ({nodes / args.steps:.1f} nodes)")


if __name__ == "__main__":
    main()
