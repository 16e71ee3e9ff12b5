"""`HeadsSource`: the heads as a draft source, a tree from the last accepted hidden state each step: Medusa heads'
per-depth top-k lists combined best first (:func:`best_first_tree`), or a feature / context head's levels grown from
the ``width`` best paths (:func:`grow_tree`), scored by calibrated path log-probabilities. Priced (``Probing``) by
the measured per-depth acceptance and the heads' own seconds ``base + depth * per_level``."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import weakref

import numpy as np
import torch
from torch import nn

from ..drafting.draft import HEADS
from ..drafting.sources import DraftSource, Proposal
from ..drafting.trees import tree_depth_rank
from ..passes import Probing
from .context import ContextCache

DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}  # "auto": chosen by measurement
WIDE_DEPTH, WIDE_WIDTH = 10, 12  # in the widest steps (DraftSource.wide): trees at least this deep and this wide
PRIOR, DECAY = (2.0, 2.0), 0.98  # Beta prior (reached, missed) of each depth's acceptance; per-step decay of the counts


def best_first_tree(probs: np.ndarray, max_nodes: int, max_depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``max_nodes`` most probable paths through independent per-depth candidate lists ``probs`` float[K, k]
    (row ``d``: depth ``d + 1``'s, sorted descending) as a tree, parent-first, best first: (depth int64[n], 1-based;
    index int64[n] into its depth's list; parents int64[n], -1 for the root's children)."""
    depth_cap = min(max_depth, probs.shape[0])
    if max_nodes <= 0 or depth_cap <= 0 or probs.shape[1] == 0:
        return (np.zeros(0, np.int64),) * 3
    out, order = [], itertools.count(1)
    heap = [(-float(probs[0, 0]), 0, 1, 0, -1, 1.0)]  # (-score, order, depth, index, parent node, parent score)
    while heap and len(out) < max_nodes:
        neg, _, d, i, parent, parent_score = heapq.heappop(heap)
        out.append((d, i, parent))
        if i + 1 < probs.shape[1]:  # the next sibling
            heapq.heappush(heap, (-parent_score * float(probs[d - 1, i + 1]), next(order), d, i + 1, parent,
                                  parent_score))
        if d < depth_cap:  # the first child
            heapq.heappush(heap, (neg * float(probs[d, 0]), next(order), d + 1, 0, len(out) - 1, -neg))
    return tuple(np.ascontiguousarray(column) for column in np.array(out, np.int64).T)


def select_best(scores: np.ndarray, parents: np.ndarray, max_nodes: int) -> np.ndarray:
    """Indices (sorted) of the ``max_nodes`` best-scored nodes of a parent-first tree whose scores never rise from
    parent to child; ties keep the earlier node, so the set is closed under parents."""
    if len(scores) <= max_nodes:
        return np.arange(len(scores))
    keep = np.sort(np.argsort(-scores, kind="stable")[:max_nodes])
    inside = np.zeros(len(scores), bool)
    inside[keep] = True
    return keep[(parents[keep] < 0) | inside[np.maximum(parents[keep], 0)]]  # a float tie may only drop a child


def confidence_bucket(p: np.ndarray, edges: tuple[float, float] = (0.25, 0.6)) -> np.ndarray:
    """int64[n] match buckets of probabilities ``p``: 1 below ``edges[0]``, 2 below ``edges[1]``, else 3."""
    return 1 + (np.asarray(p) >= edges[0]).astype(np.int64) + (np.asarray(p) >= edges[1])


def tree_reach(tokens: np.ndarray, parents: np.ndarray, emitted: np.ndarray) -> int:
    """How many of ``emitted`` (from the first) a path of the tree spells."""
    node, reached = -1, 0
    for tok in emitted.tolist():
        kids = np.nonzero((parents == node) & (tokens == tok))[0]
        if not len(kids):
            break
        node, reached = int(kids[0]), reached + 1
    return reached


