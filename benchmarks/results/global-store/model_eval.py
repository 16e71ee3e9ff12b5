"""Deterministic modelled speed of decoder variants (fp32 SmolLM2, so outputs never diverge): the budget plans on a
pinned curve (the kept AMX bf16 step curve) and each step is priced on the costs a real call's steps were measured at
on that CPU (``amx.md``: 1 row 63.8 ms, 16 rows 76.5, 32 rows 86.3, 64 rows 114), plus 6.5 ms a step with the heads
(``amx/heads_prof.py``). Modelled speed = new tokens x t(1) / the sum of the step prices.

    python benchmarks/results/global-store/model_eval.py WORKLOADS PROMPTS SKIP VARIANTS_JSON
    python benchmarks/results/global-store/model_eval.py chat,code-editing 4 0 \
        '{"default": {}, "prior": {"prior": "/tmp/prior.pkl"}, "fixed": {"config": {"adaptive": false}}}'

A variant: ``config`` (LookaheadConfig fields), ``heads`` (true: the bundled heads), ``store`` (a saved NgramTrie,
loaded afresh per prompt, as ``trie=``), ``prior`` (a pickled SuccessorTable the model source starts from).
"""
import json
import pickle
import sys
import weakref

import numpy as np
import torch

from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.cache import NgramTrie
from lookahead.cost import CostModel
from lookahead.heads import DraftHeads
from lookahead.models import load_smollm2

torch.set_num_threads(1)
PLAN = ((1, 0.0574), (2, 0.0600), (4, 0.0613), (8, 0.0627), (16, 0.0634), (32, 0.0736), (64, 0.0903))
CALL = CostModel([(1, 0.0638), (2, 0.0660), (4, 0.0680), (8, 0.0710), (16, 0.0765), (32, 0.0863), (64, 0.114)])
HEADS_STEP = 0.0065


def decoder_for(spec: dict, model) -> LookaheadDecoder:
    config = {"cost_curve": PLAN, **spec.get("config", {})}
    heads = DraftHeads.bundled() if spec.get("heads") else None
    store = NgramTrie.load(spec["store"]) if spec.get("store") else None
    dec = LookaheadDecoder(LookaheadConfig(**config), heads=heads, trie=store)
    if spec.get("prior"):
        start_from_prior(dec, spec["prior"], model)
    return dec


def start_from_prior(decoder: LookaheadDecoder, path: str, model) -> None:
    """The decoder's model source starts from the pickled table at ``path`` (prior_table.py), kept as for a later
    call of the same model (an experiment's reach into the source: the product has no such option)."""
    source = decoder.policy.model
    with open(path, "rb") as f:
        prior = pickle.load(f)
    source.table.keys[:], source.table.ids[:], source.table.share[:] = prior.keys, prior.ids, prior.share
    source.keep, source._model = True, weakref.ref(model)


def main() -> None:
    names, n_prompts, skip = sys.argv[1].split(","), int(sys.argv[2]), int(sys.argv[3])
    variants = json.loads(sys.argv[4])
    model, tok = load_smollm2(dtype=torch.float32)
    for w, prompts in build_workloads(names, n_prompts + skip).items():
        res = {k: [] for k in variants}
        for p in prompts[skip:]:
            inputs = encode(p, tok, "cpu")
            line = []
            for name, spec in variants.items():
                dec = decoder_for(spec, model)
                out = model.generate(**inputs, max_new_tokens=128, do_sample=False, custom_generate=dec)
                n = out.shape[1] - inputs["input_ids"].shape[1]
                rows = np.array([1 + a + b for a, b in dec.stats.budgets[1:]])  # the prefill excluded
                cost = float(CALL(rows).sum()) + float(CALL(1)) + (HEADS_STEP * len(rows) if spec.get("heads") else 0)
                speed = n * float(CALL(1)) / cost
                res[name].append(speed)
                line.append(f"{name} {speed:.2f}x({n / dec.stats.target_calls:.2f})")
            print(w, p.id, " ".join(line), flush=True)
        print(w, "geomean", {k: round(float(np.exp(np.mean(np.log(v)))), 3) for k, v in res.items()}, flush=True)


if __name__ == "__main__":
    main()
