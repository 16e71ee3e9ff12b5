"""Draft passes (``LookaheadDecoder(draft=...)``): a cheaper forward drafts a greedy chain, which the target verifies
in its one forward per step. Greedy drafts are deterministic given the context: point-mass acceptance is exact."""
from __future__ import annotations

import threading
import time
import weakref

import numpy as np
import torch
from torch import nn

from .._tuning import DEFAULT, Tuning
from ..compat import crop_cache
from ..drafting.draft import DRAFT_MODEL, EARLY_EXIT, LAYER_SKIP, LOW_RANK
from ..drafting.sources import DraftSource, Proposal
from . import drafters
from .drafters import ModelDrafter, check_draft_model, truncated_copy

__all__ = ["DraftPassSource", "Probing", "check_draft_model", "draft_source", "self_drafter", "truncated_copy"]

SELF_ORIGINS = {"layer-skip": LAYER_SKIP, "early-exit": EARLY_EXIT, "low-rank": LOW_RANK}

_LOCK = threading.Lock()  # guards _BUILT and every drafter's measured ratio
_BUILT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # target -> {(kind, size): (drafter, info)}


def draft_source(draft, tuning: Tuning = DEFAULT) -> DraftPassSource:
    """The source for ``draft=`` (a name of :data:`SELF_ORIGINS`, a causal LM with the target's tokenizer, or a
    function ``target -> causal LM``), shaped by the tuning's ``self_draft_size``, ``draft_*`` fields."""
    if not (draft in SELF_ORIGINS if isinstance(draft, str) else callable(draft)):
        raise ValueError(f"draft must be one of {tuple(SELF_ORIGINS)}, a causal LM or a function target -> causal LM;"
                         f" got {draft!r}")
    t = tuning
    for name, ok, why in (("self_draft_size", t.self_draft_size <= 1, "in [0, 1] (0: chosen by calibration)"),
                          ("draft_depth", 1 <= t.draft_depth <= 64, "in [1, 64]"),
                          ("draft_branches", 1 <= t.draft_branches <= 8, "in [1, 8]"),
                          ("draft_cost", t.draft_cost <= 100, "in [0, 100] (0: measured)")):
        if not ok:
            raise ValueError(f"Tuning.{name}={getattr(t, name)!r} is invalid: must be {why}")
    return DraftPassSource(draft, t.draft_depth, t.draft_branches, t.draft_cost, t.self_draft_size, t.margin)


def self_drafter(target, kind: str, size: float, prompt: np.ndarray) -> tuple[object, dict]:
    """(drafter, info) of ``kind`` for ``target``, built once per target, kind and size in the process and shared:
    at ``size``, or when it is 0 chosen by :func:`~lookahead.passes.drafters.calibrate` on the last 64 tokens of a
    first prompt of at least 8 (else the middle candidate)."""
    with _LOCK:
        built = _BUILT.setdefault(target, {})
        if (kind, size) not in built:
            drafters.check_llama_family(target)
            if size or len(prompt) < 8:
                chosen = size or drafters.CANDIDATE_SIZES[kind][1]
                drafter, layers = drafters.build(target, kind, chosen)
                built[kind, size] = (drafter, {"size": chosen, "layers": layers})
            else:
                ids = torch.as_tensor(np.ascontiguousarray(prompt[-64:]))[None].to(next(target.parameters()).device)
                info, drafter = drafters.calibrate(target, kind, ids)
                built[kind, size] = (drafter, info)
        return built[kind, size]


class Probing:
    """How deep a priced source drafts (:meth:`pick_depth`); while nothing pays, a depth-2 probe after
    ``probe_every[0]`` steps, the wait doubling up to ``probe_every[1]``, keeps the acceptance measured."""

    probe_every = (16, 256)

    def reset_probes(self) -> None:
        self._idle, self._probe = 0, self.probe_every[0]

    def pick_depth(self, gains: np.ndarray, seconds: np.ndarray, cost, margin: float) -> int:
        """The depth ``d`` maximising ``(1 + gains[:d].sum()) / (cost(1 + d) + seconds[d - 1])`` (``gains[j - 1]``:
        the chance depth ``j``'s token is accepted) if it beats a plain step by ``margin``, else 0."""
        d = np.arange(1, len(gains) + 1)
        rate = (1 + np.cumsum(gains)) / (cost(1 + d) + seconds)
        if rate.max() * float(cost(1)) >= margin:
            self.reset_probes()
            return int(d[int(np.argmax(rate))])
        self._idle += 1
        if self._idle < self._probe:
            return 0
        self._idle, self._probe = 0, min(2 * self._probe, self.probe_every[1])
        return min(len(gains), 2)


# a call's figures; tried / accepted: chain tokens whose verdict the emitted tokens tell, verified or not
STATS = ("forwards", "seconds", "proposed", "tried", "accepted", "steps", "drafting_steps")