class Bound:
    """Heads bound to one model on its output layer's device, computing in ``dtype``: their copy there (``net``),
    the LM-head rows of their vocabulary (``weight`` [Vk, H], ``bias``), the model's input embedding. Logits come
    out float32 whatever ``dtype``."""

    def __init__(self, heads, model, dtype: torch.dtype = torch.float32):
        out = model.get_output_embeddings()
        device = self.device = out.weight.device
        self.dtype, self.net = dtype, heads.on_device(device, dtype)
        ids, bias = heads.vocab_ids.to(device), getattr(out, "bias", None)
        if heads.own_outputs:  # the heads' own output layers replace the LM-head rows
            self.weight, self.bias = torch.empty(0, heads.hidden_size, device=device, dtype=dtype), None
        else:
            self.weight = out.weight.detach()[ids].to(dtype).contiguous()
            self.bias = None if bias is None else bias.detach()[ids].to(dtype)
        self.embed = model.get_input_embeddings()
        self.vocab = heads.vocab_ids.numpy()  # host int64[Vk]
        self.temperatures = heads.temperature.tolist()

    def temperature(self, level: int) -> float:  # of head / level ``level`` (1-based; deeper levels: the last)
        return self.temperatures[min(level, len(self.temperatures)) - 1]

    def logits(self, x: torch.Tensor) -> torch.Tensor:  # float32[..., Vk] of features [..., H]
        return nn.functional.linear(x, self.weight, self.bias).float()

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:  # [N, H] of token ids long[N]
        return self.embed(ids).to(self.dtype)


_LOCK = threading.RLock()  # the per-model tables below: the first concurrent calls of a model bind and measure once
_BOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(id(heads), dtype): (heads, Bound)}
_COSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {tree shape + dtype: (base, per level)}


def bind(heads, model, dtype: torch.dtype = torch.float32) -> Bound:
    """``heads`` bound to ``model`` in ``dtype``, made once per model, heads and dtype; ValueError for another model."""
    heads.check_model(model)
    with _LOCK:
        kept = _BOUND.setdefault(model, {})
        entry = kept.get((id(heads), dtype))
        if entry is None or entry[0] is not heads:
            entry = kept[(id(heads), dtype)] = (heads, Bound(heads, model, dtype))
        return entry[1]


def heads_dtypes(setting: str, kind: str, device: torch.device, measured: bool) -> tuple[torch.dtype, ...]:
    """The dtypes a source may compute in: a fixed one's alone; for ``"auto"`` float32 and bfloat16 on a CPU when
    the cost is measured (the cheaper is kept), else float32; a context head always float32."""
    if kind == "context":
        return (torch.float32,)
    if DTYPES[setting] is not None:
        return (DTYPES[setting],)
    return (torch.float32, torch.bfloat16) if measured and device.type == "cpu" else (torch.float32,)


