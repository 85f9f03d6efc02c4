"""BYOL's objective (Grill et al., NeurIPS 2020), the base of the FedSC paper's FedAvg+BYOL, FedU and FedEMA.

The online network is the model's backbone f, projector g and predictor q; the target network ξ is a copy of f and
g that follows the online weights by an exponential moving average after every local step,

    ξ ← τ·ξ + (1 − τ)·θ_{f,g}      (τ = ``ema``, 0.99 in the FedSC authors' baselines),

and is never differentiated. For two views v₁, v₂ of an image, with p = q(g(f(v))) and z' = g_ξ(f_ξ(v)),

    ℓ = (2 − 2·cos(p(v₁), z'(v₂))) + (2 − 2·cos(p(v₂), z'(v₁)))          (both view orders, as the authors' code)

and a client's batch loss is the mean of ℓ over its real rows. The target is the objective's *local state*
(:meth:`BYOL.local_state_init`): it starts each round from the client's starting online weights (the authors' code
resets it to the synchronised model after every round) and lives only on the client; it is never sent.

References:
  Grill et al., *Bootstrap your own latent: a new approach to self-supervised learning*, NeurIPS 2020.
  https://arxiv.org/abs/2006.07733

Example:
  >>> p, z = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]), torch.tensor([[[0.0, 2.0], [3.0, 0.0]]])
  >>> byol_losses(p, z).tolist()      # both pairs aligned: p(v₁)∥z'(v₂) and p(v₂)∥z'(v₁)
  [0.0]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from trustfl.core.checks import check_number
from trustfl.core.functional import functional_call
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.models.ssl import in_encoder
from trustfl.objectives.base import AbstractObjective, Batch, view_pair_outputs

__all__ = ["BYOL", "TARGET", "byol_losses"]

TARGET = "byol_target/"
"""Prefix of the target network's tensors in a client's ``personal`` mapping."""


def byol_losses(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-image symmetric BYOL losses ``(B,)`` from online predictions and target projections ``(B, 2, H)``."""
    p, z = F.normalize(predictions, dim=-1), F.normalize(targets.detach(), dim=-1)
    return (2 - 2 * (p[:, 0] * z[:, 1]).sum(-1)) + (2 - 2 * (p[:, 1] * z[:, 0]).sum(-1))


@register("objective", "byol")
@dataclass(frozen=True)
class BYOL(AbstractObjective):
    """BYOL on two views per image (the batch's ``views`` ``(B, 2, *input_shape)``).

    The model must have a predictor (``sc_mlp`` / ``sc_cnn`` with ``predictor = [...]``; its parameters named
    ``predictor.*``). :meth:`forward` without views returns the projector output (the kNN monitor's features).

    Args:
      ema: τ in [0, 1), the target's moving-average rate per local step.
    """

    task: ClassVar[str] = "custom"
    reads_labels: ClassVar[bool] = False
    input_key: ClassVar[str] = "views"
    batch_coupled: ClassVar[bool] = True
    ema: float = 0.99

    def __post_init__(self) -> None:
        check_number("ema", self.ema, low=0, high=1, high_open=True)

    def forward(self, model: nn.Module, params: Mapping[str, torch.Tensor], batch: Batch) -> torch.Tensor:
        if self.input_key not in batch:
            return functional_call(model, params, (batch["x"],))
        return view_pair_outputs("byol", model, params, batch, self.input_key, output="predictor")

    def client_outputs(self, model: nn.Module, params: Mapping[str, torch.Tensor], batch: Batch,
                       personal: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``(2, B, 2, H)``: online predictions and target projections of both views. Without a target in
        ``personal`` (outside local training) the online weights stand in for it."""
        online = view_pair_outputs("byol", model, params, batch, self.input_key, output="predictor")
        target = {n: (personal.get(TARGET + n, v) if in_encoder(n) else v).detach() for n, v in params.items()}
        with torch.no_grad():
            projected = view_pair_outputs("byol", model, target, batch, self.input_key, output="projector")
        return torch.stack([online, projected])

    def losses(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        if outputs.dim() != 4 or outputs.shape[0] != 2:
            raise ConfigError(f"objective 'byol' computes its losses from client_outputs (online predictions and "
                              f"target projections, (2, B, 2, H)), found shape {tuple(outputs.shape)}.")
        return byol_losses(outputs[0], outputs[1])

    def local_state_init(self, params: Mapping[str, torch.Tensor], cohort: Any) -> dict[str, torch.Tensor]:
        """The target network ξ: a copy of each client's starting backbone and projector ``(m, ...)``."""
        if all(in_encoder(n) for n in params):
            raise ConfigError("objective 'byol' needs a model with a predictor (e.g. `model.predictor = [128]` for "
                              "sc_mlp / sc_cnn); the model has no `predictor.*` parameters.")
        return {TARGET + n: v.detach().clone() for n, v in params.items() if in_encoder(n)}

    def local_state_update(self, state: dict[str, torch.Tensor], params: Mapping[str, torch.Tensor],
                           active: torch.Tensor | None, batch: Any = None, mask: Any = None) -> dict[str, torch.Tensor]:
        """ξ ← τξ + (1 − τ)θ for the rows that stepped."""
        out = {}
        for key, xi in state.items():
            new = torch.lerp(xi, params[key[len(TARGET):]].to(xi.dtype), 1.0 - self.ema)
            out[key] = new if active is None else torch.where(active.view(-1, *([1] * (xi.dim() - 1))), new, xi)
        return out
