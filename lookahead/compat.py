"""Every place where lookahead relies on transformers beyond its documented public API: here, and for the paths a
default call does not take in :mod:`lookahead.compat_optional`, imported on the first use of one of its names (so
``compat.NAME`` reaches both).

A transformers upgrade that changes one breaks here, and ``tests/test_compat.py`` says which. Each function's
docstring names what it relies on.
"""

from __future__ import annotations

import copy
import functools
import inspect
import sys

import numpy as np
import torch

TESTED_TRANSFORMERS = ("5.17", "5.24", "5.25")  # str.startswith takes the tuple

# the model kwargs under which generate() hands over its cache, newest first
CACHE_KWARGS = ("cache", "past_key_values", "cache_params")


def arguments_of_calling_generate(custom_generate, names: tuple[str, ...], depth: int = 2) -> tuple:
    """The arguments ``names`` of the ``generate(custom_generate=custom_generate, ...)`` frame up the stack (None
    each outside one): what ``generate`` does not hand to a callable. ``depth``: 2 when called from ``__call__``."""
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
    """Whether ``model.forward`` was set to ``torch.compile(model.forward)`` (``_torchdynamo_orig_callable``)."""
    return getattr(model.forward, "_torchdynamo_orig_callable", None) is not None


def forward_parameters(model) -> frozenset[str]:
    """The names ``model.forward`` takes, cached per function (a forward replaced on the instance is read anew)."""
    forward = model.forward
    return _parameters(getattr(forward, "__func__", forward))


@functools.lru_cache(maxsize=64)
def _parameters(function) -> frozenset[str]:
    return frozenset(inspect.signature(function).parameters)


def supports_logits_to_keep(model) -> bool:
    """Whether ``model.forward`` takes ``logits_to_keep`` (the private ``_supports_logits_to_keep``)."""
    probe = getattr(model, "_supports_logits_to_keep", None)
    return bool(probe()) if probe is not None else "logits_to_keep" in forward_parameters(model)


def text_config(model):
    """The config of ``model``'s text decoder: its own, or a multimodal model's text part (``get_text_config``)."""
    get = getattr(model.config, "get_text_config", None)
    return get() if get is not None else model.config


def takes_tree_masks(model) -> bool:
    """Whether ``model``'s forward takes a draft tree's additive 4D mask; Bloom and ALiBi Falcon take only causal
    steps (no mask, or a 2D one)."""
    config = model.config
    model_type = getattr(config, "model_type", "")
    return not (model_type == "bloom" or (model_type == "falcon" and getattr(config, "alibi", False)))


def last_logits(model, ids, pos, mask, forward_kwargs: dict, keeps_logits: bool, keep: int):
    """One forward of ``model``: float logits [b, keep, V] of its last ``keep`` positions (``logits_to_keep``)."""
    kwargs = {**forward_kwargs, "logits_to_keep": keep} if keeps_logits else forward_kwargs
    logits = model(input_ids=ids, position_ids=pos, attention_mask=mask, **kwargs).logits
    if logits.shape[1] != keep:
        logits = logits[:, -keep:]
    return logits if logits.dtype == torch.float32 else logits.float()


def rollbackable_layer_types() -> tuple[type, type]:
    """(full-attention layer, sliding-window layer): the dynamic cache layers that can drop rejected entries. An
    exact list, since transformers also calls recurrent layers croppable."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    return DynamicLayer, DynamicSlidingWindowLayer


def cache_kwarg_name(model) -> str:
    """The forward's name for the KV cache: ``cache`` where supported, else ``past_key_values``."""
    return "cache" if "cache" in forward_parameters(model) else "past_key_values"


def cache_of(model_kwargs: dict):
    """The cache in ``generate``'s ``model_kwargs`` (under any of :data:`CACHE_KWARGS`), or None."""
    return next((model_kwargs[name] for name in CACHE_KWARGS if model_kwargs.get(name) is not None), None)


