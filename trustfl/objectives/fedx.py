"""FedX's local objective (Han et al., ECCV 2022): two-sided cross knowledge distillation, the FedSC paper's baseline.

A client trains backbone f, projector g and predictor q against the frozen model it received (the global model,
kept as the objective's local state, never differentiated). For the two views v₁, v₂ of each image of a batch, let
z_k = g(f(v_k)) and p_k = q(z_k) (local), z^G_k the global model's projection, and a = g(f(r)), a^G its global
counterpart for an *anchor* batch r of the client's own images. With temperatures τ (contrast) and τ₂ (the
relational target):

    L = NT-Xent(z₁, z₂) + NT-Xent(p₁, z^G₂) + JS(z₁, z₂; a) + JS(p₁, p₂; a^G)

- NT-Xent(x, y) (SimCLR): over the 2B vectors {x_i} ∪ {y_i}, unit-normalised, each one's positive is its pair and
  its negatives every other vector, ℓ = −log(e^{s_pos/τ} / Σ_{k≠self} e^{s_k/τ}), averaged over the 2B.
- JS(x, y; a) (the relational loss): the similarity distributions of x_i and y_i over the anchors,
  P_x = softmax(x̂_i·âᵀ/τ) and the target T = ½(softmax(x̂_i·âᵀ/τ₂) + softmax(ŷ_i·âᵀ/τ₂)), give
  ½(KL(T‖P_x) + KL(T‖P_y)), averaged over the batch (the target is not detached, as FedX's code).

This is the local loss of the FedSC authors' FedX baseline (their ``Client_X``: τ = 0.1, τ₂ = 0.01; the global term
of NT-Xent is one-sided, p₁ against z^G₂ only). The anchors: FedX draws an independent random batch of the client's
data every step; here they are the first view of the client's *previous* batch of the round (its own data, drawn
by its own sampler), and in a round's first step its current batch. Padding rows are no anchors, no negatives and
carry no loss.

References:
  Han et al., *FedX: Unsupervised Federated Learning with Cross Knowledge Distillation*, ECCV 2022.
  https://arxiv.org/abs/2207.09158
"""
from __future__ import annotations

import math
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
from trustfl.objectives.base import AbstractObjective, Batch, view_pair, view_pair_outputs
from trustfl.objectives.contrastive import masked_logits

__all__ = ["FedX", "GLOBAL", "ANCHOR", "nt_xent_losses", "relational_losses"]

GLOBAL = "fedx_global/"
"""Prefix of the frozen received model's tensors in a client's ``personal`` mapping."""
ANCHOR = "fedx_anchor/"
"""``personal`` keys of the anchor images (``ANCHOR + "x"``) and their mask (``ANCHOR + "mask"``)."""


def nt_xent_losses(x: torch.Tensor, y: torch.Tensor, temperature: float, mask: torch.Tensor) -> torch.Tensor:
    """Per-image NT-Xent ``(B,)`` (the mean of the image's two terms), padding rows (``mask`` False) 0."""
    b = x.shape[0]
    v = F.normalize(torch.cat([x, y]), dim=-1)                                        # (2B, H)
    real = torch.cat([mask, mask]).bool()
    eye = torch.eye(2 * b, dtype=torch.bool, device=v.device)
    logits = masked_logits(v @ v.T / temperature, real.unsqueeze(0) & ~eye, temperature)
    pair = torch.arange(2 * b, device=v.device).roll(b)                              # i ↔ i ± B
    positive = (v * v[pair]).sum(-1) / temperature
    per = torch.logsumexp(logits, dim=1) - positive
    return torch.where(mask.bool(), 0.5 * (per[:b] + per[b:]), 0.0)


def relational_losses(x: torch.Tensor, y: torch.Tensor, anchors: torch.Tensor, anchor_mask: torch.Tensor,
                      temperature: float, target_temperature: float, mask: torch.Tensor) -> torch.Tensor:
    """Per-image JS relational loss ``(B,)`` against ``anchors`` ``(A, H)`` (module notes), padding rows 0."""
    a = F.normalize(anchors, dim=-1)
    sx, sy = F.normalize(x, dim=-1) @ a.T, F.normalize(y, dim=-1) @ a.T               # (B, A)
    keep = anchor_mask.bool().unsqueeze(0)
    log_px = torch.log_softmax(masked_logits(sx / temperature, keep, temperature), dim=1)
    log_py = torch.log_softmax(masked_logits(sy / temperature, keep, temperature), dim=1)
    log_tx = torch.log_softmax(masked_logits(sx / target_temperature, keep, target_temperature), dim=1)
    log_ty = torch.log_softmax(masked_logits(sy / target_temperature, keep, target_temperature), dim=1)
    log_target = torch.logaddexp(log_tx, log_ty) - math.log(2.0)   # finite where T underflows: no 0·log 0
    target = log_target.exp()
    entropy = (target * log_target).sum(1)
    per = entropy - 0.5 * ((target * log_px).sum(1) + (target * log_py).sum(1))       # ½(KL(T‖P_x) + KL(T‖P_y))
    return torch.where(mask.bool(), per, 0.0)


