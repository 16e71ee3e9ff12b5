"""A shadow of a model's module tree (:func:`shadow`): the same parameters, buffers and hooks, another way to
compute a step. Nothing is installed on the user's model; another thread's forward never meets the shadow."""

from __future__ import annotations

import copy
import threading
import weakref

import torch
from torch import nn

from . import compat

LINEAR, TRANSPOSED, ONEDNN = 0, 1, 2
"""The layouts: ``nn.Linear``, the other way round, oneDNN's linear."""


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


_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
          "_forward_hooks_always_called", "_backward_hooks", "_backward_pre_hooks")


class LayoutLinear(nn.Module):
    """``nn.Linear``'s product over the same ``weight`` and ``bias``, in the layout ``plan`` gives its input's rows
    (one row, any call that records gradients, or an input ``nn.Linear`` would not take: ``nn.Linear``'s)."""

    def __init__(self, linear: nn.Linear, plan):
        super().__init__()
        self.weight, self.bias, self.plan = linear.weight, linear.bias, plan
        object.__setattr__(self, "original", linear)  # not a child module
        for name in _HOOKS:  # the user's hooks on the layer act in the shadow's steps too (the same dicts)
            setattr(self, name, getattr(linear, name))
        self._kinds: dict[int, int] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if x.dim() < 2 or torch.is_grad_enabled() or x.dtype != w.dtype or x.shape[-1] != w.shape[1]:
            return nn.functional.linear(x, w, self.bias)
        rows = x.numel() // x.shape[-1]
        kind = self._kinds.get(rows)
        if kind is None:
            kind = self._kinds[rows] = self.plan.kind(rows)
        if kind == TRANSPOSED:
            return transposed_linear(x, w, self.bias)
        if kind == ONEDNN:
            return onednn_linear(x, w, self.bias)
        return nn.functional.linear(x, w, self.bias)


def _clone(module: nn.Module, plan, configs: dict | None) -> nn.Module:
    """``module``'s tree, ``nn.Linear``s as :class:`LayoutLinear` where ``plan`` has a layout; with ``configs`` (a memo)
    each attention module names grouped attention in a copy of its config (``compat.grouped_config``)."""
    if plan and type(module) is nn.Linear and module.weight.device.type == "cpu" and module.weight.is_floating_point():
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
    """``model``'s module tree with every eligible ``nn.Linear`` a :class:`LayoutLinear` under ``plan`` and, with
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
