"""A fast functional forward for the vertical models' MLPs: ``Sequential`` of ``Linear`` and ``ReLU`` layers run
directly on slices of a flat parameter vector.

``torch.func.functional_call`` swaps a module's parameters in and out on every call, which costs more than the
small layers themselves at vertical FL's sizes (one party or the head, a batch of 64). The same computation
written as ``F.linear``/``relu`` calls on views of the flat vector gives bitwise the same outputs (``nn.Linear``
calls ``F.linear``). Other modules fall back to ``functional_call``.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from trustfl.core.functional import functional_call
from trustfl.types import ParamLayout


class FlatForward:
    """``forward(flat, x)``: ``module`` run with the parameters held in ``flat`` (``named_parameters`` order)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.layout = ParamLayout.of({k: v.detach() for k, v in module.named_parameters()})
        self.plan: list[tuple[str, tuple[int, int, tuple[int, ...]] | None, tuple[int, int] | None]] | None = None
        if isinstance(module, nn.Sequential) and all(isinstance(m, (nn.Linear, nn.ReLU)) for m in module):
            plan, start = [], 0
            for layer in module:
                if isinstance(layer, nn.ReLU):
                    plan.append(("relu", None, None))
                    continue
                shape = tuple(layer.weight.shape)
                weight = (start, start + math.prod(shape), shape)
                start = weight[1]
                bias = None
                if layer.bias is not None:
                    bias = (start, start + layer.bias.numel())
                    start = bias[1]
                plan.append(("linear", weight, bias))
            self.plan = plan

    def __call__(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.plan is None:
            return functional_call(self.module, self.layout.unflatten(flat), (x,))
        for op, weight, bias in self.plan:
            if op == "relu":
                x = torch.relu(x)
            else:
                w = flat[weight[0]:weight[1]].view(weight[2])
                x = F.linear(x, w, None if bias is None else flat[bias[0]:bias[1]])
        return x
