"""The step curve against the earlier forward curve, on the same code: SmolLM2 fp32, 2 threads, 4 prompts of
code editing and code completion, 128 new tokens, greedy; plain, the default decoder (its calibrated step
curve) and the default decoder with the forward curve the earlier version measured (pinned), alternated
twice per prompt (forward then reversed order), the faster of the two runs each. Output: curve_ab.txt."""

import time

import torch

from lookahead import LookaheadDecoder
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.models import load_smollm2

torch.set_num_threads(2)
model, tok = load_smollm2()
OLD = ((1, 0.0607), (2, 0.0983), (4, 0.0983), (8, 0.0983), (16, 0.0983), (32, 0.1355), (64, 0.2065))
KW = dict(max_new_tokens=128, do_sample=False)
METHODS = {"plain": lambda: None, "step-curve": LookaheadDecoder,
           "forward-curve(old)": lambda: LookaheadDecoder(cost_curve=OLD)}


def run(make, inputs):
    decoder = make()
    t = time.perf_counter()
    out = model.generate(**inputs, **KW, **({"custom_generate": decoder} if decoder else {}))
    return time.perf_counter() - t, (decoder.stats.target_calls if decoder else out.shape[1])


workloads = build_workloads(["code-editing", "code-completion"], 4)
first = encode(workloads["code-editing"][0], tok, model.device)
for make in METHODS.values():  # warm-up
    run(make, first)
for name, prompts in workloads.items():
    for prompt in prompts:
        inputs = encode(prompt, tok, model.device)
        times, calls = {m: [] for m in METHODS}, {}
        for rep in range(2):
            for m, make in (METHODS.items() if rep == 0 else reversed(METHODS.items())):
                seconds, calls[m] = run(make, inputs)
                times[m].append(seconds)
        best = {m: min(v) for m, v in times.items()}
        print(name, prompt.id, {m: round(best["plain"] / best[m], 2) for m in METHODS}, calls, flush=True)
