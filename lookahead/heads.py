"""Trained draft heads: small modules over the target's final hidden state that draft a tree each step.

The decoder already runs one verification forward per step; the input of the model's output embedding (the
hidden state after the final norm) at the row whose logits gave the step's last emitted token, ``h(t)``, says
much about the next few tokens. Heads trained on the model's own greedy continuations turn it into a draft
tree at a small fraction of a forward, with no extra target forward and no second model. The exact
acceptance core verifies every node, so heads change speed only, never the output.

Three kinds (:data:`KINDS`), all ending in the model's own LM head restricted to a vocabulary ``vocab_ids``
(int64[Vk], the most frequent tokens of the model's own outputs in the training data; on a CPU SmolLM2's
full head, 49152 x 576, costs 13 ms per row on one core, the 4096 most frequent rows 0.2 ms):

- ``"medusa"`` (Cai et al. 2024): head ``k`` (1..K) maps ``h(t)`` through a residual SiLU block
  ``r = h + silu(W_k h + b_k)`` (``W_k`` zero-initialised: an untrained head predicts what the LM head
  does) and predicts token ``t + 1 + k``. The tree is the best-first product of the heads' top-k lists
  (:func:`best_first_tree`).
- ``"feature"`` (EAGLE-style, Li et al. 2024, without attention): one block maps (the current feature,
  the embedding of the token it emitted) to the next feature, ``f' = z + mlp(z)``, ``z = fc([n(f), n(e)])``
  (``n``: RMS normalisation); the LM head of ``f'`` gives the next token. Starting from ``h(t)`` and the
  last emitted token it drafts level by level, expanding the ``width`` best paths at each level, and keeps
  the ``max_nodes`` best nodes overall (:func:`select_best`).
- ``"context"`` (EAGLE-style, with attention): the feature head's map with one causal attention layer over the
  answer's earlier positions in between (``context_head.py``); it keeps a cache of every accepted row's input
  and drafts as the feature head does, each path's queries also attending to its own ancestors. On SmolLM2 it
  holds deeper chains than the feature head but drafts no better beside the other sources
  (``benchmarks/results/heads.md``), so it is not the default and none ships.

Files: :meth:`DraftHeads.save` writes ``heads.safetensors`` (the weights, fp16) and ``heads.json`` (format
version, the target's :func:`fingerprint`, K, the kind, the training data's description, held-out accuracy).
:meth:`DraftHeads.from_medusa` reads heads saved by the original Medusa repository (``config.json`` and
``medusa_lm_head.pt`` or ``.safetensors``): each head one residual block and its own full-vocabulary output
layer (``own_outputs``), or, in its earliest format, the model's LM head.
Heads for another model are refused with a ValueError at :meth:`DraftHeads.load` (given the model) and in
:meth:`HeadsSource.start`, before the first forward. ``DraftHeads.bundled()`` loads the heads shipped for the
bundled SmolLM2-135M-Instruct. Train heads for any causal LM with ``python -m lookahead train-heads``.

Pricing: :class:`HeadsSource` is a priced source. Each step it picks the depth ``d`` maximising modelled
tokens per second ``(1 + a_1 + a_1 a_2 + ...) / (t(1 + d) + s(d))`` (``a_j``: the measured chance that its
tree holds the emitted token at depth ``j`` given it held depth ``j - 1``; ``t``: the call's cost curve;
``s(d) = base + d * per_level``: the heads' own seconds, measured once per model or given) and drafts
only when that beats a plain step ``1 / t(1)`` by the budget's margin (with a depth-2 probe now and then).
"""

from __future__ import annotations

import copy
import hashlib
import heapq
import json
import os
import time
import weakref
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from .context_head import ContextCache, ContextLayer, attend, attention_heads, rms
from .draft import HEADS
from .source import DraftSource, Proposal
from .tree import tree_depths

FORMAT = "lookahead-draft-heads"
VERSION = 3  # the newest format read; 2 adds each Medusa head's own output layer (``own_outputs``), 3 the context head
KINDS = ("medusa", "feature", "context")
DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}
"""``HeadsSettings.dtype``: the names, and the torch dtype each fixes (``"auto"``: chosen by measurement)."""
WEIGHTS_FILE, HEADER_FILE, DEFAULT_FILE = "heads.safetensors", "heads.json", "default.txt"
MEDUSA_CONFIG, MEDUSA_WEIGHTS = "config.json", ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
BUNDLED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "heads-smollm2")
"""The folder of the heads shipped for the bundled SmolLM2-135M-Instruct."""

FEATURE_DEPTH = 6
"""A feature head's default draft depth (trained 4 levels deep, its levels 5 and 6 still add accepted tokens)."""
WIDE_DEPTH, WIDE_WIDTH = 10, 12
"""A heads tree in the widest steps (``config.STEP_NODES_LEVELS``): at least this deep and this many paths wide."""

PROBE_ENTRIES = 64
"""LM-head weights the fingerprint keeps as numbers: the same weights in another precision match them."""


# ------------------------------------------------------------------------------------------- fingerprint


