"""The example's own parts: a model class and a robust aggregator, plugged in from experiment.toml.

* ``SensorNet`` is a plain ``torch.nn.Module``; the config names it by import path
  (``model.name = "examples/custom/components.py:SensorNet"``) and its constructor arguments come from the
  ``[model]`` table. trustfl passes ``input_shape`` and ``num_classes`` only to constructors that accept them.
* ``norm_capped_mean`` is registered with ``@trustfl.register``: the mean of the messages after scaling every
  message down to at most ``cap`` times the median message norm (a simple defence against a few huge updates).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

import trustfl
from trustfl.aggregate import AbstractAggregator
from trustfl.types import StageOut


class SensorNet(nn.Module):
    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(input_shape[-1], width), nn.ReLU(),
                                 nn.Linear(width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@trustfl.register("aggregator", "norm_capped_mean")
@dataclass(frozen=True)
class NormCappedMean(AbstractAggregator):
    """Mean of the messages, each scaled to a norm of at most ``cap`` × the median norm."""

    cap: float = 2.0

    def apply(self, x: torch.Tensor, state, ctx) -> StageOut:
        norms = x.norm(dim=1)
        limit = self.cap * norms.median()
        scale = torch.clamp(limit / norms.clamp_min(torch.finfo(x.dtype).tiny), max=1.0)
        capped = (scale[:, None] * x)
        return StageOut(capped.mean(0), state, {"capped": float((scale < 1).sum())})
