"""Closed-form cohort gradients for stacks of linear layers and ReLUs (``mlp``, ``logreg`` and plain
``nn.Sequential`` MLPs), without ``vmap`` and without autograd through the model.

For client ``i`` with ``h_0 = x`` (flattened), ``a_k = h_{k−1} W_kᵀ + b_k``, ``h_k = relu(a_k)`` (k < L) and logits
``z = a_L``, the objective gives ``G_L = ∂L_i/∂z`` by autograd on the logits alone (any per-example loss: cross-entropy,
squared error, …; masked rows get zero weight), and back-propagation is, per layer,

    ∂L_i/∂W_k = G_kᵀ h_{k−1},   ∂L_i/∂b_k = Σ_rows G_k,   G_{k−1} = (G_k W_k) ⊙ [h_{k−1} > 0],

each one batched matrix product over the cohort (no input gradient for the first layer). The products, the separate
bias additions and the loss are those the generic path runs (forward under ``vmap``, autograd on the stacked leaves),
on the weights' own memory layout, so the result is bitwise the generic path's (``tests/client/test_linear_stack.py``);
what goes is that path's per-step overhead: ``vmap``'s batching of every operation and the autograd graph through the
model. The weight gradients keep the generic path's memory layout (``(m, out, in)`` stored ``(m, in, out)``).

:func:`sgd_step` goes one step further for plain local SGD: it applies ``W ← W − η G_kᵀ h_{k−1}`` inside the product
that computes the gradient (no gradient tensor, the weights streamed once), with ``G_L`` from the objective's
``weighted_loss_grad`` (cross-entropy: ``softmax − one-hot`` in closed form). It agrees with :func:`mean_grad` and
a separate update to float rounding, not bitwise.

Any other model, a model with hooks, or an objective with its own forward takes the generic path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from trustfl.models.zoo import MLP, LogisticRegression
from trustfl.objectives.base import AbstractObjective, Batch, flat_batch, masked_mean

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LinearStack:
    """The linear layers of a recognised model, in order: ``(weight name, bias name or None)``; a ReLU follows
    every layer but the last, and the input is flattened to ``(B, features)`` when ``flattens``."""

    layers: tuple[tuple[str, str | None], ...]
    flattens: bool


def _hooked(model: nn.Module) -> bool:
    for mod in model.modules():
        if mod._forward_hooks or mod._forward_pre_hooks or mod._backward_hooks or mod._backward_pre_hooks:
            return True
    return False


def _sequence(modules: list[nn.Module], prefix: str, flattens: bool) -> LinearStack | None:
    """``Linear (ReLU Linear)*`` with exact module types (a subclass may compute something else), else ``None``."""
    if flattens is False and modules and type(modules[0]) is nn.Flatten:
        if (modules[0].start_dim, modules[0].end_dim) != (1, -1):
            return None
        modules, flattens, first = modules[1:], True, 1
    else:
        first = 0
    if not modules or len(modules) % 2 == 0:
        return None
    layers = []
    for j, mod in enumerate(modules):
        if j % 2 == 1:
            if type(mod) is not nn.ReLU:
                return None
            continue
        if type(mod) is not nn.Linear:
            return None
        name = f"{prefix}{j + first}"
        layers.append((f"{name}.weight", None if mod.bias is None else f"{name}.bias"))
    return LinearStack(tuple(layers), flattens)


def linear_stack(model: nn.Module) -> LinearStack | None:
    """The model's :class:`LinearStack` when its forward is exactly one, else ``None`` (checked on every call: a
    few attribute reads, and a model changed in place is never described by a stale plan)."""
    if _hooked(model) or nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks:
        return None
    if type(model) is MLP and type(model.net) is nn.Sequential:
        return _sequence(list(model.net), "net.", True)
    if type(model) is LogisticRegression and type(model.linear) is nn.Linear:
        bias = None if model.linear.bias is None else "linear.bias"
        return LinearStack((("linear.weight", bias),), True)
    if type(model) is nn.Sequential:
        return _sequence(list(model), "", False)
    return None


def applies(stack: LinearStack | None, objective: AbstractObjective, params: Mapping[str, torch.Tensor],
            batch: Batch) -> bool:
    """Whether :func:`mean_grad` computes this step: a recognised model whose every parameter is trained, an
    objective that calls the model plainly on its input, and a floating input of the parameters' dtype."""
    if stack is None or objective.batch_coupled or type(objective).forward is not AbstractObjective.forward:
        return False
    names = [n for layer in stack.layers for n in layer if n is not None]
    if len(names) != len(params) or any(n not in params for n in names):
        return False
    x = batch.get(objective.input_key)
    dtype = params[stack.layers[0][0]].dtype
    return (x is not None and x.dtype == dtype and all(params[n].dtype == dtype for n in names)
            and (stack.flattens or x.dim() == 3))