def _probe_positions(vocab: int, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    """Fixed (row, column) positions of the LM-head weights a fingerprint keeps (the same for every model)."""
    rng = np.random.default_rng(0)
    return rng.integers(0, vocab, PROBE_ENTRIES), rng.integers(0, hidden, PROBE_ENTRIES)


_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (weight key, fingerprint)


def weight_key(weight: torch.Tensor) -> tuple:
    """What changes when a weight tensor is replaced or changed in place: (data pointer, version counter, shape,
    dtype). A decision kept per model (its fingerprint, its corpus) is made again when its LM head's key changes."""
    try:
        version = weight._version
    except RuntimeError:  # an inference tensor (made under torch.inference_mode) has no version counter
        version = -1
    return weight.data_ptr(), version, tuple(weight.shape), str(weight.dtype)


def fingerprint(model) -> dict:
    """What identifies a target model for its heads: ``architecture`` (class name), ``model_type``,
    ``hidden_size`` and ``vocab_size`` (of its LM head), ``lm_head_sha256`` (of the LM-head weights rounded to
    bfloat16, so a float32 and a bfloat16 copy of one model agree) and ``lm_head_probe`` (64 of those
    weights as numbers, which match within rounding when the hash differs only by precision). Computed once
    per model object (again if its LM-head weight is replaced or changed in place)."""
    weight = model.get_output_embeddings().weight
    key = weight_key(weight)
    kept = _FINGERPRINTS.get(model)
    if kept is not None and kept[0] == key:
        return kept[1]
    w = weight.detach()
    vocab, hidden = w.shape
    bf16 = w.to("cpu", torch.bfloat16).contiguous()
    digest = hashlib.sha256(bf16.view(torch.int16).numpy().tobytes()).hexdigest()
    rows, cols = _probe_positions(vocab, hidden)
    probe = w[torch.from_numpy(rows).to(w.device), torch.from_numpy(cols).to(w.device)].float().cpu()
    found = {"architecture": type(model).__name__, "model_type": getattr(model.config, "model_type", None),
             "hidden_size": int(hidden), "vocab_size": int(vocab), "lm_head_sha256": digest,
             "lm_head_probe": [round(float(x), 7) for x in probe]}
    _FINGERPRINTS[model] = (key, found)
    return found


def fingerprint_mismatch(saved: dict, model) -> str | None:
    """Why heads trained for the model ``saved`` describes do not fit ``model`` (None: they fit)."""
    now = fingerprint(model)
    for name in ("model_type", "hidden_size", "vocab_size"):
        if saved.get(name) != now[name]:
            return f"{name} is {now[name]!r}, the heads were trained for {saved.get(name)!r}"
    if saved.get("lm_head_sha256") == now["lm_head_sha256"]:
        return None
    old, new = np.asarray(saved.get("lm_head_probe", []), float), np.asarray(now["lm_head_probe"], float)
    if old.shape == new.shape and np.allclose(old, new, rtol=1e-2, atol=1e-3):
        return None  # the same weights in another precision (float16, bfloat16)
    return "its LM-head weights differ from those of the model the heads were trained for"


def check_model(saved: dict, model) -> None:
    """Raise ValueError unless heads trained for ``saved`` (a :func:`fingerprint`) fit ``model``."""
    why = fingerprint_mismatch(saved, model)
    if why is not None:
        raise ValueError(
            f"these draft heads were trained for another model ({saved.get('architecture')}, "
            f"{saved.get('model_type')}, hidden {saved.get('hidden_size')}, vocabulary {saved.get('vocab_size')}): "
            f"for this {type(model).__name__}, {why}. Train heads for this model with "
            "`python -m lookahead train-heads --model PATH --out DIR` and load those."
        )


# ------------------------------------------------------------------------------------------- draft trees


def best_first_tree(probs: np.ndarray, max_nodes: int, max_depth: int) -> tuple[np.ndarray, np.ndarray,
                                                                                   np.ndarray]:
    """The ``max_nodes`` most probable paths through independent per-depth candidate lists, as a tree.

    ``probs`` float[K, k]: row ``d`` holds depth ``d + 1``'s candidate probabilities, sorted descending. A
    node is a path ``(i_1, ..., i_d)`` scored by ``probs[0, i_1] * ... * probs[d - 1, i_d]``; nodes come out
    best first (a parent before its children, never below a child's score). Returns (depth int64[n],
    1-based; index int64[n] into its depth's list; parents int64[n], -1 for the root's children), in the
    order found: parent-first, siblings best first (what the merge of ``proposer.py`` takes as it is).

    Example: ``probs = [[0.6, 0.3], [0.6, 0.4]]``, 3 nodes: ``(0)`` 0.6, ``(0, 0)`` 0.36, ``(1)`` 0.3 ->
    depth ``[1, 2, 1]``, index ``[0, 0, 1]``, parents ``[-1, 0, -1]``.
    """
    depth_cap = min(max_depth, probs.shape[0])
    depth, index, parents = [], [], []
    if max_nodes <= 0 or depth_cap <= 0 or probs.shape[1] == 0:
        return (np.zeros(0, np.int64),) * 3
    # heap entries: (-score, order, depth, index, parent node, parent score)
    heap = [(-float(probs[0, 0]), 0, 1, 0, -1, 1.0)]
    order = 1
    while heap and len(depth) < max_nodes:
        neg, _, d, i, parent, parent_score = heapq.heappop(heap)
        node = len(depth)
        depth.append(d)
        index.append(i)
        parents.append(parent)
        score = -neg
        if i + 1 < probs.shape[1]:  # the next sibling
            heapq.heappush(heap, (-(parent_score * float(probs[d - 1, i + 1])), order, d, i + 1, parent,
                                  parent_score))
            order += 1
        if d < depth_cap:  # the first child
            heapq.heappush(heap, (-(score * float(probs[d, 0])), order, d + 1, 0, node, score))
            order += 1
    return np.array(depth, np.int64), np.array(index, np.int64), np.array(parents, np.int64)


def select_best(scores: np.ndarray, parents: np.ndarray, max_nodes: int) -> np.ndarray:
    """Indices (sorted) of the ``max_nodes`` best-scored nodes of a parent-first tree whose scores never rise
    from a parent to its child (log-probabilities of paths); ties keep the earlier node, so the set is closed
    under parents.

    Example: scores ``[-0.1, -0.5, -0.2, -0.9]``, parents ``[-1, -1, 0, 2]``, 2 nodes -> ``[0, 2]``.
    """
    if len(scores) <= max_nodes:
        return np.arange(len(scores))
    keep = np.sort(np.argsort(-scores, kind="stable")[:max_nodes])
    inside = np.zeros(len(scores), bool)
    inside[keep] = True
    ok = (parents[keep] < 0) | inside[np.maximum(parents[keep], 0)]
    return keep[ok]  # (a float tie between a parent and its child can only drop the child)


def confidence_bucket(p: np.ndarray, edges: tuple[float, float] = (0.25, 0.6)) -> np.ndarray:
    """int64[n] match buckets (1, 2, 3) of nodes' calibrated conditional probabilities ``p`` float[n]:
    below ``edges[0]``: 1, below ``edges[1]``: 2, else 3 (what the acceptance estimates condition on)."""
    p = np.asarray(p)
    return 1 + (p >= edges[0]).astype(np.int64) + (p >= edges[1])


# ----------------------------------------------------------------------------------------------- modules


@dataclass(frozen=True)
class HeadsSettings:
    """How a :class:`HeadsSource` drafts: at most ``max_nodes`` nodes (also capped by the decoder's
    ``step_nodes`` as the call resolves it: 127 on a flat cost curve, where the wider tree measured 3.9% more
    tokens per call on code completion, 63 elsewhere; in the widest steps, 255, twice the nodes, at least
    :data:`WIDE_DEPTH` deep and :data:`WIDE_WIDTH` wide: ``HeadsSource.limits``) ``max_depth`` deep (0: the
    Medusa heads' K; for a feature head, which runs on past the depth it was trained to, ``FEATURE_DEPTH`` or K if
    deeper), ``topk`` candidates per head or per expanded node, ``width`` paths expanded per level (feature heads),
    ``cost``: the heads' own seconds per step as ``(base, per_level)`` (None: measured once per model and tree
    shape; tests pin it), and ``dtype``, what the heads compute in: ``"float32"``, ``"bfloat16"``, or ``"auto"``:
    on a CPU the faster of the two as measured with the cost (float32 when the cost is given and on other devices;
    a context head always computes in float32). The drafts' precision never touches the output, which the target verifies: it
    only moves which candidates rank first. On a 2-core AMD EPYC with AVX512-BF16 the feature head's level
    took 0.44-0.58 ms in bf16 against 1.6-2.0 ms in fp32, its 4096-row output layer over 8 paths 0.16 ms against 0.47.
    """

    max_nodes: int = 127
    max_depth: int = 0
    topk: int = 10
    width: int = 8
    cost: tuple[float, float] | None = None
    dtype: str = "auto"

    def __post_init__(self) -> None:
        def bad(name, why):
            return ValueError(f"HeadsSettings.{name}={getattr(self, name)!r} is invalid: {why}")

        for name, low, high in (("max_nodes", 1, 256), ("max_depth", 0, 64), ("topk", 1, 64), ("width", 1, 64)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise bad(name, f"must be an int in [{low}, {high}]")
        if self.cost is not None:
            try:
                base, per = (float(c) for c in self.cost)
            except (TypeError, ValueError):
                raise bad("cost", "must be (base seconds, seconds per level) or None") from None
            if base < 0 or per < 0:
                raise bad("cost", "seconds must be >= 0")
            object.__setattr__(self, "cost", (base, per))
        if self.dtype not in DTYPES:
            raise bad("dtype", f"must be one of {tuple(DTYPES)}")


class DraftHeads(nn.Module):
    """K trained draft heads of one kind over a frozen target (see the module docstring).

    Usage::

        heads = DraftHeads.bundled()                   # or DraftHeads.load("my-heads", model=model)
        decoder = LookaheadDecoder(heads=heads)
        out = model.generate(**inputs, custom_generate=decoder)
        decoder.stats.accepted_by_origin["heads"]      # draft tokens the heads got accepted

    - ``kind``: ``"medusa"`` or ``"feature"``; ``num_heads``: K (Medusa heads, or the feature head's trained
      depth); ``hidden_size``: the target's H; ``vocab_ids`` int64[Vk]: the LM-head rows the heads predict.
    - ``target``: the target's :func:`fingerprint` (None for heads not yet bound to a model); ``trained_on``:
      a JSON-safe description of the training data and results (the header's ``"training"``); ``ffn``: the
      feature block's width / H; ``dropout``: applied to the blocks' inputs in training only.
    - ``own_outputs`` (Medusa heads only): each head ends in its own output layer ``head_out[k]``
      float[Vk, H] instead of the model's LM-head rows (the original Medusa format, :meth:`from_medusa`).
    - ``settings``: :class:`HeadsSettings`.

    The parameters stay float32 on the CPU; each other device and dtype (``HeadsSettings.dtype``) gets its own copy on
    first use.
    """

    def __init__(self, kind: str, num_heads: int, hidden_size: int, vocab_ids, target: dict | None = None,
                 trained_on: dict | None = None, ffn: int = 2, settings: HeadsSettings | None = None,
                 dropout: float = 0.0, own_outputs: bool = False, attention: int | None = None):
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"DraftHeads kind={kind!r} is invalid: must be one of {KINDS}")
        if own_outputs and kind != "medusa":
            raise ValueError(f"DraftHeads own_outputs=True is invalid for kind={kind!r}: only Medusa heads have them")
        if not 1 <= num_heads <= 16:
            raise ValueError(f"DraftHeads num_heads={num_heads!r} is invalid: must be in [1, 16]")
        self.kind, self.num_heads, self.hidden_size, self.ffn = kind, int(num_heads), int(hidden_size), int(ffn)
        self.target, self.trained_on = target, dict(trained_on or {})  # (nn.Module owns `training`: the mode)
        self.settings = settings or HeadsSettings()
        h = self.hidden_size
        ids = torch.as_tensor(np.asarray(vocab_ids), dtype=torch.long)
        if ids.ndim != 1 or not len(ids):
            raise ValueError("DraftHeads vocab_ids must be a non-empty 1-D list of token ids")
        self.register_buffer("vocab_ids", ids.clone())  # long[Vk]
        self.register_buffer("temperature", torch.ones(self.num_heads))  # per head / level, fitted on held-out
        if kind == "medusa":
            self.block_weight = nn.Parameter(torch.zeros(self.num_heads, h, h))  # [K, H, H], zero: identity
            self.block_bias = nn.Parameter(torch.zeros(self.num_heads, h))  # [K, H]
            if own_outputs:
                self.head_out = nn.Parameter(torch.zeros(self.num_heads, len(ids), h))  # [K, Vk, H]
        elif kind == "context":  # its own module: the attention layer of ``context_head.py``
            self.context = ContextLayer(h, self.ffn, attention or attention_heads(h), dropout)
        else:
            self.fc = nn.Linear(2 * h, h)
            self.up = nn.Linear(h, self.ffn * h)
            self.down = nn.Linear(self.ffn * h, h)
            nn.init.zeros_(self.down.weight)
            nn.init.zeros_(self.down.bias)
        self.own_outputs = bool(own_outputs)
        self.drop = nn.Dropout(dropout)  # active in training only
        self._devices: dict = {}

    # ----------------------------------------------------------------------------------------- compute

    def medusa_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """float[N, K, H]: each Medusa head's residual block of ``hidden`` float[N, H]."""
        z = torch.einsum("nj,kij->nki", self.drop(hidden), self.block_weight) + self.block_bias  # [N, K, H]
        return hidden[:, None, :] + nn.functional.silu(z)

    def medusa_logits(self, rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """float[..., d, Vk]: head ``k``'s logits of ``rows[..., k, :]`` (float[..., d, H], the first ``d`` heads'
        blocks), through its own output layer (``own_outputs``), else through the model's LM-head rows
        ``weight`` float[Vk, H] and ``bias``."""
        if self.own_outputs:
            return torch.einsum("...kh,kvh->...kv", rows, self.head_out[: rows.shape[-2]])
        return nn.functional.linear(rows, weight, bias)

    def feature_step(self, feature: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """float[N, H]: the next feature from the current one and its emitted token's embedding (both [N, H])."""
        z = self.fc(self.drop(torch.cat([rms(feature), rms(embedding)], -1)))  # [N, H]
        return z + self.down(self.drop(nn.functional.silu(self.up(z))))

    # -------------------------------------------------------------------------------------- binding

    def check_model(self, model) -> None:
        """Raise ValueError unless these heads were trained for ``model``."""
        if self.target is None:
            raise ValueError("these draft heads carry no target fingerprint (DraftHeads(target=None)); build "
                             "them with DraftHeads.for_model(model, ...) or load saved ones")
        check_model(self.target, model)

    @classmethod
    def for_model(cls, model, kind: str, num_heads: int, vocab_ids, **kwargs) -> DraftHeads:
        """Untrained heads for ``model`` (its fingerprint and hidden size), predicting ``vocab_ids``."""
        return cls(kind, num_heads, fingerprint(model)["hidden_size"], vocab_ids, target=fingerprint(model),
                   **kwargs)

    def on_device(self, device, dtype: torch.dtype = torch.float32) -> DraftHeads:
        """These heads on ``device`` in ``dtype`` (themselves on the CPU in float32; a copy otherwise, made once per
        device and dtype)."""
        device = torch.device(device)
        if device.type == "cpu" and dtype == torch.float32:
            return self
        key = (device, dtype)
        if key not in self._devices:  # a deep copy without the other copies
            clone = copy.deepcopy(self, memo={id(self._devices): {}})
            self._devices[key] = clone.to(device=device, dtype=dtype).requires_grad_(False)
        return self._devices[key]

    def make_source(self, config=None) -> HeadsSource:
        """The draft source of these heads for a decoder with this ``LookaheadConfig`` (the most nodes its
        ``step_nodes`` lets a step verify caps the tree)."""
        settings = self.settings
        max_nodes = settings.max_nodes if config is None else max(1, min(settings.max_nodes, config.step_nodes_range[1]))
        depth = settings.max_depth or (self.num_heads if self.kind == "medusa" else max(FEATURE_DEPTH, self.num_heads))
        return HeadsSource(self, max_nodes=max_nodes, max_depth=depth,
                           topk=settings.topk, width=settings.width, cost=settings.cost, dtype=settings.dtype)

    def with_settings(self, **changes) -> DraftHeads:
        """These heads (the same parameters) drafting with other :class:`HeadsSettings` fields."""
        from dataclasses import replace

        other = copy.copy(self)
        other.__dict__ = dict(self.__dict__)
        other.settings = replace(self.settings, **changes)
        other._devices = {}
        return other

    # ----------------------------------------------------------------------------------------- files

    def header(self) -> dict:
        version = 3 if self.kind == "context" else 2 if self.own_outputs else 1  # older readers refuse what they lack
        head = {"format": FORMAT, "version": version, "kind": self.kind,
                "num_heads": self.num_heads, "hidden_size": self.hidden_size, "ffn": self.ffn,
                "vocab": int(len(self.vocab_ids)), "temperature": [round(float(t), 6) for t in self.temperature],
                "target": self.target, "training": self.trained_on}
        if self.own_outputs:  # version 2: a reader of version 1 refuses these rather than misreading them
            head["own_outputs"] = True
        if self.kind == "context":
            head["attention_heads"] = self.context.heads
        return head

    def save(self, folder: str) -> None:
        """Write ``heads.safetensors`` (weights in float16, the vocabulary as int64) and ``heads.json``."""
        from safetensors.torch import save_file

        os.makedirs(folder, exist_ok=True)
        tensors = {name: p.detach().to("cpu", torch.float16).contiguous() for name, p in self.named_parameters()}
        tensors["vocab_ids"] = self.vocab_ids.cpu().contiguous()
        save_file(tensors, os.path.join(folder, WEIGHTS_FILE), metadata={"format": FORMAT, "version": str(VERSION)})
        with open(os.path.join(folder, HEADER_FILE), "w", encoding="utf-8") as f:
            json.dump(self.header(), f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, folder: str, model=None, **settings) -> DraftHeads:
        """Heads saved with :meth:`save` (or, for a training run's output folder, those its ``default.txt``
        names); with ``model``, refused (ValueError) unless trained for it. ``settings``: :class:`HeadsSettings`
        fields."""
        from safetensors.torch import load_file

        path = os.path.join(folder, HEADER_FILE)
        default = os.path.join(folder, DEFAULT_FILE)
        if not os.path.exists(path) and os.path.exists(default):  # a training run's folder: its default kind
            with open(default, encoding="utf-8") as f:
                return cls.load(os.path.join(folder, f.read().strip()), model, **settings)
        if not os.path.exists(path):
            raise FileNotFoundError(f"no {HEADER_FILE} in {folder!r}: not a folder written by DraftHeads.save")
        with open(path, encoding="utf-8") as f:
            head = json.load(f)
        if head.get("format") != FORMAT or not isinstance(head.get("version"), int):
            raise ValueError(f"{path} is not a lookahead draft-heads header (format {head.get('format')!r})")
        if head["version"] > VERSION:
            raise ValueError(f"{path} has format version {head['version']}; this lookahead reads up to {VERSION}")
        tensors = load_file(os.path.join(folder, WEIGHTS_FILE))
        heads = cls(head["kind"], head["num_heads"], head["hidden_size"], tensors.pop("vocab_ids"),
                    target=head.get("target"), trained_on=head.get("training"), ffn=head.get("ffn", 2),
                    settings=HeadsSettings(**settings), own_outputs=bool(head.get("own_outputs", False)),
                    attention=head.get("attention_heads"))
        state = {k: v.float() for k, v in tensors.items()}
        state["vocab_ids"] = heads.vocab_ids
        state["temperature"] = torch.tensor(head.get("temperature", [1.0] * heads.num_heads), dtype=torch.float32)
        heads.load_state_dict(state, strict=True)
        heads.eval()
        if model is not None:
            heads.check_model(model)
        return heads

    @classmethod
    def from_medusa(cls, folder: str, model, **settings) -> DraftHeads:
        """Medusa heads saved by the original Medusa repository (FasterDecoding/Medusa) for ``model``.

        ``folder`` holds ``config.json`` (``medusa_num_heads``, ``medusa_num_layers``,
        ``base_model_name_or_path``) and ``medusa_lm_head.safetensors`` or ``medusa_lm_head.pt`` (the state
        dict of its ``medusa_head``: per head ``i``, ``{i}.0.linear.weight`` [H, H] and ``.bias`` [H], the
        residual block ``h + silu(W h + b)``, then ``{i}.1.weight`` [V, H], the head's own output layer; the
        earliest format has no output layer and uses the model's LM head; keys may carry the ``medusa_head.``
        prefix of a whole Medusa model's state dict). Heads with more than one block
        (``medusa_num_layers`` > 1) are refused, as are weights whose sizes do not fit ``model``. The
        verification stays exact: Medusa's own "typical acceptance" is not used. ``settings``:
        :class:`HeadsSettings` fields.

        Example: a folder whose config says ``"medusa_num_heads": 5, "medusa_num_layers": 1``, for a model with
        H = 4096 and a 32000-token vocabulary, gives 5 heads with ``block_weight`` [5, 4096, 4096] and
        ``head_out`` [5, 32000, 4096] (2.6 GB in float32).
        """
        config_path = os.path.join(folder, MEDUSA_CONFIG)
        if not os.path.exists(config_path):
            raise FileNotFoundError(f"no {MEDUSA_CONFIG} in {folder!r}: not a Medusa heads folder")
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        if "medusa_num_heads" not in config:
            raise ValueError(f"{config_path} has no medusa_num_heads: not a Medusa heads config")
        num_heads, layers = int(config["medusa_num_heads"]), int(config.get("medusa_num_layers", 1))
        if layers not in (0, 1):
            raise ValueError(f"Medusa heads with medusa_num_layers={layers} cannot be read: each lookahead Medusa "
                             "head holds one residual block (0 or 1)")
        weights = next((os.path.join(folder, n) for n in MEDUSA_WEIGHTS if os.path.exists(os.path.join(folder, n))),
                       None)
        if weights is None:
            raise FileNotFoundError(f"no {' or '.join(MEDUSA_WEIGHTS)} in {folder!r}")
        if weights.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(weights)
        else:
            state = torch.load(weights, map_location="cpu", weights_only=True)
        prefix = "medusa_head."  # a whole MedusaModel's state dict names the heads under its attribute
        state = {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}
        target = fingerprint(model)
        hidden, vocab = target["hidden_size"], target["vocab_size"]
        own = f"0.{layers}.weight" in state

        def tensor(name, shape):
            if name not in state:
                raise ValueError(f"{weights} has no {name!r}: not the Medusa heads of a {num_heads}-head config")
            t = state[name]
            if tuple(t.shape) != shape:
                raise ValueError(f"{weights}: {name} is {tuple(t.shape)}, {shape} fits this model "
                                 f"(hidden size {hidden}, vocabulary {vocab}): heads for another model")
            return t.float()

        heads = cls("medusa", num_heads, hidden, np.arange(vocab), target=target, own_outputs=own,
                    trained_on={"source": "Medusa checkpoint", "folder": os.path.abspath(folder),
                                "base_model": config.get("base_model_name_or_path")},
                    settings=HeadsSettings(**settings))
        with torch.no_grad():
            for i in range(num_heads):
                if layers:
                    heads.block_weight[i] = tensor(f"{i}.0.linear.weight", (hidden, hidden))
                    heads.block_bias[i] = tensor(f"{i}.0.linear.bias", (hidden,))
                if own:
                    heads.head_out[i] = tensor(f"{i}.{layers}.weight", (vocab, hidden))
        heads.eval()
        return heads

    @classmethod
    def bundled(cls, kind: str | None = None, **settings) -> DraftHeads:
        """The heads shipped for the bundled SmolLM2-135M-Instruct (``lookahead.models.load_smollm2``);
        ``kind``: ``"medusa"`` or ``"feature"`` (None: the one shipped as the default)."""
        return cls.load(BUNDLED if kind is None else os.path.join(BUNDLED, kind), **settings)

    def __repr__(self) -> str:
        return (f"DraftHeads(kind={self.kind!r}, num_heads={self.num_heads}, hidden_size={self.hidden_size}, "
                f"vocab={len(self.vocab_ids)}, target={(self.target or {}).get('architecture')})")


class Bound:
    """Heads bound to one target model on one device, computing in ``dtype``: their copy there, the model's LM-head
    rows of the heads' vocabulary ([Vk, H] in ``dtype``, and bias [Vk] or None; new tensors), its input embedding
    module. Logits come out float32 whatever ``dtype``, so the paths' scores add up in float32."""

    def __init__(self, heads: DraftHeads, model, dtype: torch.dtype = torch.float32):
        out = model.get_output_embeddings()
        device = out.weight.device
        self.device, self.dtype = device, dtype
        self.net = heads.on_device(device, dtype)
        ids = heads.vocab_ids.to(device)
        bias = getattr(out, "bias", None)
        if heads.own_outputs:  # the heads' own output layers replace the LM-head rows: no copy of them
            self.weight, self.bias = torch.empty(0, heads.hidden_size, device=device, dtype=dtype), None
        else:
            self.weight = out.weight.detach()[ids].to(dtype).contiguous()  # [Vk, H]
            self.bias = None if bias is None else bias.detach()[ids].to(dtype)
        self.embed = model.get_input_embeddings()
        self.vocab = heads.vocab_ids.numpy()  # host int64[Vk]
        self.temperatures = heads.temperature.tolist()  # per head / level, on the host
        self.lookup = {int(t): i for i, t in enumerate(self.vocab.tolist())}  # token -> vocabulary position

    def temperature(self, level: int) -> float:
        """The calibration temperature of head / level ``level`` (1-based; deeper levels use the last)."""
        return self.temperatures[min(level, len(self.temperatures)) - 1]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """float32[..., Vk] of features ``x`` [..., H] (in :attr:`dtype`)."""
        return nn.functional.linear(x, self.weight, self.bias).float()

    def embedding(self, vocab_index: torch.Tensor) -> torch.Tensor:
        """[N, H] in :attr:`dtype`: the model's input embeddings of the heads' vocabulary entries ``vocab_index``
        long[N]."""
        return self.embed(self.net.vocab_ids[vocab_index]).to(self.dtype)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """[N, H] in :attr:`dtype`: the model's input embeddings of token ids ``ids`` long[N] (on this device)."""
        return self.embed(ids).to(self.dtype)


_BOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(id(heads), dtype): (heads, Bound)}
_COSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {key: (base, per level) seconds}


def bind(heads: DraftHeads, model, dtype: torch.dtype = torch.float32) -> Bound:
    """``heads`` bound to ``model``, computing in ``dtype`` (made once per model, heads object and dtype; checked
    against the model's fingerprint)."""
    heads.check_model(model)
    kept = _BOUND.setdefault(model, {})
    entry = kept.get((id(heads), dtype))
    if entry is None or entry[0] is not heads:
        entry = kept[(id(heads), dtype)] = (heads, Bound(heads, model, dtype))
    return entry[1]


def heads_dtypes(setting: str, kind: str, device: torch.device, measured: bool) -> tuple[torch.dtype, ...]:
    """The dtypes a :class:`HeadsSource` may compute in (``HeadsSettings.dtype``): a fixed one's alone; for
    ``"auto"`` float32 and bfloat16 on a CPU when the cost is measured (the faster is kept: :func:`cheapest`), else
    float32. A context head (its cache, rotary positions and attention) always computes in float32.

    Example: ``heads_dtypes("auto", "feature", torch.device("cpu"), True)`` -> ``(float32, bfloat16)``."""
    fixed = DTYPES[setting]
    if kind == "context":
        return (torch.float32,)
    if fixed is not None:
        return (fixed,)
    if measured and device.type == "cpu":
        return torch.float32, torch.bfloat16
    return (torch.float32,)


def cheapest(costs: dict, depth: int):
    """The key of ``costs`` ({key: (base, per level) seconds}) whose tree ``depth`` levels deep costs least (the
    first of equals).

    Example: ``cheapest({"a": (0.0, 0.002), "b": (0.001, 0.0006)}, 6)`` -> ``"b"``."""
    return min(costs, key=lambda k: costs[k][0] + costs[k][1] * depth)


# ------------------------------------------------------------------------------------------------ source


@dataclass
class HeadsStats:
    """What the heads did in one call: ``proposals`` made and their ``nodes``; ``seconds`` spent drafting;
    ``reached``: per proposal, how deep its tree held the emitted tokens (the verdict, whether or not the
    budget verified those nodes); ``steps`` seen and ``drafting_steps``."""

    proposals: int = 0
    nodes: int = 0
    seconds: float = 0.0
    reached: list = field(default_factory=list)
    steps: int = 0
    drafting_steps: int = 0


class HeadsSource(DraftSource):
    """The draft source of :class:`DraftHeads` (origin ``heads``; see the module docstring).

    ``observe_hidden`` keeps the step's last verified row's hidden state (a context head: every accepted row's,
    for its cache of the answer's positions); ``propose`` drafts from it and the last emitted token; ``learn``
    checks how deep the last tree held the emitted tokens, which measures the per-depth acceptance ``a_j`` the
    pricing uses. A node's match bucket is its calibrated conditional
    probability (:func:`confidence_bucket`).
    """

    origin = HEADS
    wants_hidden = True
    priced = True
    prior = (2.0, 2.0)  # Beta prior (reached, missed) of each depth's conditional acceptance: 0.5
    decay = 0.98
    probe_every = (16, 256)
    transient = ("bound", "hidden", "cache")  # the binding to one model (device tensors, its modules), made at start
    wide_nodes = 2  # config.STEP_NODES_LEVELS

    def __init__(self, heads: DraftHeads, max_nodes: int, max_depth: int, topk: int = 8, width: int = 4,
                 cost: tuple[float, float] | None = None, dtype: str = "auto"):
        if dtype not in DTYPES:
            raise ValueError(f"HeadsSource dtype={dtype!r} is invalid: must be one of {tuple(DTYPES)}")
        self.heads, self.max_nodes, self.max_depth = heads, max_nodes, max_depth
        self.topk, self.width, self.given_cost, self.dtype = topk, width, cost, dtype
        self.cost = cost or (0.0, 0.0)
        self._model = None  # the model the cost is measured on (once per tree shape: :meth:`_price`)
        self.bound: Bound | None = None
        self.hidden: torch.Tensor | None = None
        self.cache: ContextCache | None = None  # a context head's answer so far
        self.last = -1
        self._tree: tuple[np.ndarray, np.ndarray] | None = None  # (tokens, parents) of the last proposal
        deepest = max(max_depth, WIDE_DEPTH)
        self._reach = np.zeros(deepest)  # decayed counts per depth: reached given the parent was
        self._tried = np.zeros(deepest)
        self._idle, self._probe = 0, self.probe_every[0]
        self.stats = HeadsStats()

    def limits(self) -> tuple[int, int]:
        """(nodes, depth) of this call's trees: in the widest steps twice the nodes and at least :data:`WIDE_DEPTH`
        deep (``DraftSource.limits``)."""
        nodes, depth = super().limits()
        return nodes, (max(depth, WIDE_DEPTH) if self.wide else depth)

    def paths(self) -> int:
        """The paths a feature or context head's tree expands per level in this call's steps."""
        return max(self.width, WIDE_WIDTH) if self.wide else self.width

    @property
    def alphas(self) -> np.ndarray:
        """float[max(max_depth, WIDE_DEPTH)]: measured P(the tree holds the emitted token at depth j | it held depth
        j - 1)."""
        a, b = self.prior
        return (self._reach + a) / (self._tried + a + b)

    def start(self, prompt: np.ndarray, model=None) -> None:
        if model is None:
            raise ValueError("trained draft heads need the target model at start")
        device = model.get_output_embeddings().weight.device
        dtypes = heads_dtypes(self.dtype, self.heads.kind, device, self.given_cost is None)
        self.bound = bind(self.heads, model, dtypes[0])  # raises ValueError for another model, before any forward
        self._model = model
        self._price()  # the tree as configured; a call of the widest steps prices its wider tree at its first step
        self.hidden = None
        self.cache = ContextCache() if self.heads.kind == "context" else None
        self.last = int(prompt[-1]) if len(prompt) else -1
        self._tree = None
        self._idle, self._probe = 0, self.probe_every[0]
        self.stats = HeadsStats()

    def observe_hidden(self, hidden) -> None:
        """``hidden`` float[a, H]: the accepted path's rows, the root's first (copies kept: the caller's untouched)."""
        if self.cache is not None:
            self.cache.observe(hidden.detach().clone())
        else:
            self.hidden = hidden[-1].detach().clone()  # float[H] on the model's device

    def seconds(self, depth) -> np.ndarray:
        """The heads' own seconds for a tree ``depth`` deep (an array of depths)."""
        base, per = self.cost
        return base + per * np.asarray(depth, dtype=np.float64)

    def _price(self) -> None:
        """The heads' own cost for the tree shape of this call's steps (:meth:`limits`, :meth:`paths`), measured
        once per model, shape and dtype (``measure_cost``) unless given; with several dtypes to choose from
        (:func:`heads_dtypes`), the heads compute in the one whose tree of this call's depth costs least."""
        if self.given_cost is not None or self._model is None:
            return
        costs = _COSTS.setdefault(self._model, {})
        h, device = self.heads, self.bound.device  # the cost depends on the heads' shapes and the tree's size
        shape = (h.kind, h.num_heads, h.hidden_size, h.ffn, len(h.vocab_ids), h.own_outputs, str(device),
                 *self.limits(), self.topk, self.paths())
        options = {}
        for dtype in heads_dtypes(self.dtype, h.kind, device, True):
            key = (*shape, dtype)
            if key not in costs:
                self.bound = bind(h, self._model, dtype)
                costs[key] = measure_cost(self)
            options[dtype] = costs[key]
        best = cheapest(options, self.limits()[1])
        self.bound, self.cost = bind(h, self._model, best), options[best]

    def priced_depth(self, depth: int, cost, margin: float = 1.05) -> int:
        """How deep to draft this step on the cost curve ``cost`` (a ``CostModel``; None: ``depth``), see the
        module docstring; a probe of at most 2 every so many steps while drafting does not pay."""
        if self.stats.steps == 0:  # this call's first step: its tree shape is known now
            self._price()
        self.stats.steps += 1
        depth = min(depth, self.limits()[1])
        if cost is None or depth <= 0:
            return depth
        d = np.arange(1, depth + 1)
        t1 = float(cost(1))
        gain = 1 + np.cumsum(np.cumprod(self.alphas[:depth]))
        rate = gain / (cost(1 + d) + self.seconds(d))
        if rate.max() * t1 >= margin:
            self._idle, self._probe = 0, self.probe_every[0]
            return int(d[int(np.argmax(rate))])
        self._idle += 1
        if self._idle >= self._probe:
            self._idle, self._probe = 0, min(2 * self._probe, self.probe_every[1])
            return min(depth, 2)
        return 0

    def propose(self, context: np.ndarray, max_nodes: int, max_depth: int) -> Proposal | None:
        """A tree from the last observed hidden state (None before the first one)."""
        if self.bound is None or (self.hidden is None and self.cache is None):
            return None
        most_nodes, deepest = self.limits()
        depth, nodes = min(max_depth, deepest), min(max_nodes, most_nodes)
        if depth <= 0 or nodes <= 0:
            return None
        last = int(context[-1]) if len(context) else self.last
        t = time.perf_counter()
        with torch.no_grad():
            if self.cache is not None:
                if not self.cache.flush(self.bound.net.context, self.bound.embed_tokens):
                    return None
                tokens, parents, cond = context_propose(self.bound, self.cache, nodes, depth, self.topk, self.paths())
            elif self.heads.kind == "medusa":
                tokens, parents, cond = medusa_propose(self.bound, self.hidden, nodes, depth, self.topk)
            else:
                tokens, parents, cond = feature_propose(self.bound, self.hidden, last, nodes, depth, self.topk,
                                                        self.paths())
        self.stats.seconds += time.perf_counter() - t
        if not len(tokens):
            return None
        self._tree = (tokens, parents)
        self.stats.proposals += 1
        self.stats.nodes += len(tokens)
        self.stats.drafting_steps += 1
        return Proposal(tokens, parents, confidence_bucket(cond))

    def learn(self, emitted: np.ndarray) -> None:
        if len(emitted):
            self.last = int(emitted[-1])
        if self.cache is not None and self.bound is not None:
            self.cache.learn(emitted, self.bound.device)
        if self._tree is None:
            return
        tokens, parents = self._tree
        self._tree = None
        reached = tree_reach(tokens, parents, np.asarray(emitted, dtype=np.int64))
        self.stats.reached.append(reached)
        depth = int(np.max(tree_depths(parents))) if len(parents) else 0
        tried = min(depth, reached + 1, len(emitted))  # depths whose parent the tree held
        self._reach *= self.decay
        self._tried *= self.decay
        self._tried[:tried] += 1
        self._reach[:reached] += 1

    def report(self) -> dict:
        """This call's figures (JSON-safe)."""
        s = self.stats
        return {"kind": self.heads.kind, "dtype": None if self.bound is None else str(self.bound.dtype).split(".")[-1],
                "cost_seconds": list(self.cost), "alphas": self.alphas.round(3).tolist(),
                "proposals": s.proposals, "nodes": s.nodes, "seconds": s.seconds, "steps": s.steps,
                "drafting_steps": s.drafting_steps,
                "mean_reached": float(np.mean(s.reached)) if s.reached else 0.0}


def tree_reach(tokens: np.ndarray, parents: np.ndarray, emitted: np.ndarray) -> int:
    """How many of ``emitted`` (from the first) a path of the tree (tokens, parents) spells.

    Example: tokens ``[5, 6, 7]``, parents ``[-1, -1, 1]``, emitted ``[6, 7, 9]`` -> 2."""
    node, reached = -1, 0
    for tok in emitted.tolist():
        kids = np.nonzero((parents == node) & (tokens == tok))[0]
        if not len(kids):
            break
        node, reached = int(kids[0]), reached + 1
    return reached


def medusa_propose(bound: Bound, hidden: torch.Tensor, max_nodes: int, max_depth: int, topk: int):
    """(tokens int64[n], parents int64[n] parent-first, conditional probabilities float[n]) of the Medusa
    heads' best-first tree after ``hidden`` float[H] (see :func:`best_first_tree`)."""
    net = bound.net
    depth = min(max_depth, net.num_heads)
    h = hidden.to(bound.weight.dtype)[None]  # [1, H]
    rows = net.medusa_hidden(h)[0, :depth]  # [d, H]
    logits = net.medusa_logits(rows, bound.weight, bound.bias).float() / net.temperature[:depth, None].float()  # [d, Vk]
    top = torch.softmax(logits, -1).topk(min(topk, logits.shape[-1]), -1)
    probs, ids = top.values.cpu().numpy(), top.indices.cpu().numpy()  # [d, k] each
    node_depth, index, parents = best_first_tree(probs, max_nodes, depth)
    tokens = bound.vocab[ids[node_depth - 1, index]]
    return tokens.astype(np.int64), parents, probs[node_depth - 1, index]


def feature_propose(bound: Bound, hidden: torch.Tensor, last: int, max_nodes: int, max_depth: int, topk: int,
                    width: int):
    """(tokens int64[n], parents int64[n] parent-first, conditional probabilities float[n]) of the feature
    head's tree after ``hidden`` float[H] and the last emitted token ``last`` (:func:`grow_tree`)."""
    net = bound.net

    def advance(level, feature, emb):
        feature = net.feature_step(feature, emb)  # [m, H]
        return feature, feature

    feature = hidden.to(bound.weight.dtype)[None]  # [1, H]
    return grow_tree(bound, feature, last_embedding(bound, last), advance, lambda state, rows: state[rows],
                     max_nodes, max_depth, topk, width)


def context_propose(bound: Bound, cache: ContextCache, max_nodes: int, max_depth: int, topk: int, width: int):
    """(tokens, parents, conditional probabilities) of the context head's tree after the answer ``cache`` holds
    (its newest position's input is the level-1 query; see ``context_head.py``), grown as :func:`grow_tree`
    grows the feature head's, each path's queries also attending to its own ancestors."""
    layer = bound.net.context
    keys, values = cache.keys[None], cache.values[None]  # [1, T, nh, hd]
    first = cache.count - 1  # the level-1 query's position

    def advance(level, state, emb):
        if state is None:  # level 1: the newest cached position's own input
            z = cache.last_input[None]  # [1, H]
            pos = torch.full((1,), first, device=z.device)
            attended = attend(layer.query(z, pos)[None], keys, values, None)[0]
            feature = layer.output(z, attended)
            empty = torch.zeros((1, 0) + keys.shape[2:], device=z.device, dtype=keys.dtype)
            return feature, (feature, empty, empty)
        feature, chain_k, chain_v = state  # [m, H], [m, c, nh, hd] x 2
        z = layer.inputs(feature, emb)
        pos = torch.full((z.shape[0],), first + level - 1, device=z.device)
        k, v = layer.keys(z, pos)
        chain_k, chain_v = torch.cat([chain_k, k[:, None]], 1), torch.cat([chain_v, v[:, None]], 1)
        attended = attend(layer.query(z, pos)[None], keys, values, None, chain_k[None], chain_v[None])[0]
        feature = layer.output(z, attended)
        return feature, (feature, chain_k, chain_v)

    def select(state, rows):
        return tuple(x[rows] for x in state)

    return grow_tree(bound, None, None, advance, select, max_nodes, max_depth, topk, width)


def last_embedding(bound: Bound, last: int) -> torch.Tensor:
    """float[1, H]: the model's input embedding of token ``last`` (through the heads' vocabulary when inside it)."""
    vocab_pos = bound.lookup.get(int(last), -1)
    if vocab_pos >= 0:
        return bound.embedding(torch.tensor([vocab_pos], device=bound.device))
    return bound.embed_tokens(torch.tensor([last], device=bound.device))  # outside it: straight from the model


def grow_tree(bound: Bound, state, emb, advance, select, max_nodes: int, max_depth: int, topk: int, width: int):
    """A tree grown level by level: ``advance(level, state, emb) -> (features float[m, H], state)`` gives each
    expanded path's next feature (``emb`` float[m, H]: the embeddings of the paths' last tokens; at level 1 the
    given ``state`` and ``emb``); the ``width`` best paths so far are expanded into their ``topk`` next tokens
    (``select(state, rows)``: the state of the chosen rows); the ``max_nodes`` best paths overall are kept.
    Returns (tokens int64[n], parents int64[n] parent-first, conditional probabilities float[n]). Everything
    stays on the device until one copy to the host at the end."""
    device = bound.device
    parent_scores = torch.zeros(1, device=device)  # [m] log-probability of each expanded path
    parent_index = torch.full((1,), -1, dtype=torch.long, device=device)  # [m] global node index
    levels_tok, levels_par, levels_logp, levels_score = [], [], [], []
    count = 0
    k = min(topk, len(bound.vocab))
    for level in range(1, max_depth + 1):
        feature, state = advance(level, state, emb)  # [m, H]
        logp = torch.log_softmax(bound.logits(feature) / bound.temperature(level), -1)  # [m, Vk]
        top = logp.topk(k, -1)
        scores = (parent_scores[:, None] + top.values).reshape(-1)  # [m * k]
        levels_tok.append(top.indices.reshape(-1))
        levels_par.append(parent_index.repeat_interleave(k))
        levels_logp.append(top.values.reshape(-1))
        levels_score.append(scores)
        if level == max_depth:
            break
        m = min(width, scores.shape[0])
        best = scores.topk(m).indices  # [m]
        state = select(state, best // k)
        emb = bound.embedding(levels_tok[-1][best])
        parent_scores = scores[best]
        parent_index = count + best
        count += scores.shape[0]
    tok = torch.cat(levels_tok).cpu().numpy()
    par = torch.cat(levels_par).cpu().numpy()
    cond = torch.cat(levels_logp).exp().cpu().numpy()
    score = torch.cat(levels_score).cpu().numpy()
    keep = select_best(score, par, max_nodes)
    new_index = np.full(len(tok), -1, np.int64)
    new_index[keep] = np.arange(len(keep))
    parents = np.where(par[keep] < 0, -1, new_index[np.maximum(par[keep], 0)])
    return bound.vocab[tok[keep]].astype(np.int64), parents, cond[keep]


def measure_cost(source: HeadsSource, repeats: int = 5, context: int = 128, accepted: int = 4) -> tuple[float, float]:
    """(base, per level) seconds of ``source``'s proposals, from the fastest of ``repeats`` timings of a
    depth-1 and a full-depth tree on a random hidden state (once per model: :meth:`HeadsSource.start`). A context
    head drafts after ``context`` cached positions, and each timed proposal first caches ``accepted`` new ones,
    as after a step that accepted that many tokens."""
    bound = source.bound
    gen = torch.Generator().manual_seed(0)
    h = source.heads.hidden_size
    saved = source.hidden, source.cache
    source.hidden = torch.randn(h, generator=gen).to(bound.device)
    vocab = torch.as_tensor(bound.vocab)
    if source.heads.kind == "context":
        source.cache = ContextCache()

    def queue(n):  # n accepted rows and their tokens, as a step hands them over
        if source.cache is not None:
            source.cache.observe(torch.randn(n, h, generator=gen).to(bound.device))
            source.cache.learn(vocab[torch.randint(0, len(vocab), (n,), generator=gen)].numpy(), bound.device)

    queue(context)
    sync = torch.cuda.synchronize if bound.device.type == "cuda" else (lambda: None)
    most_nodes, full = source.limits()
    best = {}
    stats = source.stats
    try:
        for depth in (1, full):
            for _ in range(repeats):
                queue(accepted)
                sync()
                t = time.perf_counter()
                source.propose(np.array([0], np.int64), most_nodes, depth)
                sync()
                best[depth] = min(best.get(depth, float("inf")), time.perf_counter() - t)
    finally:
        (source.hidden, source.cache), source._tree, source.stats = saved, None, stats
    per = max(best[full] - best[1], 0.0) / max(full - 1, 1)
    return max(best[1] - per, 0.0), per
