"""A call's checks, before anything expensive: each refuses with a ``ValueError`` that says what to do instead. One
raised inside :func:`refusals` is a *refusal*, raised before the first decoding step, so ``enable``'s implicit default
can run plain ``generate`` instead."""

from __future__ import annotations

import contextlib

import torch

from . import compat
from .kv import PLAIN_LAYERS, CacheNotRollbackable, cache_layers


def sharded(model) -> bool:
    """Whether ``model`` is sharded over tensor-parallel ranks."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return False
    from .parallel import RankSync

    return RankSync.for_model(model).active


HANDLED_KWARGS = {"attention_mask", "position_ids", "use_cache", "logits_to_keep", *compat.CACHE_KWARGS}
MEDIA_KWARG = "mm_encoder_outputs"
MEDIA_TYPE_KWARGS = ("token_type_ids", "mm_token_type_ids")
STATIC_IMPLEMENTATIONS = ("static", "sliding_window", "hybrid", "hybrid_chunked")
REFUSAL = "lookahead_refusal"


@contextlib.contextmanager
def refusals():
    """Mark every ``ValueError`` raised inside as a refusal (:func:`is_refusal`) and re-raise it."""
    try:
        yield
    except ValueError as err:
        setattr(err, REFUSAL, True)
        raise


def is_refusal(err: BaseException) -> bool:
    return bool(getattr(err, REFUSAL, False))


def check_supported(model, batch: int, generation_config, synced_gpus: bool = False, decoder=None) -> None:
    """Refuse every setting a call of ``batch`` rows would not decode exactly as asked (inputs unseen: ``enable``
    asks this of a call it routes)."""
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("LookaheadDecoder supports decoder-only models; this is an encoder-decoder model. Use plain "
                         "generate() for it.")
    gen = generation_config
    if gen is not None:
        if gen.num_beams != 1:
            raise ValueError(f"LookaheadDecoder does not do beam search (num_beams={gen.num_beams}). Remove num_beams "
                             "or use plain generate().")
        if getattr(gen, "prompt_lookup_num_tokens", None):
            raise ValueError("LookaheadDecoder cannot be combined with prompt_lookup_num_tokens; pick one.")
        check_generation_mode(gen)
    if synced_gpus:
        raise ValueError("LookaheadDecoder does not support synced_gpus (DeepSpeed ZeRO-3 / FSDP).")
    if decoder is not None and decoder.draft is not None and sharded(model):
        raise ValueError("LookaheadDecoder's draft passes (draft=) do not run under tensor "
                         "parallelism (their forwards would be sharded and timed per rank); use the default "
                         "draft sources, which every rank computes alike.")
    impl = getattr(gen, "cache_implementation", None) if gen is not None else None
    if impl not in (None, "dynamic", *STATIC_IMPLEMENTATIONS):
        raise CacheNotRollbackable("LookaheadDecoder needs a dynamic or static KV cache it can roll back; "
                                   f"cache_implementation={impl!r} is neither. Remove cache_implementation (or use "
                                   "'static') or use plain generate().")
    if batch > 1:
        if impl in STATIC_IMPLEMENTATIONS:
            raise ValueError(f"LookaheadDecoder with a static cache (cache_implementation={impl!r}) decodes batch size "
                             "1; for a batch drop cache_implementation (the default dynamic cache), or call generate "
                             "once per prompt.")
        if gen is not None and gen.return_dict_in_generate and (gen.output_scores or gen.output_logits):
            raise ValueError("LookaheadDecoder with batch size > 1 does not return scores or logits (output_scores / "
                             "output_logits): plain generate's scores of a finished row come from forwards the "
                             "decoder never runs. Use batch size 1 or plain generate() for them.")
        for name in ("draft", "heads_given"):
            if decoder is not None and getattr(decoder, name) is not None:
                raise ValueError(f"LookaheadDecoder({name.split('_')[0]}=...) decodes batch size 1 only; call "
                                 "generate once per prompt, or use a decoder without it for batches.")


_OTHER_MODES = {
    "contrastive_search": ("contrastive search", "penalty_alpha and top_k > 1"),
    "dola_generation": ("DoLa decoding", "dola_layers"),
    "constrained_beam_search": ("constrained beam search", "force_words_ids or constraints"),
}


def check_generation_mode(gen) -> None:
    """Refuse a config whose ``get_generation_mode`` is neither greedy search nor sampling. Example:
    ``GenerationConfig(penalty_alpha=0.6, top_k=4)`` raises (contrastive search); with ``top_k=1`` (greedy) it
    passes."""
    mode = getattr(gen.get_generation_mode(), "value", None) if hasattr(gen, "get_generation_mode") else None
    if mode in _OTHER_MODES:
        what, flags = _OTHER_MODES[mode]
        raise ValueError(f"LookaheadDecoder decodes greedily or by sampling; this generation config asks for {what} "
                         f"({flags}). Drop those settings, or use plain generate() for {what}.")


def check_no_assistant(assistant_model) -> None:
    """Refuse ``generate(assistant_model=...)`` beside the decoder (``generate`` would silently drop it)."""
    if assistant_model is not None:
        raise ValueError("LookaheadDecoder cannot be combined with assistant_model= (assisted decoding); give the "
                         "draft model to the decoder instead, LookaheadDecoder(draft=model), or drop "
                         "custom_generate.")


def vocabulary_size(model) -> int:
    """Token ids the input embedding takes (else ``config.vocab_size``)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    return int(rows) if rows else int(model.config.vocab_size)


