"""A one-client ghost pass's convolutions on the CPU as one matrix product over channels-last patches.

Where it pays (:func:`pays`), a ``Conv2d`` (``groups = 1``) of a one-client ghost pass on the CPU computes its output as

    Z = A Wᵀ + b,   A ∈ R^{(N·T)×(k_h·k_w·C)} the patches of the input, W ∈ R^{P×(k_h·k_w·C)},

with ``A`` copied from the channels-last input in one strided copy (one per kernel row for a one-channel input;
columns in ``(k_h, k_w, C)`` order, each row a run of contiguous ``C``-blocks) and ``Z`` channels-last, and hands
``A`` on: ghost clipping forms each example's weight gradient ``G_bᵀ A_b`` from the same ``A``
(:func:`trustfl.client.ghost.squared_norms` with ``columns``), one batched product instead of a grouped convolution
backward or a second unfolding. The gradient w.r.t. the input is PyTorch's convolution backward (the input's only:
the pass computes no weight gradients). Results equal PyTorch's convolution to float rounding (another summation
order), not bitwise; ``benchmarks/patch_conv.py`` measures the step and the difference.

Everything else (CUDA, grouped and 1-D convolutions, cohorts under ``vmap``, padded convolutions) keeps the
module's own convolution.
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from trustfl.client.ghost import GhostLayer, grouped_form


def output_side(layer: GhostLayer, height: int, width: int) -> tuple[int, int]:
    """``(H_out, W_out)`` of ``layer`` on an ``height × width`` input."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = layer.kernel_size, layer.stride, layer.padding, layer.dilation
    return (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1


def patches(layer: GhostLayer, a: torch.Tensor) -> torch.Tensor:
    """The patches of ``a (N, C, H, W)`` as ``(N, T, k_h·k_w·C)``: row ``t`` is output position ``t`` (row-major),
    its columns in ``(k_h, k_w, C)`` order; copied from the channels-last input."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = layer.kernel_size, layer.stride, layer.padding, layer.dilation
    ho, wo = output_side(layer, a.shape[2], a.shape[3])
    if ph or pw:
        a = F.pad(a, (pw, pw, ph, ph))
    n, c = a.shape[:2]
    a = a.contiguous(memory_format=torch.channels_last)
    s = a.stride()
    if c == 1:  # one copy per kernel row: runs of k_w floats copy faster in 5-D than in one 6-D copy
        out = a.new_empty((n, ho, wo, kh, kw))
        for i in range(kh):
            out[:, :, :, i] = a.as_strided((n, ho, wo, kw), (s[0], s[2] * sh, s[3] * sw, s[3] * dw),
                                           a.storage_offset() + i * dh * s[2])
        return out.view(n, ho * wo, kh * kw)
    windows = a.as_strided((n, ho, wo, kh, kw, c), (s[0], s[2] * sh, s[3] * sw, s[2] * dh, s[3] * dw, s[1]),
                           a.storage_offset())
    return windows.reshape(n, ho * wo, kh * kw * c)


class _PatchProduct(torch.autograd.Function):
    """``Z = A Wᵀ + b`` as a channels-last ``(N, P, H_out, W_out)`` tensor; backward: the input's gradient only."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, columns: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                layer: GhostLayer, side: tuple[int, int]) -> torch.Tensor:
        p = weight.shape[0]
        rows = weight.permute(0, 2, 3, 1).reshape(p, -1)  # (P, k_h·k_w·C), the columns' order
        flat = columns.view(-1, columns.shape[-1])
        out = torch.mm(flat, rows.t()) if bias is None else torch.addmm(bias, flat, rows.t())
        ctx.save_for_backward(x, weight)
        ctx.layer = layer
        return out.view(x.shape[0], *side, p).permute(0, 3, 1, 2)  # channels-last: the product's own layout

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        layer: GhostLayer = ctx.layer
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.ops.aten.convolution_backward(grad, x, weight, None, list(layer.stride),
                                                         list(layer.padding), list(layer.dilation), False, [0, 0],
                                                         1, [True, False, False])[0]
        return grad_x, None, None, None, None, None


MAX_POSITIONS = 64
"""Most output positions ``H_out·W_out`` of a convolution computed by patches where the per-example weight gradients
would otherwise come from a grouped convolution backward (:func:`trustfl.client.ghost.grouped_form`), whose kernel
is slow for few positions and fast for many."""


def applies(layer: GhostLayer, module: nn.Module, device: torch.device) -> bool:
    """Whether ``module`` (``layer``'s) may compute by patches in a one-client pass on ``device``."""
    return (device.type == "cpu" and layer.kind == "conv2d" and type(module) is nn.Conv2d and module.groups == 1
            and module.padding_mode == "zeros" and layer.weight is not None
            and "forward" not in vars(module))  # a forward of the user's own stays theirs


def pays(layer: GhostLayer, x: torch.Tensor) -> bool:
    """Whether computing by patches is faster for the input batch ``x``: an unpadded convolution whose per-example
    weight gradients would otherwise come from batched products of the unfolded input (which the patches replace), or
    from a grouped convolution backward over at most :data:`MAX_POSITIONS` output positions. A padded input would
    first be copied into a larger one, which PyTorch's convolution spares. On a 2-core Intel Xeon (AVX-512), paired
    in one process (``benchmarks/intel_xeon_avx512/patch_conv.md``): a ``cnn_cafcor`` ghost DP-SGD step with both
    convolutions by patches takes 0.848× its time for one client and 0.834× for a cohort of 10; ``cnn_rhdp``'s step
    with its padded convolutions forced by patches would take 1.048× (0.885×, 0.825× and 1.027× the day before)."""
    if x.dim() != 4 or not x.is_floating_point() or any(layer.padding):
        return False
    t = math.prod(output_side(layer, x.shape[2], x.shape[3]))
    return 0 < t and (t <= MAX_POSITIONS or not grouped_form(layer, x.shape[0], t, x.device))


@contextlib.contextmanager
def by_patches(layers: list[GhostLayer], modules: dict[str, nn.Module],
               device: torch.device) -> Iterator[list[torch.Tensor | None]]:
    """While open, the ``Conv2d`` layers :func:`applies` accepts compute by patches; yields the list in which each
    forward leaves its layer's patches (``None`` for the others), in ``layers``' order."""
    columns: list[torch.Tensor | None] = [None] * len(layers)
    patched = []

    def forward_of(i: int, layer: GhostLayer, module: nn.Module):
        def forward(x: torch.Tensor) -> torch.Tensor:
            if not pays(layer, x):  # the module's own convolution
                columns[i] = None
                return type(module).forward(module, x)
            with torch.no_grad():
                cols = patches(layer, x.detach())
            columns[i] = cols
            bias = module.bias.detach() if module.bias is not None else None
            return _PatchProduct.apply(x, cols, module.weight.detach(), bias, layer,
                                       output_side(layer, x.shape[2], x.shape[3]))
        return forward

    try:
        for i, layer in enumerate(layers):
            module = modules[layer.name]
            if applies(layer, module, device):
                module.forward = forward_of(i, layer, module)  # an instance attribute: shadows nn.Conv2d.forward
                patched.append(module)
        yield columns
    finally:
        for module in patched:
            del module.forward
