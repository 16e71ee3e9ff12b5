"""The call layer: what every decode loop shares, from validating a ``generate`` call to one step's pieces.

A decode loop (``decoder.SingleCall`` for one row, ``batch.BatchCall`` for several) is a thin loop over:

1. **checks** before anything expensive, each raising a ``ValueError`` that says what to do instead:
   :func:`check_supported` (the generation settings), :func:`check_inputs` (the token ids and the
   attention mask), :func:`check_model_kwargs`, :func:`check_cache_layers`, :func:`check_store`;
2. **set-up** once per call (:func:`prepare`): the stopping split, the cache and how the forward takes it, the
   KV window, the device flags and the cost curve, in one :class:`CallSetup`;
3. **the step's pieces**, each written once with a batched form (a single row is a batch of one):
   :func:`forward`, :func:`read_rows` (every row's argmax and the top-k the model-prediction source learns
   from, in one pass), :func:`greedy_verdicts` (one Numba pass over every row's tree) or
   :func:`processed_verdict` (processors or sampling, row by row: there the math differs), :func:`first_stops`
   (the stopping criteria on the emitted tokens), ``kv_cache.keep_rows_entries`` (one gather per cache layer
   for every row's kept entries).

Terms (pending tokens, draft tree, step) are defined in ``config.py``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
from transformers.cache_utils import StaticLayer

from . import compat
from . import kernels as K
from .cost import CostModel
from .distributed import RankSync
from .draft import Draft
from .kv_cache import PLAIN_LAYERS, CacheNotRollbackable, cache_layers, grow_in_place, new_cache
from .sliding import SlidingWindow
from .verify import PositionUniforms, Verdict, verify

HANDLED_KWARGS = {"attention_mask", "position_ids", "use_cache", "logits_to_keep", *compat.CACHE_KWARGS}
"""The model kwargs that ``generate`` prepares and that the decode loops handle themselves."""

# -- checks ---------------------------------------------------------------------------------------------------


STATIC_IMPLEMENTATIONS = ("static", "sliding_window", "hybrid", "hybrid_chunked")
"""The ``cache_implementation`` values for which ``generate`` makes a ``StaticCache`` the decoder rolls back: "static",
and the older names transformers still takes for it (a static cache whose layer types it infers); the offloaded ones
are refused."""


REFUSAL = "lookahead_refusal"
"""The attribute (True) of an error the decoder raised in its checks and set-up, before its first decoding step:
``lookahead.enable``'s implicit default then runs plain ``generate`` instead (:func:`is_refusal`)."""


@contextlib.contextmanager
def refusals():
    """Mark every ``ValueError`` raised inside as a refusal (:data:`REFUSAL`), and let it go on."""
    try:
        yield
    except ValueError as err:
        setattr(err, REFUSAL, True)
        raise


def is_refusal(err: BaseException) -> bool:
    """Whether ``err`` is a refusal of the decoder's (:func:`refusals`), raised before its first decoding step."""
    return bool(getattr(err, REFUSAL, False))


def check_supported(model, batch: int, generation_config, synced_gpus: bool = False, decoder=None) -> None:
    """Refuse, with a clear message, every setting the decoder would not decode exactly as asked, for a call
    of ``batch`` rows (before any input is looked at: ``lookahead.enable`` asks this of a call it routes)."""
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(
            "LookaheadDecoder supports decoder-only models; this is an encoder-decoder model. "
            "Use plain generate() for it."
        )
    gen = generation_config
    if gen is not None:
        if gen.num_beams != 1:
            raise ValueError(
                f"LookaheadDecoder does not do beam search (num_beams={gen.num_beams}). "
                "Remove num_beams or use plain generate()."
            )
        if getattr(gen, "prompt_lookup_num_tokens", None):
            raise ValueError("LookaheadDecoder cannot be combined with prompt_lookup_num_tokens; pick one.")
        check_generation_mode(gen)
    if synced_gpus:
        raise ValueError("LookaheadDecoder does not support synced_gpus (DeepSpeed ZeRO-3 / FSDP).")
    if decoder is not None and (decoder.draft_model is not None or decoder.config.self_draft != "none") \
            and RankSync.for_model(model).active:
        raise ValueError("LookaheadDecoder's draft passes (draft_model=, self_draft=) do not run under tensor "
                         "parallelism (their forwards would be sharded and timed per rank); use the default "
                         "draft sources, which every rank computes alike.")
    impl = getattr(gen, "cache_implementation", None) if gen is not None else None
    if impl not in (None, "dynamic", *STATIC_IMPLEMENTATIONS):
        raise CacheNotRollbackable(
            f"LookaheadDecoder needs a dynamic or static KV cache it can roll back; cache_implementation={impl!r} "
            "is neither. Remove cache_implementation (or use 'static') or use plain generate()."
        )
    if batch > 1 and impl in STATIC_IMPLEMENTATIONS:
        raise ValueError(f"LookaheadDecoder with a static cache (cache_implementation={impl!r}) decodes batch size 1; "
                         "for a batch drop cache_implementation (the default dynamic cache), or call generate once "
                         "per prompt.")
    if batch > 1:
        if gen is not None and gen.return_dict_in_generate and (gen.output_scores or gen.output_logits):
            raise ValueError(
                "LookaheadDecoder with batch size > 1 does not return scores or logits (output_scores / "
                "output_logits): plain generate's scores of a finished row come from forwards the decoder never "
                "runs. Use batch size 1 or plain generate() for them."
            )
        if decoder is not None and decoder.draft_model is not None:
            raise ValueError("LookaheadDecoder(draft_model=...) decodes batch size 1 only; call generate once per "
                             "prompt.")
        if decoder is not None and decoder.policy.wants_hidden:
            raise ValueError("LookaheadDecoder(heads=...) decodes batch size 1 only; call generate once per prompt, "
                             "or use a decoder without heads for batches.")