class HeadsSource(Probing, DraftSource):
    """The draft source of :class:`DraftHeads`: drafts from the last accepted row (a context head: from its cache of
    every row) and the last token; learns how deep each tree held the emitted tokens. Match bucket: a node's
    calibrated conditional probability."""

    origin = HEADS
    wants_hidden = priced = True
    wide_nodes = 2
    transient = ("bound", "hidden", "cache", "_model")

    def __init__(self, heads, max_nodes: int, max_depth: int, topk: int = 8, width: int = 4,
                 cost: tuple[float, float] | None = None, dtype: str = "auto"):
        if dtype not in DTYPES:
            raise ValueError(f"HeadsSource dtype={dtype!r} is invalid: must be one of {tuple(DTYPES)}")
        self.heads, self.max_nodes, self.max_depth = heads, max_nodes, max_depth
        self.topk, self.width, self.given_cost, self.dtype = topk, width, cost, dtype
        self.cost = cost or (0.0, 0.0)
        self._model = self.bound = self.hidden = self.cache = self._tree = None  # _model: a weak reference
        self._reach, self._tried = np.zeros((2, max(max_depth, WIDE_DEPTH)))  # per depth, decayed: reached, tried
        self._reset(-1)

    def _reset(self, last: int) -> None:
        self.last, self.hidden, self._tree = last, None, None
        self.stats = {"steps": 0, "proposals": 0, "nodes": 0, "seconds": 0.0, "reached": []}
        self.reset_probes()

    def limits(self) -> tuple[int, int]:
        """(nodes, depth): in the widest steps twice the nodes, at least :data:`WIDE_DEPTH` deep."""
        nodes, depth = super().limits()
        return nodes, (max(depth, WIDE_DEPTH) if self.wide else depth)

    def paths(self) -> int:
        """Paths a feature or context head expands per level in this call's steps."""
        return max(self.width, WIDE_WIDTH) if self.wide else self.width

    @property
    def alphas(self) -> np.ndarray:
        """float[max(max_depth, WIDE_DEPTH)]: P(the tree holds depth j's emitted token | it held depth j - 1)."""
        a, b = PRIOR
        return (self._reach + a) / (self._tried + a + b)

    def start(self, prompt: np.ndarray, model=None) -> None:
        if model is None:
            raise ValueError("trained draft heads need the target model at start")
        device = model.get_output_embeddings().weight.device
        dtypes = heads_dtypes(self.dtype, self.heads.kind, device, self.given_cost is None)
        self.bound = bind(self.heads, model, dtypes[0])  # ValueError for another model, before any forward
        self._model = weakref.ref(model)
        self._price()  # this call's widest steps price their tree at the first step
        self.cache = ContextCache() if self.heads.kind == "context" else None
        self._reset(int(prompt[-1]) if len(prompt) else -1)

    def observe_hidden(self, hidden) -> None:
        """``hidden`` float[a, H]: the accepted path's final hidden states, the root's first (copies are kept)."""
        if self.cache is not None:
            self.cache.observe(hidden.detach().clone())
        else:
            self.hidden = hidden[-1].detach().clone()

    def _price(self) -> None:
        """The heads' own cost for this call's tree shape, measured once per model, shape and dtype unless given;
        with several dtypes to choose from, they compute in the one whose tree of this call's depth costs least."""
        model = self._model() if self._model is not None else None
        if self.given_cost is not None or model is None:
            return
        h, device = self.heads, self.bound.device
        shape = (h.kind, h.num_heads, h.hidden_size, h.ffn, len(h.vocab_ids), h.own_outputs, str(device),
                 *self.limits(), self.topk, self.paths())
        options = {}
        with _LOCK:
            costs = _COSTS.setdefault(model, {})
            for dtype in heads_dtypes(self.dtype, h.kind, device, True):
                if (*shape, dtype) not in costs:
                    self.bound = bind(h, model, dtype)
                    costs[(*shape, dtype)] = measure_cost(self)
                options[dtype] = costs[(*shape, dtype)]
        depth = self.limits()[1]
        best = min(options, key=lambda k: options[k][0] + options[k][1] * depth)  # the first of equals
        self.bound, self.cost = bind(h, model, best), options[best]

    def priced_depth(self, depth: int, cost, margin: float = 1.05) -> int:
        """How deep to draft this step on the cost curve ``cost`` (None: ``depth``); 0: not at all."""
        if self.stats["steps"] == 0:  # this call's first step: its tree shape is known now
            self._price()
        self.stats["steps"] += 1
        depth = min(depth, self.limits()[1])
        if cost is None or depth <= 0:
            return depth
        d = np.arange(1, depth + 1)
        return self.pick_depth(np.cumprod(self.alphas[:depth]), self.cost[0] + self.cost[1] * d, cost, margin)

    def propose(self, context: np.ndarray, max_nodes: int, max_depth: int) -> Proposal | None:
        """A tree from the last observed hidden state (None before the first one)."""
        if self.bound is None or (self.hidden is None and self.cache is None):
            return None
        most_nodes, deepest = self.limits()
        depth, nodes = min(max_depth, deepest), min(max_nodes, most_nodes)
        if depth <= 0 or nodes <= 0:
            return None
        bound, last = self.bound, int(context[-1]) if len(context) else self.last
        t = time.perf_counter()
        with torch.no_grad():
            if self.cache is not None:
                if not self.cache.flush(bound.net.context, bound.embed_tokens):
                    return None
                tokens, parents, cond = context_propose(bound, self.cache, nodes, depth, self.topk, self.paths())
            elif self.heads.kind == "medusa":
                tokens, parents, cond = medusa_propose(bound, self.hidden, nodes, depth, self.topk)
            else:
                tokens, parents, cond = feature_propose(bound, self.hidden, last, nodes, depth, self.topk, self.paths())
        self.stats["seconds"] += time.perf_counter() - t
        if not len(tokens):
            return None
        self._tree = (tokens, parents)
        self.stats["proposals"] += 1
        self.stats["nodes"] += len(tokens)
        return Proposal(tokens, parents, confidence_bucket(cond))

    def learn(self, emitted: np.ndarray) -> None:
        if len(emitted):
            self.last = int(emitted[-1])
        if self.cache is not None and self.bound is not None:
            self.cache.learn(emitted, self.bound.device)
        if self._tree is None:
            return
        (tokens, parents), self._tree = self._tree, None
        reached = tree_reach(tokens, parents, np.asarray(emitted, dtype=np.int64))
        self.stats["reached"].append(reached)
        deepest = int(tree_depth_rank(parents)[0].max()) if len(parents) else 0
        tried = min(deepest, reached + 1, len(emitted))  # depths whose parent the tree held
        self._reach *= DECAY
        self._tried *= DECAY
        self._tried[:tried] += 1
        self._reach[:reached] += 1

    def report(self) -> dict:
        """This call's figures (JSON-safe)."""
        s = self.stats
        return {"kind": self.heads.kind, "dtype": None if self.bound is None else str(self.bound.dtype).split(".")[-1],
                "cost_seconds": list(self.cost), "alphas": self.alphas.round(3).tolist(),
                **{k: s[k] for k in ("proposals", "nodes", "seconds", "steps")},
                "mean_reached": float(np.mean(s["reached"])) if s["reached"] else 0.0}


