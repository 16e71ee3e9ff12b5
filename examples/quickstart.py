"""Quickstart: the same text as plain greedy ``generate``, in fewer forward passes of the model.

The prompt asks the model to edit a class it is shown, so most of the answer copies the prompt:
the workload where drafting from the prompt's n-grams pays. Run it::

    python examples/quickstart.py          # optional argument: max new tokens (default 160)

The first run on a machine converts the bundled model's weights (20-60 s) and measures its cost
curve (a few seconds); both are kept in ~/.cache/lookahead, so later runs load the model in a few
seconds and measure nothing (``bash .ci/install`` does both ahead). Each step says on stderr what it
is doing.
"""

import sys

import torch

from lookahead import LookaheadDecoder
from lookahead.tools.console import log_to_stderr, phase, set_threads
from lookahead.tools.demo import DEMO_PROMPT, chat_inputs
from lookahead.tools.models import load_smollm2

MAX_NEW_TOKENS = int(sys.argv[1]) if len(sys.argv) > 1 else 160
log_to_stderr()  # what the library is doing (loading, calibrating), on stderr as it happens
set_threads("auto")  # torch threads only on the cores other work leaves free (prints why)

model, tok = load_smollm2()  # SmolLM2-135M-Instruct, bundled with the package; any causal LM works
inputs = chat_inputs(tok, DEMO_PROMPT)  # the chat template around "add docstrings to this class: ..."
n_prompt = inputs["input_ids"].shape[1]

with phase("plain generate") as plain_time:
    plain = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)

decoder = LookaheadDecoder()  # the one added object: transformers' own custom_generate plugin point
with phase("generate with LookaheadDecoder") as ours_time:
    out = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, custom_generate=decoder)

print(tok.decode(out[0, n_prompt:], skip_special_tokens=True))
n_new = out.shape[1] - n_prompt
s = decoder.stats
print(f"\nsame text as plain generate: {torch.equal(out, plain)}")
print(f"plain generate  : {n_new} model calls, {plain_time.seconds:.1f} s")
print(f"LookaheadDecoder: {s.target_calls} model calls, {ours_time.seconds:.1f} s"
      + (f" (of which {s.time_calibration:.1f} s measuring the cost curve, once per model and machine)"
         if s.time_calibration >= 0.05 else ""))
print(s.explain())
# Other spellings: lookahead.enable(model), then model.generate(..., lookahead=True) or assistant=decoder
# (examples/pipeline_flag.py shows them on a pipeline).
