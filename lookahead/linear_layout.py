"""A verification step's linear layers on a CPU, computed the other way round where BLAS is slow for a few rows.

``nn.Linear`` computes ``x @ W^T`` for ``m`` rows ``x`` float[m, H] and a weight ``W`` float[out, H]. Some CPU
BLAS builds run that product far slower for a few rows than for one. On a 2-core AMD EPYC (torch 2.13's MKL
2024, 2 threads) SmolLM2-135M's 211 matrix products took 48 ms of a one-token forward and 86 ms of a
two-token one, at half the memory bandwidth, and its 49152 x 576 output layer alone 10.0 ms for one row,
23.4 ms for 2, 18.3 for 4 and 17.1 for 8. The same product the other way round, ``(W @ x^T)^T``, took 5.0,
4.5 and 7.2 ms for that layer. Every verification step of a draft runs its rows through those products.
Whole SmolLM2 forwards after 300 tokens of context, interleaved, every ``nn.Linear`` the other way round
against none: 2 rows 69 against 127 ms, 4 rows 79 against 126 ms, 8 rows 120 against 116 ms, 16 rows 124
against 142 ms; one row (always ``nn.Linear``) 77-82 ms.

:class:`TransposedLinears` computes inputs of 2 to ``max_rows`` rows the other way round, through each
module's public hooks (a forward pre-hook hands ``nn.Linear`` no rows, a forward hook returns the product).
One-row inputs, a plain decoding step's, are left to ``nn.Linear``, so a step that drafts nothing is bit for
bit plain ``generate``'s. Both ways compute the same sums in another order: outputs agree to float rounding,
the same kind of difference there already is between one row and several through BLAS. Whether, and up to
how many rows, it pays is measured, not assumed: the decoder calibrates its step curve both ways and keeps
this layout for the row counts where it was faster (:func:`rows_that_pay`).

Example::

    with TransposedLinears(linear_modules(model), max_rows=4):
        logits = model(input_ids=ids, ...).logits  # 2-4 rows: every nn.Linear as (W @ x^T)^T
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .cost import CostModel

MAX_ROWS = 16
"""The most rows ever computed the other way round (and the largest step the calibration times that way): above,
both ways cost about the same."""
PAYS_BELOW = 0.95
"""A calibrated row count keeps the other way round when its step costs at most this fraction of ``nn.Linear``'s."""
MIN_WEIGHTS = 1 << 24
"""``auto`` looks only at models whose linear layers hold at least this many weights together (SmolLM2-135M's:
134 million): in a smaller one the products are a small part of a step, and the hooks' own cost is not."""
AUTO_DTYPES = (torch.float32, torch.float64)
"""``auto`` looks only at models whose linear weights have one of these dtypes, the full-precision ones, whose
products go through the BLAS: in fp32 a few rows through MKL's ``nn.Linear`` cost far more than one (above). In
bf16 oneDNN's kernels are already fast for a few rows, and the calibration rejected the other way round (16 rows
1.5x a one-row step against ``nn.Linear``'s 1.4x), so a bf16 or fp16 model's first call does not time a layout it
would not take (about 8 s for SmolLM2 in bf16 on a 2-core CPU without AMX)."""
VARIANT = "+transposed-linears"
"""Added to the calibration's variant for the step curve timed with every linear the other way round."""


def weights(modules: Sequence[nn.Linear]) -> int:
    """The weights of ``modules`` together (a weight shared by several, as a tied output layer, counted once)."""
    return sum(w.numel() for w in {id(m.weight): m.weight for m in modules}.values())


def linear_modules(model) -> list[nn.Linear]:
    """The ``model``'s plain ``nn.Linear`` modules whose product the hooks can compute: on a CPU, a 2D floating
    weight (subclasses, quantized or sharded layers are left alone)."""
    out = []
    for module in model.modules():
        if type(module) is nn.Linear:
            w = module.weight
            if w.device.type == "cpu" and w.dim() == 2 and w.is_floating_point():
                out.append(module)
    return out


