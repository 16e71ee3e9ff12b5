"""The same tokens as plain greedy ``generate`` on architectures beyond the six of ``tiny.py``: tiny random models
built from configs (no download), 30-token prompts, 40 new tokens, the default decoder on the pinned test curve.
Among them models with QK norms (Qwen3, OLMo 2), sliding-window layers beside full ones past the window (GPT-OSS,
Cohere 2), local attention (GPT-Neo), multi-head latent attention with experts (DeepSeek V3), experts (Mixtral),
learned absolute positions (GPT-BigCode, OPT) and parallel blocks (GPT-NeoX, Phi, CodeGen)."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from lookahead import LookaheadDecoder

from tiny import TINY_COST_CURVE

V, H = 96, 32
COMMON = dict(vocab_size=V, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=2, num_attention_heads=4,
              max_position_embeddings=512)
IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
WINDOW = dict(sliding_window=16, layer_types=["sliding_attention", "full_attention"])
EXPERTS = dict(num_experts_per_tok=2)

ARCHS = {  # name: (config, model class, dtype); experts run in float32 (grouped products take no float64)
    "qwen3": (lambda: tf.Qwen3Config(num_key_value_heads=2, head_dim=8, **COMMON), tf.Qwen3ForCausalLM, torch.float64),
    "olmo2": (lambda: tf.Olmo2Config(num_key_value_heads=2, **IDS, **COMMON), tf.Olmo2ForCausalLM, torch.float64),
    "gpt-neox": (lambda: tf.GPTNeoXConfig(**COMMON), tf.GPTNeoXForCausalLM, torch.float64),
    "phi": (lambda: tf.PhiConfig(**COMMON), tf.PhiForCausalLM, torch.float64),
    "codegen": (lambda: tf.CodeGenConfig(vocab_size=V, n_embd=H, n_layer=2, n_head=4, rotary_dim=4, n_positions=512,
                                         n_ctx=512), tf.CodeGenForCausalLM, torch.float64),
    "gpt-bigcode": (lambda: tf.GPTBigCodeConfig(vocab_size=V, n_embd=H, n_layer=2, n_head=4, n_positions=512),
                    tf.GPTBigCodeForCausalLM, torch.float64),
    "opt": (lambda: tf.OPTConfig(vocab_size=V, hidden_size=H, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                                 word_embed_proj_dim=H, max_position_embeddings=512), tf.OPTForCausalLM, torch.float64),
    "gpt-neo (local attention)": (lambda: tf.GPTNeoConfig(vocab_size=V, hidden_size=H, num_layers=2, num_heads=4,
                                                          attention_types=[[["global", "local"], 1]], window_size=16,
                                                          max_position_embeddings=512),
                                  tf.GPTNeoForCausalLM, torch.float64),
    "cohere2 (past its window)": (lambda: tf.Cohere2Config(num_key_value_heads=2, **WINDOW, **IDS, **COMMON),
                                  tf.Cohere2ForCausalLM, torch.float64),
    "gpt-oss (past its window)": (lambda: tf.GptOssConfig(num_key_value_heads=2, head_dim=8, num_local_experts=4,
                                                          **WINDOW, **EXPERTS, **COMMON),
                                  tf.GptOssForCausalLM, torch.float32),
    "mixtral": (lambda: tf.MixtralConfig(num_key_value_heads=2, num_local_experts=4, **EXPERTS, **COMMON),
                tf.MixtralForCausalLM, torch.float32),
    "deepseek-v3": (lambda: tf.DeepseekV3Config(num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                                                qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, n_routed_experts=4,
                                                moe_intermediate_size=16, first_k_dense_replace=1, n_group=1,
                                                topk_group=1, **EXPERTS, **IDS, **COMMON),
                    tf.DeepseekV3ForCausalLM, torch.float32),
}


@pytest.mark.parametrize("arch", list(ARCHS))
def test_greedy_is_plain_generate(arch):
    config, cls, dtype = ARCHS[arch]
    torch.manual_seed(1234)
    model = cls(config()).eval().to(dtype)
    model.generation_config.pad_token_id = 0
    base = torch.randint(3, V, (12,), generator=torch.Generator().manual_seed(0))
    ids = base.repeat(3)[:30][None]
    kw = dict(max_new_tokens=40, do_sample=False, eos_token_id=None)
    plain = model.generate(ids, **kw)
    decoder = LookaheadDecoder(cost_curve=TINY_COST_CURVE)
    assert model.generate(ids, custom_generate=decoder, **kw).tolist() == plain.tolist()
    assert decoder.stats.accepted > 0  # drafts were verified and kept, not only plain steps


def _gemma3_with_vision():
    text = tf.Gemma3TextConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=16,
                               layer_types=["sliding_attention", "full_attention"], max_position_embeddings=512)
    vision = tf.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                   image_size=28, patch_size=14)
    torch.manual_seed(0)
    model = tf.Gemma3ForConditionalGeneration(tf.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=299, boi_token_index=297,
        eoi_token_index=298)).eval().to(torch.float64)
    model.generation_config.pad_token_id = 0
    return model


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_multimodal_model_on_text_alone_is_plain_generate(cache):
    """Gemma 3 with its vision tower (``Gemma3ForConditionalGeneration``, the 4B-27B models' class), text only:
    ``generate`` hands it an empty ``mm_encoder_outputs``, and its sliding layers are named in its text config."""
    model = _gemma3_with_vision()
    ids = torch.randint(3, 290, (12,), generator=torch.Generator().manual_seed(0)).repeat(3)[:30][None]
    kw = dict(max_new_tokens=40, do_sample=False, eos_token_id=None,
              **({"cache_implementation": "static"} if cache == "static" else {}))
    plain = model.generate(ids, **kw)
    decoder = LookaheadDecoder(cost_curve=TINY_COST_CURVE)
    assert model.generate(ids, custom_generate=decoder, **kw).tolist() == plain.tolist()
    assert decoder.stats.accepted > 0


def _tiny_llava():
    vision = tf.CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 image_size=32, patch_size=8, projection_dim=32)
    text = tf.LlamaConfig(num_key_value_heads=2, **dict(COMMON, vocab_size=120))
    torch.manual_seed(0)
    model = tf.LlavaForConditionalGeneration(tf.LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=100, vision_feature_layer=-1,
        vision_feature_select_strategy="default")).eval().to(torch.float64)
    model.generation_config.pad_token_id = 0
    return model


def _tiny_qwen2_vl():
    torch.manual_seed(0)
    model = tf.Qwen2VLForConditionalGeneration(tf.Qwen2VLConfig(
        text_config=dict(num_key_value_heads=2, rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]}, **COMMON),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=4, patch_size=14, spatial_merge_size=2),
        image_token_id=V - 1, video_token_id=V - 2, vision_start_token_id=V - 3)).eval().to(torch.float64)
    model.generation_config.pad_token_id = 0
    return model


def _text(seed: int = 0, length: int = 30) -> list[int]:
    """The text after an image: 12 random ids (below every placeholder id), repeated, ``length`` of them."""
    return torch.randint(3, 90, (12,), generator=torch.Generator().manual_seed(seed)).repeat(3)[:length].tolist()


IMAGE_CASES = {  # name: (model, a prompt with the model's image placeholders, the image's inputs)
    "llava": (_tiny_llava, lambda text: [1] + [100] * 16 + text,
              lambda: dict(pixel_values=torch.randn(1, 3, 32, 32, dtype=torch.float64))),
    "gemma3": (_gemma3_with_vision, lambda text: [5, 297] + [299] * 4 + [298] + text,
               lambda: dict(pixel_values=torch.randn(1, 3, 28, 28, dtype=torch.float64))),
    "qwen2-vl": (_tiny_qwen2_vl, lambda text: [5, V - 3] + [V - 1] * 4 + [7] + text,  # 4 x 4 patches, merged 2 x 2
                 lambda: dict(pixel_values=torch.randn(16, 3 * 2 * 14 * 14, dtype=torch.float64),
                              image_grid_thw=torch.tensor([[1, 4, 4]]))),
}


@pytest.mark.parametrize("name, cache", [(name, "dynamic") for name in IMAGE_CASES]
                         + [("llava", "static"), ("qwen2-vl", "static")])
def test_a_multimodal_model_with_an_image_is_plain_generate(name, cache):
    """An image's features go to the prompt's forward (every prompt token but the last); the decoder continues that
    cache with text-only steps, as plain generate's later steps are: the same tokens, with drafts accepted. On a static
    cache too, where every layer is a full-attention one (Gemma 3's sliding layers are refused there)."""
    make, prompt, media = IMAGE_CASES[name]
    model = make()
    text = _text()
    ids = torch.tensor([prompt(text)])
    torch.manual_seed(1)
    image = media()
    kw = dict(max_new_tokens=40, do_sample=False, eos_token_id=None,
              **({"cache_implementation": "static"} if cache == "static" else {}))
    without = dict(kw)  # the placeholders' own embeddings instead
    kw.update(image)
    plain = model.generate(ids, **kw)
    assert plain.tolist() != model.generate(ids, **without).tolist()  # the image's features were read
    decoder = LookaheadDecoder(cost_curve=TINY_COST_CURVE)
    assert model.generate(ids, custom_generate=decoder, **kw).tolist() == plain.tolist()
    assert decoder.stats.accepted > 0


@pytest.mark.parametrize("name, cache", [("llava", "dynamic"), ("llava", "static"), ("qwen2-vl", "dynamic")])
def test_one_padded_row_with_an_image_is_plain_generate(name, cache):
    """A row with three padding columns before its image: the prompt's forward takes the padding mask, and the row
    continues as any padded row does."""
    make, prompt, media = IMAGE_CASES[name]
    model = make()
    text = _text()
    ids = torch.tensor([[0, 0, 0] + prompt(text)])
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    torch.manual_seed(1)
    kw = dict(media(), attention_mask=mask, max_new_tokens=30, do_sample=False, eos_token_id=None,
              **({"cache_implementation": "static"} if cache == "static" else {}))
    plain = model.generate(ids, **kw)
    decoder = LookaheadDecoder(cost_curve=TINY_COST_CURVE)
    assert model.generate(ids, custom_generate=decoder, **kw).tolist() == plain.tolist()
    assert decoder.stats.accepted > 0


@pytest.mark.parametrize("name", list(IMAGE_CASES))
def test_a_batch_with_images_is_plain_generate(name):
    """Two rows, each with its image, the second left-padded: the images' features go to the batch's prompt step
    (one padded forward, no drafts beside them), its later steps are text: plain's tokens, drafts accepted."""
    make, prompt, media = IMAGE_CASES[name]
    model = make()
    first, second = prompt(_text()), prompt(_text(seed=1, length=26))
    pad = len(first) - len(second)
    ids = torch.tensor([first, [0] * pad + second])
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    torch.manual_seed(1)
    images = [media(), media()]
    kw = {k: torch.cat([image[k] for image in images]) for k in images[0]}
    kw.update(attention_mask=mask, max_new_tokens=30, do_sample=False, eos_token_id=None)
    plain = model.generate(ids, **kw)
    decoder = LookaheadDecoder(cost_curve=TINY_COST_CURVE)
    assert model.generate(ids, custom_generate=decoder, **kw).tolist() == plain.tolist()
    assert decoder.stats.accepted > 0


def test_an_images_token_types_go_to_its_prompt_forward():
    """Gemma 3's processor gives token_type_ids (1 on image tokens), which its prompt's forward reads (attention among
    an image's tokens) and its text steps do not: the decoder's prompt forward gets them, its steps get none, and the
    tokens are plain's."""
    model = _gemma3_with_vision()
    text = torch.randint(3, 290, (12,), generator=torch.Generator().manual_seed(0)).repeat(3)[:30].tolist()
    ids = torch.tensor([[5, 297] + [299] * 4 + [298] + text])
    types = (ids == 299).long()
    torch.manual_seed(1)
    kw = dict(pixel_values=torch.randn(1, 3, 28, 28, dtype=torch.float64), token_type_ids=types, max_new_tokens=40,
              do_sample=False, eos_token_id=None)
    plain = model.generate(ids, **kw)
    seen = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs.get("token_type_ids")),
                                           with_kwargs=True)
    try:
        ours = model.generate(ids, custom_generate=LookaheadDecoder(cost_curve=TINY_COST_CURVE), **kw)
    finally:
        hook.remove()
    assert ours.tolist() == plain.tolist()
    assert seen[0].tolist() == types[:, :-1].tolist() and all(t is None for t in seen[1:]) and len(seen) > 2
    for other in (torch.zeros_like(types), torch.ones_like(types)):  # types that mark other tokens: a prefix LM's
        with pytest.raises(ValueError, match="only where they mark the image placeholders"):
            model.generate(ids, custom_generate=LookaheadDecoder(cost_curve=TINY_COST_CURVE),
                           **dict(kw, token_type_ids=other))


