"""Mixed precision for local training: an objective whose forward pass runs under ``torch.autocast``.

``engine.dtype = "bfloat16"`` wraps the objective the local chain sees (evaluation and client statistics keep the
plain objective). Only the model's forward is autocast: the outputs are cast back to float32 before the losses,
so the per-example losses, gradient norms, clipping, noise, the stacked parameters and the updates stay float32
(a per-example clip computed from bfloat16 norms could exceed its bound C, which DP accounting assumes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
from torch import nn

from trustfl.objectives.base import AbstractObjective, Batch


@dataclass(frozen=True)
class Autocast(AbstractObjective):
    """``inner`` with its forward pass computed in ``dtype`` autocast on the batch's device.

    ``forward(model, params, batch)`` = ``inner.forward`` under ``torch.autocast(device.type, dtype)``, its
    floating outputs cast to float32; every other method is ``inner``'s. Gradients reach the float32 parameters
    through autocast's casts (the backward of a bfloat16 operation is computed in bfloat16).

    Args:
      inner: the objective.
      dtype: the autocast dtype (``torch.bfloat16``).

    Example:
      >>> import torch
      >>> from trustfl.objectives.builtin import CrossEntropy
      >>> obj = Autocast(CrossEntropy(), torch.bfloat16)
      >>> model = torch.nn.Linear(3, 2)
      >>> params = dict(model.named_parameters())
      >>> obj.forward(model, params, {"x": torch.ones(4, 3)}).dtype
      torch.float32
    """

    inner: AbstractObjective
    dtype: torch.dtype = torch.bfloat16

    @property
    def task(self) -> str:  # type: ignore[override]
        return self.inner.task

    @property
    def input_key(self) -> str:  # type: ignore[override]
        return self.inner.input_key

    @property
    def batch_coupled(self) -> bool:  # type: ignore[override]
        return self.inner.batch_coupled

    def forward(self, model: nn.Module, params: Mapping[str, torch.Tensor], batch: Batch) -> torch.Tensor:
        device = next(iter(params.values())).device
        with torch.autocast(device.type, dtype=self.dtype):
            out = self.inner.forward(model, params, batch)
        return out.float() if out.is_floating_point() and out.dtype != torch.float32 else out

    def losses(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.inner.losses(outputs, batch)

    def loss_sum(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        return self.inner.loss_sum(outputs, batch)

    def client_loss(self, outputs: torch.Tensor, batch: Batch, mask: torch.Tensor,
                    personal: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return self.inner.client_loss(outputs, batch, mask, personal)

    def check_data(self, targets: torch.Tensor, num_classes: int) -> None:
        return self.inner.check_data(targets, num_classes)

    def num_outputs(self, targets: torch.Tensor, num_classes: int) -> int:
        return self.inner.num_outputs(targets, num_classes)
