"""Small-batch ``nn.Linear`` on a CPU through Numba kernels that read each weight row once per step.

Why: a decoding step that verifies ``k`` tokens multiplies a ``(k, in)`` activation by every weight
matrix of the model. While ``k`` is small the weights, not the arithmetic, are the cost, so a step of
``k`` tokens should cost about what a one-token step costs. torch's CPU matrix multiply repacks or
re-reads the weights on every small call (on the 2-core machine of DESIGN.md two tokens cost 1.65x one
token); the kernels here stream each weight row from memory once for all ``k`` rows.

- :func:`linear_into`: the kernel call on NumPy views (fp32 or bf16 weights, fp32 accumulation).
- :func:`fast_linears`: a context manager that routes a model's exact ``nn.Linear`` modules through the
  kernels for the row counts a policy chooses, per instance (an instance ``forward`` attribute), never
  patching a class, restored on exit even on error.
- :func:`measure_paths`: times whole-model forwards on both paths per ``k``; :class:`PathTimes` says
  which path is faster at each ``k`` and gives the cost curve of the faster path.

The kernel (:func:`_rows4`): four weight rows at a time against four activation rows at a time, i.e.
sixteen dot products sharing eight streams; LLVM vectorises the loop over ``in`` (each of the sixteen
sums becomes one SIMD accumulator: sixteen FMAs per eight loads), and the next weight block is
prefetched while this one is computed. ``fastmath`` is limited to ``reassoc`` and ``contract`` (needed
for that vectorisation and for FMAs; no finite-math or NaN assumptions): each sum is accumulated
in SIMD lanes and reduced at the end, so the rounding differs from torch's (tolerance ~1e-6
relative) and, unlike a sequential dot product, is not guaranteed identical for a row computed in a
block of four and a row computed alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence

import llvmlite.binding as llvm_binding
import numba
import numpy as np
import torch
from llvmlite import ir
from numba import njit, prange
from numba.core import cgutils, types
from numba.extending import intrinsic

_FASTMATH = {"reassoc", "contract"}  # vectorise the reductions and fuse mul-add; no nnan / ninf / arcp
_BLOCK = 4  # weight rows (and activation rows) per register block
_PREFETCH_NAME = "llvm.prefetch.p0" if llvm_binding.llvm_version_info >= (15,) else "llvm.prefetch.p0i8"


@intrinsic
def _prefetch(typingctx, arr, row, col):
    """Prefetch ``arr[row, col]`` into L2 (``llvm.prefetch``, read, locality 2): a hint, no fault."""
    sig = types.void(arr, row, col)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        idx = [context.cast(builder, args[1], signature.args[1], types.intp),
               context.cast(builder, args[2], signature.args[2], types.intp)]
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, idx, wraparound=False)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            _PREFETCH_NAME)
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(2), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _prefetch_rows(w, r0, count):
    """Prefetch rows ``r0 .. r0 + count - 1`` of ``w`` (any 2-D C-contiguous array), one hint per 64 bytes."""
    step = max(64 // w.itemsize, 1)
    for a in range(count):
        for i in range(0, w.shape[1], step):
            _prefetch(w, r0 + a, i)


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _rows4(x, w, r, bias, y, o):
    """``y[:, o:o+4] = x @ w[r:r+4].T (+ bias[o:o+4])``: four weight rows against every row of ``x``.

    x float32[k, n], w float32[rows, n], bias float32[out] or float32[0], y float32[k, out]. The four
    weight rows are read once from memory and then from L1 for each block of four ``x`` rows.
    """
    k, n = x.shape
    has_bias = bias.shape[0] > 0
    b0 = bias[o] if has_bias else np.float32(0.0)
    b1 = bias[o + 1] if has_bias else np.float32(0.0)
    b2 = bias[o + 2] if has_bias else np.float32(0.0)
    b3 = bias[o + 3] if has_bias else np.float32(0.0)
    w0, w1, w2, w3 = w[r], w[r + 1], w[r + 2], w[r + 3]
    j = 0
    while j + 4 <= k:
        x0, x1, x2, x3 = x[j], x[j + 1], x[j + 2], x[j + 3]
        s00 = s01 = s02 = s03 = np.float32(0.0)
        s10 = s11 = s12 = s13 = np.float32(0.0)
        s20 = s21 = s22 = s23 = np.float32(0.0)
        s30 = s31 = s32 = s33 = np.float32(0.0)
        for i in range(n):
            a0, a1, a2, a3 = w0[i], w1[i], w2[i], w3[i]
            c0, c1, c2, c3 = x0[i], x1[i], x2[i], x3[i]
            s00 += a0 * c0
            s01 += a0 * c1
            s02 += a0 * c2
            s03 += a0 * c3
            s10 += a1 * c0
            s11 += a1 * c1
            s12 += a1 * c2
            s13 += a1 * c3
            s20 += a2 * c0
            s21 += a2 * c1
            s22 += a2 * c2
            s23 += a2 * c3
            s30 += a3 * c0
            s31 += a3 * c1
            s32 += a3 * c2
            s33 += a3 * c3
        y[j, o], y[j, o + 1], y[j, o + 2], y[j, o + 3] = s00 + b0, s10 + b1, s20 + b2, s30 + b3
        y[j + 1, o], y[j + 1, o + 1], y[j + 1, o + 2], y[j + 1, o + 3] = s01 + b0, s11 + b1, s21 + b2, s31 + b3
        y[j + 2, o], y[j + 2, o + 1], y[j + 2, o + 2], y[j + 2, o + 3] = s02 + b0, s12 + b1, s22 + b2, s32 + b3
        y[j + 3, o], y[j + 3, o + 1], y[j + 3, o + 2], y[j + 3, o + 3] = s03 + b0, s13 + b1, s23 + b2, s33 + b3
        j += 4
    while j < k:
        x0 = x[j]
        s00 = s10 = s20 = s30 = np.float32(0.0)
        for i in range(n):
            c0 = x0[i]
            s00 += w0[i] * c0
            s10 += w1[i] * c0
            s20 += w2[i] * c0
            s30 += w3[i] * c0
        y[j, o], y[j, o + 1], y[j, o + 2], y[j, o + 3] = s00 + b0, s10 + b1, s20 + b2, s30 + b3
        j += 1


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _row1(x, w, r, bias, y, o):
    """``y[:, o] = x @ w[r] (+ bias[o])``: one weight row (the tail when ``out`` is not a multiple of 4)."""
    k, n = x.shape
    b = bias[o] if bias.shape[0] > 0 else np.float32(0.0)
    for j in range(k):
        s = np.float32(0.0)
        for i in range(n):
            s += w[r, i] * x[j, i]
        y[j, o] = s + b


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _widen_bf16(wu, r, count, buf):
    """``buf[:count]`` = rows ``r .. r + count - 1`` of the bf16 bits ``wu`` (uint16[out, n]) as float32 bits.

    bf16 is the top half of an fp32, so widening is ``bits << 16``: buf uint32[4, n] (viewed as float32
    by the caller). Example: bf16 bits 0x3F80 (1.0) -> 0x3F800000 (1.0f).
    """
    n = wu.shape[1]
    for a in range(count):
        for i in range(n):
            buf[a, i] = np.uint32(wu[r + a, i]) << np.uint32(16)


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _blocks_f32(x, w, bias, y, first, last):
    """Output blocks ``first .. last - 1`` (4 rows each) of ``y = x @ w.T + bias``, prefetching 2 ahead."""
    nblocks = w.shape[0] // _BLOCK
    for blk in range(first, last):
        ahead = blk + 2
        if ahead < nblocks:
            _prefetch_rows(w, ahead * _BLOCK, _BLOCK)
        _rows4(x, w, blk * _BLOCK, bias, y, blk * _BLOCK)


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _blocks_bf16(x, wu, bias, y, first, last):
    """As :func:`_blocks_f32` for bf16 weight bits ``wu`` (uint16[out, n]): each block widened to fp32 first."""
    n = wu.shape[1]
    nblocks = wu.shape[0] // _BLOCK
    buf = np.empty((_BLOCK, n), np.uint32)  # uint32[4, n]: one widened block
    wf = buf.view(np.float32)
    for blk in range(first, last):
        ahead = blk + 2
        if ahead < nblocks:
            _prefetch_rows(wu, ahead * _BLOCK, _BLOCK)
        _widen_bf16(wu, blk * _BLOCK, _BLOCK, buf)
        _rows4(x, wf, 0, bias, y, blk * _BLOCK)


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _tail(x, w, bias, y, bf16):
    """The last ``out % 4`` output columns, one weight row at a time."""
    out, n = w.shape
    buf = np.empty((1, n), np.uint32)
    wf = buf.view(np.float32)
    for o in range(out - out % _BLOCK, out):
        if bf16:
            _widen_bf16(w, o, 1, buf)
            _row1(x, wf, 0, bias, y, o)
        else:
            _row1(x, w, o, bias, y, o)


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _serial_f32(x, w, bias, y):
    _blocks_f32(x, w, bias, y, 0, w.shape[0] // _BLOCK)
    _tail(x, w, bias, y, False)


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _serial_bf16(x, wu, bias, y):
    _blocks_bf16(x, wu, bias, y, 0, wu.shape[0] // _BLOCK)
    _tail(x, wu, bias, y, True)


@njit(cache=True, nogil=True, fastmath=_FASTMATH, parallel=True)
def _parallel_f32(x, w, bias, y, chunks):
    nblocks = w.shape[0] // _BLOCK
    for c in prange(chunks):
        _blocks_f32(x, w, bias, y, c * nblocks // chunks, (c + 1) * nblocks // chunks)
    _tail(x, w, bias, y, False)


@njit(cache=True, nogil=True, fastmath=_FASTMATH, parallel=True)
def _parallel_bf16(x, wu, bias, y, chunks):
    nblocks = wu.shape[0] // _BLOCK
    for c in prange(chunks):
        _blocks_bf16(x, wu, bias, y, c * nblocks // chunks, (c + 1) * nblocks // chunks)
    _tail(x, wu, bias, y, True)


def linear_into(x: np.ndarray, w: np.ndarray, bias: np.ndarray, y: np.ndarray, threads: int = 1) -> None:
    """``y[...] = x @ W.T + bias`` with fp32 accumulation; ``w`` float32[out, n] or bf16 bits uint16[out, n].

    x float32[k, n] C-contiguous, bias float32[out] or float32[0] (no bias), y float32[k, out]
    C-contiguous (written, never read). ``threads > 1`` splits the output blocks over Numba threads
    (at most ``numba.config.NUMBA_NUM_THREADS``). Example: ``x = np.ones((2, 3), np.float32)``,
    ``w = np.arange(6, dtype=np.float32).reshape(2, 3)``, no bias -> ``y = [[3, 12], [3, 12]]``.
    """
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1] or y.shape != (x.shape[0], w.shape[0]):
        raise ValueError(f"linear_into: shapes x{x.shape} w{w.shape} y{y.shape} do not match")
    bf16 = w.dtype == np.uint16
    if threads > 1 and w.shape[0] >= 8 * _BLOCK:
        threads = min(threads, numba.config.NUMBA_NUM_THREADS)
        previous = numba.get_num_threads()
        numba.set_num_threads(threads)
        try:
            (_parallel_bf16 if bf16 else _parallel_f32)(x, w, bias, y, min(4 * threads, w.shape[0] // _BLOCK))
        finally:
            numba.set_num_threads(previous)
    else:
        (_serial_bf16 if bf16 else _serial_f32)(x, w, bias, y)


# --- routing a model's nn.Linear modules through the kernels (per instance, for a scope) --------------

_SUPPORTED = (torch.float32, torch.bfloat16)


def _all_rows(rows: int) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """One module's weights as NumPy views (no copy) and what its patched forward checks on each call."""

    weight: torch.Tensor  # the Parameter seen at entry (identity checked per call)
    bias: torch.Tensor | None
    w: np.ndarray  # float32[out, in] or uint16[out, in] (bf16 bits), sharing the weight's memory
    b: np.ndarray  # float32[out] (a converted copy of the bias) or float32[0]
    data_ptr: int


