"""The package's Numba kernels: where they are defined, which were compiled, and whether Numba's on-disk cache
holds them (for ``python -m lookahead warmup`` and the first call's notice). Imports no torch."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

CORE = ("lookahead.budget", "lookahead.loop", "lookahead.packing", "lookahead.verify", "lookahead.drafting.kernels",
        "lookahead.drafting.recycle", "lookahead.cache.kernels", "lookahead.cache.primitives", "lookahead.cache.suffix")
"""The modules whose kernels a default call runs (the optional subpackages have their own)."""


def kernel_modules(core: bool = False) -> list:
    """The package's modules whose source says ``njit``, imported (``lookahead.cache`` included); ``core``: only
    :data:`CORE`."""
    if core:
        return [importlib.import_module(name) for name in CORE]
    names = set()
    for package in ("lookahead", "lookahead.cache"):
        names.update(info.name for info in pkgutil.walk_packages(importlib.import_module(package).__path__,
                                                                 package + "."))
    found = []
    for name in sorted(names):
        path = getattr(importlib.util.find_spec(name), "origin", None)
        if name == __name__ or not path or not path.endswith(".py"):
            continue
        with open(path, encoding="utf-8") as f:
            if "njit" in f.read():
                found.append(importlib.import_module(name))
    return found


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
    called = set()
    for _, d in found:
        called.update(d.py_func.__code__.co_names)
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


_CHECKED: list = []  # one entry once this process has checked (or need not check) for uncompiled kernels


def mark_checked() -> None:
    """No first-call notice in this process (``warmup`` compiles the kernels and says so itself)."""
    _CHECKED.append(True)


def warn_if_uncompiled() -> None:
    """Once per process, log that this call compiles the :data:`CORE` kernels where Numba's cache lacks one."""
    if _CHECKED:
        return
    _CHECKED.append(True)
    if kernels_compiled(kernel_modules(core=True)) is False:
        import logging

        logging.getLogger("lookahead").warning(
            "lookahead: the Numba kernels are not compiled yet, so this first call compiles the ones it needs "
            "(tens of seconds, once per machine); `python -m lookahead warmup` compiles them ahead")