_OTHER_MODES = {
    "contrastive_search": ("contrastive search", "penalty_alpha and top_k > 1"),
    "dola_generation": ("DoLa decoding", "dola_layers"),
    "constrained_beam_search": ("constrained beam search", "force_words_ids or constraints"),
}
"""Generation modes (``GenerationMode`` values) other than greedy search and sampling that :func:`check_supported`
has not refused by then (beam searches by ``num_beams``, assisted decoding by ``prompt_lookup_num_tokens``): what
each is, and the flags of a generation config that ask for it."""


def check_generation_mode(gen) -> None:
    """Refuse a generation config whose flags ask ``generate`` for another decoding method than greedy search or
    multinomial sampling (``GenerationConfig.get_generation_mode``): the decoder would otherwise decode greedily
    or by sampling and drop them without a word.

    Example: ``GenerationConfig(penalty_alpha=0.6, top_k=4)`` raises "... contrastive search (penalty_alpha and
    top_k > 1) ..."; ``GenerationConfig(penalty_alpha=0.6, top_k=1)``, which plain ``generate`` decodes greedily,
    passes."""
    mode = getattr(gen.get_generation_mode(), "value", None) if hasattr(gen, "get_generation_mode") else None
    if mode in _OTHER_MODES:
        what, flags = _OTHER_MODES[mode]
        raise ValueError(f"LookaheadDecoder decodes greedily or by sampling; this generation config asks for {what} "
                         f"({flags}). Drop those settings, or use plain generate() for {what}.")


def check_no_assistant(assistant_model) -> None:
    """Refuse an ``assistant_model=`` passed to ``generate`` beside the decoder: ``generate`` does not hand it to a
    callable ``custom_generate``, so it would be dropped without a word."""
    if assistant_model is not None:
        raise ValueError("LookaheadDecoder cannot be combined with assistant_model= (assisted decoding); give the "
                         "draft model to the decoder instead, LookaheadDecoder(draft_model=...), or drop "
                         "custom_generate.")


