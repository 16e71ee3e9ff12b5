"""The KV keep of one row's step (``kv_cache.keep_entries``) with its column copies made by torch or, on a CPU, on
NumPy views of the same memory (``kv_cache.host_view``), for a 1-layer cache and SmolLM2-135M's 30 layers (3 KV heads
of 64, 300 cached columns, a 20-row step keeping 6 of them in two runs). Each copy through torch pays its dispatch,
a few microseconds, and a step makes about eight per layer.

    PYTHONPATH=. python benchmarks/results/host-step/kv_cache_speed.py
"""
import time

import numpy as np
import torch
from transformers import LlamaConfig

from lookahead import kv_cache as KV


def per_step_us(layers: int, copies: str, steps: int = 300) -> float:
    config = LlamaConfig(vocab_size=256, hidden_size=576, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=9, num_key_value_heads=3)
    model = type("Model", (), {"config": config})
    real = KV.host_view
    if copies == "torch":
        KV.host_view = lambda t: None
    try:
        cache = KV.new_cache(model)
        for layer in range(layers):
            cache.update(torch.randn(1, 3, 300, 64), torch.randn(1, 3, 300, 64), layer)
        times = []
        for _ in range(steps):
            for layer in range(layers):
                cache.update(torch.randn(1, 3, 20, 64), torch.randn(1, 3, 20, 64), layer)
            t = time.perf_counter()
            KV.keep_entries(cache, 20, [0, 1, 5, 6, 7, 12])
            times.append(time.perf_counter() - t)
    finally:
        KV.host_view = real
    return float(np.median(times) * 1e6)


def main():
    torch.set_num_threads(1)
    for layers in (1, 30):
        for copies in ("torch", "numpy", "torch", "numpy"):
            print(f"{layers:2d} layers, copies by {copies:5s}: {per_step_us(layers, copies):7.1f} us per step")


if __name__ == "__main__":
    main()
