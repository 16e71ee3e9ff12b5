"""The cheaper forwards a draft pass runs (:class:`Drafter`): the target's own layers with some left out
(:class:`LayerStack`), new low-rank copies of them (:func:`low_rank_drafter`), or a separate causal LM
(:class:`ModelDrafter`). Nothing of the target is modified."""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from transformers import DynamicCache

from ..compat import cache_kwarg_name, crop_cache, supports_logits_to_keep

# forward: embed -> rotary -> layers -> norm -> head, as LayerStack runs it (Gemma scales its embeddings: refused)
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "phi3", "smollm3")

# what calibrate compares: the fraction of layers kept (layer skip) or run (early exit), or of each matrix's rank
CANDIDATE_SIZES = {"layer-skip": (0.75, 0.625, 0.5), "early-exit": (0.75, 0.625, 0.5, 0.375),
                   "low-rank": (0.5, 0.25, 0.125)}


def check_llama_family(model) -> None:
    """Raise ValueError unless ``model`` has the layout a :class:`LayerStack` runs."""
    base = getattr(model, "model", None)
    kind = getattr(getattr(model, "config", None), "model_type", None)
    missing = [n for n in ("embed_tokens", "rotary_emb", "layers", "norm") if not hasattr(base, n)]
    missing += [] if hasattr(model, "lm_head") else ["lm_head"]
    if kind not in LLAMA_FAMILY or missing:
        raise ValueError(
            f"draft='layer-skip', 'early-exit' and 'low-rank' need a Llama-family model (model_type in "
            f"{LLAMA_FAMILY}, with model.model.embed_tokens/rotary_emb/layers/norm and model.lm_head); got "
            f"model_type={kind!r}" + (f", missing {missing}" if missing else "")
            + ". Drop draft=, or pass a draft model with the target's tokenizer (draft=model).")


def check_draft_model(draft_model, target=None) -> None:
    """Raise ValueError unless ``draft_model`` is a decoder-only causal LM with ``target``'s vocabulary."""
    config = getattr(draft_model, "config", None)
    if not isinstance(draft_model, nn.Module) or not hasattr(config, "vocab_size"):
        raise ValueError(f"a draft model must be a Hugging Face causal LM (an nn.Module with a config); got "
                         f"{type(draft_model).__name__}")
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError("a draft model must be a decoder-only causal LM; this one is an encoder-decoder model")
    if target is None:
        return
    if config.vocab_size != target.config.vocab_size:
        raise ValueError(f"the draft model has a vocabulary of {config.vocab_size} tokens, the target model "
                         f"{target.config.vocab_size}: a draft model must use the target's tokenizer.")
    for key in ("bos_token_id", "eos_token_id"):
        a, b = getattr(config, key, None), getattr(target.config, key, None)
        if a is not None and b is not None and a != b:
            raise ValueError(f"the draft model's {key}={a} differs from the target's {b}: not the same tokenizer.")


def causal_mask(past: int, q: int, dtype: torch.dtype, device) -> torch.Tensor | None:
    """Additive mask [1, 1, q, past + q] (0 where visible) for ``q`` new tokens after ``past`` cached ones; None
    for one token. Example: past 1, q 2 -> rows ``[0, 0, min]``, ``[0, 0, 0]``."""
    if q == 1:
        return None
    return torch.full((q, past + q), torch.finfo(dtype).min, dtype=dtype, device=device).triu(past + 1)[None, None]


class Drafter:
    """``forward(ids long[1, q], past, cache, all_rows=False)``: logits float[V] of the last of ``ids`` after ``past``
    cached tokens (float[q, V] with ``all_rows``); ``ratio``: one forward's time over the target's, once measured."""

    ratio: float | None = None
    modules: list

    def new_cache(self) -> DynamicCache:
        return DynamicCache()  # plain layers: a sliding-window layer could not be cropped past its window

    def linear_params(self) -> int:  # weights read per token: a CPU forward's cost
        return sum(p.numel() for m in self.modules if isinstance(m, (nn.Linear, LowRankLinear)) for p in m.parameters())