@register("objective", "fedx")
@dataclass(frozen=True)
class FedX(AbstractObjective):
    """FedX on two views per image (the batch's ``views`` ``(B, 2, *input_shape)``); the model needs a predictor.

    Args:
      temperature: τ > 0 of both contrastive losses and of the relational predictions (0.1).
      target_temperature: τ₂ > 0 of the relational target (0.01, the FedSC authors' FedX baseline).
    """

    task: ClassVar[str] = "custom"
    reads_labels: ClassVar[bool] = False
    input_key: ClassVar[str] = "views"
    batch_coupled: ClassVar[bool] = True
    temperature: float = 0.1
    target_temperature: float = 0.01

    def __post_init__(self) -> None:
        check_number("temperature", self.temperature, low=0, low_open=True, finite=True)
        check_number("target_temperature", self.target_temperature, low=0, low_open=True, finite=True)

    def forward(self, model: nn.Module, params: Mapping[str, torch.Tensor], batch: Batch) -> torch.Tensor:
        if self.input_key not in batch:
            return functional_call(model, params, (batch["x"],))
        return view_pair_outputs("fedx", model, params, batch, self.input_key)

    def client_outputs(self, model: nn.Module, params: Mapping[str, torch.Tensor], batch: Batch,
                       personal: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``(2B + A, 3H)``: for both views and the anchors, the local projection, the local prediction and the
        received model's projection (no gradient). Without the received model in ``personal`` (outside local
        training) the local weights stand in for it."""
        views = view_pair("fedx", batch, self.input_key)
        b = views.shape[0]
        anchors = personal.get(ANCHOR + "x", views[:, 0])
        inputs = torch.cat([views.reshape(2 * b, *views.shape[2:]), anchors])
        local = functional_call(model, params, (inputs,), {"output": "projector_predictor"})
        frozen = {n: personal.get(GLOBAL + n, v).detach() for n, v in params.items()}
        with torch.no_grad():
            received = functional_call(model, frozen, (inputs,), {"output": "projector"})
        return torch.cat([local, received], dim=-1)

    def losses(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        b = batch[self.input_key].shape[0]
        return self._losses(outputs, torch.ones(b, dtype=torch.bool, device=outputs.device),
                            torch.ones(outputs.shape[0] - 2 * b, dtype=torch.bool, device=outputs.device))

    def client_loss(self, outputs: torch.Tensor, batch: Batch, mask: torch.Tensor,
                    personal: Mapping[str, torch.Tensor]) -> torch.Tensor:
        anchor_mask = personal.get(ANCHOR + "mask", mask)
        losses = self._losses(outputs, mask.bool(), anchor_mask.bool())
        return losses.sum() / mask.to(losses.dtype).sum().clamp(min=1)

    def _losses(self, outputs: torch.Tensor, mask: torch.Tensor, anchor_mask: torch.Tensor) -> torch.Tensor:
        if outputs.dim() != 2 or outputs.shape[1] % 3:
            raise ConfigError(f"objective 'fedx' computes its losses from client_outputs ((2B + A, 3H)), found "
                              f"shape {tuple(outputs.shape)}.")
        b, h = mask.shape[0], outputs.shape[1] // 3
        z, p, zg = outputs[:, :h], outputs[:, h:2 * h], outputs[:, 2 * h:]
        z1, z2, za = z[:b], z[b:2 * b], z[2 * b:]
        p1, p2 = p[:b], p[b:2 * b]
        zg2, zga = zg[b:2 * b], zg[2 * b:]
        t, t2 = self.temperature, self.target_temperature
        return (nt_xent_losses(z1, z2, t, mask) + nt_xent_losses(p1, zg2, t, mask)
                + relational_losses(z1, z2, za, anchor_mask, t, t2, mask)
                + relational_losses(p1, p2, zga, anchor_mask, t, t2, mask))

    def local_state_init(self, params: Mapping[str, torch.Tensor], cohort: Any) -> dict[str, torch.Tensor]:
        """The received model, frozen: a copy of each client's starting parameters ``(m, ...)``."""
        if all(in_encoder(n) for n in params):
            raise ConfigError("objective 'fedx' needs a model with a predictor (e.g. `model.predictor = [128]` for "
                              "sc_mlp / sc_cnn); the model has no `predictor.*` parameters.")
        return {GLOBAL + n: v.detach().clone() for n, v in params.items()}

    def local_state_update(self, state: dict[str, torch.Tensor], params: Mapping[str, torch.Tensor],
                           active: torch.Tensor | None, batch: Any = None, mask: Any = None) -> dict[str, torch.Tensor]:
        """Keep the step's first-view images (and their mask) as the next step's anchors, for the rows that stepped."""
        if batch is None or self.input_key not in batch:
            return state
        images, real = batch[self.input_key][:, :, 0], mask.bool()
        if ANCHOR + "x" in state and active is not None:
            keep = active.view(-1, *([1] * (images.dim() - 1)))
            images = torch.where(keep, images, state[ANCHOR + "x"])
            real = torch.where(active.view(-1, 1), real, state[ANCHOR + "mask"])
        elif active is not None:   # a client without a step keeps no anchors yet: its rows are masked
            real = real & active.view(-1, 1)
        return {**state, ANCHOR + "x": images.detach(), ANCHOR + "mask": real}
