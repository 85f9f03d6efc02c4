"""Max-pooling with the bits of ``F.max_pool2d`` and the speed of PyTorch's channels-last CPU kernel.

PyTorch's CPU max-pool kernel for NCHW tensors is 3-4× slower than its channels-last kernel, which vectorises over
channels (``benchmarks/pooling_speed.py``): in a ``cnn_cafcor`` step the first pool alone took as long as the second
convolution. A maximum is exact, and both kernels scan each window in row-major order and keep the first maximum
(or NaN), so they give the same values and the same indices. :func:`max_pool2d` computes the forward pass on the
channels-last kernel and returns a contiguous NCHW output; its backward is PyTorch's NCHW backward with those
indices, so gradients keep their bits *and* their layout (a channels-last gradient would change which kernels the
layers below run, and their rounding). ``tests/models/test_pooling.py`` checks the bits.

Anything else (other devices, dtypes or layouts, or tensors under a ``torch.func`` transform such as ``vmap``, where
a custom autograd function does not apply) takes ``F.max_pool2d`` itself.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

_FAST_DTYPES = (torch.float32, torch.float64)


def _under_transform(x: torch.Tensor) -> bool:
    check = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    return True if check is None else bool(check(x))  # unknown torch: assume a transform, take the plain op


def _fast(x: torch.Tensor) -> bool:
    return (x.device.type == "cpu" and x.dim() == 4 and x.dtype in _FAST_DTYPES and x.shape[1] > 1
            and x.is_contiguous() and not _under_transform(x))


class _ChannelsLastMaxPool(torch.autograd.Function):
    """``F.max_pool2d(x, k)`` (stride ``k``, no padding) for an NCHW-contiguous CPU ``x``, forward on the channels-last
    kernel."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, k: int) -> torch.Tensor:  # type: ignore[override]
        out, idx = torch.ops.aten.max_pool2d_with_indices(x.contiguous(memory_format=torch.channels_last), [k, k],
                                                          [k, k])
        ctx.k = k
        ctx.save_for_backward(x, idx.contiguous())
        return out.contiguous()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        x, idx = ctx.saved_tensors
        k = ctx.k
        return torch.ops.aten.max_pool2d_with_indices_backward(grad.contiguous(), x, [k, k], [k, k], [0, 0], [1, 1],
                                                               False, idx), None


def max_pool2d(x: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """``F.max_pool2d(x, kernel_size)``: the same values, gradients and layouts, faster on the CPU.

    Example:
      >>> x = torch.arange(32.0).view(1, 2, 4, 4)
      >>> torch.equal(max_pool2d(x, 2), F.max_pool2d(x, 2))
      True
    """
    if not _fast(x):
        return F.max_pool2d(x, kernel_size)
    if not (torch.is_grad_enabled() and x.requires_grad):  # no graph: the values alone
        return torch.max_pool2d(x.contiguous(memory_format=torch.channels_last), kernel_size).contiguous()
    return _ChannelsLastMaxPool.apply(x, kernel_size)
