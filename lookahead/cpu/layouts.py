"""Which layout each step size computes a model's linear layers in, on a CPU: timed, then planned
(:func:`plan_layouts`); the package docstring says why."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .._tuning import DEFAULT, Tuning
from ..cost import STEP_VARIANT, CostModel
from ..shadow import shadow
from .linear import LINEAR, ONEDNN, TRANSPOSED, onednn_linear

KIND_NAMES = ("nn.Linear", "transposed", "oneDNN")
ONEDNN_MAX_ROWS = 1 << 12
DEFAULT_TRANSPOSED_ROWS = 8  # the default plan's last transposed step size
FORCED = {"transposed": TRANSPOSED, "onednn": ONEDNN}
"""``Tuning.linear_layout`` values that force a layout."""


@dataclass(frozen=True)
class LinearPlan:
    """How a step of ``r`` rows computes its linear layers: ``bounds`` ``((upto, kind), ...)``, ``upto``
    increasing; ``r`` takes the kind of the first bound with ``upto >= r``; one row, past the last bound and an empty
    plan: ``nn.Linear``. Example: ``LinearPlan(((4, TRANSPOSED), (8, LINEAR), (64, ONEDNN)))``: 2-4 rows transposed,
    5-8 ``nn.Linear``, 9-64 oneDNN; ``describe()`` -> ``"2-4 rows transposed, 9-64 rows oneDNN"``."""

    bounds: tuple[tuple[int, int], ...] = ()

    def __post_init__(self):
        uptos = [b[0] for b in self.bounds]
        if (any(not isinstance(u, int) or u < 1 for u in uptos) or uptos != sorted(set(uptos))
                or any(kind not in (LINEAR, TRANSPOSED, ONEDNN) for _, kind in self.bounds)):
            raise ValueError(f"LinearPlan.bounds={self.bounds!r} is invalid: each upto an int >= 1, increasing; each "
                             "kind LINEAR, TRANSPOSED or ONEDNN")

    def kind(self, rows: int) -> int:
        """The layout of a step of ``rows`` rows."""
        if rows >= 2:
            for upto, kind in self.bounds:
                if rows <= upto:
                    return kind
        return LINEAR

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


@functools.cache
def onednn_available() -> bool:
    """Whether this torch (built with oneDNN, as the x86 and ARM CPU wheels are) has oneDNN's linear and it computes
    ``F.linear``, checked once on a small fp32 product."""
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
    """Whether oneDNN's linear may compute ``modules``' products: fp32 weights, and :func:`onednn_available`."""
    return bool(modules) and all(m.weight.dtype == torch.float32 for m in modules) and onednn_available()


def plan_layouts(linear: CostModel, transposed: CostModel | None = None, onednn: CostModel | None = None,
                 below: float = DEFAULT.layout_pays_below, force: int | None = None) -> tuple[LinearPlan, CostModel]:
    """(the :class:`LinearPlan`, the step curve it gives) from the step curves timed in each layout: ``linear``
    (``nn.Linear``), ``transposed`` (up to ``layout_max_rows``) and ``onednn``, each read up to the rows it covers;
    None: not timed.

    At each point ``k`` >= 2 of ``linear`` the plan takes the cheapest layout relative to its own curve's one-row
    step (so the machine's speed at each timing cancels out); another layout only where it costs at most ``below``
    times ``nn.Linear``; ``force``: that layout wherever it was timed. Rows between two points take the upper point's
    layout. The curve: ``linear``'s points at the chosen layouts' relative costs (provisional when a curve it takes
    is; steps when all are); ``linear`` itself where every step is ``nn.Linear``.

    Example (ms): linear ``{1: 80, 2: 126, 4: 126, 8: 116, 16: 142}``, transposed ``{1: 80, 2: 69, 4: 79, 8: 120,
    16: 124}``, oneDNN ``{1: 88, 2: 92, 4: 99, 8: 106, 16: 132}``: at 2 rows transposed costs 0.86 one-row steps
    (oneDNN 1.05, ``nn.Linear`` 1.58), at 8 oneDNN 1.20 (transposed 1.50, ``nn.Linear`` 1.45) -> 2-4 rows transposed,
    5-16 rows oneDNN; curve ``{1: 80, 2: 69, 4: 79, 8: 96.4, 16: 120}``.
    """
    base = float(linear(1))
    others = [(kind, curve, float(curve(1)), min(curve.covers, cap)) for kind, curve, cap in
              ((TRANSPOSED, transposed, DEFAULT.layout_max_rows), (ONEDNN, onednn, 1 << 62))
              if curve is not None and force in (None, kind)]
    bounds: list[tuple[int, int]] = []
    points, used = [], {id(linear): linear}
    for k, t in linear.points:
        kind, rel = LINEAR, t / base
        options = [(float(curve(k)) / one, other, curve) for other, curve, one, reach in others if 2 <= k <= reach]
        options = [o for o in options if force is not None or o[0] <= below * rel]
        if options:
            rel, kind, curve = min(options, key=lambda o: o[0])
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


def whole_plan(kind: int) -> LinearPlan:
    """Every step a layout may compute: transposed up to ``layout_max_rows`` rows, oneDNN up to 4096."""
    return LinearPlan(((DEFAULT.layout_max_rows if kind == TRANSPOSED else ONEDNN_MAX_ROWS, kind),))


def linear_modules(model) -> list[nn.Linear]:
    """``model``'s plain ``nn.Linear`` modules a layout can compute: on a CPU, a 2D floating weight."""
    return [m for m in model.modules() if type(m) is nn.Linear and m.weight.device.type == "cpu"
            and m.weight.dim() == 2 and m.weight.is_floating_point()]


def _check_onednn(kind: int, modules: Sequence[nn.Linear]) -> None:
    if kind == ONEDNN and not onednn_fits(modules):
        dtypes = sorted({str(m.weight.dtype) for m in modules})
        raise ValueError(f"Tuning.linear_layout='onednn' cannot run here: it needs torch.float32 linear weights "
                         f"(this model's: {', '.join(dtypes)}) and a torch built with oneDNN "
                         f"(torch.backends.mkldnn.is_available(): {torch.backends.mkldnn.is_available()})")


def plan_steps(model, linear: CostModel, measure, calibrations, rows: int, tuning: Tuning, persist, runner,
               variant: str = STEP_VARIANT):
    """(the step curve, what runs the steps, the plan in words) for ``model`` on a CPU: each layout's step curve is
    read from ``calibrations`` (kept under ``variant``) or timed by ``measure(sizes, runner)`` (None: only read) and
    :func:`plan_layouts` compares it with ``linear``, the ``nn.Linear`` curve of ``runner``; ``runner`` and
    ``linear`` where no layout pays or none was found."""
    modules = linear_modules(model)
    layout = tuning.linear_layout
    force = FORCED.get(layout)
    grouped = runner is not model
    if not modules:
        return linear, runner, KIND_NAMES[LINEAR]
    _check_onednn(force, modules)

    def timed(kind: int, most: int, name: str) -> CostModel | None:
        run = None if measure is None else lambda sizes: measure(sizes, shadow(model, whole_plan(kind), grouped))
        return calibrations.get(model, most, run, variant + name, persist=persist)

    transposed = onednn = None
    if layout in ("auto", "transposed"):
        transposed = timed(TRANSPOSED, tuning.layout_max_rows, "+transposed-linears")
    if layout == "onednn" or (layout == "auto" and onednn_fits(modules)):
        onednn = timed(ONEDNN, rows, "+onednn-linears")
    plan, curve = plan_layouts(linear, transposed, onednn, tuning.layout_pays_below, force)
    if force is not None:
        plan = whole_plan(force)
    if not plan:
        return curve, runner, KIND_NAMES[LINEAR]
    return curve, shadow(model, plan, grouped), plan.describe()


def default_plan(model, tuning: Tuning, grouped: bool = False):
    """(the shadow that runs the steps, the plan in words) where no layout was timed: transposed up to 8 rows and
    oneDNN above where it fits, else transposed up to ``layout_max_rows``. ``warmup --calibrate`` plans from timings
    instead."""
    modules = linear_modules(model)
    if not modules:
        return model if not grouped else shadow(model, grouped=True), KIND_NAMES[LINEAR]
    cap = min(DEFAULT_TRANSPOSED_ROWS, tuning.layout_max_rows)
    plan = (LinearPlan(((cap, TRANSPOSED), (ONEDNN_MAX_ROWS, ONEDNN))) if onednn_fits(modules)
            else LinearPlan(((tuning.layout_max_rows, TRANSPOSED),)))
    return shadow(model, plan, grouped), plan.describe()


def forced(model, tuning: Tuning, grouped: bool = False):
    """(the shadow that runs every step in the layout ``tuning.linear_layout`` forces, the plan in words)."""
    kind = FORCED[tuning.linear_layout]
    _check_onednn(kind, linear_modules(model))
    plan = whole_plan(kind)
    return shadow(model, plan, grouped), plan.describe()
