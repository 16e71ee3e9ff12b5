"""An existing text-generation pipeline: a flag per call, or one line that makes every call use it.

    python examples/pipeline_flag.py
"""

from transformers import pipeline

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
pipe = pipeline("text-generation", model=model, tokenizer=tok)
MESSAGES = [{"role": "user", "content": PROMPT}]
plain = pipe(MESSAGES, max_new_tokens=120, do_sample=False)

# a flag per call (the pipeline hands it on to model.generate)
lookahead.enable(pipe)
out = pipe(MESSAGES, max_new_tokens=120, do_sample=False, lookahead=True)
print(out[0]["generated_text"][-1]["content"])
print(f"\nlookahead=True: same text as plain: {out == plain}; {pipe.model.generate.decoder.stats}")

# one added line: existing calls, unchanged, use the default decoder
decoder = LookaheadDecoder()
lookahead.enable(pipe, default=decoder)
out = pipe(MESSAGES, max_new_tokens=120, do_sample=False)
print(f"default=: same text as plain: {out == plain}; {decoder.stats.tokens_per_call:.2f} tokens per call")
out = pipe(MESSAGES, max_new_tokens=120, do_sample=False, lookahead=False)  # opt one call out

lookahead.disable(pipe)  # back to the plain pipeline