def _prepare(m: torch.nn.Linear) -> _Prepared | None:
    """The kernel's view of ``m``, or None when ``m`` is not covered (device, dtype, layout, bias dtype)."""
    w, b = m.weight, m.bias
    if (w.device.type != "cpu" or w.dtype not in _SUPPORTED or w.dim() != 2 or not w.is_contiguous()
            or (b is not None and (b.dtype != w.dtype or b.device.type != "cpu"))):
        return None
    wd = w.detach()
    view = wd.numpy() if w.dtype == torch.float32 else wd.view(torch.int16).numpy().view(np.uint16)
    bias = (b.detach().to(torch.float32).numpy().copy() if b is not None else np.zeros(0, np.float32))
    return _Prepared(w, b, view, bias, w.data_ptr())


def _kernel_forward(module_ref: weakref.ref, prep: _Prepared, use: Callable[[int], bool],
                    threads: Callable[[], int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """The instance ``forward`` of one module: the kernel when covered and chosen, else ``F.linear``."""
    linear = torch.nn.functional.linear
    out_features, in_features = prep.w.shape

    def forward(input: torch.Tensor) -> torch.Tensor:
        m = module_ref()
        if m is None:  # unreachable through the module itself; a stray reference to this function
            return linear(input, prep.weight, prep.bias)
        params = m._parameters  # plain dict look-ups: cheaper than m.weight
        weight, bias = params["weight"], params["bias"]
        if (weight is not prep.weight or bias is not prep.bias or input.dtype != weight.dtype
                or input.device.type != "cpu" or input.dim() == 0 or input.shape[-1] != in_features
                or weight.data_ptr() != prep.data_ptr
                or (torch.is_grad_enabled() and (weight.requires_grad or input.requires_grad))):
            return linear(input, weight, bias)
        rows = input.numel() // in_features
        if rows == 0 or not use(rows):
            return linear(input, weight, bias)
        if weight.dtype == torch.float32:  # NumPy's reshape copies a non-contiguous input: never in place
            x = np.ascontiguousarray(input.detach().numpy().reshape(rows, in_features))
        else:
            x = input.detach().reshape(rows, in_features).to(torch.float32).contiguous().numpy()
        y = np.empty((rows, out_features), np.float32)  # float32[rows, out]
        linear_into(x, prep.w, prep.b, y, threads())
        out = torch.from_numpy(y.reshape(*input.shape[:-1], out_features))
        return out if weight.dtype == torch.float32 else out.to(weight.dtype)

    return forward


@dataclasses.dataclass
class _Active:
    """One model's patch while inside :func:`fast_linears` (entries counted: nested entries share it)."""

    use: object
    modules: list  # [nn.Linear] whose instance ``forward`` we set
    depth: int = 1


_ACTIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> _Active
_ACTIVE_LOCK = threading.Lock()


def _as_predicate(use) -> Callable[[int], bool]:
    """``use`` as ``rows -> bool``: a callable as is; ``None`` every row count; a collection membership;
    a :class:`PathTimes` its :meth:`PathTimes.kernel_rows`."""
    if use is None:
        return _all_rows
    if isinstance(use, PathTimes):
        use = use.kernel_rows()
    if callable(use):
        return use
    rows = frozenset(int(r) for r in use)
    return rows.__contains__


def _torch_threads() -> int:
    return torch.get_num_threads()


def covered_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The modules of ``model`` :func:`fast_linears` routes: exact ``nn.Linear`` (no subclass), on a CPU,
    fp32 or bf16 C-contiguous weight (bias of the same dtype or none), no instance ``forward`` already set
    (by a hook library, say: left alone)."""
    return [m for m in model.modules()
            if type(m) is torch.nn.Linear and "forward" not in m.__dict__ and _prepare(m) is not None]


@contextlib.contextmanager
def fast_linears(model: torch.nn.Module, use=None, threads: Callable[[], int] | int | None = None
                 ) -> Iterator[int]:
    """Route ``model``'s covered ``nn.Linear`` modules (see :func:`covered_linears`) through the kernels.

    For each covered module an instance attribute ``forward`` is set (no class is touched, no other
    model is touched); it runs the kernel when the input's row count (product of its leading dims) is
    chosen by ``use``, else ``torch.nn.functional.linear`` unchanged. It also falls back to torch when
    the input's dtype differs from the weight's, the input is not on a CPU, autograd needs a graph, or
    the module's weight or bias was replaced since entry. Inputs are never modified.

    ``use``: ``None`` (every row count), a collection of row counts, a ``rows -> bool`` callable, or a
    :class:`PathTimes` (the row counts where kernels measured faster). ``threads``: the kernel's thread
    count, an int or a callable read per call; default ``torch.get_num_threads()``.

    Re-entrant: a nested (or concurrent, from another thread) entry on the same model with an equal
    ``use`` shares the first entry's routing and the last exit restores; with a different ``use`` it
    raises ``RuntimeError``. On exit, normal or by exception, every instance ``forward`` set here is
    deleted, so the class's ``forward`` applies again. Yields the number of modules routed.

    Example::

        with torch.no_grad(), fast_linears(model, use={1, 2, 4}):
            model(input_ids=ids)  # 1, 2 or 4 rows per linear: kernels; other row counts: torch
    """
    thread_count = (threads if callable(threads) else (lambda: threads) if threads is not None
                    else _torch_threads)
    predicate = _as_predicate(use)
    with _ACTIVE_LOCK:
        active = _ACTIVE.get(model)
        if active is not None:
            if active.use is not use and active.use != use:
                raise RuntimeError("fast_linears: already active on this model with a different `use`; "
                                   "exit the outer scope first")
            active.depth += 1
        else:
            active = _Active(use, [])
            try:
                for m in covered_linears(model):
                    m.forward = _kernel_forward(weakref.ref(m), _prepare(m), predicate, thread_count)
                    active.modules.append(m)
            except BaseException:
                _restore(active.modules)
                raise
            _ACTIVE[model] = active
    try:
        yield len(active.modules)
    finally:
        with _ACTIVE_LOCK:
            active.depth -= 1
            if active.depth == 0:
                _restore(active.modules)
                _ACTIVE.pop(model, None)


@contextlib.contextmanager
def routed(model: torch.nn.Module, rows: frozenset[int]) -> Iterator[None]:
    """:func:`fast_linears` for the row counts ``rows`` (a calibrated ``CostModel.kernel_rows``); nothing when
    ``rows`` is empty, or when another call already routes this model with another set (its routing
    then applies: both are the calibrated faster path of the same model)."""
    with contextlib.ExitStack() as stack:
        if rows:
            try:
                stack.enter_context(fast_linears(model, use=rows))
            except RuntimeError:
                pass
        yield


def _restore(modules: list) -> None:
    for m in modules:
        m.__dict__.pop("forward", None)
    modules.clear()


# --- which path is faster, per k, on this machine ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PathTimes:
    """Whole-forward seconds per number of new tokens ``k`` on torch's path and on the kernels' path.

    ``sizes`` int[m] increasing; ``torch_s`` and ``kernel_s`` float[m] seconds (> 0). Example::

        t = PathTimes((1, 2, 4), (0.050, 0.080, 0.090), (0.030, 0.040, 0.100))
        t.faster            # {1: 'kernel', 2: 'kernel', 4: 'torch'}
        t.curve_points      # ((1, 0.030), (2, 0.040), (4, 0.090)): for cost.CostModel
        t.kernel_rows()     # frozenset({1, 2}): rows 3 lie between a kernel win and a torch win
    """

    sizes: tuple[int, ...]
    torch_s: tuple[float, ...]
    kernel_s: tuple[float, ...]

    def __post_init__(self):
        if not self.sizes or any(int(k) != k or k < 1 for k in self.sizes) or list(self.sizes) != sorted(
                set(self.sizes)):
            raise ValueError(f"PathTimes.sizes must be distinct increasing integers >= 1; got {self.sizes!r}")
        for name in ("torch_s", "kernel_s"):
            values = getattr(self, name)
            if len(values) != len(self.sizes) or not all(float(v) > 0 for v in values):
                raise ValueError(f"PathTimes.{name} must hold one positive time per size; got {values!r}")

    @property
    def faster(self) -> dict[int, str]:
        """``{k: 'kernel' | 'torch'}``: the faster path per measured ``k`` (a tie goes to torch)."""
        return {k: "kernel" if tk < tt else "torch" for k, tt, tk in zip(self.sizes, self.torch_s, self.kernel_s)}

    @property
    def curve_points(self) -> tuple[tuple[int, float], ...]:
        """``((k, seconds), ...)``: the faster path's time per ``k``, the points ``cost.CostModel`` takes."""
        return tuple((k, min(tt, tk)) for k, tt, tk in zip(self.sizes, self.torch_s, self.kernel_s))

    def kernel_rows(self) -> frozenset[int]:
        """Row counts routed to the kernels: each measured ``k`` where they were faster, and each ``r``
        between two measured sizes where they were faster at both. Beyond the largest size: torch."""
        wins = [f == "kernel" for f in self.faster.values()]
        rows = {k for k, w in zip(self.sizes, wins) if w}
        for (lo, w_lo), (hi, w_hi) in zip(zip(self.sizes, wins), zip(self.sizes[1:], wins[1:])):
            if w_lo and w_hi:
                rows.update(range(lo, hi + 1))
        return frozenset(rows)


def measure_paths(model, sizes: Sequence[int], clock: Callable[[], float] = time.perf_counter,
                  context: int = 128, repeats: int = 3, cache_factory: Callable | None = None,
                  threads: int | None = None) -> PathTimes:
    """Time one whole forward per ``k`` in ``sizes`` on both paths after a ``context``-token prefill.

    As ``cost.measure_cost_curve``: a ``DynamicCache`` (or ``cache_factory()``), random ids, each timed
    forward cropped off the cache again; here the two paths alternate at every ``k`` of every repeat
    (so drift in the machine's speed hits both alike) and each keeps its fastest of ``repeats`` runs.
    One untimed forward per path and size first (compiles the kernels; a cached compile is quick).
    ``clock`` is injectable: tests pass a fake one. About 2 x 3 s for SmolLM2-135M on one core.
    """
    from transformers import DynamicCache

    from . import compat

    sizes = tuple(sorted(set(int(k) for k in sizes)))
    cache_kwarg, keeps_logits = compat.cache_kwarg_name(model), compat.supports_logits_to_keep(model)
    limit = getattr(model.config, "max_position_embeddings", None) or 4096
    context = max(1, min(context, limit - max(sizes) - 1))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, context + max(sizes)), generator=gen)
    cache = (cache_factory or (lambda: DynamicCache(config=model.config)))()
    best = {("torch", k): float("inf") for k in sizes} | {("kernel", k): float("inf") for k in sizes}

    def forward(k: int) -> None:
        pos = torch.arange(context, context + k)[None]
        model(input_ids=ids[:, context:context + k], position_ids=pos, use_cache=True, **{cache_kwarg: cache},
              **({"logits_to_keep": k} if keeps_logits else {}))
        cache.crop(-k)

    def on_path(path: str):
        return fast_linears(model, threads=threads) if path == "kernel" else contextlib.nullcontext()

    with torch.no_grad():
        model(input_ids=ids[:, :context], use_cache=True, **{cache_kwarg: cache})
        for path in ("torch", "kernel"):
            with on_path(path):
                for k in sizes:
                    forward(k)
        for rep in range(repeats):
            for k in sizes:
                for path in (("torch", "kernel") if rep % 2 == 0 else ("kernel", "torch")):
                    with on_path(path):
                        t = clock()
                        forward(k)
                        best[path, k] = min(best[path, k], clock() - t)
    return PathTimes(sizes, tuple(best["torch", k] for k in sizes), tuple(best["kernel", k] for k in sizes))
