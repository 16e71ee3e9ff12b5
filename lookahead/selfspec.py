"""Draft passes: a cheaper forward proposes a chain, the full target verifies it in its one forward per step.

Four ways to get the cheaper forward, each a *drafter* (``forward(ids, positions, cache) -> logits``):

- :func:`layer_skip_drafter` (origin ``"layer-skip"``): the target's own modules with some decoder layers skipped.
- :func:`early_exit_drafter` (``"early-exit"``): the target's layers ``[:L]``, then its final norm and head.
- :func:`low_rank_drafter` (``"low-rank"``): a NEW module tree whose large ``nn.Linear`` weights are rank-r
  truncated-SVD factors of the target's (computed once per model and kept in a ``WeakKeyDictionary``); the
  embedding, norms and rotary tables are the target's own.
- :class:`ModelDrafter` (``"draft-model"``): a user's draft model with the target's vocabulary
  (``LookaheadDecoder(draft_model=small_model)``).

The first three hold *references* to a Llama-family target's modules (``model.model.{embed_tokens, rotary_emb,
layers, norm}`` and ``model.lm_head``) in a small :class:`LayerStack`; nothing of the target is modified or
patched, and the target's own forward (which verifies every step) is untouched: every method is exact because
verification is. A :class:`DraftPassSource` runs a drafter autoregressively from its own KV cache (greedy: a
chain, plus the runner-up tokens at each depth as leaves), and crops that cache to the accepted prefix when it
learns the emitted tokens.

Pricing: a draft pass is not free. Each step the source picks its depth ``d`` to maximise modelled tokens per
second ``(1 + a + ... + a^d) / (t(1 + d) + d * c * t(1))`` (``a``: its measured acceptance per token, ``c``:
one draft forward's cost as a fraction of one target forward, ``t``: the call's cost curve), against a plain
step (``1 / t(1)``, by the budget's margin); ``d = 0`` drafts nothing (a depth-2 probe now and then keeps
``a`` measured). Worked example: a = 0.8, c = 0.5 and a flat curve: d = 1 gives 1.8 / 1.5 = 1.2 tokens per
t(1), d = 2 gives 2.44 / 2 = 1.22, d = 4 gives 3.36 / 3 = 1.12: two tokens deep. With c = 0.1, d = 8 gives
4.33 / 1.8 = 2.4.

Early exit and verification: the target's forward is HF's public one over all layers, so verification does
NOT reuse the draft pass's layers ``[:L]`` (the draft's keys/values for those layers equal the target's for the
same tokens only up to floating point; reusing them would need a forward entry point starting at layer L,
which transformers does not offer publicly). Stated, not done.

Sampling: drafts are greedy (deterministic given the context), so the decoder's multi-candidate rule is exact
for them (and, as ``tests/test_selfspec.py`` checks against speculative sampling's rule, for any draft chosen
independently of the verification's uniforms).
"""

from __future__ import annotations

import copy
import inspect
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .compat import crop_cache
from .config import SELF_DRAFTS
from .draft import DRAFT_MODEL, EARLY_EXIT, LAYER_SKIP, LOW_RANK
from .source import DraftSource, Proposal

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "phi3", "smollm3")
"""Model types whose decoder forward is embed -> rotary -> layers -> norm -> head, as :class:`LayerStack` runs it
(Gemma has the same module names but scales the embeddings inside its forward: refused)."""

CANDIDATE_SIZES = {"layer-skip": (0.75, 0.625, 0.5), "early-exit": (0.75, 0.625, 0.5, 0.375),
                   "low-rank": (0.5, 0.25, 0.125)}
"""Sizes the prompt calibration compares when ``self_draft_size`` is 0: fraction of layers kept (layer skip),
run (early exit), or rank as a fraction of each matrix's smaller side (low rank)."""


# ----------------------------------------------------------------------------------------------- drafters