def check_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, vocab_size: int) -> None:
    """Refuse inputs plain ``generate`` would fail on late or decode into garbage.

    - ``input_ids`` long[b, L]: not empty; ids in ``[0, vocab_size)`` (else ``IndexError``, as the embedding's).
    - ``attention_mask`` long[b, L] or None: each row has a visible token and left padding only (``0 ... 0 1 ... 1``).
    Example: ``attention_mask=[[1, 1, 0]]`` raises "... padding on the right of row 0 ...".
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be 2D [batch, sequence]; got shape {tuple(input_ids.shape)}")
    if input_ids.shape[1] == 0 or input_ids.shape[0] == 0:
        raise ValueError(f"input_ids is empty (shape {tuple(input_ids.shape)}): give generate() at least one "
                         "prompt token per row (e.g. the tokenizer's BOS token)")
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        row, col = (input_ids == bad).nonzero()[0].tolist()
        raise IndexError(f"input_ids holds token id {bad} (row {row}, position {col}), outside the model's vocabulary "
                         f"of {vocab_size} ids (0 to {vocab_size - 1}): the ids come from another tokenizer")
    if attention_mask is None:
        return
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, input_ids {tuple(input_ids.shape)}:"
                         " they must match")
    visible = attention_mask.bool()
    empty = (~visible.any(1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"row {empty[0]} of attention_mask hides every token: nothing to decode from. Drop the row "
                         "or give it a visible token")
    after = visible.int().cummax(1).values.bool() & ~visible  # hidden after a shown token: not left padding
    bad = after.any(1).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"attention_mask has padding on the right of row {bad[0]} (or inside it): LookaheadDecoder "
                         "decodes after the last token of each row, so rows must be padded on the left. Set "
                         "tokenizer.padding_side = 'left' before tokenizing the batch")


def given(value) -> bool:
    """Whether a model input holds something: not None nor a dict of Nones (a text-only ``mm_encoder_outputs``)."""
    if isinstance(value, dict):
        return any(v is not None for v in value.values())
    return value is not None


def check_model_kwargs(model_kwargs: dict, gen) -> None:
    """Refuse model inputs and outputs the decoder would not handle as plain generate does."""
    wanted = sorted(k for k in ("output_attentions", "output_hidden_states")
                    if model_kwargs.get(k) or (gen.return_dict_in_generate and getattr(gen, k, False)))
    if wanted:
        raise ValueError(f"LookaheadDecoder does not return attentions or hidden states ({', '.join(wanted)}=True): "
                         "the draft rows of each forward would make them differ from plain generate's. Use plain "
                         "generate() for them.")
    media = given(model_kwargs.get(MEDIA_KWARG))
    unknown = {k for k, v in model_kwargs.items()
               if given(v) and k not in HANDLED_KWARGS and k != MEDIA_KWARG and not (media and k in MEDIA_TYPE_KWARGS)}
    if unknown:
        raise ValueError(f"LookaheadDecoder does not support these model inputs: {sorted(unknown)} (it decodes from "
                         "token ids, with images given as generate() encodes them). Use plain generate() for them.")


def media_of(model_kwargs: dict):
    """The encoded media features ``generate`` handed the call, or None."""
    media = model_kwargs.get(MEDIA_KWARG)
    return media if given(media) else None


def check_cache_layers(cache) -> int | None:
    """Refuse a cache whose layers cannot roll back exactly; the smallest sliding window of its layers, or None."""
    _, sliding = compat.rollbackable_layer_types()
    window = None
    for layer in cache_layers(cache):
        if type(layer) not in (*PLAIN_LAYERS, sliding):
            raise CacheNotRollbackable(f"the model's cache layer {type(layer).__name__} cannot roll back rejected "
                                       "draft tokens (static, quantized, offloaded or recurrent state). "
                                       "LookaheadDecoder cannot decode this model exactly; use plain generate() "
                                       "for it.")
        if isinstance(layer, sliding):
            window = layer.sliding_window if window is None else min(window, layer.sliding_window)
    return window


def check_store(memory, vocab_size: int) -> None:
    """Refuse a shared store (``store=``) built with another tokenizer."""
    if memory is not None and memory.max_token() >= vocab_size:
        raise ValueError(f"the shared trie holds token id {memory.max_token()}, outside this model's vocabulary of "
                         f"{vocab_size}: the store was built with another tokenizer. Use a store built with this "
                         "model's tokenizer (NgramTrie.load(path, vocab_size=..., tokenizer_id=...) checks it when "
                         "the store was saved with them).")


def with_stop_strings(stopping_criteria, stop_strings, tokenizer):
    """``stopping_criteria`` plus a ``StopStringCriteria`` for ``stop_strings``."""
    from transformers import StoppingCriteriaList, StopStringCriteria

    if tokenizer is None:
        raise ValueError("stop_strings need the model's tokenizer, and generate(..., tokenizer=tok) does not hand it "
                         "on to a custom_generate callable (transformers takes it out of the call before it reads the "
                         "callable's parameters). Give it to the decoder, LookaheadDecoder(tokenizer=tok), or call "
                         "lookahead.enable(model) and use generate(..., lookahead=True, tokenizer=tok), which passes "
                         "it on.")
    return StoppingCriteriaList([*(stopping_criteria or []), StopStringCriteria(tokenizer, stop_strings)])


