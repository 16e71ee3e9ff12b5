"""Measurement scripts of the project (run from the repository root, e.g. ``python -m benchmarks.replay``).

A leaf: nothing in ``lookahead`` imports it, and it is not installed. The side-by-side benchmark
harness behind ``python -m lookahead bench`` ships with the package, in :mod:`lookahead.bench`.

- ``replay``: noise-free replays of the draft policy on recorded greedy outputs.
- ``host_overhead``: host (Python) time per decoding step outside the model's forward.
- ``trie_speed``, ``memory_store``, ``window_sweep``: the n-gram store's speed, the cross-request
  store, the window's (W, N, G) sweep.
- ``results/``: committed figures with the commands that made them.
"""
