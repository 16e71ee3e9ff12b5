"""A SmolLM2-135M fp32 step of 2 and 3 rows after 300 tokens, every linear the other way round
(``linear_layout.TransposedLinears``): the hooks as they were (each pre-hook narrowed its input to no rows, the
product reshaped twice) against the current ones (a no-row input made once per module, views), interleaved, 15
rounds, each timing the second forward inside the hooks (the first makes the no-row inputs). 2 torch threads.

    PYTHONPATH=. python benchmarks/results/host-step/transposed_hooks_ab.py
"""

from __future__ import annotations

import statistics
import time

import torch

from lookahead.linear_layout import TransposedLinears, linear_modules
from lookahead.models import load_smollm2


class Before(TransposedLinears):
    """The hooks before the change."""

    def _pre(self, module, args):
        if len(args) != 1 or torch.is_grad_enabled():
            return None
        x, w = args[0], module.weight
        if x.dim() < 2 or x.dtype != w.dtype or x.device != w.device or x.shape[-1] != w.shape[1]:
            return None
        if not 2 <= x.numel() // x.shape[-1] <= self.max_rows:
            return None
        self._pending[id(module)] = x
        return (x.narrow(-2, 0, 0),)

    def _post(self, module, args, output):
        x = self._pending.pop(id(module), None)
        if x is None:
            return None
        flat, weight, bias = x.reshape(-1, x.shape[-1]), module.weight, module.bias
        y = torch.addmm(bias[:, None], weight, flat.t()) if bias is not None else weight @ flat.t()
        return y.t().contiguous().reshape(*x.shape[:-1], weight.shape[0])


def main() -> None:
    torch.set_num_threads(2)
    model, _ = load_smollm2()
    modules = linear_modules(model)
    ids = torch.randint(100, 40000, (1, 300))
    times: dict = {}
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
        for _ in range(15):
            for k in (2, 3):
                for name, hooks in (("before", Before), ("after", TransposedLinears)):
                    new, pos = torch.randint(100, 40000, (1, k)), torch.arange(300, 300 + k)[None]
                    with hooks(modules, 16):
                        model(new, past_key_values=cache, position_ids=pos, use_cache=True)
                        cache.crop(-k)
                        t = time.perf_counter()
                        model(new, past_key_values=cache, position_ids=pos, use_cache=True)
                        times.setdefault((k, name), []).append((time.perf_counter() - t) * 1e3)
                    cache.crop(-k)
    for k in (2, 3):
        before, after = times[(k, "before")], times[(k, "after")]
        print(f"{k} rows: before {statistics.median(before):.2f} ms, after {statistics.median(after):.2f} ms, "
              f"median of the rounds' ratios {statistics.median(b / a for a, b in zip(before, after)):.3f}")


if __name__ == "__main__":
    main()
