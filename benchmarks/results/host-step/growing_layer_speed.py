"""Host time of the decoder's KV cache layers in a decode step: every layer's ``update`` (inside the forward) and the
step's crop of every layer (after it), for ``GrowingLayer`` and transformers' ``DynamicLayer``.

A SmolLM2-135M-shaped cache (30 layers, 3 KV heads of 64, 300 cached tokens), steps of 16 new entries of which 2 are
kept: the columns are written, then the 14 rejected ones cropped. New key and value tensors every layer, as a forward
makes them. Prints the median over rounds of microseconds per step.

    PYTHONPATH=. python benchmarks/results/host-step/growing_layer_speed.py [rounds]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from lookahead.compat import crop_cache
from lookahead.kv_cache import GrowingLayer

LAYERS, HEADS, HEAD_DIM, CONTEXT, ROWS, KEPT, STEPS = 30, 3, 64, 300, 16, 2, 200


def one_round(layer_type) -> tuple[float, float]:
    """(us per step in the layers' updates, us per step in the crop) over STEPS steps."""
    cache = DynamicCache()
    cache.layers[:] = [layer_type() for _ in range(LAYERS)]
    for layer in cache.layers:
        layer.update(torch.randn(1, HEADS, CONTEXT, HEAD_DIM), torch.randn(1, HEADS, CONTEXT, HEAD_DIM))
    new = [(torch.randn(1, HEADS, ROWS, HEAD_DIM), torch.randn(1, HEADS, ROWS, HEAD_DIM)) for _ in range(LAYERS)]
    updating = cropping = 0.0
    for _ in range(STEPS):
        t0 = time.perf_counter()
        for layer, (k, v) in zip(cache.layers, new):
            layer.update(k, v)
        t1 = time.perf_counter()
        crop_cache(cache, ROWS - KEPT)
        cropping += time.perf_counter() - t1
        updating += t1 - t0
    assert cache.get_seq_length() == CONTEXT + STEPS * KEPT
    return updating / STEPS * 1e6, cropping / STEPS * 1e6


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    torch.set_num_threads(1)
    runs = {"GrowingLayer": [], "DynamicLayer": []}
    for _ in range(rounds):  # interleaved
        runs["GrowingLayer"].append(one_round(GrowingLayer))
        runs["DynamicLayer"].append(one_round(DynamicLayer))
    print(f"{LAYERS} layers, {CONTEXT} cached tokens, steps of {ROWS} rows keeping {KEPT}; median of {rounds} rounds")
    print("| layer | updates, us per step | crop, us per step | together, us per layer and step |")
    print("|---|---|---|---|")
    for name, values in runs.items():
        upd = statistics.median(v[0] for v in values)
        crop = statistics.median(v[1] for v in values)
        print(f"| {name} | {upd:.0f} | {crop:.0f} | {(upd + crop) / LAYERS:.1f} |")


if __name__ == "__main__":
    main()
