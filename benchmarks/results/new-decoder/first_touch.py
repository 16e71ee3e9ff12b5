"""A new decoder's first call, and where its page faults land: 20 decoders are made, each one's first 2-token call
on ``host_overhead.py``'s tiny model is timed with its ``learn_prompt`` (the model-prediction table learning the
prompt's rows), then 20 more decoders are made and their construction timed (medians, ms).

    PYTHONPATH=<checkout> python benchmarks/results/new-decoder/first_touch.py

``DraftPolicy.learn_prompt`` is wrapped with a timer (the plugin's own class, in this script's process only).
"""

import os
import statistics
import sys
import time

import torch

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "..", ".."))  # the repository root, last: benchmarks.*
import lookahead.policy as policy  # noqa: E402
from benchmarks.host_overhead import prompt_ids, tiny_model  # noqa: E402
from lookahead import LookaheadDecoder  # noqa: E402

LEARN_PROMPT = policy.DraftPolicy.learn_prompt
SPENT: list[float] = []


def timed_learn_prompt(self, *args):
    t = time.perf_counter()
    try:
        return LEARN_PROMPT(self, *args)
    finally:
        SPENT.append(time.perf_counter() - t)


def main() -> None:
    policy.DraftPolicy.learn_prompt = timed_learn_prompt
    torch.set_num_threads(1)
    model, ids = tiny_model(), prompt_ids(1)
    kw = dict(max_new_tokens=2, do_sample=False)
    model.generate(ids, custom_generate=LookaheadDecoder(), **kw)  # compile and calibrate, outside the timings
    SPENT.clear()
    decoders = [LookaheadDecoder() for _ in range(20)]
    calls = []
    for decoder in decoders:
        t = time.perf_counter()
        model.generate(ids, custom_generate=decoder, **kw)
        calls.append(time.perf_counter() - t)
    made = []
    for _ in range(20):
        t = time.perf_counter()
        decoders.append(LookaheadDecoder())
        made.append(time.perf_counter() - t)
    print(f"first call {statistics.median(calls) * 1e3:.2f} ms, of which learn_prompt "
          f"{statistics.median(SPENT) * 1e3:.2f} ms (first six: {', '.join(f'{x * 1e3:.2f}' for x in SPENT[:6])}); "
          f"construction {statistics.median(made) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
