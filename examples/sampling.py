"""Sampling: ``do_sample=True`` with temperature / top-p, drawn exactly from the model's distribution.

The output follows the same distribution as plain sampling with these settings (for a given seed the
draws differ from plain ``generate``'s: the decoder consumes random numbers per position). A draft is
accepted only as often as the model would itself have sampled it, so fewer drafts are accepted than
in greedy decoding; on a prompt the answer copies (edit the class it is shown) many still are.
Run it (~20 s to load the model, then one sampled and one greedy generation)::

    python examples/sampling.py          # optional argument: max new tokens (default 160)
"""

import sys

import torch

from lookahead import LookaheadDecoder
from lookahead.demo import DEMO_PROMPT, chat_inputs
from lookahead.models import load_smollm2

MAX_NEW_TOKENS = int(sys.argv[1]) if len(sys.argv) > 1 else 160

model, tok = load_smollm2()
inputs = chat_inputs(tok, DEMO_PROMPT)
n_prompt = inputs["input_ids"].shape[1]

torch.manual_seed(0)
sampled = LookaheadDecoder()
out = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=True, temperature=0.7, top_p=0.9,
                     custom_generate=sampled)
print(tok.decode(out[0, n_prompt:], skip_special_tokens=True))

greedy = LookaheadDecoder()  # the same prompt, greedy, for comparison
model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, custom_generate=greedy)

print()
for name, s in (("sampled (temperature 0.7, top-p 0.9)", sampled.stats), ("greedy", greedy.stats)):
    print(f"{name:37}: {s.tokens_per_call:.2f} tokens per model call, "
          f"{s.accepted} of {s.drafted} drafted tokens accepted ({s.acceptance_rate:.0%})")
print(f"sampled: {sampled.stats.explain()}")