class LayerStack(Drafter):
    """A forward through a Llama-family model's embedding, rotary table, the given decoder ``layers`` (the target's
    own, or new ones), final norm and ``head``. Not an ``nn.Module``: no ``.to()`` on it can reach the target. Each
    layer keeps its ``layer_idx``: a left-out layer's cache slot stays empty."""

    def __init__(self, model, layers: Sequence[nn.Module], head: nn.Module | None = None):
        check_llama_family(model)
        base = model.model
        self.embed, self.rotary, self.norm = base.embed_tokens, base.rotary_emb, base.norm
        self.head = model.lm_head if head is None else head
        self.layers = list(layers)
        self.modules = [m for layer in self.layers for m in layer.modules()] + list(self.head.modules())
        self.device = self.embed.weight.device
        self.cache_kwarg = cache_kwarg_name(type(self.layers[0])) if self.layers else "past_key_values"

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, past: int, cache, all_rows: bool = False) -> torch.Tensor:
        q = ids.shape[1]
        pos = torch.arange(past, past + q, device=ids.device)[None]
        h = self.embed(ids)
        emb = self.rotary(h, position_ids=pos)
        mask = causal_mask(past, q, h.dtype, h.device)
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_ids=pos, position_embeddings=emb, use_cache=True,
                      **{self.cache_kwarg: cache})
            h = h[0] if isinstance(h, tuple) else h
        logits = self.head(self.norm(h if all_rows else h[:, -1:]))[0].float()
        return logits if all_rows else logits[-1]


