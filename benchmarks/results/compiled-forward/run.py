"""SmolLM2-135M fp32, 2 threads, a code-editing chat prompt, 96 new tokens, greedy: plain generate twice, the
decoder three times (a new decoder each), plain again, in one process; with ``compiled`` as the first argument
``model.forward = torch.compile(model.forward)`` (inductor, default options) first; ``static`` as the second runs
every call on ``cache_implementation="static"``. Prints each call's wall time, whether its output equals the first
plain call's, and the decoder's tokens per call.

    python benchmarks/results/compiled-forward/run.py eager|compiled [dynamic|static]
"""
import sys
import time

import torch

from lookahead import LookaheadDecoder
from lookahead.demo import chat_inputs
from lookahead.models import load_model

torch.set_num_threads(2)
model, tok = load_model(None, dtype=torch.float32)
mode = sys.argv[1]
if mode == "compiled":
    model.forward = torch.compile(model.forward)
prompt = "Rewrite this Python class so every method has a docstring and type hints:\n\nclass Counter:\n    def __init__(self):\n        self.counts = {}\n    def add(self, name, count):\n        self.counts[name] = self.counts.get(name, 0) + count\n    def remove(self, name, count):\n        self.counts[name] = self.counts.get(name, 0) - count\n    def total(self):\n        return sum(self.counts.values())\n"
inputs = chat_inputs(tok, prompt)
kw = dict(max_new_tokens=96, do_sample=False)
if len(sys.argv) > 2 and sys.argv[2] == "static":
    kw["cache_implementation"] = "static"
ref = None
for label in ["plain", "plain", "dec", "dec", "dec", "plain"]:
    extra = {"custom_generate": LookaheadDecoder()} if label == "dec" else {}
    t = time.perf_counter()
    out = model.generate(**inputs, **kw, **extra)
    dt = time.perf_counter() - t
    ref = out if ref is None else ref
    print(mode, label, f"{dt:.2f}s", "same" if torch.equal(out, ref) else "DIFF",
          f"tpc={extra['custom_generate'].stats.tokens_per_call:.2f}" if extra else "", flush=True)
