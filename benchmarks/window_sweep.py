"""Lookahead-window sweep on SmolLM2-135M: tokens per target call and speed ratio against plain greedy
``generate`` (and prompt lookup), same run, prompt by prompt, for a few (W, N, G) settings.

    python -m benchmarks.window_sweep [max_new_tokens]     # from the repository root; one JSON line per prompt

The budget is fixed (``adaptive=False``) so every setting verifies what it drafts; outputs are checked
against plain greedy decoding (``same``).
"""

from __future__ import annotations

import json
import sys
import time

import torch

from lookahead import LookaheadDecoder
from lookahead.demo import chat_inputs
from lookahead.models import load_smollm2

CHAT = ["What are three good habits for staying healthy? Explain each briefly.",
        "Explain why the sky is blue to a ten-year-old."]
CODE = ["Write a Python function that parses a CSV file and returns a list of dictionaries, one per row."]
SETTINGS = {
    "off": dict(window_width=0),
    "W5N4G4": dict(window_width=5, window_ngram=4, window_candidates=4),
    "W7N5G7": dict(window_width=7, window_ngram=5, window_candidates=7),
    "W3N3G3": dict(window_width=3, window_ngram=3, window_candidates=3),
}


def _timed(fn, **kwargs):
    t = time.perf_counter()
    out = fn(**kwargs)
    return out, time.perf_counter() - t


def main(max_new_tokens: int = 64) -> None:
    torch.set_num_threads(1)  # a shared 2-core machine: one thread is steadier
    model, tok = load_smollm2()
    for workload, prompts in (("chat", CHAT), ("code", CODE)):
        for i, text in enumerate(prompts):
            inp = chat_inputs(tok, text)
            kw = dict(max_new_tokens=max_new_tokens, do_sample=False)
            model.generate(**inp, max_new_tokens=4, do_sample=False)  # warm-up
            plain, t_plain = _timed(model.generate, **inp, **kw)
            _, t_pld = _timed(model.generate, **inp, **kw, prompt_lookup_num_tokens=10)
            row = dict(workload=workload, prompt=i, new=plain.shape[1] - inp["input_ids"].shape[1],
                       plain_s=round(t_plain, 3), pld_ratio=round(t_plain / t_pld, 3))
            for name, settings in SETTINGS.items():
                dec = LookaheadDecoder(adaptive=False, **settings)
                out, t = _timed(model.generate, **inp, **kw, custom_generate=dec)
                row[name] = dict(ratio=round(t_plain / t, 3), tokens_per_call=round(dec.stats.tokens_per_call, 3),
                                 same=bool(torch.equal(out, plain)), accepted=dict(dec.stats.accepted_by_origin))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 64)
