"""The logits readout (``kernels.rows_top``: every row's argmax and top 8) of this checkout against another
version of ``lookahead/kernels.py``, alternated, on 65 rows of 256, 32,000 and 49,152 logits (normal logits at
the tiny random model's spread and a real model's; a quarter-step rounding of some arrays adds ties). Checks that
both give the same argmax, ids and values on every array, then times each (median and min of 10 rounds of 200
calls, new logits every call).

    git show HEAD:lookahead/kernels.py > /tmp/kernels_other.py   # or a variant: git apply readout-gather.patch
    PYTHONPATH=. python benchmarks/results/host-step/readout_ab.py /tmp/kernels_other.py
"""
import importlib.util
import os
import sys

import numpy as np

from lookahead import kernels as THIS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rows_top_speed import per_call_us  # noqa: E402 (beside this script: each call reads new logits)

ROWS, TOP = 65, 8


def load(path):
    spec = importlib.util.spec_from_file_location("kernels_other", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # Numba's cache finds the kernels' module by its name
    spec.loader.exec_module(mod)
    return mod


def main():
    other = load(sys.argv[1])
    counts = np.array([ROWS])
    argmax, ids = np.empty((1, ROWS), np.int64), np.empty((1, ROWS, TOP), np.int64)
    vals = np.empty((1, ROWS, TOP), np.float32)
    for vocab, scale in ((256, 0.16), (32000, 3.0), (49152, 3.0)):
        pool = [(np.random.default_rng(i).standard_normal((1, ROWS, vocab)) * scale).astype(np.float32)
                for i in range(40)]
        pool += [np.round(p * 4) / 4 for p in pool[:10]]  # ties
        same = True
        for x in pool:
            other.rows_top(x, counts, counts, TOP, argmax, ids, vals)
            ref = argmax.copy(), ids.copy(), vals.copy()
            THIS.rows_top(x, counts, counts, TOP, argmax, ids, vals)
            same &= bool((ref[0] == argmax).all() and (ref[1] == ids).all() and (ref[2] == vals).all())
        times = {"other": [], "this": []}
        for r in range(10):
            order = (("other", other), ("this", THIS)) if r % 2 else (("this", THIS), ("other", other))
            for name, mod in order:
                times[name].append(per_call_us(lambda x, m=mod: m.rows_top(x, counts, counts, TOP, argmax, ids, vals),
                                               pool))
        print(f"{ROWS} rows x {vocab}: " + ", ".join(f"{k} {np.median(v):.1f} us (min {min(v):.1f})"
                                                     for k, v in times.items()) + f"; identical: {same}")


if __name__ == "__main__":
    main()
