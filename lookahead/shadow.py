"""A shadow of a model's module tree (:func:`shadow`): the same parameters, buffers and hooks, another way to
compute a step. Nothing is installed on the user's model; another thread's forward never meets the shadow."""

from __future__ import annotations

import copy
import threading
import weakref

from torch import nn

from . import compat


def _clone(module: nn.Module, plan, configs: dict | None) -> nn.Module:
    """``module``'s tree, ``nn.Linear``s as ``cpu.linear.LayoutLinear`` where ``plan`` has a layout; with
    ``configs`` (a memo) each attention module names grouped attention in a copy of its config
    (``compat.grouped_config``)."""
    if plan and type(module) is nn.Linear and module.weight.device.type == "cpu" and module.weight.is_floating_point():
        from .cpu.linear import LayoutLinear

        return LayoutLinear(module, plan)
    other = copy.copy(module)  # a new object with the same attributes: parameters and buffers shared
    other.__dict__.pop("forward", None)  # an instance-level forward (a compiled one) would run the original's tree
    if configs is not None and hasattr(module, "num_key_value_groups") and hasattr(module, "config"):
        key = id(module.config)
        if key not in configs:
            configs[key] = compat.grouped_config(module.config)
        other.config = configs[key]
    other._modules = {name: None if child is None else _clone(child, plan, configs)
                      for name, child in module._modules.items()}
    return other


_SHADOWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {(plan, grouped): (tree, shadow)}
_LOCK = threading.Lock()


def shadow(model, plan=None, grouped: bool = False) -> nn.Module:
    """``model``'s module tree with every eligible ``nn.Linear`` a ``cpu.linear.LayoutLinear`` under ``plan`` and, with
    ``grouped``, every attention module running ``compat.grouped_attention``; parameters, buffers and hooks shared.
    Made once per model, plan and ``grouped`` (it holds no per-call state), again when :func:`_tree` changes."""
    with _LOCK:
        kept = _SHADOWS.setdefault(model, {})
        tree = _tree(model)
        found = kept.get((plan, grouped))
        if found is None or found[0] != tree:
            found = kept[(plan, grouped)] = (tree, _clone(model, plan, {} if grouped else None))
        return found[1]


def _tree(model) -> tuple:
    """What a shadow was made from: the ids of ``model``'s modules, parameters and buffers, its attention kernel."""
    return (tuple(id(m) for m in model.modules()), tuple(id(p) for p in model.parameters()),
            tuple(id(b) for b in model.buffers()), getattr(compat.text_config(model), "_attn_implementation", None))