class DraftPassSource(Probing, DraftSource):
    """Runs a drafter from its own KV cache: a greedy chain ``depth`` deep with the ``branches - 1`` runner-ups at
    each depth as leaves. Depth ``d`` gains ``a + ... + a^d`` tokens (``a``: measured acceptance) for ``d`` draft
    forwards of ``cost`` target forwards each (0: measured); ``size``: the self draft's (0: calibrated)."""

    priced = True
    prior = (3.0, 2.0)  # Beta prior (accepted, rejected) of a: 0.6, before anything is tried
    decay = 0.98
    transient = ("drafter", "cache", "_built")

    def __init__(self, draft, depth: int, branches: int = 1, cost: float = 0.0, size: float = 0.0,
                 margin: float = DEFAULT.margin):
        self.draft, self.size, self.branches, self.cost_ratio, self.margin = draft, size, branches, cost, margin
        self.origin = SELF_ORIGINS[draft] if isinstance(draft, str) else DRAFT_MODEL
        self.max_depth, self.max_nodes = depth, depth * branches
        self.drafter = self.cache = self._built = None  # _built: (weakref to the target, its ModelDrafter)
        self.info: dict = {}
        self.ratio = cost or 0.5
        self.hopeless = False
        self._acc = self._tried = 0.0
        self._reset()

    def _reset(self, context=()) -> None:
        self.stats = dict.fromkeys(STATS, 0)
        self.reset_probes()
        self.tokens = [int(t) for t in context]
        self.cached: list[int] = []  # the tokens whose keys and values the drafter's cache holds, in order
        self.chain: list[int] = []

    @property
    def alpha(self) -> float:
        """Measured P(chain token accepted | its parent was), shrunk to the prior."""
        a, b = self.prior
        return (self._acc + a) / (self._tried + a + b)

    def start(self, prompt: np.ndarray, model=None) -> None:
        if model is None:
            raise ValueError("a draft pass needs the target model at start")
        if isinstance(self.draft, str):
            self.drafter, self.info = self_drafter(model, self.draft, self.size, prompt)
        else:
            if self._built is None or self._built[0]() is not model:
                draft = self.draft if isinstance(self.draft, nn.Module) else self.draft(model)
                check_draft_model(draft, model)
                self._built = (weakref.ref(model), ModelDrafter(draft))
            self.drafter = self._built[1]
            self.info = {"draft_model": type(self.drafter.model).__name__,
                         "layers": getattr(self.drafter.model.config, "num_hidden_layers", None)}
        self.ratio = self.cost_ratio
        if not self.ratio:
            with _LOCK:
                if self.drafter.ratio is None:
                    self.drafter.ratio = drafters.measure_cost_ratio(model, self.drafter)
                self.ratio = self.drafter.ratio
        agreement = self.info.get("agreement")  # one that cannot pay even with free verification: no draft, no probe
        self.hopeless = agreement is not None and drafters.modelled_speed(agreement, self.ratio) < self.margin
        self.cache = self.drafter.new_cache()
        self._reset(prompt)

    def priced_depth(self, depth: int, cost, margin: float = DEFAULT.margin) -> int:
        """How deep to draft this step on the cost curve ``cost`` (a ``CostModel``; None: ``depth``)."""
        if cost is None or depth <= 0:
            return depth
        d = np.arange(1, depth + 1)
        return 0 if self.hopeless else self.pick_depth(self.alpha ** d, d * self.ratio * float(cost(1)), cost, margin)

    def _forward(self, ids: list[int]) -> torch.Tensor:
        t = time.perf_counter()
        logits = self.drafter.forward(torch.tensor([ids], device=self.drafter.device), len(self.cached), self.cache)
        self.cached.extend(ids)
        self.stats["forwards"] += 1
        self.stats["seconds"] += time.perf_counter() - t
        return logits

    def propose(self, context: np.ndarray, max_nodes: int, max_depth: int) -> Proposal | None:
        """A chain with its runner-ups, breadth-first; ``context`` is not read (the source keeps the whole one)."""
        depth = min(max_depth, max_nodes // self.branches)
        self.stats["steps"] += 1
        if depth <= 0 or self.drafter is None:
            return None
        if len(self.cached) >= len(self.tokens):  # a stop cut the emitted tokens inside the chain: re-feed the last
            crop_cache(self.cache, len(self.cached) - len(self.tokens) + 1)
            del self.cached[len(self.tokens) - 1:]
        logits = self._forward(self.tokens[len(self.cached):])
        tokens, shares = [], []
        for level in range(depth):
            top = torch.topk(torch.softmax(logits, -1), self.branches)
            tokens += top.indices.tolist()
            shares += top.values.tolist()
            if level + 1 < depth:
                logits = self._forward([tokens[-self.branches]])
        self.chain = tokens[:: self.branches]
        self.stats["proposed"] += depth
        self.stats["drafting_steps"] += 1
        # each level's nodes hang from the previous level's first node
        parents = np.repeat([-1, *range(0, (depth - 1) * self.branches, self.branches)], self.branches)
        match = np.digitize(shares, (0.4, 0.8)) + 1  # >= 0.8: 3, >= 0.4: 2, else 1
        return Proposal(np.array(tokens, dtype=np.int64), parents.astype(np.int64), match.astype(np.int64))

    def learn(self, emitted: np.ndarray) -> None:
        emitted = [int(t) for t in emitted]
        if self.chain:
            accepted = _common_prefix(self.chain, emitted)
            tried = accepted + (accepted < min(len(self.chain), len(emitted)))
            self._acc = self.decay * self._acc + accepted
            self._tried = self.decay * self._tried + tried
            self.stats["tried"] += tried
            self.stats["accepted"] += accepted
            self.chain = []
        old = len(self.tokens)
        self.tokens.extend(emitted)
        if len(self.cached) > old:  # drafted tokens are cached: keep those the context shares
            keep = old + _common_prefix(self.cached[old:], emitted)
            if keep < len(self.cached):
                crop_cache(self.cache, len(self.cached) - keep)
                del self.cached[keep:]


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
