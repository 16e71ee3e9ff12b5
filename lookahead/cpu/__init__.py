"""A step on a CPU: linear layers computed another way where the BLAS is slow for a few rows, grouped attention.

``nn.Linear`` computes ``x @ W^T``. Some CPU BLAS builds run that product far slower for a few rows than for one,
and every verification step of a draft runs its rows through those products. The same product the other way round,
``(W @ x^T)^T``, or through oneDNN's linear (fp32 weights) can be several times cheaper there. Whether, and for which row counts, each pays
is measured: the decoder times its steps in every layout and each calibrated step size takes the cheapest
(``layouts.plan_layouts``). One-row steps always go through ``nn.Linear``, so a plain step is plain ``generate``'s.

Grouped-query attention with a mask (a draft tree's) hands the grouped keys to SDPA as they are
(``compat.grouped_attention``) instead of repeating them per query head every step: the same logits, less copying.

Scoped to the call: the steps run a *shadow* of the model (``shadow.py``), a copy of its module tree that shares
every parameter and buffer, in which each ``nn.Linear`` is a :class:`LayoutLinear` of the same weight and each
attention module reads a copy of its config that names grouped attention. Nothing is installed on the user's model,
and another thread's forward never meets the shadow. It is made once per model and plan and shared (it holds no
per-call state), and made again when the model's tree changes.
"""
