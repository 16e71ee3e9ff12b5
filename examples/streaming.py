"""Streaming: a streamer gets the prompt once, then every emitted token in order, a block per model call.

Plain ``generate`` hands a streamer one token per model call. The decoder hands it every token a
call produced, so where drafts are accepted the text arrives in blocks of several tokens. The
prompt asks the model to edit a class it is shown, so the answer copies the prompt and many blocks
are long. Below, ``|`` marks where one chunk of streamed text ends. ``TextStreamer`` (print as it
arrives) works the same, and so do the ``assistant=`` and ``lookahead=True`` spellings. Run it (a few
seconds to load the model once its converted weights are kept)::

    python examples/streaming.py          # optional argument: max new tokens (default 160)
"""

import sys
from threading import Thread

from transformers import TextIteratorStreamer

from lookahead import LookaheadDecoder
from lookahead.tools.console import log_to_stderr, set_threads
from lookahead.tools.demo import DEMO_PROMPT, chat_inputs
from lookahead.tools.models import load_smollm2

MAX_NEW_TOKENS = int(sys.argv[1]) if len(sys.argv) > 1 else 160
log_to_stderr()  # what the library is doing (loading, calibrating), on stderr as it happens
set_threads("auto")  # torch threads only on the cores other work leaves free (prints why)

model, tok = load_smollm2()
inputs = chat_inputs(tok, DEMO_PROMPT)

# iterate over the text in another thread, e.g. to serve it
streamer = TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True, timeout=600)
decoder = LookaheadDecoder()
worker = Thread(target=model.generate, kwargs=dict(**inputs, max_new_tokens=MAX_NEW_TOKENS,
                                                   custom_generate=decoder, streamer=streamer))
worker.start()
chunks = []
for text in streamer:  # a chunk is the text that became printable after one model call
    if text:  # empty when the call's tokens ended inside a word, which the streamer holds back
        chunks.append(text)
        print(text, end="|", flush=True)
worker.join()

s = decoder.stats
print(f"\n\n{len(chunks)} chunks for {s.new_tokens} tokens in {s.target_calls} model calls "
      f"(plain generate: one model call, and at most one chunk, per token)")
print(s.explain())
