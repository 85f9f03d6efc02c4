"""The spectral contrastive (SC) loss and FedSC's client objective (Jing, Yu, Zhang & Zhang, ICML 2024).

Representations are the projector outputs z = g(f(x)) ∈ ℝ^H. A batch of B images gives two groups of V views,
``z1`` (views X_1..X_V) and ``z2`` (views X_{V+1}..X_{2V}); view v of ``z1`` and view v of ``z2`` are the positive
pairs. The mini-batch estimators of Sec. 5.2 (Z_v ∈ ℝ^{H×B}, columns z) are

    R̂⁺ = 1/(2BV) Σ_{v≤V} [Z_v Z_{v+V}ᵀ + Z_{v+V} Z_vᵀ],   Tr R̂⁺ = 1/(BV) Σ_b Σ_{v≤V} z_{b,v}ᵀ z_{b,v+V}
    R̂  = 1/(2BV) Σ_{v≤2V} Z_v Z_vᵀ

and the losses, with ``scale`` s (1: the paper's normalisation; 2: the authors' code, which only rescales the lr):

    SC (Eq. 1):                 L̂    = s·( −Tr R̂⁺ + ½ ‖R̂‖_F² )
    FedSC client (Eq. 5, 80):   L̂_j  = s·( −Tr R̂⁺ + ½ α ‖R̂‖_F² + (1 − α) Tr(R̂ R̄_{−j}) )

R̄_{−j} (``reference``) is the server's estimate of the other clients' correlation matrix; it is a constant
(stop-gradient). With α = q_j and R̄_{−j} = R_{−j}(θ) the q-weighted client gradients sum to the gradient of the
pooled SC loss (Eq. 6); FedSC's experiments decay α by :func:`alpha_schedule` instead (App. C). ‖R̂‖_F² keeps the
self pairs (the estimator is biased, as in the paper's analysis): it equals the original form's
½ E[(z(x)ᵀz(x⁻))²] with x, x⁻ drawn from all 2BV views with replacement.

Not a sum of per-example terms: ‖R̂‖_F² couples the batch. :func:`fedsc_example_losses` gives per-example
attributions ℓ_b whose mean *is* L̂_j as a function of the representations (so the mean's value and gradient are
exact), by writing ½α‖R̂‖² + (1−α)Tr(R̂R̄) = Tr(M R̂) = 1/(2BV) Σ_{b,u} z_{b,u}ᵀ M z_{b,u} with
M = ½αR̂ + (1−α)R̄ (R̂ not detached). Per-example gradients of ℓ_b (DP-SGD) are therefore meaningless.

References:
  Jing et al., *FedSC: Provable Federated Self-supervised Learning with Spectral Contrastive Objective over
  Non-i.i.d. Data*, ICML 2024. https://proceedings.mlr.press/v235/jing24b.html
  HaoChen et al., *Provable Guarantees for Self-Supervised Deep Learning with Spectral Contrastive Loss*, NeurIPS
  2021. https://arxiv.org/abs/2106.04156

Example:
  >>> z1, z2 = torch.eye(2), torch.eye(2)
  >>> float(spectral_contrastive_loss(z1, z2))   # −Tr R̂⁺ + ½‖R̂‖² = −1 + ½·(½)
  -0.75
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, Mapping, Optional

import torch
from torch import nn

from trustfl.core.checks import check_number
from trustfl.core.functional import functional_call
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.objectives.base import AbstractObjective, Batch

__all__ = ["MU_RANGE", "SCALE_RANGE", "SpectralContrastive", "alpha_schedule", "check_mu", "check_scale",
           "correlation_estimates", "fedsc_example_losses", "fedsc_loss", "masked_fedsc_loss", "norm_clip",
           "spectral_contrastive_loss"]

MU_RANGE = (1e-75, 1e76)
"""μ's range: √μ, the representations' norm bound, must be a normal float32 number (beyond 1e76 it overflows)."""
SCALE_RANGE = (1e-30, 1e30)
"""s's range: the float32 loss's factor, with room for the loss it multiplies (1e±39 rounds to 0 or inf there)."""


def check_mu(name: str, value: Any, allow_none: bool = False) -> Any:
    """``value`` if it is a number in :data:`MU_RANGE` (or None where allowed), else a ConfigError naming ``name``."""
    return check_number(name, value, low=MU_RANGE[0], high=MU_RANGE[1], allow_none=allow_none,
                        note="√μ, the representations' norm bound, must be a normal float32 number")


def check_scale(name: str, value: Any) -> Any:
    """``value`` if it is a number in :data:`SCALE_RANGE`, else a ConfigError naming ``name``."""
    return check_number(name, value, low=SCALE_RANGE[0], high=SCALE_RANGE[1],
                        note="the loss's factor, computed in float32")


def norm_clip(z: torch.Tensor, max_norm: float) -> torch.Tensor:
    """NormClip(z, c) = z if ‖z‖₂ <= c else c·z/‖z‖₂, row-wise over the last dimension (differentiable)."""
    check_number("max_norm", max_norm, low=0, low_open=True, finite=True)
    norms = torch.linalg.vector_norm(z, dim=-1, keepdim=True)
    return z * (max_norm / norms.clamp(min=max_norm))


def _pairs(z1: torch.Tensor, z2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both groups as ``(B, V, H)``; ``(B, H)`` is one view per group."""
    if z1.shape != z2.shape or z1.dim() not in (2, 3):
        raise ConfigError(f"`z1` and `z2` must have the same shape (B, H) or (B, V, H), found {tuple(z1.shape)} "
                          f"and {tuple(z2.shape)}.")
    return (z1.unsqueeze(1), z2.unsqueeze(1)) if z1.dim() == 2 else (z1, z2)


