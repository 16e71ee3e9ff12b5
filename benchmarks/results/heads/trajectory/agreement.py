"""Does the heads' agreement move the other sources' acceptance cells? The heads come last in the merge, and a node
they also drafted counts them in its ``agreement``: the trie's or the corpus's node then learns in the *agreed* cells,
from the prior, instead of the *alone* cells it learned in without the heads. This variant keeps each other node's
agreement as it would be without the heads' tree (the same merge, run without it), and nothing else.

    PYTHONPATH=. python benchmarks/results/heads/trajectory/agreement.py [--prompts 8] [--out FILE.json]

Variants: ``default``, ``heads+corpus`` (as in ``modeled.py``) and ``heads+corpus-no-agree``; the same modeled time.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from lookahead import policy as policy_module
from lookahead.draft import ORIGINS

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import modeled  # noqa: E402

HEADS = ORIGINS.index("heads")
_merge = policy_module.merge_proposals
ACTIVE = [False]


def merging(proposals, window=None, limit=None):
    draft = _merge(proposals, window, limit)
    if not ACTIVE[0] or limit is not None or not any(o == HEADS for o, _ in proposals):
        return draft
    others = [(o, p) for o, p in proposals if o != HEADS]
    without = _merge(others, window, None)
    mine = draft.origin != HEADS
    agreement = draft.agreement.copy()
    assert int(mine.sum()) == len(without) and np.array_equal(draft.tokens[mine], without.tokens)
    agreement[mine] = without.agreement
    return dataclasses.replace(draft, agreement=agreement)


policy_module.merge_proposals = merging
_variants = modeled.variants


def variants(heads, corpus):
    v = _variants(heads, corpus)

    def no_agree():
        ACTIVE[0] = True
        return v["heads+corpus"]()

    def plain(make):
        def made():
            ACTIVE[0] = False
            return make()
        return made

    return {"default": plain(v["default"]), "heads+corpus": plain(v["heads+corpus"]),
            "heads+corpus-no-agree": no_agree, "heads": plain(v["heads"])}


modeled.variants = variants

if __name__ == "__main__":
    modeled.main()