class TransposedLinears:
    """While entered: each module's inputs of 2 to ``max_rows`` rows (all leading dimensions together) come out as
    ``(W @ x^T)^T (+ bias)``, contiguous, of the shape and dtype ``nn.Linear`` gives; every other input, and any
    call that records gradients, goes through ``nn.Linear`` as usual. The hooks are removed on exit.

    Its pre-hooks run after a module's other pre-hooks: a hook put first (``prepend=True``, as the draft heads'
    does on the output layer) sees the real rows."""

    def __init__(self, modules: Sequence[nn.Linear], max_rows: int = MAX_ROWS):
        self.modules, self.max_rows = list(modules), max_rows
        self._pending: dict[int, torch.Tensor] = {}  # id(module) -> the input its forward hook computes from
        self._no_rows: dict[int, torch.Tensor] = {}  # id(module) -> float[0, H], nn.Linear's input in place of x
        self._handles: list = []

    def __enter__(self) -> TransposedLinears:
        for module in self.modules:
            self._handles.append(module.register_forward_pre_hook(self._pre))
            self._handles.append(module.register_forward_hook(self._post))
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles, self._pending, self._no_rows = [], {}, {}

    def _pre(self, module, args):
        if len(args) != 1 or torch.is_grad_enabled():
            return None
        x = args[0]
        w = module.weight
        if x.dim() < 2 or x.dtype != w.dtype or x.device != w.device or x.shape[-1] != w.shape[1]:
            return None
        rows = x.numel() // x.shape[-1]
        if not 2 <= rows <= self.max_rows:
            return None
        key = id(module)
        self._pending[key] = x
        no_rows = self._no_rows.get(key)
        if no_rows is None:  # what nn.Linear gets instead, made once: no rows, whose product costs nothing
            no_rows = self._no_rows[key] = w.new_empty((0, w.shape[1]))
        return (no_rows,)

    def _post(self, module, args, output):
        x = self._pending.pop(id(module), None)
        if x is None:
            return None
        return transposed_linear(x, module.weight, module.bias)


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed as ``(weight @ x^T)^T``: ``x`` [..., H], ``weight`` [V, H] ->
    [..., V], contiguous. Example: x ``[[1., 2.]]``, weight ``[[1., 0.], [1., 1.]]`` -> ``[[1., 3.]]``."""
    shape = x.shape
    flat_t = x.view(-1, shape[-1]).t() if x.is_contiguous() else x.reshape(-1, shape[-1]).t()  # [H, m]
    y = torch.addmm(bias[:, None], weight, flat_t) if bias is not None else torch.mm(weight, flat_t)  # [V, m]
    return y.t().contiguous().view(shape[:-1] + (weight.shape[0],))


def rows_that_pay(linear: CostModel, transposed: CostModel, below: float = PAYS_BELOW) -> int:
    """The most rows up to which steps run faster the other way round: the largest calibrated ``k`` in 2 ..
    :data:`MAX_ROWS` such that at it and at every calibrated ``k`` below it (from 2) the ``transposed`` curve's
    step costs at most ``below`` times the ``linear`` one's, each relative to its own one-row step; 0 when even
    2 rows do not. Relative, because the two curves may have been measured at different times (each is
    persisted), and a one-row step is the same computation in both (``nn.Linear``): how fast the machine was
    then cancels out.

    Example: linear ``{1: 80, 2: 126, 4: 126, 8: 116, 16: 142}`` ms, transposed ``{1: 80, 2: 69, 4: 79,
    8: 120, 16: 124}`` -> 4 (8 rows: no faster, so 16 is not reached either); the same transposed curve measured
    on a machine 1.5x slower, ``{1: 120, 2: 104, ...}``, gives 4 too.
    """
    rows = 0
    base_t, base_l = float(transposed(1)), float(linear(1))
    for k, t in transposed.points:
        if k < 2:
            continue
        if k > MAX_ROWS or not t / base_t <= below * float(linear(k)) / base_l:
            break
        rows = k
    return rows


def combined_curve(linear: CostModel, transposed: CostModel, rows: int) -> CostModel:
    """The step curve of calls that run 2 to ``rows`` rows the other way round: the ``transposed`` curve's
    points up to ``rows``, put on the ``linear`` curve's scale (its one-row step), and the ``linear`` one's above
    (provisional when either is; read as steps when both are). Example: the curves of :func:`rows_that_pay`,
    measured (``steps``), with rows 4 -> ``{1: 80, 2: 69, 4: 79, 8: 116, 16: 142}`` ms; given (interpolated, so
    non-decreasing) -> ``{1: 80, 2: 80, 4: 80, 8: 126, 16: 142}``."""
    if rows < 2:
        return linear
    scale = float(linear(1)) / float(transposed(1))
    points = ([(k, t * scale) for k, t in transposed.points if k <= rows]
              + [(k, t) for k, t in linear.points if k > rows])
    return CostModel(points, linear.provisional or transposed.provisional, linear.steps and transposed.steps,
                     linear.covers)
