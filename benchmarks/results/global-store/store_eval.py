"""Tokens per call on the flat cost curve (the GPU regime) for decoder, heads and store variants, plain outputs cached
(``context-head/variants.py`` with a ``store`` key: a saved NgramTrie loaded afresh for each prompt, as
``LookaheadDecoder(trie=...)``; and a ``prior`` key: a pickled SuccessorTable (prior_table.py) the model source
starts from, ``model_eval.start_from_prior``); and a ``corpus`` key: a ``DraftCorpus`` folder, or ``"bundled"``
(``LookaheadDecoder(corpus=...)``, the product's read-only corpus source).

    PYTHONPATH=. python benchmarks/results/global-store/store_eval.py --workloads code-completion,chat \
        --variants '[{"name": "store", "store": "/tmp/store.trie"}, {"name": "heads+store", "heads": {},
                     "store": "/tmp/store.trie"}, {"name": "prior", "prior": "/tmp/prior.pkl"}]'

SmolLM2-135M (bundled), fp32, one torch thread, greedy, 128 new tokens, a fresh decoder per prompt, the flat curve
of ``benchmarks.heads`` and the heads' cost pinned at 0.3 ms + 0.1 ms per level (as ``benchmarks.heads --heads-cost
0.0003,0.0001``). A variant: ``config`` (LookaheadConfig fields), ``heads`` (null: none; ``{}``: the bundled
feature heads; ``kind``, ``dir``: a training run's folder; other keys: HeadsSettings fields); a ``cost_curve`` in
``config`` replaces the flat curve. Plain ``generate``'s
outputs are kept in ``--cache`` (by prompt id) so that later runs only decode the variants; every output is checked
against them. ``--skip N``: a second set of prompts, none of them among the first ``N``.
"""

import argparse
import json
import os
import pickle
from collections import Counter

import torch
from model_eval import start_from_prior  # this folder's (a script's folder is on sys.path)

from benchmarks.replay import FLAT_CURVE
from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead.bench.runner import encode
from lookahead.bench.workloads import build_workloads
from lookahead.cache import NgramTrie
from lookahead.corpus import DraftCorpus
from lookahead.heads import DraftHeads
from lookahead.models import load_smollm2

HEADS_COST = (0.0003, 0.0001)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default="code-completion")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--skip", type=int, default=0,
                    help="a second set: each workload's prompts among its first PROMPTS + SKIP that are not among its "
                         "first SKIP")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--variants", required=True)
    ap.add_argument("--cache", default="/tmp/lookahead-plain-outputs.pkl")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tok = load_smollm2(dtype=torch.float32)
    plain = {}
    if os.path.exists(args.cache):
        with open(args.cache, "rb") as f:
            plain = pickle.load(f)
    names = args.workloads.split(",")
    seen = build_workloads(names, args.skip) if args.skip else {}
    for wl, prompts in build_workloads(names, args.prompts + args.skip).items():
        skipped = {p.id for p in seen.get(wl, [])}
        prompts = [p for p in prompts if p.id not in skipped][: args.prompts]
        for v in json.loads(args.variants):
            tokens = calls = identical = 0
            accepted, per = Counter(), []
            for p in prompts:
                inputs = encode(p, tok, model.device)
                key = (wl, p.id, args.tokens)
                if key not in plain:
                    plain[key] = model.generate(**inputs, max_new_tokens=args.tokens, do_sample=False)[0].tolist()
                    with open(args.cache, "wb") as f:
                        pickle.dump(plain, f)
                heads = None
                if v.get("heads") is not None:
                    h = dict(v["heads"])
                    kind, folder = h.pop("kind", "feature"), h.pop("dir", None)
                    heads = (DraftHeads.load(f"{folder}/{kind}", cost=HEADS_COST, **h) if folder else
                             DraftHeads.bundled(kind, cost=HEADS_COST, **h))
                store = NgramTrie.load(v["store"]) if v.get("store") else None
                corpus = None
                if v.get("corpus"):  # a DraftCorpus folder, or "bundled": the product's corpus source
                    corpus = DraftCorpus.bundled() if v["corpus"] == "bundled" else DraftCorpus.load(v["corpus"])
                decoder = LookaheadDecoder(LookaheadConfig(**{"cost_curve": FLAT_CURVE, **v.get("config", {})}),
                                           heads=heads, trie=store, corpus=corpus)
                if v.get("prior"):
                    start_from_prior(decoder, v["prior"], model)
                out = model.generate(**inputs, max_new_tokens=args.tokens, do_sample=False, custom_generate=decoder)
                new = out.shape[1] - inputs["input_ids"].shape[1]
                tokens, calls = tokens + new, calls + decoder.stats.target_calls
                identical += out[0].tolist() == plain[key]
                accepted.update(decoder.stats.accepted_by_origin)
                per.append(round(new / decoder.stats.target_calls, 2))
            print(f"{wl:16s} {v['name']:24s} tokens/call {tokens / calls:.3f} identical {identical}/{len(prompts)} "
                  f"per prompt {per} accepted {dict(accepted)}", flush=True)


if __name__ == "__main__":
    main()
