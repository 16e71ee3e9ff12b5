"""The CPU linear layouts a shadow (``shadow.py``) computes a step's ``nn.Linear``s in: :class:`LayoutLinear`."""

from __future__ import annotations

import torch
from torch import nn

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
