"""Sampling: ``do_sample=True`` with temperature / top-p, drawn exactly from the model's distribution.

The output follows the same distribution as plain sampling with these settings (for a given seed the
draws differ from plain ``generate``'s: the decoder consumes random numbers per position). A drafted
token is accepted with the probability the model gives it after temperature and top-p, where greedy
decoding accepts it exactly when it is the model's top choice. Where the model is sure of the next
token, as in the code an answer copies, both accept about as often; the sampled answer is another text
than the greedy one, so its tokens per model call come out close to greedy's, above or below it from
prompt to prompt (on the prompt here, an edit of the class it is shown, often above). Run it (a few
seconds to load the model once its converted weights are kept; then one sampled and one greedy
generation)::

    python examples/sampling.py          # optional argument: max new tokens (default 160)
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

model, tok = load_smollm2()
inputs = chat_inputs(tok, DEMO_PROMPT)
n_prompt = inputs["input_ids"].shape[1]

torch.manual_seed(0)
sampled = LookaheadDecoder()
with phase("sampled generate (temperature 0.7, top-p 0.9) with the decoder"):
    out = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=True, temperature=0.7, top_p=0.9,
                         custom_generate=sampled)
print(tok.decode(out[0, n_prompt:], skip_special_tokens=True))

greedy = LookaheadDecoder()  # the same prompt, greedy, for comparison
with phase("greedy generate with the decoder, for comparison"):
    model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, custom_generate=greedy)

print()
for name, s in (("sampled (temperature 0.7, top-p 0.9)", sampled.stats), ("greedy", greedy.stats)):
    print(f"{name:37}: {s.tokens_per_call:.2f} tokens per model call, "
          f"{s.accepted} of {s.drafted} drafted tokens accepted ({s.acceptance_rate:.0%})")
print(f"sampled: {sampled.stats.explain()}")
