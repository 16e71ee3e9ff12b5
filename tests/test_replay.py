"""The policy replay (benchmarks/replay.py) against the real decoder, and its unit pieces."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from benchmarks.replay import prompt_lookup_draft, replay, replay_all, replay_prompt_lookup
from lookahead import LookaheadConfig, LookaheadDecoder
from lookahead._tuning import Tuning
from lookahead.cost import CostModel

CURVE = ((1, 1.0), (2, 1.6), (4, 1.7), (8, 1.9), (16, 2.2), (32, 3.0))
PROMPTS = [
    [3, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11, 12, 13, 14, 15, 10, 11],
    [3, 41, 7, 88, 19, 64, 2, 53, 30, 77, 9],
    [5, 6, 7, 8, 5, 6, 9, 8, 5, 6, 7, 40, 41, 5, 6],
]


def test_worked_example_of_the_docstring():
    # the prompt teaches 5 -> 6 -> 9; the output is 5 6 7: a chain draft accepts 5, 6 and emits 7 as well
    cost = CostModel(((1, 1.0), (4, 2.0)))
    fixed = Tuning(adaptive=False, max_match=1)
    res = replay([5, 6, 9, 1, 2], [5, 6, 7], 3, LookaheadConfig(), cost, tuning=fixed)
    assert res["budgets"][0] == 0  # the prompt's last token (2) has no continuation in the trie
    res = replay([2, 5, 6, 9, 1, 2], [5, 6, 7], 3, LookaheadConfig(), cost, tuning=fixed)
    assert res["target_calls"] == 1 and res["accepted"] == 2 and res["new_tokens"] == 3


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("adaptive", [True, False])
def test_replay_makes_the_decoders_decisions(tiny_models, arch, adaptive):
    """With an explicit (non-learning) cost curve the decoder's choices depend on tokens only, so the
    replay on its greedy output must choose the same budgets and make the same number of calls."""
    model = tiny_models(arch)
    config = LookaheadConfig(cost_curve=CURVE)
    tuning = Tuning(adaptive=adaptive, recycle_k=0)  # the replay has no logits
    records = {}
    for k, prompt in enumerate(PROMPTS):
        ids = torch.tensor([prompt])
        dec = LookaheadDecoder(config, _tuning=tuning)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=40,
                             do_sample=False, custom_generate=dec)
        output = out[0, len(prompt):].tolist()
        cost = CostModel(CURVE)
        res = replay(prompt, output, 40, config, cost, tuning=tuning)
        assert res["budgets"] == [b for b, _ in dec.stats.budgets]
        assert res["target_calls"] == dec.stats.target_calls
        assert res["accepted"] == dec.stats.accepted
        # modelled time (arithmetic on CURVE, no clock): each step after the prefill costs cost(1 + nodes),
        # plain decoding cost(1) per token
        steps = sum(float(cost(1 + b)) for b in res["budgets"][1:])
        assert res["seconds"] == pytest.approx(steps)
        assert res["speedup"] == pytest.approx((len(output) - 1) * 1.0 / steps)
        records[f"p{k}"] = {"workload": "w", "prompt": prompt, "output": output, "max_new_tokens": 40}
    result = replay_all({"prompts": records}, config, CostModel(CURVE), tuning=tuning)
    per_prompt, summary = result["per_prompt"], result["summary"]["w"]
    ratios = sorted(p["speedup"] for p in per_prompt.values())
    assert summary["prompts"] == len(PROMPTS)
    assert (summary["speedup_min"], summary["speedup_median"]) == (ratios[0], ratios[1])
    assert summary["tokens_per_call"] == pytest.approx(
        sum(p["new_tokens"] for p in per_prompt.values()) / sum(p["target_calls"] for p in per_prompt.values()))


def test_prompt_lookup_draft_matches_transformers_generator():
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    assert prompt_lookup_draft([1, 2, 3, 9, 1, 2]) == [3, 9, 1, 2]
    assert prompt_lookup_draft([4, 2, 7, 5, 2]) == [7, 5, 2]  # one-token match, first occurrence
    assert prompt_lookup_draft([1, 2, 3]) == []
    rng = np.random.default_rng(0)
    for _ in range(200):
        seq = rng.integers(0, 6, size=int(rng.integers(2, 30))).tolist()
        gen = PromptLookupCandidateGenerator(num_output_tokens=10, max_matching_ngram_size=2, max_length=1000)
        ids, _ = gen.get_candidates(torch.tensor([seq]))
        assert prompt_lookup_draft(seq) == ids[0, len(seq):].tolist(), seq


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_prompt_lookup_replay_makes_transformers_calls(tiny_models, arch):
    model = tiny_models(arch)
    calls = []
    handle = model.register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        for prompt in PROMPTS:
            ids = torch.tensor([prompt])
            calls.clear()
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=30,
                                 do_sample=False, prompt_lookup_num_tokens=10)
            res = replay_prompt_lookup(prompt, out[0, len(prompt):].tolist(), 30, CostModel(CURVE))
            assert res["target_calls"] == len(calls), prompt
    finally:
        handle.remove()


def test_record_then_replay_all(tiny_models, tmp_path):
    from benchmarks.replay import main, record

    model = tiny_models("llama")
    data = record(model, None, {"w": PROMPTS[:2]}, 12, cost=CostModel(CURVE), progress=False)
    assert [r["prompt"] for r in data["prompts"].values()] == PROMPTS[:2]
    assert all(len(r["output"]) == 12 and r["max_new_tokens"] == 12 for r in data["prompts"].values())
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(data))
    assert main(["run", str(path)]) == 0
