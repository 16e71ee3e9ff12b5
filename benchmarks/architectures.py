"""Which model architectures the decoder runs exactly: a sweep over tiny random models built from configs (no
download), each asked for the same greedy tokens as plain ``generate``.

Each model has a vocabulary of 96, width 32 and 2-3 layers, and sliding-window models a window of 16 tokens. Experts
run in float32 (their grouped products take no float64), the rest in float64. The prompt is 12 random ids
repeated to 30 tokens, and 40 new tokens follow (past every window). The decoder is the default one on a pinned
cost curve (``TINY_COST_CURVE``), so tokens per call do not depend on the machine. Per architecture it prints
whether the output is identical to plain's, the target calls and tokens per call, or the error the call raised (a
refusal before any forward, or a failure). Plain ``generate`` runs first: an architecture it cannot run here is
reported as such. Run it from outside the repository with ``PYTHONPATH=<checkout>`` to sweep another checkout's
plugin.

    python -m benchmarks.architectures [NAME ...] [--out results.txt]
"""

from __future__ import annotations

import argparse
import sys
import warnings

import torch
import transformers as tf

from lookahead import LookaheadDecoder

V, H = 96, 32
CURVE = ((1, 0.0025), (2, 0.0027), (16, 0.0030), (64, 0.0036))  # tests/tiny.py's TINY_COST_CURVE
COMMON = dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=512)
IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
MIXED = dict(sliding_window=16, layer_types=["sliding_attention", "full_attention"])
EXPERTS = dict(num_experts_per_tok=2)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, image_size=28,
              patch_size=14)  # a vision tower beside the text decoder; the prompts are text alone


