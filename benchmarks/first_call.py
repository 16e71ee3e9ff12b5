"""The first decoder calls of a fresh process against plain ``generate``, on one 64-token code answer (SmolLM2,
greedy, 2 threads): plain twice, then three decoder calls, each with its time, model calls, whether its tokens equal
plain's, and why it decoded plain if it did. One JSON line on stdout. ``benchmarks/results/README.md`` gives the
fresh-environment sequence it was run in.

    python benchmarks/first_call.py float32
"""
import json, sys, time, torch
torch.set_num_threads(2)
dtype = sys.argv[1]
from lookahead.tools.models import load_smollm2
from lookahead import LookaheadDecoder
model, tok = load_smollm2()
model.to(getattr(torch, dtype))
code = ("Write a Python class Stack with push, pop, peek, is_empty and size methods, each with a docstring, "
        "then rewrite this function with type hints:\n"
        "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return total / len(values)\n")
ids = tok.apply_chat_template([{"role": "user", "content": code}], add_generation_prompt=True, return_tensors="pt")
ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
row = {"dtype": dtype}
for i in range(2):
    t = time.perf_counter(); plain = model.generate(ids, max_new_tokens=64, do_sample=False); row[f"plain_{i+1}_s"] = round(time.perf_counter() - t, 3)
for i in range(3):
    d = LookaheadDecoder(); t = time.perf_counter()
    out = model.generate(ids, max_new_tokens=64, do_sample=False, custom_generate=d)
    row[f"decoder_{i+1}_s"] = round(time.perf_counter() - t, 3)
    row[f"decoder_{i+1}_identical"] = bool(torch.equal(out, plain))
    row[f"decoder_{i+1}_calls"] = d.stats.target_calls
    row[f"decoder_{i+1}_plain_because"] = d.stats.plain_reason
row["first_call_limit_s"] = round(1.1 * row["plain_2_s"] + 0.2, 3)
row["first_call_within"] = row["decoder_1_s"] <= row["first_call_limit_s"]
print(json.dumps(row), flush=True)
