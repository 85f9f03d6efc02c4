"""Built-in evaluators: accuracy, mean objective loss, MSE, MAE, R² and binary accuracy."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch

from trustfl.core.registry import register
from trustfl.evaluate.base import AbstractEvaluator, declare
from trustfl.objectives.base import AbstractObjective, Batch, match_targets


def _matched(outputs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return match_targets(outputs, y, "evaluator")


@register("evaluator", "accuracy")
@declare
@dataclass(frozen=True)
class Accuracy(AbstractEvaluator):
    """Share of examples whose largest output is the label: ``(1/N) Σ_n 1[argmax z_n = y_n]``."""

    metrics: ClassVar[Mapping[str, bool]] = {"accuracy": True}
    task: ClassVar[str | None] = "classification"

    def init(self) -> Any:
        return [0, 0]

    def update(self, acc, outputs, batch, objective):
        acc[0] += int((outputs.argmax(1) == batch["y"]).sum())
        acc[1] += int(batch["y"].shape[0])
        return acc

    def result(self, acc) -> dict[str, float]:
        return {"accuracy": acc[0] / max(acc[1], 1)}


@register("evaluator", "class_accuracy")
@declare
@dataclass(frozen=True)
class ClassAccuracy(AbstractEvaluator):
    """Accuracy on the test examples of some classes only: ``(1/|N_C|) Σ_{n: y_n ∈ C} 1[argmax z_n = y_n]``
    (e.g. the classes only slow clients hold, to see whether an algorithm under-learns them).

    Args:
      classes: the class ids ``C``.
    """

    metrics: ClassVar[Mapping[str, bool]] = {"class_accuracy": True}
    task: ClassVar[str | None] = "classification"
    classes: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", tuple(self.classes))

    def init(self) -> Any:
        return [0, 0]

    def update(self, acc, outputs, batch, objective):
        y = batch["y"]
        chosen = torch.isin(y, torch.tensor(self.classes, dtype=y.dtype, device=y.device))
        acc[0] += int(((outputs.argmax(1) == y) & chosen).sum())
        acc[1] += int(chosen.sum())
        return acc

    def result(self, acc) -> dict[str, float]:
        return {"class_accuracy": acc[0] / max(acc[1], 1)}


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


class _PointwiseError(AbstractEvaluator):
    """The mean of a pointwise error ``e(ŷ − y)`` over all target coordinates, accumulated in float64."""

    task: ClassVar[str | None] = "regression"

    def _error(self, diff: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def init(self) -> Any:
        return [0.0, 0]

    def update(self, acc, outputs, batch, objective):
        y = batch["y"]
        acc[0] += float(self._error(_matched(outputs, y).double() - y.double()).sum())
        acc[1] += int(y.numel())
        return acc

    def result(self, acc) -> dict[str, float]:
        (name,) = self.metrics
        return {name: acc[0] / max(acc[1], 1)}


@register("evaluator", "mse")
@declare
@dataclass(frozen=True)
class MeanSquaredError(_PointwiseError):
    """``(1/N) Σ_n ‖f(x_n) − y_n‖²/K`` (mean over the K target coordinates)."""

    metrics: ClassVar[Mapping[str, bool]] = {"mse": False}

    def _error(self, diff):
        return diff.square()


@register("evaluator", "mae")
@declare
@dataclass(frozen=True)
class MeanAbsoluteError(_PointwiseError):
    """``(1/N) Σ_n |f(x_n) − y_n|`` (mean over all target coordinates)."""

    metrics: ClassVar[Mapping[str, bool]] = {"mae": False}

    def _error(self, diff):
        return diff.abs()


@register("evaluator", "r2")
@declare
@dataclass(frozen=True)
class RSquared(AbstractEvaluator):
    """Coefficient of determination ``R² = 1 − Σ(y − ŷ)² / Σ(y − ȳ)²`` over all target coordinates.

    ``Σ(y − ȳ)²`` is accumulated per chunk as (count, mean, M2) and merged with Chan et al.'s pairwise formula,
    in float64, so targets with a large offset lose no precision (sklearn's ``r2_score`` for a single target). A
    constant test target gives ``nan``.
    """

    metrics: ClassVar[Mapping[str, bool]] = {"r2": True}
    task: ClassVar[str | None] = "regression"

    def init(self) -> Any:
        return [0, 0.0, 0.0, 0.0]  # count, mean, M2, Σ(y − ŷ)²

    def update(self, acc, outputs, batch, objective):
        y = batch["y"].double()
        n_b = int(y.numel())
        if n_b == 0:
            return acc
        mean_b = float(y.mean())
        m2_b = float((y - mean_b).square().sum())
        n_a, mean_a, m2_a, sse = acc
        n = n_a + n_b
        delta = mean_b - mean_a
        acc[0], acc[1] = n, mean_a + delta * n_b / n
        acc[2] = m2_a + m2_b + delta * delta * n_a * n_b / n
        acc[3] = sse + float((_matched(outputs, batch["y"]).double() - y).square().sum())
        return acc

    def result(self, acc) -> dict[str, float]:
        _, _, sst, sse = acc
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
