"""Tiny random causal LMs built from configs (no downloads), shared by the tests.

A plain module (pytest puts ``tests/`` on ``sys.path``): ``from tiny import tiny_model, TINY_ARCHS``.
"""

from __future__ import annotations

import torch


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


def peaky_llama(vocab: int = 16, seed: int = 7):
    """A tiny float64 Llama whose output head is scaled by 3, for the sampled-distribution checks: its top tokens
    are peaked enough that drafts are sometimes accepted and sometimes rejected."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(cfg).eval().to(torch.float64)
    with torch.no_grad():
        model.lm_head.weight.mul_(3.0)
    return model
