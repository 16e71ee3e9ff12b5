"""Decoding methods compared by the benchmark, by name.

``METHODS`` maps a name to a factory ``() -> Method``. A method is the extra keyword arguments it adds
to ``model.generate`` plus, for LookaheadDecoder, the decoder (whose ``stats`` the runner reads after
each call). Add a method by adding a factory::

    METHODS["lookahead-wide"] = lambda: lookahead_method("lookahead-wide", LookaheadConfig(tree_nodes=32))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

BASELINE = "plain"


@dataclass
class Method:
    name: str
    description: str
    settings: dict = field(default_factory=dict)  # what a reader needs to reproduce it, JSON-safe
    generate_kwargs: dict = field(default_factory=dict)  # added to every generate call
    decoder: Any = None  # a LookaheadDecoder, whose .stats describe its last call
    factory: Callable[[], Method] | None = field(default=None, repr=False)  # makes a fresh instance

    def fresh(self) -> Method:
        """A new instance (a decoder that has learnt nothing yet), or this one when there is no factory."""
        if self.factory is None:
            return self
        m = self.factory()
        m.name, m.factory = self.name, self.factory
        return m

    def kwargs(self) -> dict:
        kw = dict(self.generate_kwargs)
        if self.decoder is not None:
            kw["custom_generate"] = self.decoder
        return kw


def plain() -> Method:
    return Method(BASELINE, "plain model.generate (one target call per token)")


def plain_again() -> Method:
    """Plain ``generate`` a second time: an A/A control. Its speed-up against ``plain`` is 1 but for
    timing noise, so its spread over prompts shows how far a per-prompt ratio can move by chance."""
    return Method("plain-again", "plain model.generate again (A/A control: the timing noise floor)")


def prompt_lookup(num_tokens: int = 10) -> Method:
    return Method(
        "prompt-lookup",
        f"transformers prompt lookup decoding, prompt_lookup_num_tokens={num_tokens}",
        settings={"prompt_lookup_num_tokens": num_tokens},
        generate_kwargs={"prompt_lookup_num_tokens": num_tokens},
    )


def lookahead_method(name: str, config=None, description: str | None = None) -> Method:
    from lookahead import LookaheadConfig, LookaheadDecoder

    config = config if config is not None else LookaheadConfig()
    settings = dataclasses.asdict(config)
    text = ", ".join(f"{k}={v}" for k, v in settings.items())
    return Method(name, description or f"LookaheadDecoder({text})", settings=settings,
                  decoder=LookaheadDecoder(config))


def _lookahead_small() -> Method:
    from lookahead import LookaheadConfig

    return lookahead_method("lookahead-small", LookaheadConfig(tree_nodes=6, tree_depth=4))


def _lookahead_window() -> Method:
    from lookahead import LookaheadConfig

    return lookahead_method("lookahead-window", LookaheadConfig(window_width=4))


def _lookahead_fixed() -> Method:
    from lookahead import LookaheadConfig

    return lookahead_method("lookahead-fixed", LookaheadConfig(adaptive=False))


def _no_drafts() -> Method:
    from lookahead import LookaheadConfig

    return lookahead_method("no-drafts", LookaheadConfig(tree_nodes=0, copy_nodes=0, recycle_k=0))


ALONE = dict(tree_nodes=0, copy_nodes=0, recycle_k=0)
"""The draft-pass methods run alone: no n-gram, copy or model-prediction drafts beside them."""


def _self_draft(kind: str) -> Callable[[], Method]:
    def make() -> Method:
        from lookahead import LookaheadConfig

        return lookahead_method(f"self-{kind}", LookaheadConfig(self_draft=kind, **ALONE))

    return make


DRAFT_MODEL_LAYERS = 10
"""The bench's draft model: the target's first 10 decoder layers with its head, as a separate model
(``selfspec.truncated_copy``; no second model of SmolLM2's tokenizer is available offline)."""


_TRUNCATED: dict = {}  # id(target) -> (target, its truncated copy): one copy per target for the whole bench


def _truncated(target):
    from lookahead.selfspec import truncated_copy

    kept = _TRUNCATED.get(id(target))
    if kept is None or kept[0] is not target:
        _TRUNCATED.clear()
        _TRUNCATED[id(target)] = kept = (target, truncated_copy(target, DRAFT_MODEL_LAYERS))
    return kept[1]


def _draft_model() -> Method:
    from lookahead import LookaheadConfig, LookaheadDecoder

    config = LookaheadConfig(**ALONE)
    settings = {**dataclasses.asdict(config), "draft_model": f"truncated_copy(target, {DRAFT_MODEL_LAYERS})"}
    return Method("draft-model", f"LookaheadDecoder(draft_model=the target's first {DRAFT_MODEL_LAYERS} layers + head, "
                  "n-gram sources off)", settings=settings,
                  decoder=LookaheadDecoder(config, draft_model=_truncated))


_BUNDLED_HEADS: list = []  # the bundled SmolLM2 heads, loaded once for the whole bench


def _lookahead_heads() -> Method:
    from lookahead import LookaheadConfig, LookaheadDecoder
    from lookahead.heads import DraftHeads

    if not _BUNDLED_HEADS:
        _BUNDLED_HEADS.append(DraftHeads.bundled())
    heads = _BUNDLED_HEADS[0]
    config = LookaheadConfig()
    settings = {**dataclasses.asdict(config), "heads": repr(heads)}
    return Method("lookahead+heads", f"LookaheadDecoder(heads=DraftHeads.bundled()), default config; {heads!r}",
                  settings=settings, decoder=LookaheadDecoder(config, heads=heads))


def _lookahead_heads_corpus() -> Method:
    from lookahead import LookaheadConfig, LookaheadDecoder
    from lookahead.corpus import DraftCorpus
    from lookahead.heads import DraftHeads

    if not _BUNDLED_HEADS:
        _BUNDLED_HEADS.append(DraftHeads.bundled())
    heads, corpus = _BUNDLED_HEADS[0], DraftCorpus.bundled()
    config = LookaheadConfig()
    settings = {**dataclasses.asdict(config), "heads": repr(heads), "corpus": repr(corpus)}
    return Method("lookahead+heads+corpus", "LookaheadDecoder(heads=DraftHeads.bundled(), corpus=DraftCorpus.bundled()), "
                  f"default config; {heads!r}; {corpus!r}", settings=settings,
                  decoder=LookaheadDecoder(config, heads=heads, corpus=corpus))


def _lookahead_no_corpus() -> Method:
    from lookahead import LookaheadConfig, LookaheadDecoder

    config = LookaheadConfig()
    settings = {**dataclasses.asdict(config), "corpus": None}
    return Method("lookahead-no-corpus", "LookaheadDecoder(corpus=None), default config: no draft corpus",
                  settings=settings, decoder=LookaheadDecoder(config, corpus=None))


def _lookahead_corpus() -> Method:
    from lookahead import LookaheadConfig, LookaheadDecoder
    from lookahead.corpus import DraftCorpus

    corpus = DraftCorpus.bundled()  # one per process: its store is built once for the whole bench
    config = LookaheadConfig()
    settings = {**dataclasses.asdict(config), "corpus": repr(corpus)}
    return Method("lookahead+corpus", f"LookaheadDecoder(corpus=DraftCorpus.bundled()), default config; {corpus!r}",
                  settings=settings, decoder=LookaheadDecoder(config, corpus=corpus))


def _lookahead_linear() -> Method:
    from lookahead import LookaheadConfig

    return lookahead_method("lookahead-linear", LookaheadConfig(linear_layout="linear"))


def _lookahead_transposed() -> Method:
    from lookahead import LookaheadConfig

    return lookahead_method("lookahead-transposed", LookaheadConfig(linear_layout="transposed"))


def _lookahead_no_fill() -> Method:
    from lookahead import LookaheadConfig

    return lookahead_method("lookahead-no-fill", LookaheadConfig(fill_nodes=0))


def _lookahead_interpolated() -> Method:
    from lookahead import LookaheadConfig, LookaheadDecoder
    from lookahead.cost import CostModel

    class Interpolated(LookaheadDecoder):
        """Prices drafts with the measured curve read as a given one is: linear between the measured sizes and
        non-decreasing (how measured curves were read before they were read as steps, ``cost.CostModel``)."""

        def cost_curve(self, model, kv_window=None, sync=None):
            curve = super().cost_curve(model, kv_window, sync)
            return CostModel(curve.points, curve.provisional) if curve.steps else curve

    config = LookaheadConfig()
    return Method("lookahead-interpolated", "LookaheadDecoder(), default config, the measured cost curve "
                  "interpolated and made non-decreasing", settings=dataclasses.asdict(config),
                  decoder=Interpolated(config))


METHODS: dict[str, Callable[[], Method]] = {
    BASELINE: plain,
    "plain-again": plain_again,  # the same as plain: how much a ratio moves by chance on this machine
    "prompt-lookup": prompt_lookup,
    "lookahead": lambda: lookahead_method("lookahead"),  # the default LookaheadConfig
    "lookahead-small": _lookahead_small,  # a smaller draft tree (for slow hardware)
    "lookahead-window": _lookahead_window,  # the Jacobi lookahead window on (W=4, N=4, G=4)
    "lookahead-fixed": _lookahead_fixed,  # always the full tree: no hardware-aware budget
    "no-drafts": _no_drafts,  # every draft source off: the decoder's own cost with every step plain
    "self-layer-skip": _self_draft("layer-skip"),  # draft passes alone (selfspec.py): layers skipped,
    "self-early-exit": _self_draft("early-exit"),  # the first layers then the head,
    "self-low-rank": _self_draft("low-rank"),  # truncated-SVD weights,
    "draft-model": _draft_model,  # a separate (truncated) draft model
    "lookahead+heads": _lookahead_heads,  # the default decoder plus the bundled SmolLM2 draft heads (heads.py)
    # the default decoder given the bundled SmolLM2's own writing as drafts (corpus.py; for the bundled model
    # what the default's corpus="auto" finds), and the default without any corpus: what the corpus adds
    "lookahead+corpus": _lookahead_corpus,
    "lookahead-no-corpus": _lookahead_no_corpus,
    # the bundled heads and the bundled corpus together (corpus="auto" finds none beside heads)
    "lookahead+heads+corpus": _lookahead_heads_corpus,
    # the default decoder with every linear layer through nn.Linear (linear_layout.py): what the layout adds
    "lookahead-linear": _lookahead_linear,
    # the default decoder with 2-16 rows the other way round and nn.Linear above (no oneDNN): what oneDNN adds
    "lookahead-transposed": _lookahead_transposed,
    # the default decoder without the frequent tokens on steps nothing else drafts for (proposer.FrequentSource)
    "lookahead-no-fill": _lookahead_no_fill,
    # the default decoder pricing with its measured curve interpolated, not as steps (cost.CostModel)
    "lookahead-interpolated": _lookahead_interpolated,
}

# what ``python -m lookahead bench`` runs unless told otherwise
DEFAULT_METHODS = [BASELINE, "prompt-lookup", "lookahead", "lookahead-small"]


def make_methods(names: list[str], registry: dict[str, Callable[[], Method]] | None = None) -> list[Method]:
    """Fresh methods by name, the plain baseline first (added when missing)."""
    registry = METHODS if registry is None else registry
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; valid: {', '.join(registry)}")
    ordered = [BASELINE] + [n for n in dict.fromkeys(names) if n != BASELINE]
    methods = [registry[n]() if n in registry else plain() for n in ordered]
    for name, m in zip(ordered, methods, strict=True):
        m.name = name
        m.factory = registry.get(name, plain)
    return methods
