"""An existing text-generation pipeline: one line makes every call use the decoder, a flag opts out.

``lookahead.enable(pipe, default=decoder)`` changes that one pipeline's model (no class is patched):
existing ``pipe(...)`` calls, unchanged, decode with ``decoder``; ``lookahead=False`` runs one call
plain. The prompt asks the model to edit a class it is shown, so the answer copies the prompt: the
workload where drafting pays. Run it (a few seconds to load the model once its converted weights are
kept, 20-60 s the first time on a machine; then two generations)::

    python examples/pipeline_flag.py          # optional argument: max new tokens (default 160)
"""

import sys

from transformers import pipeline

import lookahead
from lookahead import LookaheadDecoder
from lookahead.tools.console import log_to_stderr, phase, set_threads
from lookahead.tools.demo import DEMO_PROMPT
from lookahead.tools.models import load_smollm2

MAX_NEW_TOKENS = int(sys.argv[1]) if len(sys.argv) > 1 else 160
log_to_stderr()  # what the library is doing (loading, calibrating), on stderr as it happens
set_threads("auto")  # torch threads only on the cores other work leaves free (prints why)

model, tok = load_smollm2()
pipe = pipeline("text-generation", model=model, tokenizer=tok)
messages = [{"role": "user", "content": DEMO_PROMPT}]

decoder = LookaheadDecoder()
lookahead.enable(pipe, default=decoder)  # the one added line
with phase("the pipeline with the decoder") as ours:
    out = pipe(messages, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)  # an existing call, unchanged

with phase("the same call, plain") as plain_time:
    plain = pipe(messages, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, lookahead=False)  # plain call
lookahead.disable(pipe)  # back to the plain pipeline
# Without default=, lookahead.enable(pipe) leaves calls plain and pipe(..., lookahead=True) opts one in.

s = decoder.stats
print(out[0]["generated_text"][-1]["content"])
print(f"\nsame text as plain: {out == plain}")
print(f"plain pipeline: {s.new_tokens} model calls (one per token), {plain_time.seconds:.1f} s")
print(f"with lookahead: {s.target_calls} model calls, {ours.seconds:.1f} s"
      + (f" (of which {s.time_calibration:.1f} s measuring the cost curve, once per model and machine)"
         if s.time_calibration >= 0.05 else ""))
print(s.explain())