def configs() -> dict:
    """name -> (config factory, model class, dtype)."""
    f64, f32 = torch.float64, torch.float32
    return {
        "llama": (lambda: tf.LlamaConfig(num_key_value_heads=2, **COMMON), tf.LlamaForCausalLM, f64),
        "llama (llama3 rope scaling)": (lambda: tf.LlamaConfig(
            num_key_value_heads=2, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            **COMMON), tf.LlamaForCausalLM, f64),
        "qwen2": (lambda: tf.Qwen2Config(num_key_value_heads=2, **COMMON), tf.Qwen2ForCausalLM, f64),
        "qwen2 (sliding window)": (lambda: tf.Qwen2Config(num_key_value_heads=2, use_sliding_window=True,
                                                          sliding_window=16, max_window_layers=1, **COMMON),
                                   tf.Qwen2ForCausalLM, f64),
        "qwen3": (lambda: tf.Qwen3Config(num_key_value_heads=2, head_dim=8, **COMMON), tf.Qwen3ForCausalLM, f64),
        "mistral (sliding window)": (lambda: tf.MistralConfig(num_key_value_heads=2, sliding_window=16, **COMMON),
                                     tf.MistralForCausalLM, f64),
        "phi3 (sliding window)": (lambda: tf.Phi3Config(num_key_value_heads=2, sliding_window=16, **IDS, **COMMON),
                                  tf.Phi3ForCausalLM, f64),
        "starcoder2 (sliding window)": (lambda: tf.Starcoder2Config(num_key_value_heads=2, sliding_window=16,
                                                                    **COMMON), tf.Starcoder2ForCausalLM, f64),
        "gemma": (lambda: tf.GemmaConfig(num_key_value_heads=2, head_dim=8, **COMMON), tf.GemmaForCausalLM, f64),
        "gemma2": (lambda: tf.Gemma2Config(num_key_value_heads=2, head_dim=8, **MIXED, **COMMON),
                   tf.Gemma2ForCausalLM, f64),
        "gemma3": (lambda: tf.Gemma3TextConfig(num_key_value_heads=2, head_dim=8, **MIXED, **COMMON),
                   tf.Gemma3ForCausalLM, f64),
        "cohere": (lambda: tf.CohereConfig(num_key_value_heads=2, **COMMON), tf.CohereForCausalLM, f64),
        "cohere2": (lambda: tf.Cohere2Config(num_key_value_heads=2, **MIXED, **IDS, **COMMON),
                    tf.Cohere2ForCausalLM, f64),
        "olmo": (lambda: tf.OlmoConfig(num_key_value_heads=2, **COMMON), tf.OlmoForCausalLM, f64),
        "olmo2": (lambda: tf.Olmo2Config(num_key_value_heads=2, **IDS, **COMMON), tf.Olmo2ForCausalLM, f64),
        "granite": (lambda: tf.GraniteConfig(num_key_value_heads=2, **COMMON), tf.GraniteForCausalLM, f64),
        "stablelm": (lambda: tf.StableLmConfig(num_key_value_heads=2, **COMMON), tf.StableLmForCausalLM, f64),
        "nemotron": (lambda: tf.NemotronConfig(num_key_value_heads=2, **IDS, **COMMON), tf.NemotronForCausalLM, f64),
        "glm": (lambda: tf.GlmConfig(num_key_value_heads=2, head_dim=8, **IDS, **COMMON), tf.GlmForCausalLM, f64),
        "exaone4": (lambda: tf.Exaone4Config(num_key_value_heads=2, **COMMON), tf.Exaone4ForCausalLM, f64),
        "smollm3": (lambda: tf.SmolLM3Config(num_key_value_heads=2, **IDS, **COMMON), tf.SmolLM3ForCausalLM, f64),
        "phi": (lambda: tf.PhiConfig(**COMMON), tf.PhiForCausalLM, f64),
        "gpt2": (lambda: tf.GPT2Config(vocab_size=V, n_embd=H, n_layer=2, n_head=4, n_positions=512),
                 tf.GPT2LMHeadModel, f64),
        "gpt-neo (local attention)": (lambda: tf.GPTNeoConfig(
            vocab_size=V, hidden_size=H, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
            window_size=16, max_position_embeddings=512), tf.GPTNeoForCausalLM, f64),
        "gpt-neox": (lambda: tf.GPTNeoXConfig(**COMMON), tf.GPTNeoXForCausalLM, f64),
        "gptj": (lambda: tf.GPTJConfig(vocab_size=V, n_embd=H, n_layer=2, n_head=4, rotary_dim=4, n_positions=512),
                 tf.GPTJForCausalLM, f64),
        "codegen": (lambda: tf.CodeGenConfig(vocab_size=V, n_embd=H, n_layer=2, n_head=4, rotary_dim=4,
                                             n_positions=512, n_ctx=512), tf.CodeGenForCausalLM, f64),
        "gpt-bigcode": (lambda: tf.GPTBigCodeConfig(vocab_size=V, n_embd=H, n_layer=2, n_head=4, n_positions=512),
                        tf.GPTBigCodeForCausalLM, f64),
        "opt": (lambda: tf.OPTConfig(vocab_size=V, hidden_size=H, ffn_dim=64, num_hidden_layers=2,
                                     num_attention_heads=4, word_embed_proj_dim=H, max_position_embeddings=512),
                tf.OPTForCausalLM, f64),
        "falcon": (lambda: tf.FalconConfig(vocab_size=V, hidden_size=H, num_hidden_layers=2, num_attention_heads=4),
                   tf.FalconForCausalLM, f64),
        "falcon (alibi)": (lambda: tf.FalconConfig(vocab_size=V, hidden_size=H, num_hidden_layers=2,
                                                   num_attention_heads=4, alibi=True), tf.FalconForCausalLM, f64),
        "bloom (alibi)": (lambda: tf.BloomConfig(vocab_size=V, hidden_size=H, n_layer=2, n_head=4),
                          tf.BloomForCausalLM, f64),
        "mpt (alibi)": (lambda: tf.MptConfig(vocab_size=V, d_model=H, n_layers=2, n_heads=4, max_seq_len=512),
                        tf.MptForCausalLM, f64),
        "mixtral": (lambda: tf.MixtralConfig(num_key_value_heads=2, num_local_experts=4, **EXPERTS, **COMMON),
                    tf.MixtralForCausalLM, f32),
        "qwen2-moe": (lambda: tf.Qwen2MoeConfig(num_key_value_heads=2, num_experts=4, moe_intermediate_size=32,
                                                shared_expert_intermediate_size=32, **EXPERTS, **COMMON),
                      tf.Qwen2MoeForCausalLM, f32),
        "qwen3-moe": (lambda: tf.Qwen3MoeConfig(num_key_value_heads=2, head_dim=8, num_experts=4,
                                                moe_intermediate_size=32, **EXPERTS, **COMMON),
                      tf.Qwen3MoeForCausalLM, f32),
        "gpt-oss": (lambda: tf.GptOssConfig(num_key_value_heads=2, head_dim=8, num_local_experts=4, **MIXED,
                                            **EXPERTS, **COMMON), tf.GptOssForCausalLM, f32),
        "deepseek-v3": (lambda: tf.DeepseekV3Config(
            num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
            v_head_dim=8, n_routed_experts=4, moe_intermediate_size=16, first_k_dense_replace=1, n_group=1,
            topk_group=1, **EXPERTS, **IDS, **COMMON), tf.DeepseekV3ForCausalLM, f32),
        "llama4 (chunked attention)": (lambda: tf.Llama4TextConfig(
            num_key_value_heads=2, head_dim=8, attention_chunk_size=16, num_local_experts=2,
            interleave_moe_layer_step=1, intermediate_size_mlp=64, **IDS, **COMMON), tf.Llama4ForCausalLM, f32),
        "llava, text only": (lambda: tf.LlavaConfig(
            text_config=tf.LlamaConfig(num_key_value_heads=2, **COMMON), image_token_index=V - 1,
            vision_config=tf.CLIPVisionConfig(**VISION)), tf.LlavaForConditionalGeneration, f64),
        "qwen2-vl (mrope), text only": (lambda: tf.Qwen2VLConfig(
            text_config=dict(num_key_value_heads=2, rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
                             **COMMON),
            vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=4, patch_size=14,
                               spatial_merge_size=2), image_token_id=V - 1, video_token_id=V - 2,
            vision_start_token_id=V - 3), tf.Qwen2VLForConditionalGeneration, f64),
        "gemma3 with vision, text only": (lambda: tf.Gemma3Config(
            text_config=tf.Gemma3TextConfig(num_key_value_heads=2, head_dim=8, **MIXED, **COMMON),
            vision_config=tf.SiglipVisionConfig(**VISION), mm_tokens_per_image=4, image_token_index=V - 1,
            boi_token_index=V - 3, eoi_token_index=V - 2), tf.Gemma3ForConditionalGeneration, f64),
        "paligemma, text only": (lambda: tf.PaliGemmaConfig(
            text_config=tf.GemmaConfig(num_key_value_heads=2, head_dim=8, **COMMON),
            vision_config=tf.SiglipVisionConfig(**VISION), image_token_index=V - 1, projection_dim=32),
                                 tf.PaliGemmaForConditionalGeneration, f64),
        "mamba (recurrent)": (lambda: tf.MambaConfig(vocab_size=V, hidden_size=16, num_hidden_layers=1, state_size=4,
                                                     expand=2, conv_kernel=2), tf.MambaForCausalLM, f64),
    }


