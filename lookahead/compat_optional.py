"""The private transformers API of paths a default call does not take: the plain fallback, dict outputs,
``enable``'s routing, a compiled static cache, sliding-window and static layers, draft heads. ``compat`` loads it
on the first use of one of its names, so ``compat.NAME`` reaches these too; each docstring names what it relies on.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import StaticLayer


def plain_sample(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, streamer,
                 model_kwargs: dict):
    """transformers' own decoding loop for greedy and sampled search (``GenerationMixin._sample``): what plain
    ``generate`` runs, with the arguments ``generate`` prepared for the decoder."""
    return model._sample(input_ids, logits_processor=logits_processor, stopping_criteria=stopping_criteria,
                         generation_config=generation_config, synced_gpus=synced_gpus, streamer=streamer,
                         **model_kwargs)


def generation_config_for_call(model, generation_config, kwargs: dict):
    """The ``GenerationConfig`` that ``model.generate(generation_config=..., **kwargs)`` would decode with (the
    private ``_prepare_generation_config``)."""
    config, _ = model._prepare_generation_config(generation_config, **kwargs)
    return config


def decoder_only_output(sequences, scores, logits, cache):
    """``generate``'s ``return_dict_in_generate=True`` result for a decoder-only model (the cache field's name)."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    name = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits, **{name: cache})


def compiles_on_all_devices(compile_config) -> bool:
    """Whether a ``CompileConfig`` asks to compile on every device (the private ``_compile_all_devices``)."""
    return bool(getattr(compile_config, "_compile_all_devices", False))


def refill_sliding(layer, full) -> None:
    """Fill the empty sliding layer ``layer`` from ``full`` (every token of the call, in order) as transformers
    keeps it: a dynamic layer its last ``window - 1`` entries, a static ring its last ``max_cache_len`` oldest
    first; both the total count (``cumulative_length_int``)."""
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
    """Fill the empty layer ``full`` from the static sliding layer ``ring``: its tokens at their own columns, the
    earlier ones zero (the window's mask hides them), and the same length."""
    total = int(ring.cumulative_length_int)
    kept = min(total, ring.max_cache_len)
    full.lazy_initialization(ring.keys[:, :, :1], ring.values[:, :, :1])
    full.keys[:, :, total - kept : total] = ring.keys[:, :, :kept]
    full.values[:, :, total - kept : total] = ring.values[:, :, :kept]
    full.cumulative_length.fill_(total)


def forward_with_hidden(model, ids, pos, mask, forward_kwargs: dict, keep: int):
    """(float logits [b, keep, V], hidden [b, keep, H]) of one forward of a model that ``compat.splits_head``."""
    kwargs = {k: v for k, v in forward_kwargs.items() if k != "logits_to_keep"}
    hidden = model.get_decoder()(input_ids=ids, position_ids=pos, attention_mask=mask, **kwargs).last_hidden_state
    hidden = hidden[:, -keep:]
    logits = model.get_output_embeddings()(hidden)
    return (logits if logits.dtype == torch.float32 else logits.float()), hidden
