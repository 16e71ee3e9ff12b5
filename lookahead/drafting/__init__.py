"""Drafting: what each step proposes and how it learns.

The draft (``draft.py``), the source protocol and its copying and prediction sources with their merge
(``sources.py``), the model-prediction table (``recycle.py``), the Jacobi window (``window.py``), the policy that
drives them (``policy.py``) and their Numba kernels (``kernels.py``).
"""
