"""Greedy equivalence on the bundled real model, SmolLM2-135M-Instruct (fp32, CPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from lookahead import LookaheadDecoder
from lookahead.tools.demo import DEMO_PROMPT, chat_inputs

PROMPTS = {
    "code-edit": DEMO_PROMPT,
    "code-complete": "Complete this Python function:\n\ndef fibonacci(n):\n"
                     "    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "chat": "What are three good habits for staying healthy? Explain each briefly.",
}


@pytest.mark.smollm
@pytest.mark.parametrize("name", list(PROMPTS))
def test_smollm_greedy_equivalence(smollm, name):
    model, tok = smollm
    inputs = chat_inputs(tok, PROMPTS[name])
    plain = model.generate(**inputs, max_new_tokens=64, do_sample=False)
    decoder = LookaheadDecoder()
    ours = model.generate(**inputs, max_new_tokens=64, custom_generate=decoder)
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


def _stop_string_spellings(model, tok):
    """Each spelling of a lookahead call, as a function of generate()'s other kwargs. The enabled models are shallow
    copies (the instance attribute stays off ``model``) priced with a flat curve, so that they measure none."""
    import lookahead
    from lookahead.config import FLAT_CURVE
    from lookahead.cost import set_cost_curve

    enabled = lookahead.enable(copy.copy(model))
    default = lookahead.enable(copy.copy(model), default=LookaheadDecoder())
    for copied in (enabled, default):
        set_cost_curve(copied, FLAT_CURVE)
    return {
        "custom_generate": lambda **kw: model.generate(**kw, custom_generate=LookaheadDecoder(tokenizer=tok)),
        "assistant": lambda **kw: enabled.generate(**kw, assistant=LookaheadDecoder()),
        "lookahead_true": lambda **kw: enabled.generate(**kw, lookahead=True),
        "default": lambda **kw: default.generate(**kw),
        "custom_generate_enabled": lambda **kw: enabled.generate(**kw, custom_generate=LookaheadDecoder()),
    }


@pytest.mark.smollm
def test_stop_strings_in_every_spelling(smollm):
    """stop_strings with the real tokenizer stop where plain generate stops, in every spelling."""
    model, tok = smollm
    inputs = chat_inputs(tok, "Write a Python class Stack with methods push, pop and peek.")
    full = model.generate(**inputs, max_new_tokens=60, do_sample=False)
    text = tok.decode(full[0, inputs["input_ids"].shape[1]:])
    stop = "push" if "push" in text else text.split()[len(text.split()) // 2]
    kw = dict(max_new_tokens=60, do_sample=False, stop_strings=[stop], tokenizer=tok)
    plain = model.generate(**inputs, **kw)
    assert plain.shape[1] < full.shape[1], "the stop string must stop plain generate early"
    for name, run in _stop_string_spellings(model, tok).items():
        ours = run(**inputs, **kw)
        assert ours.tolist() == plain.tolist(), name
    # generate() drops tokenizer= for a custom_generate callable: the decoder says what to do instead
    with pytest.raises(ValueError, match=r"LookaheadDecoder\(tokenizer=tok\)"):
        model.generate(**inputs, **kw, custom_generate=LookaheadDecoder())
    # stop strings set in a generation config reach the decoder through the enabled spellings too
    config = copy.deepcopy(model.generation_config)
    config.stop_strings, config.max_new_tokens, config.do_sample = [stop], 60, False
    enabled = _stop_string_spellings(model, tok)["lookahead_true"]
    assert enabled(**inputs, generation_config=config, tokenizer=tok).tolist() == plain.tolist()
