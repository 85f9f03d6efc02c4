"""Where a BYOL client starts a round: FedU's divergence-aware predictor update and FedEMA's moving average.

Both keep each client's last trained online network (backbone, projector, predictor) in the client state store and
compare it with the global one it receives. The encoder is every parameter not named ``predictor.*``. The message
is still ``θ_local − θ_received``, so the server's mean of the messages plus the global model is the mean of the
clients' uploaded networks, as both papers aggregate.

- **FedU** (Zhuang et al., ICCV 2021, "divergence-aware predictor update"): the online encoder is always replaced by
  the global one; the predictor is replaced by the global predictor only when the divergence
  d = mean over the encoder's weight matrices of ‖W_g − W_l‖₂ is below ``threshold`` (μ, 0.4 in the authors'
  EasyFL code, which also takes the mean over layers), else the client keeps its own predictor. A client's first
  participation starts from the global model.
- **FedEMA** (Zhuang et al., ICLR 2022): online encoder and predictor start from W_l ← μ·W_l + (1 − μ)·W_g with
  μ = min(λ·d, 1), d = ‖W_g − W_l‖₂ over the whole encoder, and λ = τ/d set once, at the client's first
  measured divergence (so that first mix uses μ = τ). Larger divergence keeps more of the local model: the
  original formula, not the FedSC authors' inverted ``1 − min(1, 0.2·d)``.

References:
  Zhuang, Gan, Wen, Zhang, Yi, *Collaborative unsupervised visual representation learning from decentralized
  data*, ICCV 2021. https://arxiv.org/abs/2108.06492
  Zhuang, Wen, Zhang, *Divergence-aware federated self-supervised learning*, ICLR 2022.
  https://arxiv.org/abs/2204.04385
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from trustfl.client.transforms import AbstractGradientTransform
from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.models.ssl import in_encoder
from trustfl.types import CohortContext, ParamLayout

__all__ = ["FedEMAStart", "FedUPredictorUpdate", "encoder_mask", "layer_divergence"]


def encoder_mask(layout: ParamLayout, device: torch.device) -> torch.Tensor:
    """``(d,)`` bool: the flat coordinates of the encoder (every parameter not named ``predictor.*``)."""
    parts = [torch.full((math.prod(s),), in_encoder(n), dtype=torch.bool)
             for n, s in zip(layout.names, layout.shapes)]
    return torch.cat(parts).to(device)


def layer_divergence(layout: ParamLayout, global_: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``(m,)`` mean over the encoder's weight matrices (parameters of 2 or more dimensions) of ‖W_g − W_l‖₂."""
    g, l_ = layout.unflatten(global_), layout.unflatten(local)
    names = [n for n, s in zip(layout.names, layout.shapes) if len(s) >= 2 and in_encoder(n)]
    norms = [torch.linalg.vector_norm((l_[n] - g[n]).reshape(g[n].shape[0], -1), dim=1) for n in names]
    return torch.stack(norms, dim=1).mean(1)


class _KeepsLocalModel(AbstractGradientTransform):
    """Keeps the client's trained flat model (``local``) and whether it has one (``seen``)."""

    personalizes: ClassVar[bool] = True

    def client_state_defaults(self, params):
        return {"local": torch.zeros_like(params), "seen": torch.zeros((), dtype=params.dtype, device=params.device)}

    def apply(self, grads, state, params, active, cohort):
        return grads, state

    def finish(self, state, cohort, start, end, num_steps):
        stepped = (num_steps > 0).to(end.dtype)
        local = torch.where(stepped.unsqueeze(1) > 0, end, cohort.client_state["local"])
        return {"local": local, "seen": torch.maximum(cohort.client_state["seen"], stepped)}, {}


@register("gradient_transform", "fedu")
@dataclass(frozen=True)
class FedUPredictorUpdate(_KeepsLocalModel):
    """FedU's start: global encoder; global predictor if the divergence is below ``threshold``, else the client's.

    Args:
      threshold: μ > 0 (0.4).
    """

    threshold: float = 0.4

    def __post_init__(self) -> None:
        check_number("threshold", self.threshold, low=0, low_open=True, finite=True)

    def personalize(self, start: torch.Tensor, cohort: CohortContext) -> torch.Tensor:
        local, seen = cohort.client_state["local"], cohort.client_state["seen"] > 0
        keep = seen & (layer_divergence(cohort.layout, start, local) >= self.threshold)        # (m,)
        predictor = ~encoder_mask(cohort.layout, start.device)
        return torch.where(keep.unsqueeze(1) & predictor.unsqueeze(0), local, start)


@register("gradient_transform", "fedema")
@dataclass(frozen=True)
class FedEMAStart(_KeepsLocalModel):
    """FedEMA's start: μ·W_l + (1 − μ)·W_g with μ = min(λ‖W_g − W_l‖, 1), λ = τ/d at the first divergence.

    Args:
      tau: τ > 0 (0.7, the authors' EasyFL example).
    """

    tau: float = 0.7

    def __post_init__(self) -> None:
        check_number("tau", self.tau, low=0, low_open=True, finite=True)

    def client_state_defaults(self, params):
        return {**super().client_state_defaults(params),
                "scale": torch.zeros((), dtype=params.dtype, device=params.device)}

    def _mix(self, start: torch.Tensor, cohort: CohortContext) -> tuple[torch.Tensor, torch.Tensor]:
        """``(μ (m,), λ (m,))`` for the cohort (μ = 0 for a client without a local model)."""
        local, seen = cohort.client_state["local"], cohort.client_state["seen"] > 0
        enc = encoder_mask(cohort.layout, start.device)
        d = torch.linalg.vector_norm(torch.where(enc, local - start, 0.0), dim=1)
        scale = cohort.client_state["scale"]
        scale = torch.where(seen & (scale == 0), self.tau / d.clamp(min=1e-12), scale)
        mu = torch.where(seen, torch.clamp(scale * d, max=1.0), 0.0)
        return mu, scale

    def personalize(self, start: torch.Tensor, cohort: CohortContext) -> torch.Tensor:
        mu, _ = self._mix(start, cohort)
        return torch.lerp(start, cohort.client_state["local"], mu.unsqueeze(1).to(start.dtype))

    def init(self, params, cohort):
        _, scale = self._mix(cohort.received["model"].unsqueeze(0).expand(cohort.size, -1), cohort)
        return scale

    def finish(self, state, cohort, start, end, num_steps):
        new, sent = super().finish(state, cohort, start, end, num_steps)
        return {**new, "scale": state}, sent