class LowRankLinear(nn.Module):
    """``y = (x @ Vh.T) @ US.T + bias`` (``US`` float[out, r], ``Vh`` float[r, in])."""

    def __init__(self, us: torch.Tensor, vh: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.us = nn.Parameter(us, requires_grad=False)
        self.vh = nn.Parameter(vh, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(nn.functional.linear(x, self.vh), self.us, self.bias)


def _rank(fraction: float, weight: torch.Tensor) -> int:
    return max(1, int(round(fraction * min(weight.shape))))


def low_rank_drafter(model, fraction: float, factors: dict | None = None) -> LayerStack:
    """NEW decoder layers (copies sharing the target's norm weights) and head whose ``nn.Linear`` layers are
    rank-``fraction * min(out, in)`` SVD factors. ``factors``: :func:`low_rank_factors` of at least that rank."""
    check_llama_family(model)
    factors = low_rank_factors(model, fraction) if factors is None else factors

    def low_rank(name: str, mod: nn.Linear) -> LowRankLinear:
        us, vh = factors[name]
        r = _rank(fraction, mod.weight)
        return LowRankLinear(us[:, :r].clone(), vh[:r].clone(), mod.bias)

    layers = []
    for i, layer in enumerate(model.model.layers):
        new = copy.deepcopy(layer, {id(t): t for t in (*layer.parameters(), *layer.buffers())})  # modules only
        for name, mod in list(new.named_modules()):
            if isinstance(mod, nn.Linear):
                new.set_submodule(name, low_rank(f"model.layers.{i}.{name}", mod))
        layers.append(new)
    return LayerStack(model, layers, head=low_rank("lm_head", model.lm_head))


def low_rank_factors(model, fraction: float) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{name: (US float[out, r], Vh float[r, in])}: the truncated SVD (in float64) of each linear layer of the
    decoder layers and head, r ``fraction`` of its smaller side."""
    factors = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and (name.startswith("model.layers.") or mod is model.lm_head):
            u, s, vh = torch.linalg.svd(mod.weight.detach().double(), full_matrices=False)
            r = _rank(fraction, mod.weight)
            factors[name] = ((u[:, :r] * s[:r]).to(mod.weight.dtype), vh[:r].to(mod.weight.dtype))
    return factors


class ModelDrafter(Drafter):
    """A separate causal LM as drafter, through its own forward and cache."""

    def __init__(self, model):
        self.model, self.modules = model, list(model.modules())
        self.cache_kwarg = cache_kwarg_name(model)
        self.keeps_logits = supports_logits_to_keep(model)
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, past: int, cache, all_rows: bool = False) -> torch.Tensor:
        ids = ids.to(self.device)
        pos = torch.arange(past, past + ids.shape[1], device=self.device)[None]
        kwargs = {} if all_rows or not self.keeps_logits else {"logits_to_keep": 1}
        logits = self.model(input_ids=ids, position_ids=pos, use_cache=True, **{self.cache_kwarg: cache},
                            **kwargs).logits[0].float()
        return logits if all_rows else logits[-1]


def truncated_copy(model, layers: int):
    """A separate causal LM of ``model``'s first ``layers`` decoder layers, embedding, final norm and head: new
    modules and config sharing the target's weights (what early exit at ``layers`` computes)."""
    check_llama_family(model)
    new = copy.deepcopy(model, {id(t): t for t in (*model.parameters(), *model.buffers())})
    new.model.layers = nn.ModuleList(list(new.model.layers)[:layers])
    new.config.num_hidden_layers = layers
    if getattr(new.config, "layer_types", None) is not None:
        new.config.layer_types = list(new.config.layer_types)[:layers]
    return new


def modelled_speed(accept: float, cost: float, max_depth: int = 8) -> float:
    """Best tokens per target-forward time of a chain under a flat verification cost, at least 1:
    ``max_d (1 + a + ... + a^d) / (1 + d * c)``. Example: a 0.8, c 0.5 -> d = 2: 2.44 / 2 = 1.22."""
    d = np.arange(1, max_depth + 1)
    return float(max(1.0, np.max((1 + np.cumsum(accept ** d)) / (1 + cost * d))))


def layer_importance(hidden_states: Sequence[torch.Tensor]) -> np.ndarray:
    """float[layers]: ``1 - cos(input, output)`` of each decoder layer averaged over positions (ShortGPT's block
    influence) from ``output_hidden_states`` (the last one normed: the last layer scores 1)."""
    cos = [float(nn.functional.cosine_similarity(a[0].double(), b[0].double(), dim=-1).mean())
           for a, b in zip(hidden_states[:-2], hidden_states[1:-1])]
    return np.array([1 - c for c in cos] + [1.0])


def skip_set(importance: np.ndarray, keep_fraction: float) -> tuple[int, ...]:
    """Layers kept: the first and the last, then the most important, ``keep_fraction`` of all.
    Example: importance ``[.9, .1, .5, .2, 1]``, keep 0.6 -> 3 layers: ``(0, 2, 4)``."""
    n = len(importance)
    k = min(n, max(2, int(round(keep_fraction * n))))
    order = [i for i in np.argsort(-importance, kind="stable") if i not in (0, n - 1)]
    return tuple(sorted(int(i) for i in {0, n - 1, *order[: k - 2]}))


def build(model, kind: str, size: float, importance: np.ndarray | None = None,
          factors: dict | None = None) -> tuple[LayerStack, tuple[int, ...]]:
    """``kind``'s drafter at ``size`` and the layers it runs (``importance`` None: the middle layers go first)."""
    layers = model.model.layers
    n = len(layers)
    if kind == "early-exit":
        run = tuple(range(max(1, min(n, int(round(size * n))))))
    elif kind == "layer-skip":
        run = skip_set(np.ones(n) if importance is None else importance, size)
    elif kind == "low-rank":
        return low_rank_drafter(model, size, factors), tuple(range(n))
    else:
        raise ValueError(f"unknown draft pass {kind!r}; valid: {tuple(CANDIDATE_SIZES)}")
    return LayerStack(model, [layers[i] for i in run]), run


@torch.no_grad()
def calibrate(model, kind: str, ids: torch.Tensor, sizes: Sequence[float] | None = None) -> tuple[dict, LayerStack]:
    """({"size", "layers", "agreement", "weights", "candidates"}, drafter) of ``kind``'s size with the best
    :func:`modelled_speed` of its argmax agreement with the target's on ``ids`` long[1, q] and its weights' share."""
    check_llama_family(model)
    sizes = CANDIDATE_SIZES[kind] if sizes is None else tuple(sizes)
    out = model(input_ids=ids, output_hidden_states=kind == "layer-skip", use_cache=False)
    target = out.logits[0].argmax(-1)
    importance = layer_importance(out.hidden_states) if kind == "layer-skip" else None
    factors = low_rank_factors(model, max(sizes)) if kind == "low-rank" else None
    full = LayerStack(model, list(model.model.layers)).linear_params()
    rows, best = [], None
    for size in sizes:
        drafter, layers = build(model, kind, size, importance, factors)
        logits = drafter.forward(ids, 0, drafter.new_cache(), all_rows=True)
        a = float((logits.argmax(-1) == target.to(logits.device)).double().mean())
        c = drafter.linear_params() / full
        rows.append((size, a, c))
        if best is None or modelled_speed(a, c) > modelled_speed(best[0]["agreement"], best[0]["weights"]):
            best = ({"size": size, "layers": layers, "agreement": a, "weights": c}, drafter)
    return {**best[0], "candidates": tuple(rows)}, best[1]


def measure_cost_ratio(target, drafter, context: int = 32, repeats: int = 3) -> float:
    """One draft forward's time over one target forward's (one new token after ``context``), best of ``repeats``."""
    ids = torch.randint(0, target.config.vocab_size, (1, context + 1), generator=torch.Generator().manual_seed(0))
    ids = ids.to(next(target.parameters()).device)

    def seconds(forward: Drafter) -> float:
        cache, times = forward.new_cache(), []
        forward.forward(ids[:, :context], 0, cache)
        for _ in range(repeats):
            t = time.perf_counter()
            forward.forward(ids[:, context:], context, cache)
            times.append(time.perf_counter() - t)
            crop_cache(cache, 1)
        return min(times)

    return seconds(drafter) / seconds(ModelDrafter(target))