def vocabulary_size(model) -> int:
    """The number of token ids the model's input embedding takes (``config.vocab_size`` without one)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    return int(rows) if rows else int(model.config.vocab_size)


def check_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, vocab_size: int) -> None:
    """Refuse inputs plain ``generate`` would fail on late or decode into garbage, before anything expensive.

    - ``input_ids`` long[b, L]: not empty; every id in ``[0, vocab_size)`` (the bad id and the size named;
      plain ``generate`` raises ``IndexError`` from the embedding, and so does this).
    - ``attention_mask`` long[b, L] or None: 2D; every row has a visible token and its padding on the left
      only (``0 ... 0 1 ... 1``): a right-padded row decodes after its padding, which is not what was asked.

    Example: ``attention_mask=[[1, 1, 0]]`` raises "... padding on the right of row 0 ... padding_side = 'left'".
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
    if attention_mask.dim() != 2:
        raise ValueError("attention_mask must be 2D [batch, sequence]")
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)}, input_ids {tuple(input_ids.shape)}:"
                         " they must match")
    visible = attention_mask.bool()
    empty = (~visible.any(1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"row {empty[0]} of attention_mask hides every token: nothing to decode from. Drop the row "
                         "or give it a visible token")
    # left padding only: once a row shows a token, it shows every later one
    after = visible.int().cummax(1).values.bool() & ~visible
    bad = after.any(1).nonzero().flatten().tolist()
    if bad:
        raise ValueError(f"attention_mask has padding on the right of row {bad[0]} (or inside it): LookaheadDecoder "
                         "decodes after the last token of each row, so rows must be padded on the left. Set "
                         "tokenizer.padding_side = 'left' before tokenizing the batch")


def _given(value) -> bool:
    """Whether a model input holds something: not None, nor a mapping of nothing (``generate`` hands a multimodal
    model's text-only call ``mm_encoder_outputs={}``)."""
    if isinstance(value, dict):
        return any(v is not None for v in value.values())
    return value is not None


def check_model_kwargs(model_kwargs: dict, gen) -> None:
    """Refuse model inputs and outputs the decoder would not handle exactly as plain generate does."""
    wanted = sorted(k for k in ("output_attentions", "output_hidden_states")
                    if model_kwargs.get(k) or (gen.return_dict_in_generate and getattr(gen, k, False)))
    if wanted:
        raise ValueError(
            f"LookaheadDecoder does not return attentions or hidden states ({', '.join(wanted)}=True): "
            "the draft rows of each forward would make them differ from plain generate's. Use plain "
            "generate() for them."
        )
    media = _given(model_kwargs.get(MEDIA_KWARG))
    unknown = {k for k, v in model_kwargs.items()
               if _given(v) and k not in HANDLED_KWARGS and k != MEDIA_KWARG and not (media and k in MEDIA_TYPE_KWARGS)}
    if unknown:
        raise ValueError(
            f"LookaheadDecoder does not support these model inputs: {sorted(unknown)} (it decodes from token ids, with "
            "images given as generate() encodes them). Use plain generate() for them."
        )


MEDIA_KWARG = "mm_encoder_outputs"
"""The model input under which ``generate`` hands a multimodal model its images' (videos', audio's) encoded features,
``{modality: features}``: a model reads them in its prompt's forward only (its later steps are text)."""


MEDIA_TYPE_KWARGS = ("token_type_ids", "mm_token_type_ids")
"""Beside images, the per-token types a vision-language model's processor gives. Where they mark the image placeholders
alone (0: text; Gemma 3's attention among an image's tokens reads them), only the prompt's forward reads them, and
its later, text-only steps do not (:func:`check_media` checks that they do so)."""


def media_token_ids(config) -> set[int]:
    """The ids of the placeholder tokens a multimodal model's config names for its media (``image_token_id``,
    ``video_token_index``, ...): the prompt positions whose embeddings its encoded features replace."""
    names = [f"{kind}_token_{suffix}" for kind in ("image", "video", "audio") for suffix in ("id", "index")]
    return {int(v) for v in (getattr(config, n, None) for n in names) if isinstance(v, int)}


def media_of(model_kwargs: dict):
    """The encoded media features ``generate`` handed the call (``model_kwargs[MEDIA_KWARG]``), or None."""
    media = model_kwargs.get(MEDIA_KWARG)
    return media if _given(media) else None


def check_media(model, input_ids: torch.Tensor, model_kwargs: dict, cache, static: bool, windowed: bool) -> None:
    """Before any forward: refuse a call with media features (:func:`media_of`) the decoder would not decode as plain
    ``generate`` does, with the reason.

    Refused:

    - a static cache with other layers than full-attention ``StaticLayer``s (a sliding one's prompt forward would need
      the decoder's own masks, ``static.py``);
    - a cache that holds tokens already (the features belong to the prompt's first forward);
    - positions in sections that differ (multimodal RoPE; Qwen2-VL's ``position_ids`` [sections, b, L] are taken when
      every section holds the same positions, as ``generate`` gives them, since the decoder's steps give one position
      per token);
    - one row (:func:`prefill_media`): a padded row with sliding layers past their window (``windowed``), a prompt
      whose last token is a media placeholder, and token types (:data:`MEDIA_TYPE_KWARGS`) that mark other tokens
      than the placeholders;
    - a batch: token types."""
    mask = model_kwargs.get("attention_mask")
    positions = model_kwargs.get("position_ids")
    placeholders = media_token_ids(model.config)
    types = [k for k in MEDIA_TYPE_KWARGS if _given(model_kwargs.get(k))]
    why = None
    if static and any(type(layer) is not StaticLayer for layer in cache_layers(cache)):
        why = ("decodes images on a static cache of full-attention layers only (a sliding layer's prompt forward would "
               "need the decoder's own masks); drop cache_implementation='static'")
    elif cache.get_seq_length():
        why = "decodes images from an empty cache (their features belong to the prompt's first forward)"
    elif positions is not None and positions.dim() != 2 and not bool((positions == positions[:1]).all()):
        why = (f"takes one position per token; this call's positions have {positions.shape[0]} sections that differ "
               "(multimodal RoPE)")
    elif input_ids.shape[0] > 1:
        if types:
            why = (f"decodes a batch with images without {types[0]} (its 4D masks would override the attention they "
                   "ask for); call generate once per prompt")
    elif windowed and mask is not None and not bool((mask == 1).all()):
        why = ("decodes one padded row with images only where no sliding window is shorter than the call (its sliding "
               "layers' prompt columns would have to be widened after the prompt's forward); drop the padding")
    elif input_ids.shape[1] < 2 or int(input_ids[0, -1]) in placeholders:
        why = "needs a prompt that ends in a text token after its images (a chat template's assistant turn does)"
    else:
        is_media = torch.isin(input_ids[0], torch.tensor(sorted(placeholders), dtype=input_ids.dtype,
                                                         device=input_ids.device))
        typed = [k for k in types if not torch.equal(model_kwargs[k][0] != 0, is_media)]
        if typed:
            why = (f"reads {typed[0]} only where they mark the image placeholders (Gemma 3's); these mark other "
                   "tokens (a prefix-LM's types, PaliGemma's, which its text steps would also need)")
    if why is not None:
        raise ValueError(f"LookaheadDecoder {why}. Use plain generate() for this call.")


def prefill_media(model, input_ids: torch.Tensor, model_kwargs: dict, cache, cache_kwarg: str, stats) -> None:
    """One row with media features (checked by :func:`check_media`): run the prompt's forward for every prompt token
    but the last, into ``cache``, with the features, as plain ``generate``'s first forward runs it. The decode loop
    then continues that cache from the last prompt token on, as it continues any cache that holds a prefix of
    ``input_ids``, with text-only forwards, as plain ``generate``'s later steps are (a static cache's too). Token
    types go to this forward too. (A batch passes the features to its prompt's step instead: ``batch.BatchCall``.)

    Example: LLaVA's ``[bos, <image> x 576, "Describe", "it", ":"]`` runs ``[bos, <image> x 576, "Describe", "it"]``
    with the image's features here; the decoder's first step forwards ``":"`` and its drafts."""
    mask = model_kwargs.get("attention_mask")
    positions = model_kwargs.get("position_ids")
    model(input_ids=input_ids[:, :-1], attention_mask=None if mask is None else mask[:, :-1],
          position_ids=None if positions is None else positions[..., :-1], use_cache=True,
          **{k: model_kwargs[k][:, :-1] for k in MEDIA_TYPE_KWARGS if _given(model_kwargs.get(k))},
          **{cache_kwarg: cache, MEDIA_KWARG: model_kwargs[MEDIA_KWARG]})
    stats.target_calls += 1


def check_cache_layers(cache) -> int | None:
    """Before any forward: refuse a cache whose layers the decoder cannot roll back exactly. Returns the smallest
    sliding window of its layers, or None (a call may reach past it: :mod:`lookahead.sliding`)."""
    _, sliding = compat.rollbackable_layer_types()
    window = None
    for layer in cache_layers(cache):
        if type(layer) not in (*PLAIN_LAYERS, sliding):
            raise CacheNotRollbackable(
                f"the model's cache layer {type(layer).__name__} cannot roll back rejected draft tokens "
                "(static, quantized, offloaded or recurrent state). LookaheadDecoder cannot decode this model "
                "exactly; use plain generate() for it."
            )
        if isinstance(layer, sliding):
            window = layer.sliding_window if window is None else min(window, layer.sliding_window)
    return window


def check_store(memory, vocab_size: int) -> None:
    """Refuse a shared n-gram store (``LookaheadDecoder(trie=...)``) built with another tokenizer."""
    if memory is not None and memory.max_token() >= vocab_size:
        raise ValueError(
            f"the shared trie holds token id {memory.max_token()}, outside this model's vocabulary of {vocab_size}: "
            "the store was built with another tokenizer. Use a store built with this model's tokenizer "
            "(NgramTrie.load(path, vocab_size=..., tokenizer_id=...) checks it when the store was saved with them)."
        )


def with_stop_strings(stopping_criteria, stop_strings, tokenizer):
    """``stopping_criteria`` plus transformers' ``StopStringCriteria`` for ``stop_strings`` (checked token
    by token like every criterion)."""
    from transformers import StoppingCriteriaList, StopStringCriteria

    if tokenizer is None:
        raise ValueError(
            "stop_strings need the model's tokenizer, and generate(..., tokenizer=tok) does not hand it on to a "
            "custom_generate callable (transformers takes it out of the call before it reads the callable's "
            "parameters). Give it to the decoder, LookaheadDecoder(tokenizer=tok), or call lookahead.enable(model) "
            "and use generate(..., lookahead=True, tokenizer=tok), which passes it on."
        )
    return StoppingCriteriaList([*(stopping_criteria or []), StopStringCriteria(tokenizer, stop_strings)])


# -- set-up -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenBans:
    """``compat.token_bans``'s rules packed for ``kernels.apply_bans``: rule ``r`` bans
    ``ids[offsets[r]:offsets[r + 1]]`` while ``lo[r] <= length < hi[r]``; ``width``: the top-k that always
    holds an allowed token (every banned id, plus one)."""

    ids: np.ndarray
    offsets: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    width: int

    @classmethod
    def of(cls, rules) -> TokenBans | None:
        """From ``((ids, lo, hi), ...)``; None for no rules."""
        if not rules:
            return None
        ids = np.concatenate([r[0] for r in rules]).astype(np.int64)
        offsets = np.cumsum([0] + [len(r[0]) for r in rules]).astype(np.int64)
        return cls(ids, offsets, np.array([r[1] for r in rules], np.int64), np.array([r[2] for r in rules], np.int64),
                   len(np.unique(ids)) + 1)

    def apply(self, argmax: np.ndarray, tops, counts: np.ndarray, lengths: np.ndarray) -> bool:
        """Every verified row's argmax -> its processed argmax, in place (``kernels.apply_bans``); False when some
        row needs its scores processed instead."""
        return K.apply_bans(argmax, tops[0], tops[1], counts, lengths, self.ids, self.offsets, self.lo, self.hi)


@dataclass
class CallSetup:
    """What one ``generate`` call decodes with, the same for every loop (built by :func:`prepare`).

    - ``max_length``: sequence length at which every row stops (``generate``'s ``max_length`` criterion);
      ``eos``: EOS ids checked on the host; ``other_stops``: the remaining stopping criteria (called with
      tensors); ``pads``: whether some criterion is an EOS one (then plain ``generate`` pads a stopped row).
    - ``cache``: the call's cache (the one ``generate`` made or the caller passed, its plain layers growing in
      place); ``forward_kwargs``: what every forward passes besides ids, positions and mask; ``kv_window``: the
      smallest sliding window of its layers, which every forward stays below, or None; ``sliding``: how one row
      decodes past that window (:class:`~lookahead.sliding.SlidingWindow`), or None.
    - ``processors``: per row, the logits processors as one function, or None; ``sampling``; ``bans``: the
      processors as token bans (:class:`TokenBans`), when they are all of that kind; ``argmax_verdicts``: greedy,
      no scores kept, and no processors or only token bans: a verdict needs only every row's (processed)
      argmax, which the host reads in one pass.
    - ``cost``: the cost curve the budget prices with, or None (``adaptive=False``).
    - ``runner``: what runs a step's forward (the model, or its compiled call on a static cache), None: the model.
    - ``chains``: the model takes no 4D mask (:func:`compat.takes_tree_masks`): every step's draft is one chain,
      verified causally.
    - ``masked_gqa``: a step of several rows runs with grouped-query attention in SDPA's kernel
      (:func:`compat.masked_gqa_applies`), not with its keys and values repeated per query head first.
    - ``sync``: the ranks of a tensor-parallel model (``distributed.RankSync``; inactive on one process): every
      rank prices with rank 0's curve and samples with rank 0's seeds, and every forward's inputs are checked
      to be the same on every rank before the forward runs.
    """

    model: object
    gen: object
    max_length: int
    eos: frozenset
    eos_ids: np.ndarray
    other_stops: list
    pads: bool
    cache: object
    cache_kwarg: str
    keeps_logits: bool
    forward_kwargs: dict
    kv_window: int | None
    sliding: SlidingWindow | None
    device: torch.device
    on_cpu: bool
    argmax_by_max: bool
    dtype: torch.dtype
    processors: list
    sampling: bool
    keep_scores: bool
    keep_raw: bool
    return_dict: bool
    argmax_verdicts: bool
    bans: TokenBans | None = None
    cost: CostModel | None = None
    sync: RankSync | None = None
    runner: object = None
    chains: bool = False
    masked_gqa: bool = False


def prepare(decoder, model, input_ids: torch.Tensor, logits_processor, stopping_criteria, generation_config,
            model_kwargs: dict, row_processors=None, static: bool = False) -> CallSetup:
    """Check the call and set it up (the cost curve last: it may time forwards on first use).

    ``row_processors(processors, r, b)``: row ``r``'s processors of ``b`` (batches slice per-row state);
    None: the call's own list for its one row. A batch (``b`` > 1) starts from an empty cache; one row may
    continue a cache that holds a prefix of ``input_ids``. ``static``: the cache is a static one
    (``static.py`` checks its layers and prices its steps itself: no cost curve here)."""
    gen = generation_config if generation_config is not None else model.generation_config
    b = input_ids.shape[0]
    check_model_kwargs(model_kwargs, gen)
    vocab = vocabulary_size(model)
    check_inputs(input_ids, model_kwargs.get("attention_mask"), vocab)
    check_store(decoder.memory, vocab)
    stop_length, eos, other_stops = compat.host_stopping(stopping_criteria)
    max_length = stop_length if stop_length is not None else gen.max_length
    cache = compat.cache_of(model_kwargs)
    cache = new_cache(model) if cache is None else grow_in_place(cache)
    mask = model_kwargs.get("attention_mask")
    one_row = b == 1 and not static and (mask is None or bool((mask == 1).all()))  # no padding column to hide
    window = None if static else check_cache_layers(cache)
    sliding = SlidingWindow.of(model, cache) if window is not None and gen.max_length > window else None
    chains = not compat.takes_tree_masks(model)
    if chains and not one_row:
        raise ValueError(
            f"this {model.config.model_type} model builds its attention from a 2D mask (ALiBi), so it cannot take a "
            "draft tree's 4D mask: LookaheadDecoder decodes it one unpadded row at a time on a dynamic cache, one "
            "chain of drafts per step. Use plain generate() for a batch, a padded row or a static cache."
        )
    kv_window = None if sliding is not None else window  # past it, every step's entries are kept until the verdict
    if media_of(model_kwargs) is not None:  # images: one row's prompt forward here, then a continued cache
        check_media(model, input_ids, model_kwargs, cache, static, sliding is not None)
        if b == 1:
            prefill_media(model, input_ids, model_kwargs, cache, compat.cache_kwarg_name(model), decoder.stats)
    past = int(cache.get_seq_length())
    if sliding is not None and not one_row:  # a batch's or a padded row's sliding layers will keep every column
        sliding.check_widenable(cache)
    if b > 1 and past:
        raise ValueError(f"LookaheadDecoder with batch size > 1 starts from an empty cache; this one holds {past} "
                         "tokens. Pass no cache, or use plain generate().")
    if past >= input_ids.shape[1]:
        raise ValueError(f"the cache already holds {past} tokens but input_ids has {input_ids.shape[1]}: nothing is "
                         "left to decode from (input_ids must be the whole sequence, the cached prefix included)")
    cache_kwarg = compat.cache_kwarg_name(model)
    device = input_ids.device
    on_cpu = device.type == "cpu"
    if row_processors is None:
        processors = [compat.processors_as_function(logits_processor)]
    else:
        processors = [compat.processors_as_function(row_processors(logits_processor, r, b)) for r in range(b)]
    sampling = bool(gen.do_sample)
    keep_scores = bool(gen.return_dict_in_generate and gen.output_scores)
    keep_raw = bool(gen.return_dict_in_generate and gen.output_logits)
    rules = compat.token_bans(logits_processor)
    greedy_argmax = not sampling and not (keep_scores or keep_raw)
    setup = CallSetup(
        model=model, gen=gen, max_length=max_length, eos=eos, eos_ids=np.array(sorted(eos), dtype=np.int64),
        other_stops=other_stops, pads=any(hasattr(c, "eos_token_id") for c in stopping_criteria or ()),
        cache=cache, cache_kwarg=cache_kwarg, keeps_logits=compat.supports_logits_to_keep(model),
        forward_kwargs={"use_cache": True, cache_kwarg: cache}, kv_window=kv_window, sliding=sliding, device=device,
        on_cpu=on_cpu,
        # on a CPU ``max`` finds the argmax 2.5x faster than ``argmax`` from a vocabulary of 4096 up (its indices are
        # argmax's, first maximal value first); slower below 1024
        argmax_by_max=on_cpu and getattr(model.config, "vocab_size", 0) >= 1024, dtype=model.dtype,
        processors=processors, sampling=sampling, keep_scores=keep_scores, keep_raw=keep_raw,
        return_dict=bool(gen.return_dict_in_generate), chains=chains,
        argmax_verdicts=greedy_argmax and (all(p is None for p in processors) or rules is not None),
        bans=TokenBans.of(rules) if greedy_argmax and rules else None,
        masked_gqa=not static and compat.masked_gqa_applies(model))
    setup.sync = RankSync.for_model(model)
    if decoder.config.adaptive and not static:
        t = decoder.clock()
        setup.cost = decoder.cost_curve(model, window, setup.sync)
        decoder.stats.time_calibration = decoder.clock() - t
        decoder.stats.cost_curve = setup.cost.points
        decoder.stats.cost_steps, decoder.stats.cost_provisional = setup.cost.steps, setup.cost.provisional
    return setup


def uniforms(setup: CallSetup, rows: int) -> list[PositionUniforms | None]:
    """Per row, the sampling uniforms of its emitted positions (None when greedy), seeded from torch's default
    generator (``torch.manual_seed`` makes a run repeatable), rank 0's seeds on every rank of a
    tensor-parallel model."""
    if not setup.sampling:
        return [None] * rows
    return [PositionUniforms(seed) for seed in setup.sync.seeds(rows)]


def prompt_positions(attention_mask, length: int, max_length: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(positions int64[length] of one row's prompt tokens, col_visible) from a 2D ``attention_mask`` or None.

    ``col_visible``: host bool[max(max_length, length) + 1], False at the prompt's padding and True
    for every later token; None when nothing is padding. Example: mask ``[[0, 1, 1]]`` -> positions
    ``[0, 0, 1]``, col_visible ``[F, T, T, T, ...]``.
    """
    if attention_mask is None or bool((attention_mask == 1).all()):
        return np.arange(length), None
    visible = attention_mask[0].bool().cpu().numpy()
    col_visible = np.ones(max(max_length, length) + 1, dtype=bool)
    col_visible[:length] = visible
    return np.maximum(np.cumsum(visible) - 1, 0), col_visible


# -- one step's pieces ------------------------------------------------------------------------------------------


def forward(setup: CallSetup, stats, ids, pos, mask, keep: int, cache=None,
            extra: dict | None = None) -> torch.Tensor:
    """One forward of the target model (into ``cache`` when given, else the call's; with the model inputs ``extra``
    besides, a batch's media features at its prompt's step); the float logits [b, keep, V] of its last ``keep`` query
    rows."""
    kwargs = setup.forward_kwargs if cache is None else {**setup.forward_kwargs, setup.cache_kwarg: cache}
    if extra:
        kwargs = {**kwargs, **extra}
    if setup.sync.active:  # the same forward on every rank, or a clear error before its collectives break
        setup.sync.check(stats.target_calls, ids=ids, positions=pos, keep=keep,
                         mask=_mask_shapes(mask),
                         cached=(cache if cache is not None else setup.cache).get_seq_length())
    stats.target_calls += 1
    runner = setup.model if setup.runner is None or cache is not None else setup.runner
    gqa = setup.masked_gqa and ids.shape[1] > 1  # a one-row step stays plain generate's
    with compat.FORCED_GQA if gqa else contextlib.nullcontext():
        logits = compat.last_logits(runner, ids, pos, mask, kwargs, setup.keeps_logits, keep)
    # layers spread over devices (device_map): the logits come out on the last one; read them where the ids
    # are, as plain generate does
    return logits if logits.device == setup.device else logits.to(setup.device)


def _mask_shapes(mask) -> tuple | dict | None:
    """A step's mask as its shape (per layer type for a dict of masks, ``sliding.py``): what the ranks compare."""
    if mask is None:
        return None
    if isinstance(mask, dict):
        return {kind: tuple(m.shape) for kind, m in sorted(mask.items())}
    return tuple(mask.shape)


def finish(setup: CallSetup, stats) -> None:
    """The end of a decode loop: on a tensor-parallel model, a rank that stopped before the others (a stopping
    criterion reading the clock, ``max_time``) is reported instead of left waiting in a collective."""
    if setup.sync is not None and setup.sync.active:
        setup.sync.finish(stats.target_calls)


def shared_seconds(setup: CallSetup, seconds: float) -> float:
    """A time measured on this rank, as rank 0 measured it (on one process: itself), for decisions every rank
    makes alike."""
    if setup.sync is None or not setup.sync.active:
        return seconds
    return setup.sync.broadcast(float(seconds))


def top_width(setup: CallSetup, k: int) -> int:
    """The top-k a step reads from every verified row: the model-prediction source's ``k``, and with token bans
    enough for one allowed token."""
    return max(k, setup.bans.width) if setup.bans is not None else k


def read_rows(setup: CallSetup, logits: torch.Tensor, argmax_rows: np.ndarray | None, top_rows: np.ndarray, k: int):
    """The host readout of a step's logits [b, q, V]: (argmax int64[b, q] of each row's first ``argmax_rows[i]``
    query rows, or None when ``argmax_rows`` is None; when ``k`` > 0, (ids int64[b, q, k], logits
    float32[b, q, k]), the top-k of each row's first ``top_rows[i]`` query rows (entries past the counts unset),
    else None).

    On a CPU both come from one pass over each query row (``kernels.rows_top``; its argmax is exactly
    ``torch.argmax``'s); an argmax alone over all rows from ``max`` where that is faster. On a GPU, ``argmax`` and
    ``topk`` run there and the top-k's host copy is queued before the argmax's (non-blocking), so both arrive
    in one synchronisation."""
    b, q, v = logits.shape
    if not k:
        if argmax_rows is None:
            return None, None
        am = logits.max(-1).indices if setup.argmax_by_max else logits.argmax(-1)
        return am.cpu().numpy(), None
    if setup.on_cpu:
        arr = (logits.detach() if logits.requires_grad else logits).numpy()  # [b, q, V] float32, a view: read only
        argmax = np.empty((b, q), np.int64)
        ids, vals = np.empty((b, q, k), np.int64), np.empty((b, q, k), np.float32)
        counts = top_rows if argmax_rows is None else argmax_rows
        K.rows_top(arr, counts, top_rows, k, argmax, ids, vals)
        return (argmax if argmax_rows is not None else None), (ids, vals)
    rows = int(top_rows.max()) if len(top_rows) else 0
    t = logits[:, :max(rows, 1)].topk(min(k, v), -1)
    # non-blocking only when the argmax's blocking copy below waits for it: else no sync would follow
    queue = setup.device.type == "cuda" and argmax_rows is not None
    tops = (t.indices.to("cpu", non_blocking=queue).numpy(), t.values.to("cpu", non_blocking=queue).numpy())
    return (logits.argmax(-1).cpu().numpy() if argmax_rows is not None else None), tops


_NO_BANS = np.zeros(0, np.int64)


def greedy_row(setup: CallSetup, logits: torch.Tensor, draft: Draft, rows: int, length: int, k: int):
    """One row's greedy verdict on a CPU and its rows' readout, in one kernel call (``kernels.greedy_row``: what
    :func:`read_rows`, :meth:`TokenBans.apply` and :func:`greedy_verdicts` do, without their separate calls):
    ``logits`` float[q, V] (the root's row, the draft's nodes', then ``rows - 1 - len(draft)`` window rows),
    ``length`` the sequence's length before the step, ``k`` > 0 the top-k read from the root's and nodes' rows.
    Returns (verdict, or None when the token bans need the scores processed; argmax int64[1, q] of the first
    ``rows`` rows (banned ids ruled out on the verified ones); (ids int64[1, q, k], logits float32[1, q, k])).
    """
    q = logits.shape[0]
    arr = (logits.detach() if logits.requires_grad else logits).numpy()[None]  # [1, q, V] float32, read only
    argmax = np.empty((1, q), np.int64)
    ids, vals = np.empty((1, q, k), np.int64), np.empty((1, q, k), np.float32)
    bans = setup.bans
    rules = (_NO_BANS,) * 4 if bans is None else (bans.ids, bans.offsets, bans.lo, bans.hi)
    decided, nodes, tokens = K.greedy_row(arr, rows, k, draft.tokens, draft.parents, draft.depth, length, *rules,
                                          argmax, ids, vals)
    verdict = Verdict(nodes.tolist(), tokens.tolist()) if decided else None
    return verdict, argmax, (ids, vals)


def tree_arrays(drafts: list[Draft]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens int64[b, w], parents int64[b, w], counts int64[b]) of every row's tree, padded to the widest."""
    counts = np.array([len(d) for d in drafts], dtype=np.int64)
    w = max(int(counts.max()) if len(counts) else 0, 1)
    tokens, parents = np.zeros((len(drafts), w), np.int64), np.full((len(drafts), w), -2, np.int64)
    for i, d in enumerate(drafts):
        tokens[i, : len(d)] = d.tokens
        parents[i, : len(d)] = d.parents
    return tokens, parents, counts


def greedy_verdicts(argmax: np.ndarray, drafts: list[Draft]) -> list[Verdict]:
    """The greedy verdict of every row's tree from its rows' argmax (int64[b, q]: row ``i``'s root, then its
    nodes), in one Numba pass (``kernels.greedy_walks``)."""
    if len(drafts) == 1:
        d = drafts[0]
        if not len(d):
            return [Verdict([], [int(argmax[0, 0])])]
        nodes, tokens = K.greedy_walk(argmax[0], d.tokens, d.parents)
        return [Verdict(nodes.tolist(), tokens.tolist())]
    tokens, parents, counts = tree_arrays(drafts)
    nodes, accepted, emitted = K.greedy_walks(argmax, tokens, parents, counts)
    return [Verdict(nodes[i, :a].tolist(), emitted[i, : a + 1].tolist()) for i, a in enumerate(accepted.tolist())]


def processed_verdict(setup: CallSetup, logits: torch.Tensor, draft: Draft, prefix: torch.Tensor, processors,
                      uniforms: list[float] | None) -> Verdict:
    """One row's verdict when its logits must be processed first (logits processors, sampling, kept scores):
    ``logits`` float[1 + n (+ more), V] of its root and nodes, ``prefix`` long[1, L] its context."""
    n = len(draft)
    return verify(logits[: n + 1], draft.tokens.tolist(), draft.parents.tolist(), prefix, processors,
                  do_sample=setup.sampling, keep_scores=setup.keep_scores, keep_raw=setup.keep_raw, uniforms=uniforms)


def first_stops(setup: CallSetup, tokens: list[list[int]], starts: np.ndarray, limits: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Where each row's emitted ``tokens`` stop on the host-checkable criteria (``max_length`` as the row's
    ``limits``, EOS ids), in one Numba pass: (index int64[b], -1 for none; by_limit bool[b]); see
    ``kernels.first_stops``. The other criteria are :func:`other_stop`'s."""
    if len(tokens) == 1:  # one row of a few tokens: a Python loop beats the kernel's call
        i, by_limit = first_stop(setup, tokens[0], int(starts[0]), int(limits[0]))
        return np.array([i]), np.array([by_limit])
    sizes = [len(t) for t in tokens]
    offsets = np.zeros(len(tokens) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    flat = np.fromiter((x for t in tokens for x in t), np.int64, int(offsets[-1]))
    return K.first_stops(flat, offsets, starts.astype(np.int64, copy=False), limits.astype(np.int64, copy=False),
                         setup.eos_ids)


def first_stop(setup: CallSetup, tokens: list[int], start: int, limit: int) -> tuple[int, bool]:
    """:func:`first_stops` of one row (``tokens`` emitted after ``start`` tokens, ``limit`` its max length), as
    Python numbers: (index, -1 for none; by the limit). Example: tokens ``[5, 2, 7]``, EOS 2 -> (1, False)."""
    eos = setup.eos
    for i, t in enumerate(tokens):
        if start + i + 1 >= limit:
            return i, True
        if t in eos:
            return i, False
    return -1, False


def other_stop(setup: CallSetup, ids: torch.Tensor, scores) -> bool:
    """Whether one of the criteria that need tensors (user criteria, stop strings, ``max_time``) holds for
    ``ids`` long[1, L] (``scores``: the last position's processed scores, or None)."""
    return any(bool(criterion(ids, scores).all()) for criterion in setup.other_stops)


def step_timer(model, cache_factory, cache_kwarg: str, keeps_logits: bool, top_k: int, clock,
               context: int = 128, max_rows: int = 64, masks: bool = True):
    """``time_one(k) -> seconds``: the end-to-end time of one decoding step with ``k`` query rows after a
    ``context``-token prefix (the calibration prices drafts with it, ``cost.calibrate_curve``): for ``k`` > 1 the
    step's 4D mask written into its buffer (``tree.StepMask``), the forward with it (a mask loses the causal fast
    path), the top-``top_k`` and argmax read of every row (``read_rows``) and the KV keep of an accepted node
    (one gather); for ``k`` = 1 a plain step: the model's own causal mask and the argmax. The draft sources' own
    host work is not in it (tens of microseconds). Every timed step's entries are cropped off again.

    Example: on a CPU in fp32, SmolLM2's ``time_one(16)`` is about 1.2x its bare 16-token forward's time at
    4 threads (the mask and the row reads), on a GPU a few hundred microseconds more than the forward.

    One 2-row step runs untimed before ``time_one`` is returned: a process's first multi-row step pays one-time
    costs (SmolLM2 on a 2-core CPU: 395 ms against 70 ms for the next, in bf16; 444 against 145 in fp32; larger
    sizes after it pay none). Timed, that first step made the two fastest timings of 2 rows disagree, which costs
    every calibration one more round of every size, and at 6x a one-row step it cost the first round a stop test
    (``cost.STOP_RATIO``).

    ``masks=False`` (a model that takes no 4D mask, :func:`compat.takes_tree_masks`): every step causal, as its
    steps are.
    """
    from .kv_cache import keep_entries
    from .tree import StepMask

    device, dtype = model.device, model.dtype
    limit = getattr(model.config, "max_position_embeddings", None) or 4096
    context = max(1, min(context, limit - max_rows - 1))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocabulary_size(model), (1, context + max_rows), generator=gen).to(device)
    cache = cache_factory()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    on_cpu = device.type == "cpu"
    reader = CallSetup.__new__(CallSetup)  # what read_rows reads of a call's set-up
    reader.on_cpu, reader.device = on_cpu, device
    reader.argmax_by_max = on_cpu and getattr(model.config, "vocab_size", 0) >= 1024
    mask = StepMask(max_rows + 1, context + max_rows + 2, dtype, device)
    gqa = compat.masked_gqa_applies(model)  # as a call's steps of several rows run (CallSetup.masked_gqa)
    with torch.no_grad():
        model(input_ids=ids[:, :context], use_cache=True, **{cache_kwarg: cache})

    def time_one(k: int) -> float:
        pos = torch.arange(context, context + k, device=device)[None]
        kwargs = {cache_kwarg: cache, "use_cache": True, **({"logits_to_keep": k} if keeps_logits else {})}
        with torch.no_grad():
            sync()
            t = clock()
            m = None if k == 1 or not masks else mask(context, 1, np.arange(-1, k - 2))  # a chain of k - 1 nodes
            with compat.FORCED_GQA if gqa and k > 1 else contextlib.nullcontext():
                logits = model(input_ids=ids[:, context : context + k], position_ids=pos, attention_mask=m,
                               **kwargs).logits[:, -k:].float()
            rows = np.array([k])
            read_rows(reader, logits, rows, rows, top_k if k > 1 else 0)
            if k > 1:
                keep_entries(cache, k, [0, k - 1])  # the pending token and an accepted node: a gather
            sync()
            elapsed = clock() - t
            compat.crop_cache(cache, 2 if k > 1 else 1)
        return elapsed

    if max_rows >= 2:  # untimed: a process's first multi-row step pays one-time costs (below)
        time_one(2)
    return time_one
