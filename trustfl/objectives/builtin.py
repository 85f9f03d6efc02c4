"""Built-in objectives: softmax cross-entropy, squared error and binary cross-entropy."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.objectives.base import AbstractObjective, Batch, match_targets


@register("objective", "cross_entropy")
@dataclass(frozen=True)
class CrossEntropy(AbstractObjective):
    """Softmax cross-entropy ``ℓ_n = −log softmax(z_n)[y_n]`` on integer labels ``y`` (classification)."""

    task: ClassVar[str] = "classification"

    def losses(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(outputs, batch["y"], reduction="none")

    def loss_sum(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        return F.cross_entropy(outputs, batch["y"], reduction="sum")

    def weighted_loss_grad(self, outputs: torch.Tensor, batch: Batch,
                           weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``ℓ_n`` and ``c_n (softmax(z_n) − e_{y_n})`` from one log-softmax (no autograd graph); a subclass that
        computes other losses gets the autograd default."""
        if type(self).losses is not CrossEntropy.losses:
            return super().weighted_loss_grad(outputs, batch, weights)
        log_p = torch.log_softmax(outputs.detach(), -1)
        y = batch["y"].unsqueeze(1)
        losses = -log_p.gather(1, y).squeeze(1)
        grad = log_p.exp_().scatter_add_(1, y, torch.full(y.shape, -1.0, dtype=log_p.dtype, device=y.device))
        return losses, grad.mul_(weights.to(grad.dtype).unsqueeze(1))

    def autograd_loss_grad(self, outputs: torch.Tensor, batch: Batch,
                           weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The kernels autograd runs for ``(cross_entropy(z, y, reduction="none") · c).sum()`` and its backward
        (log-softmax, NLL, their backward), called directly: the same bits without a graph."""
        if type(self).losses is not CrossEntropy.losses:
            return super().autograd_loss_grad(outputs, batch, weights)
        log_p = torch.log_softmax(outputs.detach(), 1)
        y = batch["y"]
        losses, total_weight = torch.ops.aten.nll_loss_forward(log_p, y, None, 0, -100)  # reduction none
        grad = torch.ops.aten.nll_loss_backward(weights.to(log_p.dtype), log_p, y, None, 0, -100, total_weight)
        return losses, torch.ops.aten._log_softmax_backward_data(grad, log_p, 1, log_p.dtype)

    def check_batch(self, batch: Batch, lead: tuple[int, ...]) -> None:
        """Integer labels ``y`` of the batch's leading shape; on the CPU none negative (``-100``, which torch's loss
        ignores, would silently drop the example)."""
        super().check_batch(batch, lead)
        y = batch.get("y")
        if not isinstance(y, torch.Tensor) or y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            found = "no 'y' entry" if y is None else (f"dtype {y.dtype}" if isinstance(y, torch.Tensor)
                                                        else type(y).__name__)
            raise ConfigError(f"`batch['y']`: cross_entropy needs integer class labels, found {found}.")
        if tuple(y.shape) != tuple(lead):
            raise ConfigError(f"`batch['y']` must have the shape {tuple(lead)} (one label per example), found "
                              f"{tuple(y.shape)}.")
        if y.device.type == "cpu" and y.numel() and int(y.min()) < 0:
            raise ConfigError(f"`batch['y']` holds the negative label {int(y.min())}; class labels are 0 .. classes-1.")

    def check_data(self, targets: torch.Tensor, num_classes: int) -> None:
        if num_classes == 1 and not targets.is_floating_point():
            raise ConfigError("`objective`: cross_entropy needs >= 2 classes, but the data set holds only one class "
                              "(every training and test label is the same); give examples of at least two classes.")
        if targets.is_floating_point() or targets.dim() != 1 or num_classes < 2:
            raise ConfigError(f"`objective`: cross_entropy needs integer class labels of shape (N,) and >= 2 "
                              f"classes, found targets of dtype {targets.dtype} and shape {tuple(targets.shape)}"
                              f"{'' if num_classes >= 2 else ' (a regression data set)'}; use objective \"mse\".")


@register("objective", "mse")
@dataclass(frozen=True)
class SquaredError(AbstractObjective):
    """Squared error ``ℓ_n = mean_k (f(x_n)_k − y_nk)²`` over the target's coordinates (regression).

    A model output of shape ``(N, 1)`` is matched to targets of shape ``(N,)``.
    """

    task: ClassVar[str] = "regression"

    def losses(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        y = batch["y"]
        out = match_targets(outputs, y, "objective 'mse'")
        return (out - y).square().reshape(y.shape[0], -1).mean(1)

    def check_data(self, targets: torch.Tensor, num_classes: int) -> None:
        if not targets.is_floating_point():
            raise ConfigError(f"`objective`: mse needs real-valued targets, found dtype {targets.dtype} (a "
                              f"classification data set); use objective \"cross_entropy\".")


@register("objective", "bce")
@dataclass(frozen=True)
class BinaryCrossEntropy(AbstractObjective):
    """Binary cross-entropy with logits, averaged over labels: ``ℓ_n = mean_k BCE(σ(z_nk), y_nk)``.

    Targets in ``{0, 1}`` of shape ``(N,)`` (binary, one output) or ``(N, K)`` (multi-label); integer targets are
    converted to the output dtype.
    """

    task: ClassVar[str] = "multilabel"

    def losses(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        y = batch["y"]
        out = match_targets(outputs, y, "objective 'bce'")
        loss = F.binary_cross_entropy_with_logits(out, y.to(out.dtype), reduction="none")
        return loss.reshape(y.shape[0], -1).mean(1)

    def check_data(self, targets: torch.Tensor, num_classes: int) -> None:
        if targets.numel() and not bool(((targets == 0) | (targets == 1)).all()):
            raise ConfigError("`objective`: bce needs targets in {0, 1}; use \"cross_entropy\" for class labels "
                              "or \"mse\" for real values.")
        if num_classes > 2:
            raise ConfigError(f"`objective`: bce takes binary targets, found {num_classes} classes; use "
                              f"\"cross_entropy\".")

    def num_outputs(self, targets: torch.Tensor, num_classes: int) -> int:
        return max(1, math.prod(targets.shape[1:]))
