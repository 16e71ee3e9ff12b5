"""What a tree step's sliding-layer mask costs on the host (``SlidingWindow.masks``, the dynamic cache; and
``static_masks``, a static one), on a CPU, one torch thread: the median of 200 calls per case, float32 masks of a
64-node step (q = 65) after ``past`` cached tokens, for windows of 512 (Gemma 3 1B), 1024 and 4096 (Mistral 7B).

    PYTHONPATH=. python benchmarks/results/architectures/mask_cost.py
"""
import statistics
import time

import torch

from lookahead.sliding import FULL, SLIDING, SlidingWindow


def median_us(fn, calls: int = 200) -> float:
    fn()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> None:
    torch.set_num_threads(1)
    q = 65
    for window in (512, 1024, 4096):
        past = 2 * window
        plan = SlidingWindow(window, (SLIDING, FULL))
        full = torch.zeros((1, 1, q, past + q))
        pos = (past + torch.arange(q))[None]
        static = torch.zeros((1, 1, q, 2 * past))
        dynamic = median_us(lambda p=plan, f=full, r=pos, c=past: p.masks(f, r, c))
        on_static = median_us(lambda p=plan, f=static, r=pos, c=past: p.static_masks(f, r, c))
        print(f"window {window}, {past} cached, q {q}: masks {dynamic:.0f} us (a [q, {min(past, window - 1) + q}] "
              f"mask), static_masks {on_static:.0f} us (a [q, {2 * past}] mask)")


if __name__ == "__main__":
    main()