def test_what_an_image_call_cannot_decode_is_refused_before_its_forward():
    model = _gemma3_with_vision()
    ids = torch.tensor([[5, 297] + [299] * 4 + [298, 7, 8, 9]])
    pixel_values = torch.randn(1, 3, 28, 28, dtype=torch.float64)
    cases = [
        (dict(input_ids=ids[:, :-4]), "ends in a text token"),
        (dict(input_ids=ids, cache_implementation="static"), "static cache of full-attention layers only"),
        (dict(input_ids=ids, attention_mask=torch.cat([torch.zeros(1, 1), torch.ones(1, 9)], 1).long(),
              max_new_tokens=30), "one padded row with images only where no sliding window is shorter than the call"),
        (dict(input_ids=ids.repeat(2, 1), pixel_values=pixel_values.repeat(2, 1, 1, 1),
              token_type_ids=(ids == 299).long().repeat(2, 1)), "a batch with images without token_type_ids"),
    ]
    for kw, match in cases:
        kw = {"pixel_values": pixel_values, "max_new_tokens": 5, **kw}
        with pytest.raises(ValueError, match=match):
            model.generate(**kw, custom_generate=LookaheadDecoder(cost_curve=TINY_COST_CURVE))


def test_qwen2_vl_on_text_alone_is_plain_generate():
    """Qwen2-VL's rotary positions have three sections (multimodal RoPE); on text alone all three are the token's
    position, which the decoder's position ids give."""
    model = _tiny_qwen2_vl()
    ids = torch.randint(3, V - 3, (12,), generator=torch.Generator().manual_seed(0)).repeat(3)[:30][None]
    kw = dict(max_new_tokens=40, do_sample=False, eos_token_id=None)
    plain = model.generate(ids, **kw)
    decoder = LookaheadDecoder(cost_curve=TINY_COST_CURVE)
    assert model.generate(ids, custom_generate=decoder, **kw).tolist() == plain.tolist()
    assert decoder.stats.accepted > 0
