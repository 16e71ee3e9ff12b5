"""What a call with a new decoder costs beyond plain ``generate``: the median wall time of 1-token and 2-token calls
on ``benchmarks/host_overhead.py``'s tiny Llama (one torch thread, its 160-token prompt), a new decoder built
(``adaptive=False``) before each call, 25 calls per case after 5 warm-up calls. Which plugin runs is the first
``lookahead`` on ``PYTHONPATH``, so one script measures two checkouts:

    PYTHONPATH=/path/to/checkout:. python benchmarks/results/new-decoder/percall.py
"""
import statistics
import time

import torch

import lookahead
from benchmarks.host_overhead import generate, make_decoder, prompt_ids, tiny_model


def main() -> None:
    torch.set_num_threads(1)
    model, ids = tiny_model(), prompt_ids()
    out = []
    for n in (1, 2):
        for method in ("plain", "always"):
            times = []
            for _ in range(30):
                decoder = make_decoder(method)
                t = time.perf_counter()
                generate(model, ids, decoder, n)
                times.append(time.perf_counter() - t)
            out.append(f"{method}/{n}: {statistics.median(times[5:]) * 1e3:.2f} ms")
    print(lookahead.__file__.rsplit("/", 2)[0], "  ".join(out))


if __name__ == "__main__":
    main()
