"""Quickstart: the same text as plain greedy ``generate``, in fewer forward passes of the model.

The prompt asks the model to edit a class it is shown, so most of the answer copies the prompt:
the workload where drafting from the prompt's n-grams pays. Run it (~20 s to load the model, then
two generations)::

    python examples/quickstart.py          # optional argument: max new tokens (default 160)
"""

import sys
import time

import torch

from lookahead import LookaheadDecoder
from lookahead.demo import DEMO_PROMPT, chat_inputs
from lookahead.models import load_smollm2

MAX_NEW_TOKENS = int(sys.argv[1]) if len(sys.argv) > 1 else 160

model, tok = load_smollm2()  # SmolLM2-135M-Instruct, bundled with the package; any causal LM works
inputs = chat_inputs(tok, DEMO_PROMPT)  # the chat template around "add docstrings to this class: ..."
n_prompt = inputs["input_ids"].shape[1]

t = time.perf_counter()
plain = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
t_plain = time.perf_counter() - t

decoder = LookaheadDecoder()  # the one added object: transformers' own custom_generate plugin point
t = time.perf_counter()
out = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, custom_generate=decoder)
t_ours = time.perf_counter() - t

print(tok.decode(out[0, n_prompt:], skip_special_tokens=True))
n_new = out.shape[1] - n_prompt
print(f"\nsame text as plain generate: {torch.equal(out, plain)}")
print(f"plain generate  : {n_new} model calls, {t_plain:.1f} s")
print(f"LookaheadDecoder: {decoder.stats.target_calls} model calls, {t_ours:.1f} s "
      f"(includes measuring this machine's forward cost once, {decoder.stats.time_calibration:.1f} s)")
print(decoder.stats.explain())
# Other spellings: lookahead.enable(model), then model.generate(..., lookahead=True) or assistant=decoder
# (examples/pipeline_flag.py shows them on a pipeline).
