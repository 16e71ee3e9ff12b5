"""The bundled model's first decoder call in a process with no kept curve (a fresh ``Calibrations``), in a dtype.

    python benchmarks/results/first-call/first_call.py bfloat16

prints plain ``generate``'s time for 32 new tokens of a code prompt, the first decoder call's, its calibration's,
the calibrated points and the rows computed the other way round (2 threads). ``ab.sh`` alternates it between two
checkouts.
"""

import sys
import time

import torch

import lookahead
from lookahead.cost import Calibrations
from lookahead.models import load_smollm2

PROMPT = ("Rewrite this function so that it also accepts a list of strings:\n\n"
          "def shout(text):\n    return text.upper() + '!'\n")


def main(dtype: str) -> None:
    torch.set_num_threads(2)
    model, tokenizer = load_smollm2(dtype=getattr(torch, dtype))
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    model.generate(ids, max_new_tokens=4, do_sample=False)  # the process's first forwards (torch's own warm-up)
    t = time.perf_counter()
    plain = model.generate(ids, max_new_tokens=32, do_sample=False)
    print(f"plain {time.perf_counter() - t:.2f}")
    decoder = lookahead.LookaheadDecoder(calibrations=Calibrations())
    t = time.perf_counter()
    ours = model.generate(ids, max_new_tokens=32, do_sample=False, custom_generate=decoder)
    print(f"first-call {time.perf_counter() - t:.2f} calibration {decoder.stats.time_calibration:.2f} "
          f"identical {ours.tolist() == plain.tolist()} transposed_rows {decoder.stats.transposed_rows}")
    t1 = decoder.stats.cost_curve[0][1]
    print("curve", " ".join(f"{k}:{t / t1:.2f}" for k, t in decoder.stats.cost_curve))


if __name__ == "__main__":
    main(sys.argv[1])
