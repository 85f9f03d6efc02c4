"""Gradient methods: the head of the local-training chain, from a batch to one gradient per client.

- ``plain``: the gradient of each client's mean loss (FedAvg's local SGD);
- ``per_example``: DP-SGD's sum of per-example gradients clipped to ``C`` (Abadi et al. 2016, Alg. 1), by ghost
  norms or materialised ``vmap`` gradients; the ``dp_noise`` transform then adds noise and divides by ``E|S_i|``;
- ``batch_clip``: CafCor's clipped mini-batch mean ``Clip((1/|S_i|) Σ_b ∇ℓ_b; C)`` (Allouah et al., Alg. 1, eq. 1).

Each method runs a whole stacked cohort at once and returns ``(grads {name: (m, ...)}, losses (m,))``.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch
from torch import nn

from trustfl.client.per_example import (METHODS, batched_mean_grad, clipped_batch_mean, clipped_grad_sum,
                                         fused_sgd)
from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.errors import ConfigError, PrivacyError
from trustfl.objectives.base import AbstractObjective, Batch
from trustfl.types import CohortContext, Params


class AbstractGradientMethod(abc.ABC):
    """Computes one gradient per client from its batch.

    Attributes:
      skips_empty_batches: ``True`` when a client whose batch is empty takes no step (plain SGD); ``False`` when
        it still steps (DP-SGD: an empty Poisson batch gives pure noise, and the step is accounted).
      clip: the sensitivity bound ``C`` of the returned gradient sum (``None``: unbounded).
    """

    skips_empty_batches: ClassVar[bool] = True
    clip: float | None = None

    @abc.abstractmethod
    def compute(self, model: nn.Module, objective: AbstractObjective, params: Mapping[str, torch.Tensor],
                batch: Batch, mask: torch.Tensor, cohort: CohortContext,
                full: bool = False) -> tuple[Params, torch.Tensor]:
        """``(grads, losses)`` for stacked ``params`` ``(m, ...)`` and a padded batch ``(m, B, ...)``.

        ``full``: the caller knows (on the host) that every row of ``mask`` is real, so a method may skip masking.
        """

    def fused_sgd(self, model: nn.Module, objective: AbstractObjective, params: Params, batch: Batch,
                  lr: float) -> Any:
        """Plain SGD steps ``θ_i ← θ_i − η g_i`` fused with :meth:`compute` where this method can, for a group of
        clients whose parameters and batch are ``params`` and ``batch``: an object with ``own(params)`` (the
        parameters to update, in its layout) and ``step(params, batch, mask, active)`` (one step in place for the
        ``active`` rows, the others bitwise unchanged; the losses ``(m,)``), or ``None``. The executor asks only
        when the local chain is this method and plain SGD. Default: ``None``."""
        return None


def _check_clip(clip: float) -> None:
    check_number("clip", clip, low=0, low_open=True, finite=True, error=PrivacyError)


@register("gradient_method", "plain")
@dataclass(frozen=True)
class PlainGradient(AbstractGradientMethod):
    """``g_i = ∇_θ (1/|S_i|) Σ_{b ∈ S_i} ℓ(θ_i; batch_b)``: the plain mini-batch gradient."""

    def compute(self, model, objective, params, batch, mask, cohort, full=False):
        return batched_mean_grad(model, objective, params, batch, mask, full, cohort.personal)

    def fused_sgd(self, model, objective, params, batch, lr):
        return fused_sgd(model, objective, params, batch, lr)


@register("gradient_method", "per_example")
@dataclass(frozen=True)
class PerExampleClipped(AbstractGradientMethod):
    """``s_i = Σ_{b ∈ S_i} min(1, C/(‖∇ℓ_b‖ + 1e-6)) ∇ℓ_b`` (DP-SGD's clipped sum, before noise and division).

    Args:
      clip: ``C > 0``.
      method: ``"ghost"`` (norms without per-example gradients where the layers allow) or ``"vmap"``.
    """

    clip: float = 1.0
    method: str = "ghost"
    skips_empty_batches: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check_clip(self.clip)
        if self.method not in METHODS:
            raise ConfigError(f"`method` must be one of {METHODS}, found {self.method!r}.")

    def compute(self, model, objective, params, batch, mask, cohort, full=False):
        sums, _, losses = clipped_grad_sum(model, params, batch, mask, self.clip, objective=objective,
                                           method=self.method, return_loss=True)
        return sums, losses


@register("gradient_method", "batch_clip")
@dataclass(frozen=True)
class BatchClipped(AbstractGradientMethod):
    """``g_i = Clip((1/|S_i|) Σ_{b ∈ S_i} ∇ℓ_b; C)`` (CafCor Alg. 1, eq. 1): user-level sensitivity ``2C``.

    Args:
      clip: ``C > 0``.
    """

    clip: float = 1.0
    skips_empty_batches: ClassVar[bool] = False

    def __post_init__(self) -> None:
        _check_clip(self.clip)

    def compute(self, model, objective, params, batch, mask, cohort, full=False):
        clipped, _, losses = clipped_batch_mean(model, params, batch, mask, self.clip, return_loss=True,
                                                objective=objective)
        return clipped, losses
