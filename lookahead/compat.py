"""Every place where lookahead relies on transformers beyond its documented public API, in one module.

A transformers upgrade that changes one of these breaks here, and ``tests/test_compat.py`` (pinned
to the installed version) says which. Checked on transformers 5.17, 5.24 and 5.25. (5.25 declares every
linear-attention cache layer croppable, recurrent state included; :func:`rollbackable_layer_types` is an exact
list of plain key/value layer classes, so hybrid layers are still refused before any forward.)

- :func:`streamer_of_calling_generate`: ``generate`` does not hand ``streamer=`` to a callable
  ``custom_generate``; we read it, read-only, from the calling ``generate`` frame
  (:func:`arguments_of_calling_generate`; ``assistant_model=`` too, which is dropped the same way).
- :func:`forward_is_compiled`: torch's (not transformers') ``_torchdynamo_orig_callable`` attribute of a function
  ``torch.compile`` made.
- :func:`supports_logits_to_keep`: the private ``_supports_logits_to_keep`` of generating models.
- :func:`generation_config_for_call`: the private ``_prepare_generation_config`` (the config a
  ``generate`` call with these kwargs would use).
- :func:`rollbackable_layer_types`: the cache layer classes whose entries can be gathered and cropped.
- :func:`cache_kwarg_name`: ``cache`` (new) or ``past_key_values`` (old) as the forward's cache argument.
  (5.17 takes ``cache=`` into ``**kwargs`` and ignores it: the forward then runs without any cache.)
- :func:`cache_of`: the cache ``generate`` prepared, under whichever of :data:`CACHE_KWARGS` it used
  (5.17 hands Mamba-like models ``cache_params``).
- :func:`crop_cache`: ``Cache.crop(-n)`` that skips layers holding nothing (5.17's ``DynamicLayer.crop``
  fails on one; 5.24 skips it itself).
- :func:`decoder_only_output`: ``GenerateDecoderOnlyOutput`` with the cache under its current field name.
- :func:`host_stopping`: the attributes of ``MaxLengthCriteria`` and ``EosTokenCriteria`` that let the
  decoder check those two on the host instead of running tensor code per token.
- :func:`processors_as_function`: what ``LogitsProcessorList.__call__`` does when ``generate``'s
  sampling loop calls it (no extra keyword arguments), without its per-call signature inspection.
- :func:`pad_token_id`: the generation config's private ``_pad_token_tensor`` (what ``generate`` pads with).
- :func:`compiles_on_all_devices`: ``CompileConfig``'s private ``_compile_all_devices``.
- :func:`refill_sliding`: a static sliding layer's ring (``cumulative_length_int`` and its buffers' order).
- :func:`forward_with_hidden`: a causal LM's forward as its decoder then its output layer (``get_decoder``,
  ``get_output_embeddings``), for the draft heads, which read the output layer's input.
- :func:`token_bans`: the attributes of the processors that only forbid some tokens at some sequence lengths
  (``MinLengthLogitsProcessor``, ``MinNewTokensLengthLogitsProcessor``, ``SuppressTokensLogitsProcessor``,
  ``SuppressTokensAtBeginLogitsProcessor``), so that a greedy verdict can take the first allowed token of
  each row's top-k on the host instead of running them on every verified row.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys

import numpy as np
import torch
from transformers.cache_utils import StaticLayer

TESTED_TRANSFORMERS = ("5.17", "5.24", "5.25")  # str.startswith takes the tuple

# the model kwargs under which generate() hands over the cache it prepared (newest name first)
CACHE_KWARGS = ("cache", "past_key_values", "cache_params")


def arguments_of_calling_generate(custom_generate, names: tuple[str, ...], depth: int = 2) -> tuple:
    """The arguments ``names`` of the ``generate(custom_generate=custom_generate, ...)`` call running the caller (None
    for each, outside such a call), read in one walk up the stack: what ``generate`` takes but does not hand to a
    callable ``custom_generate`` (``streamer``, ``assistant_model``). Only a frame named ``generate`` whose
    ``custom_generate`` is this very object counts. ``depth``: frames between here and the caller of the decoder (2:
    this function's caller is the decoder's ``__call__``).
    """
    frame = sys._getframe(depth)
    try:
        for _ in range(3):
            if frame is None:
                break
            if frame.f_code.co_name == "generate" and frame.f_locals.get("custom_generate") is custom_generate:
                return tuple(frame.f_locals.get(name) for name in names)
            frame = frame.f_back
        return (None,) * len(names)
    finally:
        del frame


def forward_is_compiled(model) -> bool:
    """Whether ``model.forward`` is a function ``torch.compile`` made (``model.forward = torch.compile(model.forward)``,
    the pattern transformers' documentation gives for compiled decoding)."""
    return getattr(model.forward, "_torchdynamo_orig_callable", None) is not None


def eager_stance():
    """A context in which every ``torch.compile``d function runs as the code it was made from
    (``torch.compiler.set_stance("force_eager")``, torch >= 2.6), or None where torch has no such switch."""
    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    return None if set_stance is None else set_stance("force_eager")


def forward_parameters(model) -> frozenset[str]:
    """The names ``model.forward`` takes, read once per forward function (``inspect.signature`` costs about 0.1 ms
    a call): keyed by the function itself, so a forward replaced on the instance (accelerate's hooks) is read
    anew."""
    forward = model.forward
    return _parameters(getattr(forward, "__func__", forward))


@functools.lru_cache(maxsize=64)
def _parameters(function) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters)