def medusa_propose(bound: Bound, hidden: torch.Tensor, max_nodes: int, max_depth: int, topk: int):
    """(tokens int64[n], parents int64[n], conditional probabilities float[n]) of the Medusa heads' best-first tree
    after ``hidden`` float[H]."""
    net = bound.net
    depth = min(max_depth, net.num_heads)
    rows = net.medusa_hidden(hidden.to(bound.weight.dtype)[None])[0, :depth]  # [d, H]
    logits = net.medusa_logits(rows, bound.weight, bound.bias).float() / net.temperature[:depth, None].float()
    top = torch.softmax(logits, -1).topk(min(topk, logits.shape[-1]), -1)
    probs, ids = top.values.cpu().numpy(), top.indices.cpu().numpy()  # [d, k] each
    node_depth, index, parents = best_first_tree(probs, max_nodes, depth)
    return bound.vocab[ids[node_depth - 1, index]].astype(np.int64), parents, probs[node_depth - 1, index]


def feature_propose(bound: Bound, hidden: torch.Tensor, last: int, max_nodes: int, max_depth: int, topk: int,
                    width: int):
    """The feature head's tree (as :func:`medusa_propose`) after ``hidden`` float[H] and the last token ``last``."""
    emb = bound.embed_tokens(torch.tensor([last], device=bound.device))
    return grow_tree(bound, hidden.to(bound.weight.dtype)[None], emb,
                     lambda level, feature, emb: (bound.net.feature_step(feature, emb),) * 2,
                     lambda feature, rows: feature[rows], max_nodes, max_depth, topk, width)


def context_propose(bound: Bound, cache: ContextCache, max_nodes: int, max_depth: int, topk: int, width: int):
    """The context head's tree after the answer ``cache`` holds (its newest position's input is the level-1 query),
    each path's queries also attending to its own ancestors' keys."""
    layer = bound.net.context
    keys, values = cache.keys[None], cache.values[None]  # [1, T, nh, hd]

    def advance(level, state, emb):  # state: (features [1, m, H], and from level 2 chain keys, values)
        pos = torch.full((1, 1 if state is None else len(emb)), cache.count + level - 2, device=keys.device)
        if state is None:  # level 1: the newest cached position's own input
            feature, chain = layer.step(cache.last_input[None, None], pos, keys, values), ()
        else:
            feature, chain = layer.chain_step(state[0], emb[None], pos, keys, values, None, state[1:] or None)
        return feature[0], (feature, *chain)

    return grow_tree(bound, None, None, advance, lambda state, rows: tuple(x[:, rows] for x in state), max_nodes,
                     max_depth, topk, width)


