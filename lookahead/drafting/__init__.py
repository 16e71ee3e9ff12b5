"""Drafting: the draft (``draft.py``), the sources and their merge (``sources.py``), the model-prediction table
(``recycle.py``), the Jacobi window (``window.py``), the policy that drives them (``policy.py``) and their Numba
kernels (``kernels.py``)."""
