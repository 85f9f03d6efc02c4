"""Max-pooling with the bits of ``F.max_pool2d`` and the speed of PyTorch's channels-last CPU kernel.

PyTorch's CPU max-pool kernel for NCHW tensors is 3-4× slower than its channels-last kernel, which vectorises over
channels (``benchmarks/pooling_speed.py``): in a ``cnn_cafcor`` step the first pool alone took as long as the second
convolution. A maximum is exact, and both kernels scan each window in row-major order and keep the first maximum
(or NaN), so they give the same values and the same indices. :func:`max_pool2d` computes the forward pass on the
channels-last kernel and returns a contiguous NCHW output; its backward is PyTorch's NCHW backward with those
indices, so gradients keep their bits *and* their layout (a channels-last gradient would change which kernels the
layers below run, and their rounding). ``tests/models/test_pooling.py`` checks the bits.

Under ``vmap`` (a cohort's forward) the clients fold into the channels.
Anything else (other devices, dtypes or layouts) takes PyTorch's pooling itself.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

_FAST_DTYPES = (torch.float32, torch.float64)


def _on_cpu_4d(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dim() == 4 and x.dtype in _FAST_DTYPES


def _fast(x: torch.Tensor) -> bool:
    """Whether ``x`` (a plain tensor, or the physical tensor under ``vmap``) pools on the channels-last kernel."""
    return _on_cpu_4d(x) and x.shape[1] > 1 and x.is_contiguous()


def _wrapped(x: torch.Tensor) -> bool:
    """Whether ``x`` is a ``torch.func`` transform's tensor (``vmap``, ``grad``); assumed so on a torch without the
    query, which only costs the no-graph shortcut."""
    check = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", None)
    return check is None or bool(check(x))


class _ChannelsLastMaxPool(torch.autograd.Function):
    """``F.max_pool2d(x, k)`` (stride ``k``, no padding) for an NCHW-contiguous CPU ``x``, forward on the channels-last
    kernel; returns the values and (not differentiable) the indices, both NCHW. Under ``vmap`` the clients fold into
    the channels (:meth:`vmap`)."""

    @staticmethod
    def forward(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        out, idx = torch.ops.aten.max_pool2d_with_indices(x.contiguous(memory_format=torch.channels_last), [k, k],
                                                          [k, k])
        return out.contiguous(), idx.contiguous()

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, k = inputs
        ctx.k = k
        ctx.save_for_backward(x, output[1])
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor, _idx_grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore
        x, idx = ctx.saved_tensors
        k = ctx.k
        return torch.ops.aten.max_pool2d_with_indices_backward(grad.contiguous(), x, [k, k], [k, k], [0, 0], [1, 1],
                                                               False, idx), None

    @staticmethod
    def vmap(info, in_dims, x: torch.Tensor, k: int):  # type: ignore[override]
        # the clients fold into the channels: a batched convolution's output is (N, m·C, H, W) in memory, so this
        # is a view, and the gradient comes back in that layout
        x = x.movedim(in_dims[0], 1)  # x is the only tensor input, so it is the batched one
        n, b, c = x.shape[:3]
        out, idx = _pool(x.reshape(n, b * c, *x.shape[3:]), k)
        return (out.view(n, b, c, *out.shape[2:]), idx.view(n, b, c, *idx.shape[2:])), (1, 1)


def _pool(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    if _wrapped(x) or _fast(x):  # a batched tensor reaches _ChannelsLastMaxPool.vmap, which checks its physical one
        return _ChannelsLastMaxPool.apply(x, k)
    return torch.ops.aten.max_pool2d_with_indices(x, [k, k], [k, k])


def max_pool2d(x: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """``F.max_pool2d(x, kernel_size)``: the same values, gradients and layouts, faster on the CPU.

    Example:
      >>> x = torch.arange(32.0).view(1, 2, 4, 4)
      >>> torch.equal(max_pool2d(x, 2), F.max_pool2d(x, 2))
      True
    """
    if not _on_cpu_4d(x):
        return F.max_pool2d(x, kernel_size)
    if not (torch.is_grad_enabled() and x.requires_grad) and not _wrapped(x) and _fast(x):  # no graph: the values
        return torch.max_pool2d(x.contiguous(memory_format=torch.channels_last), kernel_size).contiguous()
    return _pool(x, kernel_size)[0]