def grow_tree(bound: Bound, state, emb, advance, select, max_nodes: int, max_depth: int, topk: int, width: int):
    """A tree grown level by level. ``advance(level, state, emb) -> (features float[m, H], state)`` gives each
    expanded path's next feature (``emb`` float[m, H]: its last token's embedding); the ``width`` best paths so far
    are expanded into their ``topk`` next tokens (``select(state, rows)``: the state of those rows); the
    ``max_nodes`` best nodes overall are kept. Returns (tokens, parents, conditional probabilities)."""
    device = bound.device
    parent_scores = torch.zeros(1, device=device)  # [m]: log-probability of each expanded path
    parent_index = torch.full((1,), -1, dtype=torch.long, device=device)  # [m]: its node index
    levels = []  # per level: (vocabulary positions, parents, log-probabilities, path scores), each [m * k]
    count, k = 0, min(topk, len(bound.vocab))
    for level in range(1, max_depth + 1):
        feature, state = advance(level, state, emb)
        top = torch.log_softmax(bound.logits(feature) / bound.temperature(level), -1).topk(k, -1)  # [m, k]
        scores = (parent_scores[:, None] + top.values).reshape(-1)
        levels.append((top.indices.reshape(-1), parent_index.repeat_interleave(k), top.values.reshape(-1), scores))
        if level == max_depth:
            break
        best = scores.topk(min(width, scores.shape[0])).indices
        state, emb = select(state, best // k), bound.embed_tokens(bound.net.vocab_ids[levels[-1][0][best]])
        parent_scores, parent_index = scores[best], count + best
        count += scores.shape[0]
    tok, par, logp, score = (torch.cat(x) for x in zip(*levels))
    tok, par, cond, score = (x.cpu().numpy() for x in (tok, par, logp.exp(), score))
    keep = select_best(score, par, max_nodes)
    new_index = np.full(len(tok), -1, np.int64)
    new_index[keep] = np.arange(len(keep))
    parents = np.where(par[keep] < 0, -1, new_index[np.maximum(par[keep], 0)])
    return bound.vocab[tok[keep]].astype(np.int64), parents, cond[keep]


def measure_cost(source: HeadsSource, repeats: int = 5, context: int = 128, accepted: int = 4) -> tuple[float, float]:
    """(base, per level) seconds of ``source``'s proposals: the fastest of ``repeats`` depth-1 and full-depth trees
    on random hidden states (a context head's after ``context`` cached positions, and ``accepted`` new ones each)."""
    bound, h = source.bound, source.heads.hidden_size
    gen = torch.Generator().manual_seed(0)
    saved = source.hidden, source.cache, source.stats
    source.hidden = torch.randn(h, generator=gen).to(bound.device)
    source.cache = ContextCache() if source.heads.kind == "context" else None
    source.stats = dict(saved[2], reached=[])
    vocab = torch.as_tensor(bound.vocab)

    def queue(n):  # n accepted rows and their tokens, as a step hands them over
        if source.cache is not None:
            source.cache.observe(torch.randn(n, h, generator=gen).to(bound.device))
            source.cache.learn(vocab[torch.randint(0, len(vocab), (n,), generator=gen)].numpy(), bound.device)

    queue(context)
    sync = torch.cuda.synchronize if bound.device.type == "cuda" else (lambda: None)
    most_nodes, full = source.limits()
    best = {}
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
        (source.hidden, source.cache, source.stats), source._tree = saved, None
    per = max(best[full] - best[1], 0.0) / max(full - 1, 1)
    return max(best[1] - per, 0.0), per
