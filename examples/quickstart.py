"""Quickstart: the same text as plain greedy ``generate``, in fewer forward passes of the model.

    python examples/quickstart.py
"""

import time

import torch

import lookahead
from lookahead import LookaheadDecoder
from lookahead.models import load_smollm2

PROMPT = (
    "Add a docstring to every method of this class and return the whole class.\n\n```python\n"
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
    "    def push(self, item):\n        self.items.append(item)\n\n"
    "    def pop(self):\n        return self.items.pop()\n```"
)

model, tok = load_smollm2()  # SmolLM2-135M-Instruct, bundled; ~20 s to load on a CPU
inputs = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                    return_tensors="pt", return_dict=True)
n_prompt = inputs["input_ids"].shape[1]

t = time.perf_counter()
plain = model.generate(**inputs, max_new_tokens=120, do_sample=False)
t_plain = time.perf_counter() - t

# 1. transformers' own plugin point: nothing to set up
decoder = LookaheadDecoder()
t = time.perf_counter()
out = model.generate(**inputs, max_new_tokens=120, custom_generate=decoder)
t_ours = time.perf_counter() - t
print(tok.decode(out[0, n_prompt:], skip_special_tokens=True))
print(f"\n{decoder.stats}")
print(f"identical to plain greedy: {torch.equal(out, plain)}; {t_plain / t_ours:.2f}x plain generate's speed")

# 2. the assistant= spelling, after enabling this one model instance (its class is not touched)
lookahead.enable(model)
small_tree = LookaheadDecoder(tree_nodes=8, tree_depth=4)  # a smaller draft tree, e.g. for a slow CPU
out = model.generate(**inputs, max_new_tokens=120, assistant=small_tree)
print(f"assistant=: identical: {torch.equal(out, plain)}; {small_tree.stats.tokens_per_call:.2f} tokens per call")
lookahead.disable(model)  # model.generate is the plain method again
