"""The package's Numba kernels: where they are defined, which were compiled, and whether Numba's on-disk cache
holds them (for ``python -m lookahead warmup`` and the first call's notice). Imports no torch."""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import pkgutil
import threading

CORE = ("lookahead.budget", "lookahead.packing", "lookahead.verify", "lookahead.drafting.kernels",
        "lookahead.drafting.recycle", "lookahead.cache.kernels", "lookahead.cache.primitives", "lookahead.cache.suffix")
"""The modules whose kernels a default call runs (the optional subpackages have their own)."""


def kernel_modules(core: bool = False) -> list:
    """The package's modules whose source says ``njit``, imported (``lookahead.cache`` included); ``core``: only
    :data:`CORE`."""
    if core:
        return [importlib.import_module(name) for name in CORE]
    names = {info.name for package in ("lookahead", "lookahead.cache")
             for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + ".")}
    origins = {name: getattr(importlib.util.find_spec(name), "origin", None) or ""
               for name in sorted(names - {__name__})}
    return [importlib.import_module(name) for name, path in origins.items()
            if path.endswith(".py") and "njit" in pathlib.Path(path).read_text(encoding="utf-8")]


def kernels(modules=None) -> list[tuple[str, object]]:
    """``(module.name, dispatcher)`` for every Numba kernel defined in ``modules`` (default: the package's)."""
    from numba.core.registry import CPUDispatcher

    return [(f"{mod.__name__}.{name}", value) for mod in (kernel_modules() if modules is None else modules)
            for name, value in vars(mod).items()
            if isinstance(value, CPUDispatcher) and value.py_func.__module__ == mod.__name__]


def _entry_kernels(modules) -> list:
    """The dispatchers of :func:`kernels` that are compiled on their own: neither ``inline="always"`` nor called by
    another kernel (those are compiled into their callers)."""
    found = kernels(modules)
    called = {name for _, d in found for name in d.py_func.__code__.co_names}
    return [(name, d) for name, d in found
            if d.targetoptions.get("inline") != "always" and d.py_func.__name__ not in called]


def missed_kernels(modules=None) -> list[str]:
    """Kernels this process has neither compiled nor loaded, except those compiled into their callers."""
    return [name for name, d in _entry_kernels(modules) if not d.signatures]


def kernels_compiled(modules=None) -> bool | None:
    """Whether Numba's on-disk cache holds every kernel for this CPU and source (None: unreadable); reads only the
    cache's index files."""
    try:
        for _, d in _entry_kernels(modules):
            magic = d.targetctx.codegen().magic_tuple()
            index = d._cache._cache_file._load_index()  # {} when missing or made from another source
            if not any(key[1] == magic for key in index):
                return False
        return True
    except Exception:  # another Numba's internals: say "unknown", never fail a run over it
        return None


class _Kernels:
    """This process's view of the :data:`CORE` kernels."""

    def __init__(self):
        self.lock = threading.Lock()
        self.ready = False  # every CORE kernel compiled or in Numba's cache (never False again)
        self.inline = False  # compile on first use, inside the call (``warmup``, the tests)


_STATE = _Kernels()


def compile_inline() -> None:
    """In this process, kernels compile inside the call that first needs them (``warmup``; a test session), not in
    the background: every call drafts from its first step."""
    _STATE.inline = True


def kernels_ready() -> bool:
    """Whether a call may run the :data:`CORE` kernels now without compiling one: they are compiled in this process,
    held by Numba's cache, or this process compiles inline (:func:`compile_inline`; also when the cache cannot be
    read). Otherwise a background process compiles them into Numba's cache (:mod:`lookahead.kernel_compiler`), at the
    lowest priority, once per machine at a time; False until it is done, so the call decodes plain meanwhile."""
    if _STATE.ready or _STATE.inline:
        return True
    with _STATE.lock:
        modules = kernel_modules(core=True)
        if not missed_kernels(modules) or kernels_compiled(modules) is not False:
            _STATE.ready = True
            return True
        from .kernel_compiler import compiling

        if not compiling():  # nothing will compile them elsewhere: compile on first use
            _STATE.inline = True
            return True
    return False
