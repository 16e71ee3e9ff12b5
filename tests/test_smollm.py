"""Greedy equivalence on the bundled real model, SmolLM2-135M-Instruct (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from lookahead import LookaheadDecoder
from lookahead.demo import DEMO_PROMPT, chat_inputs

PROMPTS = {
    "code-edit": DEMO_PROMPT,
    "code-complete": "Complete this Python function:\n\ndef fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "chat": "What are three good habits for staying healthy? Explain each briefly.",
}


@pytest.mark.smollm
@pytest.mark.parametrize("name", list(PROMPTS))
def test_smollm_greedy_equivalence(smollm, name):
    model, tok = smollm
    inputs = chat_inputs(tok, PROMPTS[name])
    plain = model.generate(**inputs, max_new_tokens=128, do_sample=False)
    decoder = LookaheadDecoder()
    ours = model.generate(**inputs, max_new_tokens=128, custom_generate=decoder)
    n_new = plain.shape[1] - inputs["input_ids"].shape[1]
    if not torch.equal(plain, ours):
        # allowed only at a floating-point near-tie of the top two logits at the first difference
        first = int((plain[0, : ours.shape[1]] != ours[0, : plain.shape[1]]).nonzero()[0])
        logits = model(plain[:, :first]).logits[0, -1]
        top2 = logits.topk(2).values
        assert float(top2[0] - top2[1]) < 1e-3, f"{name}: outputs differ at token {first} without a near-tie"
    assert decoder.stats.new_tokens == n_new
    if name.startswith("code"):
        assert decoder.stats.target_calls < n_new