def check_llama_family(model) -> None:
    """Raise ValueError unless ``model`` has the Llama-family layout a :class:`LayerStack` can run."""
    base = getattr(model, "model", None)
    kind = getattr(getattr(model, "config", None), "model_type", None)
    missing = [n for n in ("embed_tokens", "rotary_emb", "layers", "norm") if not hasattr(base, n)]
    if not hasattr(model, "lm_head"):
        missing.append("lm_head")
    if kind not in LLAMA_FAMILY or missing:
        raise ValueError(
            f"self-drafting (layer skip, early exit, low rank) needs a Llama-family model "
            f"(model_type in {LLAMA_FAMILY}, with model.model.embed_tokens/rotary_emb/layers/norm and model.lm_head); "
            f"got model_type={kind!r}" + (f", missing {missing}" if missing else "")
            + ". Use self_draft='none', or a separate draft_model=."
        )


def causal_mask(past: int, q: int, dtype: torch.dtype, device) -> torch.Tensor | None:
    """Additive mask [1, 1, q, past + q] (0 where visible) for ``q`` new tokens after ``past`` cached ones;
    None for one token (it sees everything). Example: past 1, q 2 -> rows ``[0, 0, min]``, ``[0, 0, 0]``."""
    if q == 1:
        return None
    cols = torch.arange(past + q, device=device)
    rows = past + torch.arange(q, device=device)
    visible = cols[None, :] <= rows[:, None]  # [q, past + q]
    return torch.zeros((), dtype=dtype, device=device).masked_fill(~visible, torch.finfo(dtype).min)[None, None]


class LayerStack:
    """A draft forward through (references to) a Llama-family model's parts: embedding, rotary table, the
    given decoder ``layers`` (the target's own, or new ones), final norm and head. Not an ``nn.Module``: it
    owns nothing (``.to()`` or ``.train()`` on it could not move or switch the target by accident).

    Each layer keeps its own ``layer_idx``, so in a lazily grown ``DynamicCache`` a skipped layer's slot stays
    empty; the stack counts the cached tokens itself."""

    def __init__(self, model, layers: Sequence[nn.Module], head: nn.Module | None = None):
        check_llama_family(model)
        base = model.model
        self.embed, self.rotary, self.norm = base.embed_tokens, base.rotary_emb, base.norm
        self.head = model.lm_head if head is None else head
        self.layers = list(layers)
        self.dtype = model.dtype
        self.vocab_size = model.config.vocab_size
        params = inspect.signature(type(self.layers[0]).forward).parameters if self.layers else {}
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache()  # lazily grown: one layer per layer_idx used

    @torch.no_grad()
    def hidden(self, ids: torch.Tensor, past: int, cache) -> torch.Tensor:
        """Final hidden states [1, q, H] (before the norm) of ``ids`` long[1, q] after ``past`` cached tokens."""
        q = ids.shape[1]
        pos = torch.arange(past, past + q, device=ids.device)[None]  # [1, q]
        h = self.embed(ids)
        emb = self.rotary(h, position_ids=pos)
        mask = causal_mask(past, q, h.dtype, h.device)
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_ids=pos, position_embeddings=emb, use_cache=True,
                      **{self.cache_kwarg: cache})
            h = h[0] if isinstance(h, tuple) else h
        return h

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, past: int, cache, all_rows: bool = False) -> torch.Tensor:
        """Logits float[V] of the last of ``ids`` long[1, q] (float[q, V] with ``all_rows``)."""
        h = self.hidden(ids, past, cache)
        h = h if all_rows else h[:, -1:]
        logits = self.head(self.norm(h))[0].float()  # [q or 1, V]
        return logits if all_rows else logits[-1]

    def linear_params(self) -> int:
        """Weights read per token by the stack's linear layers (and the head): what a CPU forward costs."""
        mods = [m for layer in self.layers for m in layer.modules()] + list(self.head.modules())
        return sum(p.numel() for m in mods if isinstance(m, (nn.Linear, LowRankLinear)) for p in m.parameters())


