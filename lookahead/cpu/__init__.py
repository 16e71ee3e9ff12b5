"""A step on a CPU: linear layers computed another way where the BLAS is slow for a few rows, grouped attention.

Some CPU BLAS builds run ``nn.Linear``'s ``x @ W^T`` far slower for a few rows than for one; ``(W @ x^T)^T`` or
oneDNN's linear (fp32 weights) can be cheaper there. The decoder times its steps in every layout and each step size
takes the cheapest (``layouts.py``); one-row steps always go through ``nn.Linear``, as in plain ``generate``.
Grouped-query attention with a tree mask hands the grouped keys to SDPA as they are (``compat.grouped_attention``)
instead of repeating them per query head. Both run in a *shadow* of the model (``shadow.py``) that shares every
parameter and buffer: nothing is installed on the user's model.
"""
