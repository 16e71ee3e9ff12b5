"""Fresh processes, first prompts included: two installs against plain ``generate`` and prompt lookup.

    python -m benchmarks.fresh_process --before /tmp/old_site --dtypes float32,bfloat16 \\
        --workloads code-editing,code-completion,chat --prompts-per-workload 6 --out FILE.json

One fresh Python process per install, dtype and workload (``PYTHONPATH`` picks the install: ``--before`` is a
folder holding an older ``lookahead``, the other worker uses the one this interpreter imports). Each process loads
SmolLM2-135M-Instruct in the dtype with ``--threads`` torch threads, makes one untimed 8-token plain call (torch's
own one-time costs, which no method should be charged), then decodes every prompt with plain ``generate``, prompt
lookup (``prompt_lookup_num_tokens=10``), a fresh default ``LookaheadDecoder()`` and plain again (the A/A control),
the order rotated prompt by prompt. There is no other warm-up: the decoder's first call of the process (reading a kept curve or learning one,
loading the corpus) falls in the workload's first prompt, which counts like any other. Each install keeps its own
``LOOKAHEAD_CACHE`` (``--cache-before`` / ``--cache-after``, set up beforehand with ``python -m lookahead warmup
--calibrate``, the README's set-up script), so a later process finds what an earlier one kept, as a user's would.
The installs alternate process by process. The prompts are built once, by this interpreter's install, and handed to
both as token ids.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

WORKER = r'''
import json, sys, time, torch
job = json.loads(sys.stdin.read())
torch.set_num_threads(job["threads"])
import lookahead
from lookahead import LookaheadDecoder
try:
    from lookahead.tools.models import load_smollm2
except ImportError:
    from lookahead.models import load_smollm2
model, tok = load_smollm2()
model = model.to(getattr(torch, job["dtype"]))
eos = model.generation_config.eos_token_id
pad = eos[0] if isinstance(eos, (list, tuple)) else eos
kw = {"max_new_tokens": job["max_new"], "do_sample": False, "pad_token_id": pad}

def run(ids, extra):
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), **kw,
                             **extra)
    return out[0, len(ids):].tolist(), time.perf_counter() - t

with torch.inference_mode():
    model.generate(torch.tensor([job["prompts"][0][1][:32]]), max_new_tokens=8, do_sample=False, pad_token_id=pad)
methods = ["plain", "prompt-lookup", "lookahead", "plain-again"]
records = []
for i, (name, ids) in enumerate(job["prompts"]):
    res = {}
    for m in methods[i % 4:] + methods[:i % 4]:
        extra = ({} if m.startswith("plain") else {"prompt_lookup_num_tokens": 10} if m == "prompt-lookup"
                 else {"custom_generate": LookaheadDecoder()})
        tokens, seconds = run(ids, extra)
        res[m] = {"tokens": tokens, "seconds": seconds}
    records.append({"prompt": name, **res})
print(json.dumps({"lookahead": lookahead.__file__, "records": records}))
'''


def prompts_of(workload: str, n: int) -> list[tuple[str, list[int]]]:
    from lookahead.tools.bench.runner import encode
    from lookahead.tools.bench.workloads import build_workloads
    from lookahead.tools.models import load_smollm2

    _, tok = load_smollm2()
    return [(p.id, encode(p, tok, "cpu")["input_ids"][0].tolist()) for p in build_workloads([workload], n)[workload]]


def worker(site: str | None, cache: str, job: dict) -> dict:
    env = {**os.environ, "LOOKAHEAD_CACHE": cache}
    if site:
        env["PYTHONPATH"] = site + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", WORKER], input=json.dumps(job), env=env, capture_output=True,
                          text=True, cwd=os.path.dirname(cache))  # not the checkout: it would shadow --before
    if proc.returncode:
        raise RuntimeError(f"worker failed ({site or 'this install'}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summary(result: dict) -> list[dict]:
    rows = []
    for run in result["runs"]:
        recs = run["records"]
        speed = {m: [r["plain"]["seconds"] / r[m]["seconds"] * len(r[m]["tokens"]) / max(1, len(r["plain"]["tokens"]))
                     for r in recs] for m in ("prompt-lookup", "lookahead", "plain-again")}
        rows.append({"install": run["install"], "dtype": run["dtype"], "workload": run["workload"],
                     "lookahead_median": statistics.median(speed["lookahead"]),
                     "lookahead_first": speed["lookahead"][0], "lookahead_min": min(speed["lookahead"]),
                     "prompt_lookup_median": statistics.median(speed["prompt-lookup"]),
                     "aa_median": statistics.median(speed["plain-again"]), "aa_min": min(speed["plain-again"]),
                     "aa_max": max(speed["plain-again"]),
                     "identical": sum(r["lookahead"]["tokens"] == r["plain"]["tokens"] for r in recs),
                     "prompts": len(recs)})
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="a folder holding the older lookahead package (its PYTHONPATH)")
    ap.add_argument("--cache-before", required=True, help="the older install's LOOKAHEAD_CACHE, set up")
    ap.add_argument("--cache-after", required=True, help="this install's LOOKAHEAD_CACHE, set up")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--workloads", default="code-editing,code-completion,chat")
    ap.add_argument("--prompts-per-workload", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    result = {"command": " ".join(sys.argv), "runs": []}
    order = 0
    for dtype in args.dtypes.split(","):
        for wl in args.workloads.split(","):
            job = {"dtype": dtype, "threads": args.threads, "max_new": args.max_new_tokens,
                   "prompts": prompts_of(wl, args.prompts_per_workload)}
            installs = [("before", args.before, args.cache_before), ("after", None, args.cache_after)]
            for install, site, cache in installs[order % 2:] + installs[:order % 2]:
                out = worker(site, cache, job)
                result["runs"].append({"install": install, "dtype": dtype, "workload": wl, **out})
                print(json.dumps(summary({"runs": result["runs"][-1:]})[0]), flush=True)
            order += 1
    result["summary"] = summary(result)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
