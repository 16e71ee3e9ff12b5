"""The decoding methods the bench compares: ``METHODS`` maps a name to a factory ``() -> Method``, e.g.
``METHODS["lookahead-16"] = lambda: decoder_method("lookahead-16", max_draft_tokens=16)``."""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..._tuning import Tuning

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
        return {**self.generate_kwargs, **({"custom_generate": self.decoder} if self.decoder is not None else {})}


def decoder_method(name: str, *, shown: dict | None = None, **kwargs) -> Method:
    """A method decoding with ``LookaheadDecoder(**kwargs)`` (``heads="bundled"`` / ``corpus="bundled"``: the bundled
    SmolLM2's; ``heads`` a dict: those with these settings). Its settings: the decoder's ``config``, its ``_tuning``'s
    fields off their defaults, and the other objects it was given, by ``shown`` or their repr."""
    from ...config import LookaheadConfig
    from ...decoder import LookaheadDecoder

    heads = kwargs.get("heads")
    if heads == "bundled" or isinstance(heads, dict):
        kwargs["heads"] = _bundled_heads().with_settings(**heads) if heads != "bundled" else _bundled_heads()
    if kwargs.get("corpus") == "bundled":
        from ...corpus import DraftCorpus

        kwargs["corpus"] = DraftCorpus.bundled()
    decoder = LookaheadDecoder(**kwargs)
    tuning = {f.name: getattr(decoder.tuning, f.name) for f in dataclasses.fields(decoder.tuning)
              if getattr(decoder.tuning, f.name) != f.default}
    config = {f.name for f in dataclasses.fields(LookaheadConfig)}
    given = {k: (shown or {}).get(k, v if isinstance(v, str) or v is None else repr(v))
             for k, v in kwargs.items() if k not in config and k != "_tuning"}
    args = [f"{k}={kwargs[k]!r}" for k in kwargs if k in config] + [f"{k}={v}" for k, v in given.items()]
    args += [f"_tuning=Tuning({', '.join(f'{k}={v!r}' for k, v in tuning.items())})"] if tuning else []
    settings = {"config": dataclasses.asdict(decoder.config), "tuning": tuning, **given}
    return Method(name, f"LookaheadDecoder({', '.join(args)})", settings=settings, decoder=decoder)


# the draft passes alone: no n-gram, copy, model-prediction or frequent-token drafts beside them
_ALONE = {"window": 0, "corpus": None, "_tuning": Tuning(tree_nodes=0, copy_nodes=0, recycle_k=0, fill_nodes=0)}
# the bench's draft model: the target's first layers and head as a separate model, made once per target
DRAFT_MODEL_LAYERS = 10
HEADS_FLAT_COST = (2e-4, 2e-4)  # the heads' seconds (base, per level) beside the flat curve's 10 ms step
_TRUNCATED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def truncated_draft(target):
    if target not in _TRUNCATED:
        from ...passes import truncated_copy

        _TRUNCATED[target] = truncated_copy(target, DRAFT_MODEL_LAYERS)
    return _TRUNCATED[target]


@functools.cache
def _bundled_heads():  # loaded once for the whole bench (DraftCorpus.bundled() is one per process already)
    from ...heads import DraftHeads

    return DraftHeads.bundled()


_DECODERS = {  # name -> decoder_method's keyword arguments
    "lookahead": {},  # the default decoder
    "lookahead-small": {"_tuning": Tuning(tree_nodes=6, tree_depth=4, copy_nodes=8, recycle_nodes=8)},
    "lookahead-window": {"window": 4},  # the Jacobi window on, W=4
    "lookahead-fixed": {"_tuning": Tuning(adaptive=False)},  # every draft verified whole: no budget
    "lookahead-flat": {"cost_curve": "flat"},  # the GPU regime, where tokens per call is the speed-up
    "no-drafts": {"max_draft_tokens": 0, "window": 0},  # no draft at all: the decoder's own cost, every step plain
    "self-layer-skip": {"draft": "layer-skip", **_ALONE},  # draft passes alone (lookahead.passes)
    "self-early-exit": {"draft": "early-exit", **_ALONE},
    "self-low-rank": {"draft": "low-rank", **_ALONE},
    "draft-model": {"draft": truncated_draft, "shown": {"draft": f"the target's first {DRAFT_MODEL_LAYERS} layers"},
                    **_ALONE},
    "lookahead+heads": {"heads": "bundled"},  # the bundled SmolLM2's draft heads
    # the default on a flat curve with the bundled heads' own cost pinned (a level costs 2% of a step, as on a GPU)
    "lookahead-flat+heads": {"cost_curve": "flat", "heads": {"cost": HEADS_FLAT_COST}, "corpus": "bundled"},
    "lookahead-no-heads": {"heads": None},  # the default without the bundled heads ("auto" finds them for SmolLM2)
    "lookahead-flat-no-heads": {"cost_curve": "flat", "heads": None},
    # the bundled SmolLM2's own writing (for it what corpus="auto" finds anyway), and no corpus at all
    "lookahead+corpus": {"corpus": "bundled"},
    "lookahead-no-corpus": {"corpus": None},
    "lookahead+heads+corpus": {"heads": "bundled", "corpus": "bundled"},  # both (as "auto" finds them)
    # every linear layer through nn.Linear (lookahead.cpu off): what the CPU layouts add
    "lookahead-linear": {"_tuning": Tuning(linear_layout="linear")},
    # 2-16 rows transposed and nn.Linear above (no oneDNN): what oneDNN adds
    "lookahead-transposed": {"_tuning": Tuning(linear_layout="transposed")},
    "lookahead-no-fill": {"_tuning": Tuning(fill_nodes=0)},  # no frequent tokens on steps nothing else drafts for
}

METHODS: dict[str, Callable[[], Method]] = {
    BASELINE: functools.partial(Method, BASELINE, "plain model.generate (one target call per token)"),
    "plain-again": functools.partial(Method, "plain-again",
                                     "plain model.generate again (A/A control: the timing noise)"),
    "prompt-lookup": functools.partial(Method, "prompt-lookup", "transformers prompt lookup decoding, "
                                       "prompt_lookup_num_tokens=10", settings={"prompt_lookup_num_tokens": 10},
                                       generate_kwargs={"prompt_lookup_num_tokens": 10}),
    **{name: functools.partial(decoder_method, name, **kwargs) for name, kwargs in _DECODERS.items()},
}

DEFAULT_METHODS = [BASELINE, "prompt-lookup", "lookahead", "lookahead-small"]  # what the bench runs by default


def make_methods(names: list[str], registry: dict[str, Callable[[], Method]] | None = None) -> list[Method]:
    """Fresh methods by name, the plain baseline first (added when missing)."""
    registry = METHODS if registry is None else registry
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; valid: {', '.join(registry)}")
    return [Method(name, "", factory=registry.get(name, METHODS[BASELINE])).fresh()  # fresh(): made by the factory
            for name in [BASELINE] + [n for n in dict.fromkeys(names) if n != BASELINE]]