def layer_skip_drafter(model, keep: Sequence[int]) -> LayerStack:
    """The target with only decoder layers ``keep`` (sorted indices) run."""
    layers = model.model.layers
    return LayerStack(model, [layers[i] for i in sorted(keep)])


def early_exit_drafter(model, exit_layer: int) -> LayerStack:
    """The target's layers ``[:exit_layer]``, then its final norm and head."""
    return LayerStack(model, list(model.model.layers[:exit_layer]))


class LowRankLinear(nn.Module):
    """``y = (x @ Vh.T) @ US.T + bias``: a rank-r factorisation of a linear layer (``US`` float[out, r],
    ``Vh`` float[r, in]); reads ``r * (in + out)`` weights per token instead of ``in * out``."""

    def __init__(self, us: torch.Tensor, vh: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.us = nn.Parameter(us, requires_grad=False)
        self.vh = nn.Parameter(vh, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(nn.functional.linear(x, self.vh), self.us, self.bias)


def svd_factors(weight: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(US float[out, r], Vh float[r, in]) of the best rank-``rank`` approximation of ``weight`` [out, in]
    (truncated SVD, computed in float64, returned in the weight's dtype; new tensors)."""
    u, s, vh = torch.linalg.svd(weight.detach().double(), full_matrices=False)
    r = min(rank, s.shape[0])
    return (u[:, :r] * s[:r]).to(weight.dtype).contiguous(), vh[:r].to(weight.dtype).contiguous()


_SVD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {module name: (US, Vh) at the largest rank}


def _model_factors(model, fraction: float) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per large linear layer of the decoder layers and the head: SVD factors of at least ``fraction`` of its
    smaller side, computed once per model (and again only for a larger fraction)."""
    kept = _SVD.get(model)
    if kept is not None and kept[0] >= fraction:
        return kept[1]
    factors = {}
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and (name.startswith("model.layers.") or mod is model.lm_head):
            rank = max(1, int(round(fraction * min(mod.weight.shape))))
            factors[name] = svd_factors(mod.weight, rank)
    _SVD[model] = (fraction, factors)
    return factors


def low_rank_drafter(model, fraction: float) -> LayerStack:
    """A NEW module tree: a structural copy of every decoder layer (new module objects sharing the target's norm
    weights; the target's modules are not touched) whose ``nn.Linear`` layers are rank-``fraction * min(out, in)`` SVD factors, and a
    low-rank head; the embedding, final norm and rotary table are the target's own."""
    check_llama_family(model)
    factors = _model_factors(model, fraction)

    def low_rank(name: str, mod: nn.Linear) -> LowRankLinear:
        us, vh = factors[name]
        r = max(1, int(round(fraction * min(mod.weight.shape))))
        return LowRankLinear(us[:, :r].clone(), vh[:r].clone(), None if mod.bias is None else mod.bias)

    layers = []
    for i, layer in enumerate(model.model.layers):
        memo = {id(t): t for t in (*layer.parameters(), *layer.buffers())}  # share tensors, copy the modules
        new = copy.deepcopy(layer, memo)
        for name, mod in list(new.named_modules()):
            if isinstance(mod, nn.Linear):
                parent_name, _, child = name.rpartition(".")
                parent = new.get_submodule(parent_name) if parent_name else new
                setattr(parent, child, low_rank(f"model.layers.{i}.{name}", mod))
        layers.append(new)
    return LayerStack(model, layers, head=low_rank("lm_head", model.lm_head))


class ModelDrafter:
    """A separate causal LM as drafter (classic two-model speculative decoding), its own cache."""

    def __init__(self, model):
        from .compat import cache_kwarg_name, supports_logits_to_keep

        self.model = model
        self.vocab_size = model.config.vocab_size
        self.cache_kwarg = cache_kwarg_name(model)
        self.keeps_logits = supports_logits_to_keep(model)
        self.device = next(model.parameters()).device

    def new_cache(self):
        from transformers import DynamicCache

        # plain layers, lazily grown: a sliding-window drafter's own layers could not be cropped past the window
        # (its model still masks them by the window: its mask function reads the config)
        return DynamicCache()

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, past: int, cache, all_rows: bool = False) -> torch.Tensor:
        ids = ids.to(self.device)
        pos = torch.arange(past, past + ids.shape[1], device=self.device)[None]
        kwargs = {} if all_rows or not self.keeps_logits else {"logits_to_keep": 1}
        out = self.model(input_ids=ids, position_ids=pos, use_cache=True, **{self.cache_kwarg: cache}, **kwargs)
        logits = out.logits[0].float()
        return logits if all_rows else logits[-1]

    def linear_params(self) -> int:
        return sum(p.numel() for m in self.model.modules() if isinstance(m, nn.Linear) for p in m.parameters())


def truncated_copy(model, layers: int):
    """A separate causal LM made of ``model``'s first ``layers`` decoder layers, its embedding, final norm and head:
    a NEW module tree (a new config, new module objects) sharing the target's weight tensors (no copy of them).
    What the bench uses as a draft model when no second real model is at hand; through HF's own forward it
    computes what :func:`early_exit_drafter` does.
    """
    check_llama_family(model)
    memo = {id(t): t for t in (*model.parameters(), *model.buffers())}
    new = copy.deepcopy(model, memo)
    new.model.layers = nn.ModuleList(list(new.model.layers)[:layers])
    new.config.num_hidden_layers = layers
    if getattr(new.config, "layer_types", None) is not None:
        new.config.layer_types = list(new.config.layer_types)[:layers]
    return new


def check_draft_model(draft_model, target=None) -> None:
    """Raise ValueError unless ``draft_model`` is a decoder-only causal LM with ``target``'s vocabulary."""
    config = getattr(draft_model, "config", None)
    if not isinstance(draft_model, nn.Module) or config is None or not hasattr(config, "vocab_size"):
        raise ValueError(f"draft_model must be a Hugging Face causal LM (an nn.Module with a config); got "
                         f"{type(draft_model).__name__}")
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError("draft_model must be a decoder-only causal LM; this one is an encoder-decoder model")
    if target is None:
        return
    if config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft_model has a vocabulary of {config.vocab_size} tokens, the target model {target.config.vocab_size}: "
            "a draft model must use the target's tokenizer (the same token ids)."
        )
    for key in ("bos_token_id", "eos_token_id"):
        a, b = getattr(config, key, None), getattr(target.config, key, None)
        if a is not None and b is not None and a != b:
            raise ValueError(f"draft_model's {key}={a} differs from the target's {b}: not the same tokenizer.")


# ---------------------------------------------------------------------------------- calibration and cost


def agreement(drafter, ids: torch.Tensor, target_argmax: torch.Tensor) -> float:
    """Fraction of positions of ``ids`` long[1, q] where the drafter's argmax equals the target's (long[q])."""
    logits = drafter.forward(ids, 0, drafter.new_cache(), all_rows=True)  # [q, V]
    return float((logits.argmax(-1) == target_argmax.to(logits.device)).double().mean())


def modelled_speed(accept: float, cost: float, max_depth: int = 8) -> float:
    """Best tokens per target-forward time of a chain, flat verification cost: ``max_d (1 + a + ... + a^d) /
    (1 + d * c)``. Example: a 0.8, c 0.5 -> d = 2: 2.44 / 2 = 1.22."""
    gains = np.cumsum(accept ** np.arange(1, max_depth + 1))
    return float(max(1.0, np.max((1 + gains) / (1 + cost * np.arange(1, max_depth + 1)))))


@dataclass(frozen=True)
class Choice:
    """A calibrated self-draft: ``size`` (as :data:`CANDIDATE_SIZES`), the measured ``agreement`` with the
    target's argmax on the calibration text, the ``cost`` (weights read per token relative to the target), what
    it keeps (``layers`` run, or the rank fraction) and every candidate's ``(size, agreement, cost)``."""

    size: float
    agreement: float
    cost: float
    layers: tuple[int, ...]
    candidates: tuple[tuple[float, float, float], ...]


def layer_importance(hidden_states: Sequence[torch.Tensor]) -> np.ndarray:
    """float[layers]: ``1 - cos(input, output)`` of each decoder layer, averaged over positions (ShortGPT's
    block influence): a layer that barely turns the hidden state is the cheapest to skip. ``hidden_states``:
    the model's ``output_hidden_states`` (embeddings, then each layer's output; the last one is normed, so the
    last layer scores 1, never skipped)."""
    out = []
    for a, b in zip(hidden_states[:-2], hidden_states[1:-1]):
        out.append(1 - float(nn.functional.cosine_similarity(a[0].double(), b[0].double(), dim=-1).mean()))
    return np.array(out + [1.0])


def skip_set(importance: np.ndarray, keep_fraction: float) -> tuple[int, ...]:
    """Layers kept: the first and last always, then the most important ones, ``keep_fraction`` of all.

    Example: importance ``[.9, .1, .5, .2, 1]``, keep 0.6 -> 3 layers: ``(0, 2, 4)``."""
    n = len(importance)
    k = min(n, max(2, int(round(keep_fraction * n))))
    order = [i for i in np.argsort(-importance, kind="stable") if i not in (0, n - 1)]
    return tuple(sorted(int(i) for i in {0, n - 1, *order[: k - 2]}))


def build(model, kind: str, size: float, importance: np.ndarray | None = None) -> tuple[LayerStack, tuple]:
    n = len(model.model.layers)
    if kind == "early-exit":
        exit_layer = max(1, min(n, int(round(size * n))))
        return early_exit_drafter(model, exit_layer), tuple(range(exit_layer))
    if kind == "layer-skip":
        keep = skip_set(np.ones(n) if importance is None else importance, size)
        return layer_skip_drafter(model, keep), keep
    if kind == "low-rank":
        return low_rank_drafter(model, size), tuple(range(n))
    raise ValueError(f"unknown self-draft kind {kind!r}; valid: {SELF_DRAFTS}")


@torch.no_grad()
def calibrate(model, kind: str, ids: torch.Tensor, sizes: Sequence[float] | None = None) -> tuple[Choice, LayerStack]:
    """Choose ``kind``'s size on ``ids`` long[1, q] (e.g. the prompt's last 64 tokens): one target forward (its
    argmax per position, and its hidden states for the layer importance), one drafter forward per candidate;
    the candidate with the best :func:`modelled_speed` from its agreement and its cost (weights read per
    token relative to the target's: what a CPU forward costs; memory for low rank)."""
    check_llama_family(model)
    sizes = CANDIDATE_SIZES[kind] if sizes is None else tuple(sizes)
    out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    target = out.logits[0].argmax(-1)  # [q]
    importance = layer_importance(out.hidden_states) if kind == "layer-skip" else None
    full = LayerStack(model, list(model.model.layers)).linear_params()
    rows, best = [], None
    for size in sizes:
        drafter, layers = build(model, kind, size, importance)
        a, c = agreement(drafter, ids, target), drafter.linear_params() / full
        rows.append((size, a, c))
        if best is None or modelled_speed(a, c) > modelled_speed(best[1], best[2]):
            best = (size, a, c, layers, drafter)
    size, a, c, layers, drafter = best
    return Choice(size, a, c, layers, tuple(rows)), drafter


def measure_cost_ratio(target, drafter, context: int = 32, repeats: int = 3) -> float:
    """One draft forward's time over one target forward's (1 new token after ``context``), best of ``repeats``."""
    from .compat import cache_kwarg_name

    device = next(target.parameters()).device
    ids = torch.randint(0, target.config.vocab_size, (1, context + 1), generator=torch.Generator().manual_seed(0))
    ids = ids.to(device)
    kw = cache_kwarg_name(target)

    def best(fn) -> float:
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    from transformers import DynamicCache

    with torch.no_grad():
        tc = DynamicCache()  # plain layers: a sliding-window target's could not be cropped past the window
        target(input_ids=ids[:, :context], use_cache=True, **{kw: tc})
        pos = torch.tensor([[context]], device=device)

        def target_step():
            target(input_ids=ids[:, context:], position_ids=pos, use_cache=True, **{kw: tc})
            tc.crop(-1)

        dc = drafter.new_cache()
        drafter.forward(ids[:, :context], 0, dc)

        def draft_step():
            drafter.forward(ids[:, context:], context, dc)
            dc.crop(-1)

        return best(draft_step) / best(target_step)


# -------------------------------------------------------------------------------------------- the source

DraftFactory = Callable[[object, np.ndarray], tuple[object, dict]]
"""``(target, prompt) -> (drafter, info)``: builds (or fetches) a drafter for this target and call."""


def self_draft_factory(kind: str, size: float) -> DraftFactory:
    """A factory of ``kind``'s drafter, built once per target model, kind and size in the process (kept while the
    model lives): a given ``size``, or chosen by :func:`calibrate` on the first prompt of at least 8 tokens (its
    last 64), else the middle candidate."""
    def make(target, prompt: np.ndarray):
        built = _BUILT.setdefault(target, {})
        if (kind, size) in built:
            return built[kind, size]
        check_llama_family(target)
        if size:
            drafter, layers = build(target, kind, size)
            info = {"size": size, "layers": layers}
        elif len(prompt) >= 8:
            ids = torch.from_numpy(np.ascontiguousarray(prompt[-64:]))[None].to(next(target.parameters()).device)
            choice, drafter = calibrate(target, kind, ids)
            info = {"size": choice.size, "layers": choice.layers, "agreement": choice.agreement,
                    "weights": choice.cost, "candidates": choice.candidates}
        else:
            mid = CANDIDATE_SIZES[kind][1]
            drafter, layers = build(target, kind, mid)
            info = {"size": mid, "layers": layers}
        built[kind, size] = (drafter, info)
        return built[kind, size]

    return make


_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {(kind, size): (drafter, info)}
_DRAFTERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a user's draft model -> its ModelDrafter
_RATIOS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # drafter -> its measured cost ratio


def draft_model_factory(draft_model) -> DraftFactory:
    """A factory for a user's draft model, or for ``draft_model(target) -> model`` (built once per target)."""
    built: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def make(target, prompt: np.ndarray):
        if target not in built:
            model = draft_model if isinstance(draft_model, nn.Module) else draft_model(target)
            check_draft_model(model, target)
            if model not in _DRAFTERS:
                _DRAFTERS[model] = ModelDrafter(model)
            built[target] = (_DRAFTERS[model], {"draft_model": type(model).__name__,
                                                "layers": model.config.num_hidden_layers})
        return built[target]

    return make


@dataclass
class DraftPassStats:
    """What a draft-pass source did in one call: ``forwards`` of the drafter and their ``seconds``, ``proposed``
    chain tokens, ``tried`` / ``accepted``: chain tokens whose verdict the emitted tokens tell (accepted: the
    target emitted that very token), whether or not the budget verified them; ``steps`` / ``drafting_steps``."""

    forwards: int = 0
    seconds: float = 0.0
    proposed: int = 0
    tried: int = 0
    accepted: int = 0
    steps: int = 0
    drafting_steps: int = 0


class DraftPassSource(DraftSource):
    """A proposer running a drafter autoregressively from its own KV cache (see the module docstring).

    ``propose`` catches the drafter's cache up with the context (one forward of the tokens it has not seen),
    then drafts a greedy chain ``depth`` deep, with the ``branches - 1`` runner-up tokens at each depth as
    leaves (no extra forward). ``learn(emitted)`` crops the drafter's cache to the longest prefix the context
    shares with what it holds (the accepted part of the chain stays) and updates the measured acceptance ``a``.
    A node's match bucket is the drafter's own probability of the token (>= 0.8: 3, >= 0.4: 2, else 1).

    ``cost``: one draft forward as a fraction of one target forward (0: measured once per target).
    """

    priced = True
    prior = (3.0, 2.0)  # Beta prior (accepted, rejected) of the acceptance a: 0.6, tried before it is known
    decay = 0.98
    probe_every = (16, 256)  # a depth-2 probe after this many undrafted steps, doubling up to the second
    transient = ("drafter", "cache")  # the drafter and its cache are made at start
    hopeless_below = 1.05  # calibrated modelled speed under which the source never drafts (the budget's margin)

    def __init__(self, origin: int, factory: DraftFactory, depth: int, branches: int = 1, cost: float = 0.0):
        self.origin, self.factory, self.branches, self.cost_ratio = origin, factory, branches, cost
        self.max_depth, self.max_nodes = depth, depth * branches
        self.drafter = None
        self.info: dict = {}
        self.stats = DraftPassStats()
        self.ratio = cost or 0.5
        self._acc, self._tried = 0.0, 0.0
        self._idle, self._probe = 0, self.probe_every[0]
        self.hopeless = False

    @property
    def alpha(self) -> float:
        """Measured P(chain token accepted | its parent was), shrunk to the prior."""
        a, b = self.prior
        return (self._acc + a) / (self._tried + a + b)

    def start(self, prompt: np.ndarray, model=None) -> None:
        if model is None:
            raise ValueError("a draft-pass source needs the target model at start")
        self.drafter, self.info = self.factory(model, prompt)
        if not self.cost_ratio:  # measured once per drafter in the process
            if self.drafter not in _RATIOS:
                _RATIOS[self.drafter] = measure_cost_ratio(model, self.drafter)
            self.ratio = _RATIOS[self.drafter]
        # the calibration's agreement with the target, where one was measured: a chain cannot pay even with free
        # verification (modelled_speed, the flat-curve bound) -> no draft and no probe for this drafter
        agreement = self.info.get("agreement")
        self.hopeless = agreement is not None and modelled_speed(agreement, self.ratio) < self.hopeless_below
        self.cache = self.drafter.new_cache()
        self.tokens: list[int] = [int(t) for t in prompt]
        self.cached: list[int] = []  # the tokens whose keys/values the drafter's cache holds, in order
        self.chain: list[int] = []
        self.stats = DraftPassStats()
        self._idle, self._probe = 0, self.probe_every[0]

    def priced_depth(self, depth: int, cost, margin: float = 1.05) -> int:
        """How deep to draft this step on the cost curve ``cost`` (a ``CostModel``; None: ``depth``), see the
        module docstring; a probe of at most 2 every so many steps while it pays to draft nothing; nothing at all
        when the calibration's agreement says a chain cannot pay even with free verification (``hopeless``)."""
        if cost is None or depth <= 0:
            return depth
        if self.hopeless:
            return 0
        d = np.arange(1, depth + 1)
        t1 = float(cost(1))
        rate = (1 + np.cumsum(self.alpha ** d)) / (cost(1 + d) + d * self.ratio * t1)
        if rate.max() * t1 >= margin:
            self._idle, self._probe = 0, self.probe_every[0]
            return int(d[int(np.argmax(rate))])
        self._idle += 1
        if self._idle >= self._probe:
            self._idle, self._probe = 0, min(2 * self._probe, self.probe_every[1])
            return min(depth, 2)
        return 0

    def _forward(self, ids: list[int]) -> torch.Tensor:
        t = time.perf_counter()
        x = torch.tensor([ids], dtype=torch.long)
        logits = self.drafter.forward(x, len(self.cached), self.cache)  # [V]
        self.cached.extend(ids)
        self.stats.forwards += 1
        self.stats.seconds += time.perf_counter() - t
        return logits

    def propose(self, context: np.ndarray, max_nodes: int, max_depth: int) -> Proposal | None:
        """``context`` is not read: the source keeps the whole context itself."""
        depth = min(max_depth, max_nodes // self.branches)
        self.stats.steps += 1
        if depth <= 0 or self.drafter is None:
            return None
        if len(self.cached) >= len(self.tokens):  # a stop cut the emitted tokens inside the chain: re-feed the last
            crop_cache(self.cache, len(self.cached) - len(self.tokens) + 1)
            del self.cached[len(self.tokens) - 1:]
        logits = self._forward(self.tokens[len(self.cached):])
        tokens, parents, match, chain = [], [], [], []
        parent = -1
        for level in range(depth):
            probs = torch.softmax(logits, -1)
            top = torch.topk(probs, self.branches)
            ids, shares = top.indices.tolist(), top.values.tolist()
            first = len(tokens)
            for tok, share in zip(ids, shares):
                tokens.append(tok)
                parents.append(parent)
                match.append(3 if share >= 0.8 else 2 if share >= 0.4 else 1)
            chain.append(ids[0])
            parent = first
            if level + 1 < depth:
                logits = self._forward([ids[0]])
        self.chain = chain
        self.stats.proposed += len(chain)
        self.stats.drafting_steps += 1
        # breadth-first already: each level's nodes follow the previous level's
        return Proposal(np.array(tokens, dtype=np.int64), np.array(parents, dtype=np.int64),
                        np.array(match, dtype=np.int64))

    def learn(self, emitted: np.ndarray) -> None:
        emitted = [int(t) for t in emitted]
        if self.chain:
            accepted = 0
            while accepted < min(len(self.chain), len(emitted)) and self.chain[accepted] == emitted[accepted]:
                accepted += 1
            tried = accepted + (1 if accepted < min(len(self.chain), len(emitted)) else 0)
            self._acc = self.decay * self._acc + accepted
            self._tried = self.decay * self._tried + tried
            self.stats.tried += tried
            self.stats.accepted += accepted
            self.chain = []
        old = len(self.tokens)
        self.tokens.extend(emitted)
        if len(self.cached) <= old:  # the cache holds a prefix of the context: nothing drafted stays in it
            return
        keep = old + _common_prefix(self.cached[old:], emitted)
        if keep < len(self.cached):
            crop_cache(self.cache, len(self.cached) - keep)
            del self.cached[keep:]

    def report(self) -> dict:
        """This call's figures and the drafter's settings (JSON-safe)."""
        s = self.stats
        return {"info": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.info.items()},
                "cost_ratio": self.ratio, "alpha": self.alpha, "forwards": s.forwards, "seconds": s.seconds,
                "proposed": s.proposed, "tried": s.tried, "accepted": s.accepted, "steps": s.steps,
                "drafting_steps": s.drafting_steps, "hopeless": self.hopeless}


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


SELF_ORIGINS = {"layer-skip": LAYER_SKIP, "early-exit": EARLY_EXIT, "low-rank": LOW_RANK}


def make_draft_sources(config, draft_model=None) -> list:
    """The draft-pass sources a config (``self_draft``, ``self_draft_size``, ``draft_depth``, ``draft_branches``,
    ``draft_cost``) and a ``draft_model`` ask for."""
    sources = []
    if config.self_draft != "none":
        sources.append(DraftPassSource(SELF_ORIGINS[config.self_draft],
                                       self_draft_factory(config.self_draft, config.self_draft_size),
                                       config.draft_depth, config.draft_branches, config.draft_cost))
    if draft_model is not None:
        sources.append(DraftPassSource(DRAFT_MODEL, draft_model_factory(draft_model), config.draft_depth,
                                       config.draft_branches, config.draft_cost))
    return sources
