"""Trained draft heads: small modules over the target's final hidden state that draft a tree each step.

The hidden state that gives a step's last token says much about the next few tokens; heads trained on the model's
own greedy answers turn it into a draft tree for a fraction of a forward, with no second model. Verification stays
exact, so heads change the speed, never the output. Three kinds (:data:`KINDS`), each ending in the model's own
LM-head rows of a frequent-token vocabulary ``vocab_ids``:

- ``"medusa"`` (Cai et al. 2024): head ``k`` maps ``h`` through a residual SiLU block and predicts the token
  ``k + 1`` ahead; the tree is the best-first product of the heads' top-k lists.
- ``"feature"`` (EAGLE-style, no attention): one block maps (a feature, its token's embedding) to the next feature,
  drafted level by level from ``h`` and the last token, the best paths expanded at each level.
- ``"context"``: the feature map with one causal attention layer over the answer's earlier positions
  (``context.py``); none ships.

Usage::

    from lookahead import LookaheadDecoder
    from lookahead.heads import DraftHeads

    heads = DraftHeads.bundled()                   # the bundled SmolLM2's; or DraftHeads.load(DIR, model=model)
    decoder = LookaheadDecoder(heads=heads)        # batch size 1
    out = model.generate(**inputs, custom_generate=decoder)
    decoder.stats.accepted_by_origin["heads"]      # draft tokens the heads got accepted

Heads for another model are refused (ValueError) by ``DraftHeads.load(..., model=)`` and before a call's first
forward. ``DraftHeads.from_medusa(DIR, model)`` reads heads of the original Medusa repository. Train heads for any
causal LM with ``python -m lookahead train-heads --model PATH --out DIR`` (``lookahead.heads.train``).
"""

from __future__ import annotations

from .model import BUNDLED, KINDS, DraftHeads, HeadsSettings
from .source import HeadsSource

__all__ = ["BUNDLED", "KINDS", "DraftHeads", "HeadsSettings", "HeadsSource"]
