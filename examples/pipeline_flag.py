"""An existing text-generation pipeline: one line makes every call use the decoder, a flag opts out.

``lookahead.enable(pipe, default=decoder)`` changes that one pipeline's model (no class is patched):
existing ``pipe(...)`` calls, unchanged, decode with ``decoder``; ``lookahead=False`` runs one call
plain. The prompt asks the model to edit a class it is shown, so the answer copies the prompt: the
workload where drafting pays. Run it (~20 s to load the model, then two generations)::

    python examples/pipeline_flag.py          # optional argument: max new tokens (default 160)
"""

import sys
import time

from transformers import pipeline

import lookahead
from lookahead import LookaheadDecoder
from lookahead.demo import DEMO_PROMPT
from lookahead.models import load_smollm2

MAX_NEW_TOKENS = int(sys.argv[1]) if len(sys.argv) > 1 else 160

model, tok = load_smollm2()
pipe = pipeline("text-generation", model=model, tokenizer=tok)
messages = [{"role": "user", "content": DEMO_PROMPT}]

decoder = LookaheadDecoder()
lookahead.enable(pipe, default=decoder)  # the one added line
t = time.perf_counter()
out = pipe(messages, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)  # an existing call, unchanged
t_ours = time.perf_counter() - t

t = time.perf_counter()
plain = pipe(messages, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, lookahead=False)  # this call: plain
t_plain = time.perf_counter() - t
lookahead.disable(pipe)  # back to the plain pipeline
# Without default=, lookahead.enable(pipe) leaves calls plain and pipe(..., lookahead=True) opts one in.

print(out[0]["generated_text"][-1]["content"])
print(f"\nsame text as plain: {out == plain}")
print(f"plain pipeline: {decoder.stats.new_tokens} model calls (one per token), {t_plain:.1f} s")
print(f"with lookahead: {decoder.stats.target_calls} model calls, {t_ours:.1f} s "
      f"(includes measuring this machine's forward cost once, {decoder.stats.time_calibration:.1f} s)")
print(decoder.stats.explain())