def supports_logits_to_keep(model) -> bool:
    """Whether ``model.forward`` takes ``logits_to_keep`` (then only the rows we verify get the LM head)."""
    probe = getattr(model, "_supports_logits_to_keep", None)
    return bool(probe()) if probe is not None else "logits_to_keep" in forward_parameters(model)


def text_config(model):
    """The config of ``model``'s text decoder: its own, or a multimodal model's text part (``get_text_config``)."""
    config = model.config
    get = getattr(config, "get_text_config", None)
    return get() if get is not None else config


def takes_tree_masks(model) -> bool:
    """Whether ``model``'s forward takes an additive 4D attention mask (a draft tree's). Bloom, and Falcon with
    ALiBi, build their position biases from the shape of a 2D padding mask (transformers 5.25), so they take only
    causal steps: no mask, or a 2D one."""
    config = model.config
    model_type = getattr(config, "model_type", "")
    return not (model_type == "bloom" or (model_type == "falcon" and getattr(config, "alibi", False)))


def last_logits(model, ids, pos, mask, forward_kwargs: dict, keeps_logits: bool, keep: int):
    """One forward of ``model``; the float logits of its last ``keep`` input positions, [b, keep, V] (with
    ``logits_to_keep=keep`` when the model takes it, so only those rows get the LM head)."""
    kwargs = {**forward_kwargs, "logits_to_keep": keep} if keeps_logits else forward_kwargs
    logits = model(input_ids=ids, position_ids=pos, attention_mask=mask, **kwargs).logits
    if logits.shape[1] != keep:
        logits = logits[:, -keep:]
    return logits if logits.dtype == torch.float32 else logits.float()


def generation_config_for_call(model, generation_config, kwargs: dict):
    """The ``GenerationConfig`` that ``model.generate(generation_config=..., **kwargs)`` would decode with."""
    config, _ = model._prepare_generation_config(generation_config, **kwargs)
    return config


def rollbackable_layer_types() -> tuple[type, type]:
    """(full-attention layer, sliding-window layer): the dynamic cache layers that can drop rejected entries."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    return DynamicLayer, DynamicSlidingWindowLayer


def cache_kwarg_name(model) -> str:
    """The forward's name for the KV cache: ``cache`` where supported, else ``past_key_values``."""
    return "cache" if "cache" in forward_parameters(model) else "past_key_values"


def cache_of(model_kwargs: dict):
    """The cache in ``generate``'s ``model_kwargs`` (under any of :data:`CACHE_KWARGS`), or None."""
    for name in CACHE_KWARGS:
        cache = model_kwargs.get(name)
        if cache is not None:
            return cache
    return None


def crop_cache(cache, n: int) -> None:
    """Drop the last ``n`` entries of every layer of ``cache`` that holds any (``cache.crop(-n)``).

    A lazily grown cache (a layer-skipping drafter's, or layers that share another layer's KV) has
    layers that were never written; transformers 5.24 skips them in ``crop``, 5.17 raises on them
    (``keys`` is None). Then only the initialised layers are cropped, one by one, as ``Cache.crop`` does.
    """
    if n <= 0:
        return
    layers = getattr(cache, "layers", None)
    if layers is None or all(getattr(layer, "is_initialized", True) for layer in layers):
        cache.crop(-n)
        return
    for layer in layers:
        if getattr(layer, "is_initialized", True):
            layer.crop(-n)


