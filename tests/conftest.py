"""Shared fixtures: tiny random models built from configs (no downloads) and the bundled SmolLM2."""

from __future__ import annotations

import pytest
import torch

# Tiny models run far faster on one thread (no OpenMP hand-offs, no spinning when cores are busy);
# the SmolLM2 tests switch to all cores for their duration.
_ALL_THREADS = torch.get_num_threads()
torch.set_num_threads(1)


def tiny_model(arch: str, vocab: int = 96, hidden: int = 32, layers: int = 2, max_positions: int = 512,
               seed: int = 1234):
    """A tiny random causal LM of the given architecture, in float64, built from a config (no download).

    float64 keeps random models far from fp near-ties, so "same tokens" is a strict check.
    """
    import transformers as tf

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, max_position_embeddings=max_positions)
    if arch == "llama":
        cfg, cls = tf.LlamaConfig(num_key_value_heads=2, **common), tf.LlamaForCausalLM
    elif arch == "qwen2":
        cfg, cls = tf.Qwen2Config(num_key_value_heads=2, **common), tf.Qwen2ForCausalLM
    elif arch == "mistral":
        cfg, cls = tf.MistralConfig(num_key_value_heads=2, sliding_window=4096, **common), tf.MistralForCausalLM
    elif arch == "phi3":
        cfg = tf.Phi3Config(num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2, **common)
        cls = tf.Phi3ForCausalLM
    elif arch == "gemma":
        cfg, cls = tf.GemmaConfig(num_key_value_heads=2, head_dim=hidden // 4, **common), tf.GemmaForCausalLM
    elif arch == "gpt2":
        cfg = tf.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=4, n_positions=max_positions,
                            bos_token_id=0, eos_token_id=0)
        cls = tf.GPT2LMHeadModel
    else:
        raise KeyError(arch)
    torch.manual_seed(seed)
    model = cls(cfg).eval().to(torch.float64)
    model.generation_config.pad_token_id = 0
    return model


TINY_ARCHS = ["llama", "qwen2", "mistral", "gpt2", "phi3", "gemma"]


TINY_COST_CURVE = ((1, 0.0025), (2, 0.0027), (16, 0.0030), (64, 0.0036))


@pytest.fixture(scope="session")
def tiny_models():
    cache = {}

    def get(arch: str):
        from lookahead.budget import set_cost_curve

        if arch not in cache:
            cache[arch] = tiny_model(arch)
        # a fixed curve (measured ones vary from 1.0x to 1.4x for two tokens on these ms-long forwards, and
        # the budget's choices with them): what a test decodes does not depend on the machine's noise.
        # Tests of calibration itself call forget_calibrations() after getting their model.
        set_cost_curve(cache[arch], TINY_COST_CURVE)
        return cache[arch]

    return get


@pytest.fixture(autouse=True)
def _threads_for_real_model(request):
    if request.node.get_closest_marker("smollm") is None:
        yield
        return
    torch.set_num_threads(_ALL_THREADS)
    yield
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm():
    """(model, tokenizer) of the bundled SmolLM2-135M-Instruct, fp32 on the CPU."""
    from lookahead.models import load_smollm2, smollm2_location

    try:
        smollm2_location()
    except RuntimeError as err:
        pytest.skip(f"SmolLM2 not installed ({err}); the set-up script `bash .ci/install test` installs it")

    return load_smollm2()
