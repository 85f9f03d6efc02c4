"""Built-in evaluators: accuracy, mean objective loss, MSE, MAE, R² and binary accuracy."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch

from trustfl.core.registry import register
from trustfl.evaluate.base import AbstractEvaluator, declare
from trustfl.objectives.base import AbstractObjective, Batch


def _matched(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return outputs.reshape(y.shape) if outputs.numel() == y.numel() else outputs


@register("evaluator", "accuracy")
@declare
@dataclass(frozen=True)
class Accuracy(AbstractEvaluator):
    """Share of examples whose largest output is the label: ``(1/N) Σ_n 1[argmax z_n = y_n]``."""

    metrics: ClassVar[Mapping[str, bool]] = {"accuracy": True}

    def init(self) -> Any:
        return [0, 0]

    def update(self, acc, outputs, batch, objective):
        acc[0] += int((outputs.argmax(1) == batch["y"]).sum())
        acc[1] += int(batch["y"].shape[0])
        return acc

    def result(self, acc) -> dict[str, float]:
        return {"accuracy": acc[0] / max(acc[1], 1)}


@register("evaluator", "loss")
@declare
@dataclass(frozen=True)
class MeanLoss(AbstractEvaluator):
    """The objective's mean per-example loss on the test set: ``(1/N) Σ_n ℓ_n``."""

    metrics: ClassVar[Mapping[str, bool]] = {"loss": False}

    def init(self) -> Any:
        return [0.0, 0]

    def update(self, acc, outputs, batch, objective: AbstractObjective):
        acc[0] += float(objective.loss_sum(outputs, batch))
        acc[1] += int(next(iter(batch.values())).shape[0])
        return acc

    def result(self, acc) -> dict[str, float]:
        return {"loss": acc[0] / max(acc[1], 1)}


@register("evaluator", "mse")
@declare
@dataclass(frozen=True)
class MeanSquaredError(AbstractEvaluator):
    """``(1/N) Σ_n ‖f(x_n) − y_n‖²/K`` (mean over the K target coordinates), in float64."""

    metrics: ClassVar[Mapping[str, bool]] = {"mse": False}

    def init(self) -> Any:
        return [0.0, 0]

    def update(self, acc, outputs, batch, objective):
        y = batch["y"]
        acc[0] += float((_matched(outputs, y).double() - y.double()).square().sum())
        acc[1] += int(y.numel())
        return acc

    def result(self, acc) -> dict[str, float]:
        return {"mse": acc[0] / max(acc[1], 1)}


@register("evaluator", "mae")
@declare
@dataclass(frozen=True)
class MeanAbsoluteError(AbstractEvaluator):
    """``(1/N) Σ_n |f(x_n) − y_n|`` (mean over all target coordinates), in float64."""

    metrics: ClassVar[Mapping[str, bool]] = {"mae": False}

    def init(self) -> Any:
        return [0.0, 0]

    def update(self, acc, outputs, batch, objective):
        y = batch["y"]
        acc[0] += float((_matched(outputs, y).double() - y.double()).abs().sum())
        acc[1] += int(y.numel())
        return acc

    def result(self, acc) -> dict[str, float]:
        return {"mae": acc[0] / max(acc[1], 1)}


@register("evaluator", "r2")
@declare
@dataclass(frozen=True)
class RSquared(AbstractEvaluator):
    """Coefficient of determination ``R² = 1 − Σ(y − ŷ)² / Σ(y − ȳ)²`` over all target coordinates.

    Accumulates ``Σy``, ``Σy²`` and ``Σ(y − ŷ)²`` in float64 (sklearn's ``r2_score`` with uniform averaging for a
    single target). A constant test target gives ``nan``.
    """

    metrics: ClassVar[Mapping[str, bool]] = {"r2": True}

    def init(self) -> Any:
        return [0.0, 0.0, 0.0, 0]

    def update(self, acc, outputs, batch, objective):
        y = batch["y"].double()
        acc[0] += float(y.sum())
        acc[1] += float(y.square().sum())
        acc[2] += float((_matched(outputs, batch["y"]).double() - y).square().sum())
        acc[3] += int(y.numel())
        return acc

    def result(self, acc) -> dict[str, float]:
        s, s2, sse, n = acc
        sst = s2 - s * s / n if n else 0.0
        return {"r2": 1.0 - sse / sst if sst > 0 else float("nan")}


@register("evaluator", "binary_accuracy")
@declare
@dataclass(frozen=True)
class BinaryAccuracy(AbstractEvaluator):
    """Share of labels predicted right by the sign of the logit: ``mean 1[(z > 0) = y]``."""

    metrics: ClassVar[Mapping[str, bool]] = {"binary_accuracy": True}

    def init(self) -> Any:
        return [0, 0]

    def update(self, acc, outputs, batch, objective):
        y = batch["y"]
        acc[0] += int(((_matched(outputs, y) > 0).to(y.dtype) == y).sum())
        acc[1] += int(y.numel())
        return acc

    def result(self, acc) -> dict[str, float]:
        return {"binary_accuracy": acc[0] / max(acc[1], 1)}
