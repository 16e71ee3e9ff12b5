"""A verification step's output layer on a CPU, computed the faster way round where BLAS is slow for a few rows.

``nn.Linear`` computes a model's output layer (the LM head, ``W`` float[V, H]) for ``m`` rows ``x`` float[m, H]
as ``x @ W^T``. Some CPU BLAS builds run that product far slower for a few rows than for one. On a 2-core
AMD EPYC (torch 2.13's MKL 2024, 2 threads), SmolLM2-135M's 49152 x 576 head took 10.0 ms for one row, 23.4 ms
for 2, 18.3 for 4 and 17.1 for 8, while the same product the other way round, ``(W @ x^T)^T``, took 5.0,
4.5 and 7.2 ms. A step that verifies drafts sends its rows through the head, so that gap is paid on every
drafted step; interleaved whole forwards after 300 tokens of context: 2 rows 134 -> 117 ms, 4 rows 130 ->
106 ms, 8 rows 140 -> 110 ms, 16 rows 134 -> 125 ms, against 82 ms for one row.

:class:`TransposedHead` computes inputs of ``min_rows`` to ``max_rows`` rows the other way round, through the
public module hooks of the head (a forward pre-hook hands ``nn.Linear`` no rows, a forward hook returns the
product); one-row inputs, a plain decoding step's, are left to ``nn.Linear``, so a step that drafts nothing
is bit for bit plain ``generate``'s. Both ways compute the same sums in another order: the logits agree to
float rounding (the same kind of difference there already is between one row and several through BLAS).
:func:`transposed_head_pays` decides, once per process and head, by timing both ways (0.05-0.1 s for
SmolLM2's head).

Example::

    with TransposedHead(model.get_output_embeddings()):
        logits = model(input_ids=ids, ...).logits  # rows 2..max_rows of the head computed as (W @ x^T)^T
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

import torch
from torch import nn

LAYOUTS = ("auto", "linear", "transposed")
"""``LookaheadConfig.head_layout``: decide by timing (``auto``), always ``nn.Linear`` (``linear``), or the
other way round for 2 to :data:`MAX_ROWS` rows whenever the head can be (``transposed``)."""
MAX_ROWS = 16
"""The most rows computed the other way round: above, both ways cost about the same (16 rows: 20.8 vs 15.7 ms
on the head alone above; 32: 27.2 vs 24.2)."""
MIN_WEIGHTS = 1 << 22
"""``auto`` only looks at heads of at least this many weights (SmolLM2's has 28.3 million): below, the head is a
small part of a step."""
PAYS_BELOW = 0.85
"""``auto`` takes the other way round when it costs at most this fraction of ``nn.Linear``'s time."""
_decided: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # head module -> bool, per process


def can_transpose(head) -> bool:
    """Whether ``head`` is a plain ``nn.Linear`` on a CPU whose product the hooks can compute (a 2D floating
    weight; the hooks act only where no gradient is recorded, as in ``generate``)."""
    if type(head) is not nn.Linear:
        return False
    w = head.weight
    return w.device.type == "cpu" and w.dim() == 2 and w.is_floating_point()


class TransposedHead:
    """While entered: ``head``'s inputs of ``min_rows`` to ``max_rows`` rows (all leading dimensions together)
    come out as ``(W @ x^T)^T (+ bias)``, contiguous, of the shape and dtype ``nn.Linear`` gives; every other
    input goes through ``nn.Linear`` as usual. The hooks are removed on exit.

    Its pre-hook runs after the head's other pre-hooks (a source keeping the head's input sees the real rows)."""

    def __init__(self, head: nn.Linear, min_rows: int = 2, max_rows: int = MAX_ROWS):
        self.head, self.min_rows, self.max_rows = head, min_rows, max_rows
        self._x: torch.Tensor | None = None
        self._handles: list = []

    def __enter__(self) -> TransposedHead:
        self._handles = [self.head.register_forward_pre_hook(self._pre), self.head.register_forward_hook(self._post)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._x = [], None

    def _pre(self, module, args):
        self._x = None
        if len(args) != 1 or torch.is_grad_enabled():
            return None
        x = args[0]
        w = module.weight
        if x.dim() < 2 or x.dtype != w.dtype or x.device != w.device or x.shape[-1] != w.shape[1]:
            return None
        rows = x.numel() // x.shape[-1]
        if not self.min_rows <= rows <= self.max_rows:
            return None
        self._x = x
        return (x.narrow(-2, 0, 0),)  # nn.Linear gets no rows: its product costs nothing

    def _post(self, module, args, output):
        x, self._x = self._x, None
        if x is None:
            return None
        return transposed_linear(x, module.weight, module.bias)


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed as ``(weight @ x^T)^T``: ``x`` [..., H], ``weight`` [V, H] ->
    [..., V], contiguous. Example: x ``[[1., 2.]]``, weight ``[[1., 0.], [1., 1.]]`` -> ``[[1., 3.]]``."""
    flat = x.reshape(-1, x.shape[-1])  # [m, H]
    y = (torch.addmm(bias[:, None], weight, flat.t()) if bias is not None else weight @ flat.t())  # [V, m]
    return y.t().contiguous().reshape(*x.shape[:-1], weight.shape[0])


def transposed_head_pays(head, rows: int = 8, repeats: int = 1, clock: Callable[[], float] = time.perf_counter,
                         min_weights: int = MIN_WEIGHTS) -> bool:
    """Whether, for this ``head`` on this machine, ``rows`` rows the other way round cost at most
    :data:`PAYS_BELOW` of ``nn.Linear``'s time (the fastest of ``repeats`` interleaved timings each, after one
    untimed call of each); False for a head it cannot compute (:func:`can_transpose`) or one of fewer than
    ``min_weights`` weights. Measured once per process and head (kept while the head lives)."""
    if not can_transpose(head) or head.weight.numel() < min_weights:
        return False
    known = _decided.get(head)
    if known is not None:
        return known
    w, b = head.weight, head.bias
    x = torch.randn((rows, w.shape[1]), generator=torch.Generator().manual_seed(0)).to(w.dtype)
    best = {"linear": float("inf"), "transposed": float("inf")}
    ways = {"linear": lambda: torch.nn.functional.linear(x, w, b), "transposed": lambda: transposed_linear(x, w, b)}
    with torch.no_grad():
        for f in ways.values():
            f()
        for _ in range(repeats):
            for name, f in ways.items():
                t = clock()
                f()
                best[name] = min(best[name], clock() - t)
    pays = best["transposed"] <= PAYS_BELOW * best["linear"]
    _decided[head] = pays
    return pays


def head_for(model, layout: str) -> TransposedHead | None:
    """The :class:`TransposedHead` a call on ``model`` runs its forwards in under ``layout`` (one of
    :data:`LAYOUTS`), or None: ``linear``; a head the hooks cannot compute; ``auto`` where the other way round
    does not pay (:func:`transposed_head_pays`)."""
    if layout not in LAYOUTS:
        raise ValueError(f"head_layout: must be one of {LAYOUTS}, got {layout!r}")
    if layout == "linear":
        return None
    get = getattr(model, "get_output_embeddings", None)
    head = get() if get is not None else None
    if head is None or not can_transpose(head):
        return None
    if layout == "auto" and not transposed_head_pays(head):
        return None
    return TransposedHead(head)
