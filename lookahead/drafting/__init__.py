"""Drafting: the draft (``draft.py``), its sources and their merge (``sources.py``, ``recycle.py``,
``window.py``), the policy that drives them (``policy.py``), their Numba kernels (``kernels.py``) and tree
measures (``trees.py``)."""