def correlation_estimates(z1: torch.Tensor, z2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The mini-batch estimates ``(R̂⁺, R̂)`` of Sec. 5.2, each ``(H, H)``, from ``z1``, ``z2`` ``(B, [V,] H)``."""
    a, b = _pairs(z1, z2)
    count = a.shape[0] * a.shape[1]
    cross = torch.einsum("bvh,bvk->hk", a, b)
    r_plus = (cross + cross.T) / (2 * count)
    r = (torch.einsum("bvh,bvk->hk", a, a) + torch.einsum("bvh,bvk->hk", b, b)) / (2 * count)
    return r_plus, r


def _check_alpha_reference(alpha: float, reference: Optional[torch.Tensor], h: int) -> None:
    check_number("alpha", alpha, low=0, high=1)
    if reference is not None and tuple(reference.shape) != (h, h):
        raise ConfigError(f"`reference` (R̄_(-j)) must be an ({h}, {h}) matrix for representations of size {h}, "
                          f"found shape {tuple(reference.shape)}.")


def fedsc_loss(z1: torch.Tensor, z2: torch.Tensor, reference: Optional[torch.Tensor] = None, alpha: float = 1.0,
               scale: float = 1.0) -> torch.Tensor:
    """FedSC's client batch loss L̂_j = s·(−Tr R̂⁺ + ½α‖R̂‖_F² + (1−α)Tr(R̂ R̄_{−j})) (Eq. 5 / Eq. 80, Sec. 5.2).

    Args:
      z1, z2: the two groups of views ``(B, H)`` or ``(B, V, H)``; ``z1[:, v]`` and ``z2[:, v]`` are positives.
      reference: R̄_{−j} ``(H, H)``, detached here (stop-gradient). ``None``: no estimate yet (the FedAvg+SC loss
        −Tr R̂⁺ + ½‖R̂‖², i.e. α is taken as 1, as the authors' code does when no matrix is available).
      alpha: α in [0, 1] (α = q_j: Eq. 5; the decayed schedule: :func:`alpha_schedule`).
      scale: s > 0; 1 is the paper's normalisation, 2 the authors' code.

    Returns:
      A scalar tensor.
    """
    check_number("scale", scale, low=0, low_open=True, finite=True)
    a, b = _pairs(z1, z2)
    _check_alpha_reference(alpha, reference, a.shape[-1])
    count = a.shape[0] * a.shape[1]
    r_plus_trace = (a * b).sum() / count
    _, r = correlation_estimates(a, b)
    if reference is None:
        return scale * (-r_plus_trace + 0.5 * r.square().sum())
    rbar = reference.detach().to(device=r.device, dtype=r.dtype)
    return scale * (-r_plus_trace + 0.5 * alpha * r.square().sum() + (1.0 - alpha) * (r * rbar.T).sum())


def masked_fedsc_loss(z1: torch.Tensor, z2: torch.Tensor, mask: torch.Tensor, reference: Optional[torch.Tensor],
                      alpha: torch.Tensor | float, scale: float = 1.0) -> torch.Tensor:
    """:func:`fedsc_loss` of the real rows of one client's padded batch (``mask`` ``(B,)``, nonzero = real).

    The same estimators with B the number of real rows; padding rows enter neither R̂⁺ nor R̂. ``alpha`` may be a
    0-dim tensor (a value the server sent). No argument checks and no data-dependent branches: this runs under
    ``vmap`` over clients. A client without real rows gets 0.
    """
    a, b = _pairs(z1, z2)
    keep = (mask != 0).view(-1, 1, 1)
    a = torch.where(keep, a, torch.zeros((), dtype=a.dtype, device=a.device))
    b = torch.where(keep, b, torch.zeros((), dtype=b.dtype, device=b.device))
    count = (keep.to(a.dtype).sum() * a.shape[1]).clamp(min=1)
    r_plus_trace = (a * b).sum() / count
    r = (torch.einsum("bvh,bvk->hk", a, a) + torch.einsum("bvh,bvk->hk", b, b)) / (2 * count)
    if reference is None:
        return scale * (-r_plus_trace + 0.5 * r.square().sum())
    rbar = reference.detach().to(dtype=r.dtype)
    return scale * (-r_plus_trace + 0.5 * alpha * r.square().sum() + (1.0 - alpha) * (r * rbar.T).sum())


def spectral_contrastive_loss(z1: torch.Tensor, z2: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """The SC loss's mini-batch estimate s·(−Tr R̂⁺ + ½‖R̂‖_F²) (Eq. 1 with Sec. 5.2's estimators; FedAvg+SC)."""
    return fedsc_loss(z1, z2, None, 1.0, scale)


def fedsc_example_losses(z1: torch.Tensor, z2: torch.Tensor, reference: Optional[torch.Tensor] = None,
                         alpha: float = 1.0, scale: float = 1.0) -> torch.Tensor:
    """Per-example attributions ``(B,)`` of :func:`fedsc_loss` whose mean equals it (value and gradient):

        ℓ_b = s·( −(1/V) Σ_{v≤V} z_{b,v}ᵀ z_{b,v+V} + (1/(2V)) Σ_{u≤2V} z_{b,u}ᵀ M z_{b,u} ),
        M = ½ α R̂ + (1 − α) R̄_{−j}   (M = ½ R̂ without a reference; R̂ is not detached).
    """
    check_number("scale", scale, low=0, low_open=True, finite=True)
    a, b = _pairs(z1, z2)
    _check_alpha_reference(alpha, reference, a.shape[-1])
    _, r = correlation_estimates(a, b)
    if reference is None:
        m = 0.5 * r
    else:
        m = 0.5 * alpha * r + (1.0 - alpha) * reference.detach().to(device=r.device, dtype=r.dtype)
    z = torch.cat([a, b], dim=1)                                   # (B, 2V, H)
    quad = torch.einsum("buh,hk,buk->b", z, m, z) / z.shape[1]
    return scale * (-(a * b).sum(dim=(1, 2)) / a.shape[1] + quad)


def alpha_schedule(round: int, num_rounds: int, start: float = 1.0, end: float = 0.2,
                   endpoint: bool = False) -> float:
    """FedSC's α for round ``round`` = 0..T−1: linear decay from ``start`` towards ``end`` (App. C).

    ``endpoint=False`` (the authors' code): α_r = start − (start − end)·r/T, so the last round uses
    start − (start − end)(T−1)/T (0.204 for T = 200). ``endpoint=True``: α_r = start − (start − end)·r/(T−1),
    reaching ``end`` exactly in the last round. Round r is Algorithm 1's t = r + 1.

    Example:
      >>> alpha_schedule(0, 200), round(alpha_schedule(199, 200), 6)
      (1.0, 0.204)
    """
    check_number("num_rounds", num_rounds, integer=True, low=1)
    check_number("round", round, integer=True, low=0, high=num_rounds - 1)
    check_number("start", start, low=0, high=1)
    check_number("end", end, low=0, high=1)
    span = num_rounds - 1 if endpoint else num_rounds
    return float(start) if span == 0 else float(start) - (float(start) - float(end)) * round / span


@register("objective", "spectral_contrastive")
@dataclass(frozen=True, eq=False)  # eq=False: a tensor field cannot be compared by value
class SpectralContrastive(AbstractObjective):
    """FedSC's client objective on a batch of views (FedAvg+SC with no ``reference``).

    The batch holds ``views`` ``(B, 2V, *input_shape)`` (e.g. from :func:`trustfl.selfsup.make_views`): views
    ``0..V−1`` form ``z1`` and ``V..2V−1`` form ``z2``. :meth:`forward` runs the model on all ``2V·B`` views at
    once and returns ``(B, 2V, H)``; a batch with only ``x`` gives ``(B, H)`` (features for evaluation).
    :meth:`losses` returns :func:`fedsc_example_losses` (their mean is the batch loss L̂_j), :meth:`loss_sum`
    returns ``B·L̂_j``. Both treat their input as **one client's** batch: call them per client (not on several
    clients' outputs flattened together) and on real rows only (padding rows would enter R̂).

    Args:
      alpha: α in [0, 1]; per round, from :func:`alpha_schedule` (use :meth:`with_reference`).
      mu: clip each representation to norm √μ (NormClip, as the authors' code does in training, so the loss has
        the scale of DP-CalR's matrices); ``None``: no clipping.
      scale: 1 (the paper) or 2 (the authors' code).
      reference: R̄_{−j} ``(H, H)`` on the representations' device, or ``None`` (no inter-client term).
    """

    task: ClassVar[str] = "custom"
    reads_labels: ClassVar[bool] = False
    input_key: ClassVar[str] = "views"
    batch_coupled: ClassVar[bool] = True
    alpha: float = 1.0
    mu: Optional[float] = None
    scale: float = 1.0
    reference: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        check_number("alpha", self.alpha, low=0, high=1)
        check_mu("mu", self.mu, allow_none=True)
        check_scale("scale", self.scale)
        if self.reference is not None and not isinstance(self.reference, torch.Tensor):
            raise ConfigError(f"`reference` must be an (H, H) tensor or None, found {type(self.reference).__name__}.")
        if self.reference is not None and (self.reference.dim() != 2
                                           or self.reference.shape[0] != self.reference.shape[1]):
            raise ConfigError(f"`reference` must be a square (H, H) matrix, found {tuple(self.reference.shape)}.")

    def with_reference(self, reference: Optional[torch.Tensor], alpha: float) -> "SpectralContrastive":
        """This objective with client ``j``'s R̄_{−j} (stored detached) and the round's α."""
        return replace(self, reference=None if reference is None else reference.detach(), alpha=alpha)

    def forward(self, model: nn.Module, params: Mapping[str, torch.Tensor], batch: Batch) -> torch.Tensor:
        if self.input_key not in batch:
            return functional_call(model, params, (batch["x"],))
        views = batch[self.input_key]
        b, v = views.shape[:2]
        out = functional_call(model, params, (views.reshape(b * v, *views.shape[2:]),))
        return out.reshape(b, v, -1)

    def _groups(self, outputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if outputs.dim() != 3 or outputs.shape[1] < 2 or outputs.shape[1] % 2:
            raise ConfigError(f"objective 'spectral_contrastive' needs representations of an even number >= 2 of "
                              f"views, shape (B, 2V, H), found {tuple(outputs.shape)}; put the views in the "
                              f"batch under {self.input_key!r}.")
        z = outputs if self.mu is None else norm_clip(outputs, float(self.mu) ** 0.5)
        half = z.shape[1] // 2
        return z[:, :half], z[:, half:]

    def losses(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        z1, z2 = self._groups(outputs)
        return fedsc_example_losses(z1, z2, self.reference, self.alpha, self.scale)

    def loss_sum(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        z1, z2 = self._groups(outputs)
        return outputs.shape[0] * fedsc_loss(z1, z2, self.reference, self.alpha, self.scale)

    def client_loss(self, outputs: torch.Tensor, batch: Batch, mask: torch.Tensor,
                    personal: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """L̂_j of one client's padded batch (:func:`masked_fedsc_loss`). R̄_{−j} and α come from ``personal``
        (``"reference"`` ``(H, H)`` and ``"alpha"`` ``()``, sent by the server to this client, e.g. by the
        ``fedsc_correlation`` statistic) when present, else from this objective's own fields."""
        z1, z2 = self._groups(outputs)
        if "reference" in personal:
            return masked_fedsc_loss(z1, z2, mask, personal["reference"], personal["alpha"], self.scale)
        return masked_fedsc_loss(z1, z2, mask, self.reference, self.alpha, self.scale)
