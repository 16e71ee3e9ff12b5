"""Trained draft heads: small modules over the target's final hidden state that draft a tree each step, trained on
the model's own greedy answers; verification stays exact. Kinds (:data:`KINDS`): ``"medusa"`` (Cai et al. 2024:
head ``k`` predicts the token ``k + 1`` ahead), ``"feature"`` (EAGLE-style: a block maps a feature and its token to
the next feature) and ``"context"`` (the feature map with causal attention over the answer, ``context.py``).

    heads = DraftHeads.bundled()                   # the bundled SmolLM2's; or DraftHeads.load(DIR, model=model)
    out = model.generate(**inputs, custom_generate=LookaheadDecoder(heads=heads))        # batch size 1

Heads for another model are refused (ValueError). ``DraftHeads.from_medusa(DIR, model)`` reads the original Medusa's
heads. ``python -m lookahead train-heads --model PATH --out DIR`` trains heads (``lookahead.heads.train``).
"""

from __future__ import annotations

from .model import BUNDLED, KINDS, DraftHeads, HeadsSettings
from .source import HeadsSource

__all__ = ["BUNDLED", "KINDS", "DraftHeads", "HeadsSettings", "HeadsSource"]
