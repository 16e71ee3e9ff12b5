"""Streaming: a streamer gets the prompt once, then every emitted token in order, a block at a time.

    python examples/streaming.py
"""

from threading import Thread

from transformers import TextIteratorStreamer, TextStreamer

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

# print to stdout as tokens arrive (works with custom_generate=, assistant= and lookahead=True alike)
lookahead.enable(model)
model.generate(**inputs, max_new_tokens=120, lookahead=True,
               streamer=TextStreamer(tok, skip_prompt=True, skip_special_tokens=True))

# iterate over the text in another thread, e.g. to serve it
streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True, timeout=60)
decoder = LookaheadDecoder()
worker = Thread(target=model.generate,
                kwargs=dict(**inputs, max_new_tokens=120, custom_generate=decoder, streamer=streamer))
worker.start()
chunks = list(streamer)
worker.join()
print(f"\n{len(chunks)} chunks for {decoder.stats.new_tokens} tokens in {decoder.stats.target_calls} model calls")
lookahead.disable(model)