def decoder_only_output(sequences, scores, logits, cache):
    """``generate``'s ``return_dict_in_generate=True`` result for a decoder-only model."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    name = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits, **{name: cache})


def host_stopping(stopping_criteria) -> tuple[int | None, frozenset[int], list]:
    """Split ``generate``'s stopping criteria into what the host can check from token ids alone.

    Returns ``(max_length or None, eos ids, the other criteria)``. ``MaxLengthCriteria`` stops once the
    sequence holds ``max_length`` tokens; ``EosTokenCriteria`` once the last token is an EOS id: both
    are pure functions of the ids, so the decoder checks them with integers per emitted token and
    calls only the remaining criteria (user criteria, stop strings, ``max_time``) with tensors.
    Example: ``[MaxLengthCriteria(50), EosTokenCriteria([2, 7])]`` -> ``(50, {2, 7}, [])``.
    """
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    max_length, eos, others = None, set(), []
    for criterion in stopping_criteria or ():
        if type(criterion) is MaxLengthCriteria:
            max_length = criterion.max_length if max_length is None else min(max_length, criterion.max_length)
        elif type(criterion) is EosTokenCriteria:
            eos.update(int(t) for t in criterion.eos_token_id.reshape(-1).tolist())
        else:
            others.append(criterion)
    return max_length, frozenset(eos), others


def processors_as_function(processors):
    """``processors(input_ids, scores)`` as a plain function, for the call ``generate``'s loop makes.

    ``LogitsProcessorList.__call__`` inspects every processor's signature at every call (to pass extra
    keyword arguments to processors that take them); ``generate`` passes none, and the list then simply
    chains ``scores = processor(input_ids, scores)``. That inspection cost about 0.1 ms per verified row
    with two processors. Returns None for an empty or missing list.
    """
    chain = list(processors or ())
    if not chain:
        return None

    def apply(input_ids, scores):
        for processor in chain:
            scores = processor(input_ids, scores)
        return scores

    return apply


def token_bans(processors) -> tuple[tuple[np.ndarray, int, int], ...] | None:
    """The processors as *token bans*, when every one of them only sets some tokens' scores to -inf while the
    sequence length is in some range: ``((ids int64[m], lo, hi), ...)``, the ids banned while ``lo <= length <
    hi`` (``length``: tokens in the sequence the scores continue, as ``input_ids.shape[-1]``); () for no
    processors; None when some processor is another kind (its scores must then be computed).

    For greedy decoding the processed argmax of a row is then its first token, largest logit first (equal
    logits: lower id first, as ``argmax``), that is not banned at the row's length.
    Example: ``MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=5, min_new_tokens=3, eos_token_id=2)``
    -> ``((array([2]), 0, 8),)``: EOS is banned until the sequence holds 8 tokens.
    """
    from transformers.generation import logits_process as lp

    def ids(value) -> np.ndarray:
        return np.unique(torch.as_tensor(value).reshape(-1).cpu().numpy().astype(np.int64))

    rules = []
    for proc in processors or ():
        kind = type(proc)
        if kind is lp.MinLengthLogitsProcessor:
            rules.append((ids(proc.eos_token_id), 0, int(proc.min_length)))
        elif kind is lp.MinNewTokensLengthLogitsProcessor:
            rules.append((ids(proc.eos_token_id), 0, int(proc.prompt_length_to_skip) + int(proc.min_new_tokens)))
        elif kind is lp.SuppressTokensLogitsProcessor:
            rules.append((ids(proc.suppress_tokens), 0, 1 << 62))
        elif kind is lp.SuppressTokensAtBeginLogitsProcessor:
            rules.append((ids(proc.begin_suppress_tokens), int(proc.begin_index), int(proc.begin_index) + 1))
        else:
            return None
    return tuple(rules)


def pad_token_id(gen) -> int | None:
    """The id ``generate`` pads a finished row with (its prepared ``_pad_token_tensor``, else ``pad_token_id``)."""
    pad = getattr(gen, "_pad_token_tensor", None)
    pad = gen.pad_token_id if pad is None else pad
    return None if pad is None else int(torch.as_tensor(pad).reshape(-1)[0])


def compiles_on_all_devices(compile_config) -> bool:
    """Whether a ``CompileConfig`` asks ``generate`` to compile on every device (not only CUDA / XPU)."""
    return bool(getattr(compile_config, "_compile_all_devices", False))


def refill_sliding(layer, full) -> None:
    """Fill the empty sliding layer ``layer`` (a dynamic or a static one) from ``full``, a layer that stood in for it
    holding every token of the call in order, as transformers keeps them: the dynamic layer its last ``window - 1``
    entries, the static one (a ring) its last ``max_cache_len`` oldest first; both their count. (A widened padded
    row's layer holds its padding columns too, as plain ``generate``'s does.)"""
    total = int(full.get_seq_length()) if full.is_initialized and full.keys is not None else 0
    if not total:
        return
    keys, values = full.keys[:, :, :total], full.values[:, :, :total]
    if isinstance(layer, StaticLayer):
        layer.lazy_initialization(keys[:, :, :1], values[:, :, :1])
        kept = min(total, layer.max_cache_len)
        layer.keys[:, :, :kept] = keys[:, :, total - kept :]
        layer.values[:, :, :kept] = values[:, :, total - kept :]
        layer.cumulative_length_int = total
        layer.cumulative_length.fill_(total)
        return
    kept = min(total, layer.sliding_window - 1)
    layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys[:, :, total - kept :].clone(), values[:, :, total - kept :].clone()
    layer.cumulative_length = total


def adopt_ring(full, ring) -> None:
    """Fill the empty full-length layer ``full`` from the written static sliding layer ``ring`` (transformers' ring:
    its last ``max_cache_len`` tokens oldest first, ``cumulative_length_int`` of them in all): those tokens at their
    own columns, the earlier ones left zero (the window's mask hides them), and the same length."""
    total = int(ring.cumulative_length_int)
    kept = min(total, ring.max_cache_len)
    full.lazy_initialization(ring.keys[:, :, :1], ring.values[:, :, :1])
    full.keys[:, :, total - kept : total] = ring.keys[:, :, :kept]
    full.values[:, :, total - kept : total] = ring.values[:, :, :kept]
    full.cumulative_length.fill_(total)


def splits_head(model) -> bool:
    """Whether ``model``'s logits are its output layer applied to its decoder's last hidden state, nothing after
    (no logit soft-capping or scaling), so :func:`forward_with_hidden` gives its forward's very logits."""
    config = text_config(model)
    return (callable(getattr(model, "get_decoder", None)) and model.get_output_embeddings() is not None
            and not getattr(config, "final_logit_softcapping", None) and getattr(config, "logit_scale", None) is None)


def forward_with_hidden(model, ids, pos, mask, forward_kwargs: dict, keep: int):
    """(float logits [b, keep, V], hidden [b, keep, H]) of one forward of a model that :func:`splits_head`: its
    decoder, then its output layer over the last ``keep`` rows, as its own forward computes them."""
    kwargs = {k: v for k, v in forward_kwargs.items() if k != "logits_to_keep"}
    hidden = model.get_decoder()(input_ids=ids, position_ids=pos, attention_mask=mask, **kwargs).last_hidden_state
    hidden = hidden[:, -keep:]
    logits = model.get_output_embeddings()(hidden)
    return (logits if logits.dtype == torch.float32 else logits.float()), hidden


GROUPED_ATTENTION = "lookahead_grouped_sdpa"
"""The name under which :func:`grouped_attention` is registered in transformers' ``AttentionInterface`` (its public
plugin point, a registry entry no other model uses): only the modules of a ``lookahead.cpu`` shadow name it."""


def grouped_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                      **kwargs):
    """transformers' SDPA attention (5.25's ``sdpa_attention_forward``), with grouped keys and values handed to SDPA
    as they are (``enable_gqa``) where a mask is given, as ``TRANSFORMERS_SDPA_FORCE_GQA`` makes it do, instead of
    repeated per query head first: the same logits, without a copy of every layer's keys and values per step. Every
    other case is transformers' own function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if (attention_mask is None or groups <= 1 or query.shape[2] == 1 or kwargs.get("position_bias") is not None
            or kwargs.get("softcap") is not None or kwargs.get("output_attentions")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, is_causal=False,
                                                           enable_gqa=True)
    return out.reshape(out.shape[0], -1, query.shape[2], value.shape[-1]).transpose(1, 2).contiguous(), None


def grouped_config(config):
    """A copy of an attention module's ``config`` naming :data:`GROUPED_ATTENTION` (registered on first use) as its
    attention implementation (the private ``_attn_implementation_internal``)."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if GROUPED_ATTENTION not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(GROUPED_ATTENTION, grouped_attention)
    other = copy.copy(config)
    other.__dict__["_attn_implementation_internal"] = GROUPED_ATTENTION
    return other


def grouped_applies(model) -> bool:
    """Whether ``model``'s multi-row steps should run :func:`grouped_attention`: on a CPU (CUDA's SDPA has no kernel
    taking a mask and grouped keys), SDPA attention with fewer key/value heads than query heads, torch 2.5+."""
    if model.device.type != "cpu" or tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 5):
        return False
    text = text_config(model)
    heads, kv_heads = getattr(text, "num_attention_heads", None), getattr(text, "num_key_value_heads", None)
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or not 0 < kv_heads < heads:
        return False
    return getattr(text, "_attn_implementation", None) == "sdpa"