def _forward(stack: LinearStack, params: Mapping[str, torch.Tensor], x: torch.Tensor,
             m: int, b: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each layer's input ``h_{k−1}`` ``(m, B, in)`` and the logits ``(m, B, out)``."""
    with torch.no_grad():
        h = x.reshape(m, b, -1)
        inputs = []
        for k, (w_name, b_name) in enumerate(stack.layers):
            inputs.append(h)
            # the products and the separate bias addition of the vmap path, on the weights' own memory layout:
            # the same bits (BLAS rounds a fused bias or a transposed copy differently)
            h = torch.bmm(h, params[w_name].detach().transpose(1, 2))
            if b_name is not None:
                h = h + params[b_name].detach().unsqueeze(1)
            if k < len(stack.layers) - 1:
                h = h.relu_()
    return inputs, h


def _logit_grad(objective: AbstractObjective, logits: torch.Tensor, batch: Batch,
                row_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``G_L = ∂(Σ_i L_i)/∂z`` ``(m, B, out)`` by autograd on the logits alone, and the losses ``L_i`` ``(m,)``."""
    m, b = row_weights.shape
    with torch.enable_grad():
        leaf = logits.detach().requires_grad_(True)
        losses = objective.losses(leaf.flatten(0, 1), flat_batch(batch, 2)).view(m, b)
        per_client = masked_mean(losses, row_weights)
        (out_grad,) = torch.autograd.grad(per_client.sum(), [leaf])
    return out_grad, per_client.detach()


def mean_grad(stack: LinearStack, objective: AbstractObjective, params: Mapping[str, torch.Tensor], batch: Batch,
              row_weights: torch.Tensor) -> tuple[Params, torch.Tensor]:
    """Per-client gradients of the masked mean losses ``L_i = Σ_b w_ib ℓ_ib / max(Σ_b w_ib, 1)``, and the losses
    ``(m,)``: what :func:`trustfl.client.per_example.batched_mean_grad` returns, for a model :func:`applies` to.

    ``row_weights`` ``(m, B)``: 1 for a real row, 0 for padding, in the parameters' dtype.
    """
    m, b = row_weights.shape
    inputs, logits = _forward(stack, params, batch[objective.input_key], m, b)
    out_grad, losses = _logit_grad(objective, logits, batch, row_weights)
    grads: Params = {}
    with torch.no_grad():
        for k in range(len(stack.layers) - 1, -1, -1):
            w_name, b_name = stack.layers[k]
            # stored (m, in, out), read (m, out, in): the layout autograd gives the generic path's weight gradient
            grads[w_name] = torch.bmm(inputs[k].transpose(1, 2), out_grad).transpose(1, 2)
            if b_name is not None:
                grads[b_name] = out_grad.sum(1)
            if k:
                out_grad = torch.ops.aten.threshold_backward(torch.bmm(out_grad, params[w_name].detach()),
                                                             inputs[k], 0)
    return {name: grads[name] for name in params}, losses


def ghost_inputs(stack: LinearStack, objective: AbstractObjective, params: Mapping[str, torch.Tensor], batch: Batch,
                 keep: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """What ghost clipping needs of every layer, in closed form: its input ``h_{k−1}`` and its output gradient
    ``G_k = ∂(Σ_b keep_b ℓ_b)/∂a_k``, each ``(m·B, features)``, and the per-example losses ``ℓ`` ``(m·B,)``.

    The bits of :mod:`trustfl.client.per_example`'s hooked pass (forward hooks, zero probes, autograd through the
    model), without its hooks, probes and graph: one client runs ``F.linear`` as ``nn.Linear`` does (its backward
    product is ``G_k W_k``, as autograd's), a cohort the batched products of the ``vmap`` path (:func:`_forward`);
    ``G_L`` comes from the objective's :meth:`~trustfl.objectives.base.AbstractObjective.autograd_loss_grad` (autograd's
    bits on the logits alone) and ``G_{k−1} = (G_k W_k) ⊙ [h_{k−1} > 0]``, the ReLU's backward on its output
    (``tests/client/test_linear_stack.py``).
    """
    m, b = keep.shape
    weights = [params[w].detach() for w, _ in stack.layers]
    with torch.no_grad():
        if m == 1:  # the one-client hooked pass calls the model itself: F.linear, the bias fused into addmm
            h = batch[objective.input_key][0].reshape(b, -1)
            inputs = []
            for k, (w, (_, b_name)) in enumerate(zip(weights, stack.layers)):
                inputs.append(h)
                h = F.linear(h, w[0], None if b_name is None else params[b_name][0].detach())
                if k < len(weights) - 1:
                    h = torch.relu(h)
        else:
            inputs, h = _forward(stack, params, batch[objective.input_key], m, b)
    losses, out_grad = objective.autograd_loss_grad(h.reshape(m * b, -1), flat_batch(batch, 2), keep.reshape(-1))
    out_grad = out_grad.view(h.shape)
    backprops = [out_grad]
    with torch.no_grad():
        for k in range(len(weights) - 1, 0, -1):
            below = out_grad.mm(weights[k][0]) if m == 1 else torch.bmm(out_grad, weights[k])
            out_grad = torch.ops.aten.threshold_backward(below, inputs[k], 0)
            backprops.append(out_grad)
    flat = lambda t: t.reshape(m * b, t.shape[-1])  # noqa: E731
    return [flat(a) for a in inputs], [flat(g) for g in reversed(backprops)], losses


def sgd_step(stack: LinearStack, objective: AbstractObjective, params: Mapping[str, torch.Tensor], batch: Batch,
             row_weights: torch.Tensor, lr: float, idle: torch.Tensor | None = None) -> torch.Tensor:
    """One local SGD step ``θ_i ← θ_i − η ∇L_i(θ_i)`` of every client in place, and the losses ``L_i`` ``(m,)``.

    The gradients of :func:`mean_grad`, with each weight's update fused into the product that computes its gradient
    (``W ← W − η G_kᵀ h_{k−1}``, one ``baddbmm_`` on the weight's own storage, after ``G_{k−1}`` has read ``W``):
    no gradient tensor is allocated and the weights are streamed once instead of three times. BLAS rounds the fused
    ``W − η·(GᵀH)`` differently from a separate subtraction: the result agrees with :func:`mean_grad` followed by
    ``W − η g`` to float rounding, not bitwise (``tests/client/test_linear_stack.py``).

    ``idle``: the indices of the rows that do not step (``None``: every row steps; the executor knows them on the
    host, so no device sync turns a mask into them): a row that does not step keeps its parameters bitwise, even
    non-finite ones. Its rows of
    ``G_k`` and of every layer input are overwritten with exact zeros in place (not multiplied, so that an inf or
    NaN of its own cannot reach its update; ``batch``'s input rows included: the executor gathers a fresh batch for
    every step): its products are exact zeros, ``W − η·0 = W``, and the ReLU backward on its zeroed inputs passes
    none of the layer above's products to the layer below. Only the idle rows are written, where a masked copy of
    every input and gradient would stream the whole cohort's activations again at each layer.
    """
    m, b = row_weights.shape
    inputs, logits = _forward(stack, params, batch[objective.input_key], m, b)
    # G_L from the objective's weighted_loss_grad (cross-entropy: in closed form) with c_ib = w_ib / max(Σ_b w_ib, 1)
    scale = row_weights / row_weights.sum(1, keepdim=True).clamp(min=1)
    per_example, out_grad = objective.weighted_loss_grad(logits.flatten(0, 1), flat_batch(batch, 2), scale.flatten())
    losses = masked_mean(per_example.view(m, b), row_weights)
    out_grad = out_grad.view(m, b, -1)
    with torch.no_grad():
        for k in range(len(stack.layers) - 1, -1, -1):
            w_name, b_name = stack.layers[k]
            weight, h = params[w_name], inputs[k]
            if idle is not None and idle.numel():
                out_grad.index_fill_(0, idle, 0.0)
                h.index_fill_(0, idle, 0.0)  # before the ReLU backward below reads it as its mask
            below = None
            if k:  # G_{k−1} from the weight before its update
                below = torch.ops.aten.threshold_backward(torch.bmm(out_grad, weight), inputs[k], 0)
            if weight.transpose(1, 2).is_contiguous():  # (m, in, out) storage: W_kᵀ ← W_kᵀ − η h_{k−1}ᵀ G_k
                weight.transpose(1, 2).baddbmm_(h.transpose(1, 2), out_grad, alpha=-lr)
            else:
                weight.baddbmm_(out_grad.transpose(1, 2), h, alpha=-lr)
            if b_name is not None:
                params[b_name].sub_(out_grad.sum(1), alpha=lr)
            if below is not None:
                out_grad = below
    return losses


@dataclass(frozen=True)
class FusedSGD:
    """Plain local SGD of one cohort on a recognised stack, by :func:`sgd_step`; chosen once per group of clients
    (the model, the objective and the parameters' names and dtype do not change between its steps)."""

    stack: LinearStack
    objective: AbstractObjective
    lr: float

    def own(self, params: Mapping[str, torch.Tensor], copy: bool = False) -> Params:
        """The group's parameters with every weight stored ``(m, in, out)``, where a batched ``baddbmm_`` of the
        weight gradient streams through it (a weight stored otherwise is copied). ``copy``: every parameter is
        copied (``params`` are views that the steps must not write: the clients' starts, or a broadcast model)."""
        out: Params = {}
        for name, p in params.items():
            if p.dim() == 3 and (copy or not p.transpose(1, 2).is_contiguous()):
                m, rows, cols = p.shape
                p = torch.empty((m, cols, rows), dtype=p.dtype, device=p.device).transpose(1, 2).copy_(p)
            elif copy:
                p = p.clone(memory_format=torch.contiguous_format)
            out[name] = p
        return out

    def step(self, params: Mapping[str, torch.Tensor], batch: Batch, mask: torch.Tensor,
             idle: torch.Tensor | None) -> torch.Tensor:
        """One step in place of every row but those ``idle`` indexes (``None``: all step); the losses ``(m,)``."""
        w = mask.to(batch[self.objective.input_key].dtype)
        return sgd_step(self.stack, self.objective, params, batch, w, self.lr, idle)
