"""The opt-in vmap-free cohort forward of ghost clipping (``clipped_grad_sum(cohort_layers=True)``, see
:data:`trustfl.client.per_example.COHORT_LAYERS`): the cohort's ``m·B`` examples run as one batch, each ghost layer
computing with its own client's parameters.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from trustfl.client import ghost
from trustfl.objectives.base import Batch, flat_batch

Params = dict[str, torch.Tensor]


def _cohort_forward(model: nn.Module, layers: list[ghost.GhostLayer], params: Params, batch: Batch,
                    client_forward: Callable, m: int, b: int):
    """The cohort's forward without ``vmap``: the ``m·B`` examples run as one batch through the model, and each
    ghost layer computes with its client's parameters (convolutions without input gradient: ``W_i`` times the
    unfolded patches, one matmul; others: one grouped convolution with the clients folded into the channels; linear
    layers: one batched matmul). Returns ``(outputs (m, B, ...), acts, taps)``: ``taps[i]`` is a tensor holding layer
    ``i``'s output (the output before its bias is added, no zero probe needed), or a zero probe added to it when
    there is no such tensor; its gradient is the output gradient (any reshape of ``(m, B, *out_shape)``)."""
    modules = dict(model.named_modules())
    taps: list[torch.Tensor | None] = [None] * len(layers)

    def tap(i: int, pre: torch.Tensor, bias: torch.Tensor | None, add: Callable[[torch.Tensor], torch.Tensor]
            ) -> torch.Tensor:
        """``pre`` plus the bias; ``pre`` (a fresh tensor the model never sees, so never changed in place) is
        layer ``i``'s tap, or a zero probe is added when there is no bias."""
        if bias is None:
            taps[i] = torch.zeros_like(pre, requires_grad=True)
            return pre + taps[i]
        taps[i] = pre if pre.requires_grad else pre.requires_grad_()
        return add(pre)

    def weights(layer: ghost.GhostLayer) -> tuple[torch.Tensor, torch.Tensor | None]:
        mod = modules[layer.name]
        w = params[layer.weight] if layer.weight is not None else mod.weight.detach().expand(m, *mod.weight.shape)
        if layer.bias is not None:
            return w, params[layer.bias]
        return w, None if mod.bias is None else mod.bias.detach().expand(m, *mod.bias.shape)

    def linear(i: int, layer: ghost.GhostLayer) -> Callable[[torch.Tensor], torch.Tensor]:
        w, bias = weights(layer)

        def fwd(x: torch.Tensor) -> torch.Tensor:
            lead = x.shape[:-1]
            out = torch.matmul(x.reshape(m, -1, x.shape[-1]), w.transpose(1, 2))
            out = tap(i, out, bias, lambda t: t + bias.unsqueeze(1))  # type: ignore[union-attr]
            return out.reshape(*lead, w.shape[1])
        return fwd

    def conv(i: int, layer: ghost.GhostLayer) -> Callable[[torch.Tensor], torch.Tensor]:
        w, bias = weights(layer)
        o = w.shape[1]

        def fwd(x: torch.Tensor) -> torch.Tensor:
            c, h, wd = x.shape[1:]
            if layer.groups == 1 and not x.requires_grad:  # patches · W_i: no layout copies, no grad to x needed
                cols = ghost._patches(layer, x)  # (m·B, D, T)
                out = torch.matmul(w.reshape(m, 1, o, -1), cols.view(m, b, *cols.shape[1:]))
                out = tap(i, out, bias, lambda t: t + bias.view(m, 1, o, 1))  # type: ignore[union-attr]
                (kh, _), (sh, _), (ph, _), (dh, _) = layer.kernel_size, layer.stride, layer.padding, layer.dilation
                return out.view(m * b, o, (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, -1)
            folded = x.view(m, b, c, h, wd).transpose(0, 1).reshape(b, m * c, h, wd)
            out = torch.nn.functional.conv2d(folded, w.reshape(m * o, *w.shape[2:]),
                                             None if bias is None else bias.reshape(-1), layer.stride, layer.padding,
                                             layer.dilation, m * layer.groups)
            out = out.view(b, m, o, *out.shape[2:]).transpose(0, 1).reshape(m * b, o, *out.shape[2:])
            taps[i] = torch.zeros_like(out, requires_grad=True)
            return out + taps[i]
        return fwd

    overridden = []
    try:
        for i, layer in enumerate(layers):
            modules[layer.name].forward = linear(i, layer) if layer.kind == "linear" else conv(i, layer)
            overridden.append(modules[layer.name])
        outputs, acts = client_forward({}, [None] * len(layers), flat_batch(batch, 2))
    finally:
        for mod in overridden:
            del mod.forward
    return outputs.view(m, b, *outputs.shape[1:]), tuple(a.view(m, b, *a.shape[1:]) for a in acts), taps
