"""A user's own model's first decoder call with no kept curve: a Qwen2-shaped model with random weights.

    LOOKAHEAD_PERSIST=0 python benchmarks/results/step-pricing/first_call_own_model.py 896 4864 24

prints plain ``generate``'s time for 32 tokens, the first decoder call's and its calibration's (2 threads).
``shared_timer_ab.sh`` alternates it between two checkouts of ``lookahead/decoder.py``.
"""

import logging
import sys
import time

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

import lookahead
from lookahead.cost import Calibrations


def main(hidden: int, intermediate: int, layers: int) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(2)
    cfg = Qwen2Config(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                      num_attention_heads=14, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    print("params", sum(p.numel() for p in model.parameters()) / 1e6, "M")
    ids = torch.randint(0, 1000, (1, 64))
    t = time.perf_counter()
    model.generate(ids, max_new_tokens=32, do_sample=False)
    print("plain", time.perf_counter() - t)
    decoder = lookahead.LookaheadDecoder(calibrations=Calibrations())
    t = time.perf_counter()
    model.generate(ids, max_new_tokens=32, do_sample=False, custom_generate=decoder)
    print("first decoder call", time.perf_counter() - t)
    print("calibration", decoder.stats.time_calibration)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
