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
this layout for the row counts where it was faster (:func:`plan_layouts`).

A third way, for fp32 weights where torch is built with oneDNN: oneDNN's own linear
(``torch.ops.mkldnn._linear_pointwise``, the op torch's compiler emits for CPU linears, on the unpacked weight: no
copy of the weights). On the same CPU its product of SmolLM2's 49152 x 576 output layer took 7.3 ms for 8 rows
(MKL's ``nn.Linear`` 16.1, the other way round 9.4), 9.5 for 16 (20.3, 16.1) and 22.0 for 64 (49.3, 32.3); whole
forwards after 300 tokens, relative to a one-row step: 8 rows 1.21 (1.60, 1.28), 12 rows 1.37 (1.73, 1.84),
32 rows 2.02 (2.49, 2.28), 64 rows 3.23 (3.81, 3.71); at 2-4 rows the other way round stays the cheapest (0.71-0.90
against 1.04-1.12). So the calibration times it too, and each calibrated step size takes the layout that was
cheapest there (:func:`plan_layouts`, a :class:`LinearPlan`).

Example::

    with TransposedLinears(linear_modules(model), max_rows=4):
        logits = model(input_ids=ids, ...).logits  # 2-4 rows: every nn.Linear as (W @ x^T)^T
    plan = LinearPlan(((4, TRANSPOSED), (64, ONEDNN)))
    with StepLinears(linear_modules(model), plan):
        logits = model(input_ids=ids, ...).logits  # 2-4 rows the other way round, 5-64 through oneDNN
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

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
ONEDNN_VARIANT = "+onednn-linears"
"""Added to the calibration's variant for the step curve timed with every linear of 2 or more rows through oneDNN."""
ONEDNN_DTYPES = (torch.float32,)
"""Weight dtypes whose products oneDNN's linear takes over: the full-precision one whose few-row products MKL
makes slow. bf16 and fp16 ``nn.Linear`` already run on oneDNN."""
ONEDNN_MAX_ROWS = 1 << 12
"""The most rows a forced ``"onednn"`` layout (``LookaheadConfig.linear_layout``) computes through oneDNN."""

LINEAR, TRANSPOSED, ONEDNN = 0, 1, 2
"""The layouts a step's linear layers compute in: ``nn.Linear`` (``x @ W^T``), the other way round
(``(W @ x^T)^T``), oneDNN's linear."""
KIND_NAMES = ("nn.Linear", "transposed", "oneDNN")


@dataclass(frozen=True)
class LinearPlan:
    """How a step of ``r`` rows computes its linear layers: ``bounds`` ``((upto, kind), ...)``, ``upto``
    increasing; a step of ``r`` rows takes the kind of the first bound with ``upto >= r``, ``nn.Linear`` past the
    last one, and one row always ``nn.Linear`` (a plain step stays plain ``generate``'s computation). Empty: every
    step ``nn.Linear``.

    Example: ``LinearPlan(((4, TRANSPOSED), (8, LINEAR), (64, ONEDNN)))``: 2-4 rows the other way round, 5-8
    ``nn.Linear``, 9-64 oneDNN, 1 and 65+ ``nn.Linear``; ``describe()`` -> ``"2-4 rows transposed, 9-64 rows
    oneDNN"``.
    """

    bounds: tuple[tuple[int, int], ...] = ()

    def __post_init__(self):
        uptos = [b[0] for b in self.bounds]
        if any(not isinstance(u, int) or u < 1 for u in uptos) or uptos != sorted(set(uptos)):
            raise ValueError(f"LinearPlan.bounds={self.bounds!r} is invalid: each upto an int >= 1, increasing")
        if any(kind not in (LINEAR, TRANSPOSED, ONEDNN) for _, kind in self.bounds):
            raise ValueError(f"LinearPlan.bounds={self.bounds!r} is invalid: kinds must be LINEAR, TRANSPOSED or "
                             "ONEDNN")

    @classmethod
    def uniform(cls, kind: int, max_rows: int) -> LinearPlan:
        """Every step of 2 to ``max_rows`` rows in ``kind``."""
        return cls(((max_rows, kind),))

    def kind(self, rows: int) -> int:
        """The layout of a step of ``rows`` rows."""
        if rows >= 2:
            for upto, kind in self.bounds:
                if rows <= upto:
                    return kind
        return LINEAR

    def most_rows(self, kind: int) -> int:
        """The largest step in ``kind`` (0: none)."""
        return max((upto for upto, k in self.bounds if k == kind and upto >= 2), default=0)

    def ranges(self) -> list[tuple[int, int, int]]:
        """``(first, last, kind)`` of every run of steps not computed by ``nn.Linear``, smallest first."""
        out, lo = [], 2
        for upto, kind in self.bounds:
            if upto >= lo and kind != LINEAR:
                if out and out[-1][2] == kind and out[-1][1] == lo - 1:
                    out[-1] = (out[-1][0], upto, kind)
                else:
                    out.append((lo, upto, kind))
            lo = max(lo, upto + 1)
        return out

    def describe(self) -> str:
        """The plan in words: ``"nn.Linear"`` when every step uses it."""
        return ", ".join(f"{a}-{b} rows {KIND_NAMES[k]}" for a, b, k in self.ranges()) or KIND_NAMES[LINEAR]

    def __bool__(self) -> bool:
        return bool(self.ranges())


WHOLE_PLANS = {TRANSPOSED: LinearPlan.uniform(TRANSPOSED, MAX_ROWS), ONEDNN: LinearPlan.uniform(ONEDNN, ONEDNN_MAX_ROWS)}
"""Per layout other than ``nn.Linear``, the plan its calibration times and its forced setting runs: every step it
may compute (the other way round up to :data:`MAX_ROWS` rows, oneDNN up to :data:`ONEDNN_MAX_ROWS`)."""
FORCED = {"transposed": TRANSPOSED, "onednn": ONEDNN}
"""``LookaheadConfig.linear_layout`` values that force a layout, and the layout each forces."""


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


class StepLinears:
    """While entered: each module's inputs of ``r`` rows (all leading dimensions together) that ``plan`` (a
    :class:`LinearPlan`) computes other than by ``nn.Linear`` come out that way, contiguous, of the shape and dtype
    ``nn.Linear`` gives; every other input, and any call that records gradients, goes through ``nn.Linear`` as
    usual. The hooks are removed on exit.

    Its pre-hooks run after a module's other pre-hooks: a hook put first (``prepend=True``, as the draft heads'
    does on the output layer) sees the real rows."""

    def __init__(self, modules: Sequence[nn.Linear], plan: LinearPlan):
        self.modules, self.plan = list(modules), plan
        self._kinds: dict[int, int] = {}  # rows -> the plan's kind, filled as steps come
        self._pending: dict[int, tuple[torch.Tensor, int]] = {}  # id(module) -> (its input, the kind to compute)
        self._no_rows: dict[int, torch.Tensor] = {}  # id(module) -> float[0, H], nn.Linear's input in place of x
        self._handles: list = []

    def __enter__(self) -> StepLinears:
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
        kind = self._kinds.get(rows)
        if kind is None:
            kind = self._kinds[rows] = self.plan.kind(rows)
        if kind == LINEAR:
            return None
        key = id(module)
        self._pending[key] = (x, kind)
        no_rows = self._no_rows.get(key)
        if no_rows is None:  # what nn.Linear gets instead, made once: no rows, whose product costs nothing
            no_rows = self._no_rows[key] = w.new_empty((0, w.shape[1]))
        return (no_rows,)

    def _post(self, module, args, output):
        pending = self._pending.pop(id(module), None)
        if pending is None:
            return None
        x, kind = pending
        if kind == TRANSPOSED:
            return transposed_linear(x, module.weight, module.bias)
        return onednn_linear(x, module.weight, module.bias)


class TransposedLinears(StepLinears):
    """:class:`StepLinears` computing every input of 2 to ``max_rows`` rows the other way round.

    Example: ``with TransposedLinears(modules, max_rows=4): ...``: 2-4 rows as ``(W @ x^T)^T``."""

    def __init__(self, modules: Sequence[nn.Linear], max_rows: int = MAX_ROWS):
        super().__init__(modules, LinearPlan.uniform(TRANSPOSED, max_rows))
        self.max_rows = max_rows


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed as ``(weight @ x^T)^T``: ``x`` [..., H], ``weight`` [V, H] ->
    [..., V], contiguous. Example: x ``[[1., 2.]]``, weight ``[[1., 0.], [1., 1.]]`` -> ``[[1., 3.]]``."""
    shape = x.shape
    flat_t = x.view(-1, shape[-1]).t() if x.is_contiguous() else x.reshape(-1, shape[-1]).t()  # [H, m]
    y = torch.addmm(bias[:, None], weight, flat_t) if bias is not None else torch.mm(weight, flat_t)  # [V, m]
    return y.t().contiguous().view(shape[:-1] + (weight.shape[0],))


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through oneDNN's linear (``torch.ops.mkldnn._linear_pointwise``, no fused
    activation): ``x`` [..., H], ``weight`` [V, H] -> [..., V], contiguous. The same sums as ``nn.Linear``'s in
    another order: equal to float rounding."""
    return torch.ops.mkldnn._linear_pointwise(x if x.is_contiguous() else x.contiguous(), weight, bias, "none", [],
                                              "")


@functools.cache
def onednn_available() -> bool:
    """Whether this torch has oneDNN's linear and it computes ``F.linear`` (checked once on a small fp32 product):
    torch built with oneDNN (``torch.backends.mkldnn.is_available()``), as the x86 and ARM CPU wheels are."""
    try:
        if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
            return False
        gen = torch.Generator().manual_seed(0)
        x, w, b = (torch.randn(shape, generator=gen) for shape in ((3, 2, 8), (5, 8), (5,)))
        with torch.no_grad():
            got = onednn_linear(x, w, b)
        return got.shape == (3, 2, 5) and torch.allclose(got, torch.nn.functional.linear(x, w, b), rtol=1e-4,
                                                         atol=1e-5)
    except Exception:  # noqa: BLE001 - any failure of a private op means: not available
        return False


def onednn_fits(modules: Sequence[nn.Linear]) -> bool:
    """Whether oneDNN's linear may compute ``modules``' products: every weight of a :data:`ONEDNN_DTYPES` dtype
    (on the CPU, as :func:`linear_modules` gives them) and :func:`onednn_available`."""
    return bool(modules) and all(m.weight.dtype in ONEDNN_DTYPES for m in modules) and onednn_available()


def plan_layouts(linear: CostModel, transposed: CostModel | None = None, onednn: CostModel | None = None,
                 below: float = PAYS_BELOW, force: int | None = None) -> tuple[LinearPlan, CostModel]:
    """(the :class:`LinearPlan`, the step curve it gives) from the step curves timed in each layout: ``linear``
    (``nn.Linear``), ``transposed`` (the other way round, up to :data:`MAX_ROWS`) and ``onednn``, each read up to
    the rows it covers; a layout not timed is None.

    At each point ``k`` >= 2 of the ``linear`` curve the plan takes the cheapest layout there, every step relative
    to its own curve's one-row step (the same computation, ``nn.Linear``, in each, so how fast the machine was when
    each curve was timed, and persisted, cancels out); a layout other than ``nn.Linear`` only where its step costs
    at most ``below`` times ``nn.Linear``'s. ``force``: that layout at every point it was timed, whatever it costs.
    Rows between two points take the upper point's layout, where a measured (``steps``) curve prices them. The
    curve: the ``linear`` curve's points, each the chosen layout's relative cost on the ``linear`` curve's scale
    (provisional when a curve it takes is; read as steps when all are); the ``linear`` curve itself where every
    step keeps ``nn.Linear``.

    Example (ms; measured curves): linear ``{1: 80, 2: 126, 4: 126, 8: 116, 16: 142}``, transposed ``{1: 80, 2: 69,
    4: 79, 8: 120, 16: 124}``, oneDNN ``{1: 88, 2: 92, 4: 99, 8: 106, 16: 132}``. At 2 rows the other way round
    costs 0.86 one-row steps (oneDNN 1.05, ``nn.Linear`` 1.58), at 4 rows 0.99; at 8 oneDNN 1.20 (the other way
    round 1.50, ``nn.Linear`` 1.45), at 16 oneDNN 1.50 (1.55, 1.78) -> 2-4 rows transposed, 5-16 rows oneDNN;
    curve ``{1: 80, 2: 69, 4: 79, 8: 96.4, 16: 120}``. Without the oneDNN curve: 2-4 rows transposed, 9-16 rows
    transposed as well (1.55 <= 0.95 x 1.78), 5-8 ``nn.Linear``; the same transposed curve measured on a machine
    1.5x slower gives the same plan and curve.
    """
    base = float(linear(1))
    others = [(kind, curve, float(curve(1)), min(curve.covers, cap)) for kind, curve, cap in
              ((TRANSPOSED, transposed, MAX_ROWS), (ONEDNN, onednn, 1 << 62)) if curve is not None]
    bounds: list[tuple[int, int]] = []
    points, used = [], {id(linear): linear}
    for k, t in linear.points:
        kind, rel = LINEAR, t / base
        if k >= 2:
            best = None
            for other, curve, one, reach in others:
                if k > reach or (force is not None and other != force):
                    continue
                r = float(curve(k)) / one
                if (force is not None or r <= below * rel) and (best is None or r < best[0]):
                    best = (r, other, curve)
            if best is not None:
                rel, kind, curve = best
                used[id(curve)] = curve
        if bounds and bounds[-1][1] == kind:
            bounds[-1] = (k, kind)
        else:
            bounds.append((k, kind))
        points.append((k, t if kind == LINEAR else rel * base))
    plan, curves = LinearPlan(tuple(bounds)), list(used.values())
    if len(curves) == 1:  # every step nn.Linear
        return plan, linear
    return plan, CostModel(points, any(c.provisional for c in curves), all(c.steps for c in curves), linear.covers)
