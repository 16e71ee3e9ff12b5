"""Shared fixtures: tiny random models built from configs (no downloads) and the bundled SmolLM2."""

from __future__ import annotations

import pytest
import torch

# Tiny models run far faster on one thread (no OpenMP hand-offs, no spinning when cores are busy);
# the SmolLM2 tests switch to all cores for their duration.
_ALL_THREADS = torch.get_num_threads()
torch.set_num_threads(1)


def _tiny(arch: str):
    import transformers as tf

    common = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=512)
    if arch == "llama":
        cfg, cls = tf.LlamaConfig(num_key_value_heads=2, **common), tf.LlamaForCausalLM
    elif arch == "qwen2":
        cfg, cls = tf.Qwen2Config(num_key_value_heads=2, **common), tf.Qwen2ForCausalLM
    elif arch == "mistral":
        cfg, cls = tf.MistralConfig(num_key_value_heads=2, sliding_window=4096, **common), tf.MistralForCausalLM
    elif arch == "phi3":
        cfg, cls = tf.Phi3Config(num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2, **common), tf.Phi3ForCausalLM
    elif arch == "gemma":
        cfg, cls = tf.GemmaConfig(num_key_value_heads=2, head_dim=8, **common), tf.GemmaForCausalLM
    elif arch == "gpt2":
        cfg = tf.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=512,
                            bos_token_id=0, eos_token_id=0)
        cls = tf.GPT2LMHeadModel
    else:
        raise KeyError(arch)
    torch.manual_seed(1234)
    model = cls(cfg).eval()
    # float64 keeps the random models far from fp near-ties, so "same tokens" is a strict check
    model = model.to(torch.float64)
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or 0
    return model


TINY_ARCHS = ["llama", "qwen2", "mistral", "gpt2", "phi3", "gemma"]


@pytest.fixture(scope="session")
def tiny_models():
    cache = {}

    def get(arch: str):
        if arch not in cache:
            cache[arch] = _tiny(arch)
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
