"""The agreed cells at all: every node's ``agreement`` set to 0 after the merge, so every node learns in the cells
of its origin and match bucket alone (``acceptance.CONTEXTS``' first half), for the default decoder and for the
heads with and without the corpus. Modeled time as in ``modeled.py``.

    PYTHONPATH=. python benchmarks/results/heads/trajectory/no_agreement.py [--prompts 8] [--out FILE.json]
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from lookahead import policy as policy_module

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import modeled  # noqa: E402

_merge = policy_module.merge_proposals
ACTIVE = [False]


def merging(proposals, window=None, limit=None):
    draft = _merge(proposals, window, limit)
    if not ACTIVE[0] or not len(draft.agreement):
        return draft
    return dataclasses.replace(draft, agreement=np.zeros_like(draft.agreement))


policy_module.merge_proposals = merging
_variants = modeled.variants


def variants(heads, corpus):
    v = _variants(heads, corpus)

    def switched(make, on):
        def made():
            ACTIVE[0] = on
            return make()
        return made

    out = {}
    for name in ("default", "heads", "heads+corpus"):
        out[name] = switched(v[name], False)
        out[name + "-no-agreement"] = switched(v[name], True)
    return out


modeled.variants = variants

if __name__ == "__main__":
    modeled.main()