def check(name: str, factory, cls, dtype) -> str:
    """One architecture's line of the table."""
    try:
        torch.manual_seed(1234)
        model = cls(factory()).eval().to(dtype)
    except Exception as err:  # noqa: BLE001 (a config this transformers version does not build: reported)
        return f"| {name} | model not built: {type(err).__name__}: {err} | | |"
    model.generation_config.pad_token_id = 0
    base = torch.randint(3, V - 3, (12,), generator=torch.Generator().manual_seed(0))  # (the top ids: image tokens)
    ids = base.repeat(3)[:30][None]
    kw = dict(max_new_tokens=40, do_sample=False, eos_token_id=None)
    try:
        plain = model.generate(ids, **kw)
    except Exception as err:  # noqa: BLE001
        return f"| {name} | plain generate fails here: {type(err).__name__} | | |"
    decoder = LookaheadDecoder(cost_curve=CURVE)
    try:
        ours = model.generate(ids, custom_generate=decoder, **kw)
    except Exception as err:  # noqa: BLE001 (the refusal, or a failure: both reported)
        return f"| {name} | raised {type(err).__name__}: {str(err).splitlines()[0]} | | |"
    same = "identical" if ours.tolist() == plain.tolist() else "**DIFFERS**"
    return f"| {name} | {same} | {decoder.stats.target_calls} | {decoder.stats.tokens_per_call:.2f} |"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help="architectures to check (default: all)")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args(argv)
    table = configs()
    unknown = [n for n in args.names if n not in table]
    if unknown:
        ap.error(f"unknown architectures {unknown}; known: {', '.join(table)}")
    torch.set_num_threads(1)
    lines = [f"transformers {tf.__version__}, torch {torch.__version__}", "",
             "| architecture | greedy output | target calls | tokens per call |", "|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tf.logging.set_verbosity_error()
        for name in args.names or table:
            lines.append(check(name, *table[name]))
            print(lines[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