def crop_cache(cache, n: int) -> None:
    """``cache.crop(-n)``, skipping layers never written (``is_initialized``; a layer-skipping drafter's), which
    some versions reject."""
    if n <= 0:
        return
    layers = getattr(cache, "layers", None)
    if layers is None or all(getattr(layer, "is_initialized", True) for layer in layers):
        cache.crop(-n)
        return
    for layer in layers:
        if getattr(layer, "is_initialized", True):
            layer.crop(-n)


def host_stopping(stopping_criteria) -> tuple[int | None, frozenset[int], list]:
    """Split stopping criteria into what the host checks from ids: ``(max_length or None, eos ids, the others)``.
    Example: ``[MaxLengthCriteria(50), EosTokenCriteria([2, 7])]`` -> ``(50, {2, 7}, [])``."""
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
    """``processors(input_ids, scores)`` as a plain chain, skipping the list's per-call signature inspection
    (``generate`` passes no extra arguments); None for no processors."""
    chain = list(processors or ())
    if not chain:
        return None

    def apply(input_ids, scores):
        for processor in chain:
            scores = processor(input_ids, scores)
        return scores

    return apply


def token_bans(processors) -> tuple[tuple[np.ndarray, int, int], ...] | None:
    """The processors as *token bans* ``((ids int64[m], lo, hi), ...)``: ids at -inf while ``lo <= length < hi``
    (``length``: ``input_ids.shape[-1]``); () for none; None if some processor does anything else. A greedy row's
    processed argmax is then its largest-logit token not banned at its length. Example:
    ``MinNewTokensLengthLogitsProcessor(prompt_length_to_skip=5, min_new_tokens=3, eos_token_id=2)`` ->
    ``((array([2]), 0, 8),)``: EOS is banned until the sequence holds 8 tokens.
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
    """The id ``generate`` pads a finished row with (the private ``_pad_token_tensor``)."""
    pad = getattr(gen, "_pad_token_tensor", None)
    pad = gen.pad_token_id if pad is None else pad
    return None if pad is None else int(torch.as_tensor(pad).reshape(-1)[0])


def splits_head(model) -> bool:
    """Whether ``model``'s logits are its output layer over its decoder's last hidden state, with nothing after
    (no soft-capping or scaling), so ``forward_with_hidden`` gives the same logits."""
    config = text_config(model)
    return (callable(getattr(model, "get_decoder", None)) and model.get_output_embeddings() is not None
            and not getattr(config, "final_logit_softcapping", None) and getattr(config, "logit_scale", None) is None)


GROUPED_ATTENTION = "lookahead_grouped_sdpa"
""":func:`grouped_attention`'s name in ``AttentionInterface``; only a ``lookahead.cpu`` shadow's modules use it."""


def grouped_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None,
                      **kwargs):
    """transformers' ``sdpa_attention_forward``, but with a mask it hands grouped keys and values to SDPA as they are
    (``enable_gqa``), not repeated per query head: the same result without a copy per step."""
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
    """A copy of ``config`` whose attention implementation is :data:`GROUPED_ATTENTION` (registered on first use)."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if GROUPED_ATTENTION not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(GROUPED_ATTENTION, grouped_attention)
    other = copy.copy(config)
    other.__dict__["_attn_implementation_internal"] = GROUPED_ATTENTION
    return other


def grouped_applies(model) -> bool:
    """Whether ``model``'s multi-row steps should run :func:`grouped_attention`: CPU (CUDA's SDPA has no such
    kernel), SDPA, fewer key/value heads than query heads, torch 2.5+."""
    if model.device.type != "cpu" or tuple(int(x) for x in torch.__version__.split(".")[:2]) < (2, 5):
        return False
    text = text_config(model)
    heads, kv_heads = getattr(text, "num_attention_heads", None), getattr(text, "num_key_value_heads", None)
    if not isinstance(heads, int) or not isinstance(kv_heads, int) or not 0 < kv_heads < heads:
        return False
    return getattr(text, "_attn_implementation", None) == "sdpa"


def __getattr__(name: str):  # compat_optional's names, imported on the first use of one
    if not name.startswith("_"):
        from . import compat_optional

        value = getattr(compat_optional, name, None)
        if value is not None:
            globals()[name] = value
            return value
    raise AttributeError(f"module 'lookahead.compat' has no attribute {name!r}")
