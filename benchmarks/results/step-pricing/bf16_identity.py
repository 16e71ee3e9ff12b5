"""Where bf16 outputs part from plain bf16 decoding: a decoder that never drafts, the default, prompt lookup.

    python benchmarks/results/step-pricing/bf16_identity.py 2 64

For PROMPTS prompts per workload and TOKENS new tokens, prints each method's first differing token (-1: identical).
"""

import sys

import torch

from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.models import load_smollm2

NEVER = LookaheadConfig(cost_curve=((1, 1.0), (2, 1000.0)), window_width=0)  # every step plain


def first_difference(out: torch.Tensor, base: torch.Tensor, prompt_len: int) -> int:
    n = min(out.shape[1], base.shape[1])
    differ = (out[0, :n] != base[0, :n]).nonzero()
    if len(differ):
        return int(differ[0]) - prompt_len
    return -1 if out.shape == base.shape else n - prompt_len


def main(prompts: int, tokens: int) -> None:
    torch.set_num_threads(2)
    model, tok = load_smollm2(dtype=torch.bfloat16)
    for workload, items in build_workloads(["code-editing", "code-completion", "chat"], prompts).items():
        for p in items:
            enc = encode(p, tok, "cpu")
            run = dict(max_new_tokens=tokens, do_sample=False)
            base = model.generate(**enc, **run)
            never = model.generate(**enc, **run, custom_generate=LookaheadDecoder(NEVER))
            default = model.generate(**enc, **run, custom_generate=LookaheadDecoder())
            lookup = model.generate(**enc, **run, prompt_lookup_num_tokens=10)
            n = enc["input_ids"].shape[1]
            print(workload, p.id, "never-draft", first_difference(never, base, n), "default",
                  first_difference(default, base, n), "prompt-lookup", first_difference(lookup, base, n), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
