"""Sampling: ``do_sample=True`` with temperature / top-p, drawn exactly from the model's distribution.

The tokens follow the same distribution as plain sampling with these settings, but are not the same
draws for a given seed (the decoder consumes random numbers differently).

    python examples/sampling.py
"""

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

model, tok = load_smollm2()
inputs = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                    return_tensors="pt", return_dict=True)
n_prompt = inputs["input_ids"].shape[1]
sampling = dict(do_sample=True, temperature=0.7, top_p=0.9, max_new_tokens=120)

torch.manual_seed(0)
decoder = LookaheadDecoder()
out = model.generate(**inputs, custom_generate=decoder, **sampling)
print(tok.decode(out[0, n_prompt:], skip_special_tokens=True))
print(f"\n{decoder.stats}")

# the same through the flag
lookahead.enable(model)
out = model.generate(**inputs, lookahead=True, **sampling)
print(f"lookahead=True: {model.generate.decoder.stats.tokens_per_call:.2f} tokens per call")
lookahead.disable(model)
