"""FedSC's shared correlation matrices as one client statistic (Algorithms 1 and 2 of the FedSC paper).

Client half (DP-CalR, Algorithm 2), at the received model θ^{t−1}, before local training:

    R̃_j = (1/(|D_j|·V)) Σ_{x̄∈D_j} Σ_{v≤V} ž_v ž_vᵀ + N(0, σ_j² I_{H²}),   ž_v = NormClip(z(x_v; θ), √μ)

with V views x_v ∼ 𝒜(·|x̄) from the client's ``"<name>/views"`` stream and the noise from its ``"<name>/noise"``
stream. One upload is the Gaussian mechanism with sensitivity Δ = √2·μ/|D_j| (replace-one; μ/|D_j| for
``neighboring = "zero_out"``), charged as :func:`trustfl.privacy.analysis.fedsc.release_event`.

Server half (Algorithm 1): the :class:`~trustfl.selfsup.correlation.CorrelationStore` of every client's last accepted
upload and R̃ = Σ_j q_j R̃_j. An upload is admitted when finite with ``‖R̃_j‖_F <= μ + σ_j(H + 10)``, which every
honest one meets (:meth:`FedSCCorrelation.admissible`); a refused first upload starts as the accepted ones' weighted
mean. The first sharing round every client uploads (Algorithm 1's t = 1, whatever the cohort); later
sharing rounds only the round's participants, whose matrices replace their old ones incrementally (line 13); absent
clients' matrices stay (stale). Each participant j then receives ``reference`` = R̃_{−j} = (R̃ − q_j R̃_j)/(1 − q_j)
and ``alpha`` = α_t (:func:`trustfl.objectives.spectral.alpha_schedule`, App. C; or α = q_j, Eq. 5's provable form,
with ``alpha_mode = "q"``), which the ``spectral_contrastive`` objective reads (Eq. 5 / Eq. 80). Before the first
share nothing is sent and clients train on the plain SC loss (α = 1).

Sharing schedule (rounds t = 1..T): t >= ``share_from`` and (t − ``share_from``) mod ``share_every`` = 0; in other
rounds clients train with the last stored matrices (the FedSC paper's Table 6 shares only in some rounds).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from trustfl.client.statistics import AbstractClientStatistic
from trustfl.core.checks import check_number
from trustfl.core.memory import refuse_beyond_free
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.objectives.spectral import alpha_schedule, check_mu, norm_clip
from trustfl.privacy.analysis.fedsc import NEIGHBORINGS, release_event
from trustfl.selfsup.correlation import CorrelationStore, add_matrix_noise, client_weights
from trustfl.selfsup.views import view_representations

__all__ = ["FedSCCorrelation", "SIGMA_RANGE", "check_sigma"]

WEIGHTINGS = ("num_samples", "uniform")
ALPHA_MODES = ("schedule", "q")
SIGMA_RANGE = (1e-30, 1e30)
"""σ's range besides 0: the noise σ·N(0, 1) is drawn in float32, where σ beyond it rounds to 0 or its draws to inf
(with μ in :data:`~trustfl.objectives.spectral.MU_RANGE`, σ/Δ stays within what the accountant computes)."""


ADMIT_TAIL = 10.0
"""t in the bound ``μ + σ·(H + t)`` on an honest upload's Frobenius norm (:meth:`FedSCCorrelation.admissible`)."""


def _with_absent_as_mean(values: torch.Tensor, client_ids: Sequence[int], weights: torch.Tensor) -> torch.Tensor:
    """Every client's first matrix ``(J, H, H)``: the accepted uploads ``values`` of ``client_ids``, and for the
    others the q-weighted mean of those (so R̃ is that mean), until their own next upload replaces it. Sharing starts
    without waiting for a first round in which every upload is accepted, which one bad sender could put off for ever."""
    ids = torch.as_tensor(list(client_ids), dtype=torch.long, device=values.device)
    w = weights[ids]
    mean = torch.einsum("j,jhk->hk", w / w.sum(), values)
    full = mean.expand(weights.numel(), *mean.shape).clone()
    full[ids] = values
    return full


def check_sigma(name: str, value: Any) -> Any:
    """``value`` if it is 0 (no noise) or a number in :data:`SIGMA_RANGE`, else a ConfigError naming ``name``."""
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and value == 0):
        check_number(name, value, low=SIGMA_RANGE[0], high=SIGMA_RANGE[1],
                     note="or 0: no noise; the noise is drawn in float32")
    return value


@register("client_statistic", "fedsc_correlation")
@dataclass(frozen=True)
class FedSCCorrelation(AbstractClientStatistic):
    """DP-CalR uploads and R̃_{−j} downloads (see the module notes).

    Args:
      mu: μ in :data:`~trustfl.objectives.spectral.MU_RANGE` (representations clipped to √μ).
      views: V >= 1, views per sample in DP-CalR (the FedSC paper uses 5).
      sigma: σ per matrix entry, 0 or in :data:`SIGMA_RANGE`, one number or one per client (0: no noise, no DP
        event).
      rounds: T, the run's rounds (the α schedule's length).
      share_from: t0 >= 1, the first sharing round. share_every: k >= 1.
      alpha_start, alpha_end: α's linear schedule (1 → 0.2 in the paper); ``alpha_endpoint``: reach the end.
      alpha_mode: ``"schedule"`` (the experiments' α_t, App. C) or ``"q"``: α = q_j every round (Eq. 5, the form
        whose q-weighted client gradients sum to the pooled SC gradient, Eq. 6).
      weighting: q_j ∝ |D_j| (``"num_samples"``) or q_j = 1/J (``"uniform"``, the authors' code).
      neighboring: ``"replace_one"`` or ``"zero_out"`` (the sensitivity of the charged event).
      chunk: samples per client per forward pass (bounds memory).
    """

    mu: float = 4.0
    views: int = 5
    sigma: float | Sequence[float] = 0.0
    rounds: int = 1
    share_from: int = 1
    share_every: int = 1
    alpha_start: float = 1.0
    alpha_end: float = 0.2
    alpha_endpoint: bool = False
    alpha_mode: str = "schedule"
    weighting: str = "num_samples"
    neighboring: str = "replace_one"
    chunk: int = 256
    sizes: tuple[int, ...] = ()
    """|D_j| of every client (set by the recipe from the partition; public, as in any weighted mean)."""

    def __post_init__(self) -> None:
        check_mu("mu", self.mu)
        check_number("views", self.views, integer=True, low=1)
        sig = self.sigma if isinstance(self.sigma, (list, tuple)) else [self.sigma]
        for s in sig:
            check_sigma("sigma", s)
        object.__setattr__(self, "sigma", tuple(float(s) for s in self.sigma)
                           if isinstance(self.sigma, (list, tuple)) else float(self.sigma))
        check_number("rounds", self.rounds, integer=True, low=1)
        check_number("share_from", self.share_from, integer=True, low=1)
        check_number("share_every", self.share_every, integer=True, low=1)
        check_number("alpha_start", self.alpha_start, low=0, high=1)
        check_number("alpha_end", self.alpha_end, low=0, high=1)
        check_number("chunk", self.chunk, integer=True, low=1)
        if self.alpha_mode not in ALPHA_MODES:
            raise ConfigError(f"`alpha_mode` must be one of {ALPHA_MODES}, found {self.alpha_mode!r}.")
        if self.weighting not in WEIGHTINGS:
            raise ConfigError(f"`weighting` must be one of {WEIGHTINGS}, found {self.weighting!r}.")
        if self.neighboring not in NEIGHBORINGS:
            raise ConfigError(f"`neighboring` must be one of {NEIGHBORINGS}, found {self.neighboring!r}.")
        object.__setattr__(self, "sizes", tuple(int(s) for s in self.sizes))
        if isinstance(self.sigma, tuple) and self.sizes and len(self.sigma) != len(self.sizes):
            raise ConfigError(f"`sigma` must hold one value per client ({len(self.sizes)}), found {len(self.sigma)}.")

    # -- schedule --------------------------------------------------------------------------------------------
    def shares(self, round: int) -> bool:
        """Whether round ``round`` (0-based; Algorithm 1's t = round + 1) is a sharing round."""
        t = round + 1
        return t >= self.share_from and (t - self.share_from) % self.share_every == 0

    def releases(self, participations: int | None = None) -> int:
        """Most uploads of one client over the run: the sharing rounds (T_j of the privacy analysis), counted in
        closed form (t = share_from, share_from + share_every, … up to ``rounds``)."""
        return 0 if self.rounds < self.share_from else (self.rounds - self.share_from) // self.share_every + 1

    def sigma_of(self, client_id: int) -> float:
        return self.sigma[client_id] if isinstance(self.sigma, tuple) else self.sigma

    # -- server half -----------------------------------------------------------------------------------------
    def server_init(self, sizes: Sequence[int]) -> dict[str, Any]:
        empty = [i for i, s in enumerate(sizes) if s <= 0]
        if empty:
            raise ConfigError(f"FedSC: client {empty[0]} holds no training examples; q_j and DP-CalR's sensitivity "
                              f"μ/|D_j| need |D_j| >= 1 for every client (change `data.partition` or "
                              f"`data.num_clients`).")
        q = client_weights(sizes) if self.weighting == "num_samples" else torch.full(
            (len(sizes),), 1.0 / len(sizes), dtype=torch.float64)
        return {"weights": q, "matrices": None, "total": None}

    def uploaders(self, round, cohort, state, num_clients):
        if not self.shares(round):
            return []
        return list(range(num_clients)) if state["matrices"] is None else list(cohort)

    def release(self, client_id):
        sigma = self.sigma_of(client_id)
        if sigma <= 0:
            return None
        return release_event(sigma, self.mu, self.sizes[client_id], self.neighboring)

    def admissible(self, client_ids, values):
        """Finite, and ``‖R̃_j‖_F <= μ + σ_j·(H + 10)``. An honest upload meets it: the clipped correlation is a mean
        of ``z zᵀ`` with ``‖z‖² <= μ``, so its norm is at most μ, and the noise's norm, σ_j-Lipschitz in a standard
        Gaussian of mean at most σ_j·H, exceeds ``σ_j·(H + t)`` with probability at most ``exp(−t²/2)`` (e^−50
        here). A huge or malformed matrix would reach every other client's objective through R̃_{−j}."""
        h = values.shape[-1]
        sigmas = torch.tensor([self.sigma_of(c) for c in client_ids], dtype=torch.float64, device=values.device)
        norms = torch.linalg.vector_norm(values.reshape(values.shape[0], -1).to(torch.float64), dim=1)
        return torch.isfinite(norms) & (norms <= self.mu + sigmas * (h + ADMIT_TAIL))

    def server_update(self, state, client_ids, values):
        if state["matrices"] is None:
            weights = state["weights"].to(values.dtype).to(values.device)
            if len(client_ids) != weights.numel():  # some first uploads were refused: they start as the others' mean
                values = _with_absent_as_mean(values, client_ids, weights)
            store = CorrelationStore.init(values, weights)
        else:
            store = CorrelationStore(state["matrices"], state["weights"].to(state["matrices"].dtype).to(
                state["matrices"].device), state["total"]).update(torch.tensor(client_ids), values)
        return {"weights": state["weights"], "matrices": store.matrices, "total": store.total}

    def personal(self, state, round, client_ids):
        if state["matrices"] is None or not client_ids:
            return {}
        store = CorrelationStore(state["matrices"], state["weights"].to(state["matrices"].dtype).to(
            state["matrices"].device), state["total"])
        reference = store.others(torch.tensor(client_ids))
        if self.alpha_mode == "q":  # Eq. 5: α = q_j, client j's weight in the pooled objective
            ids = torch.as_tensor(client_ids, dtype=torch.long, device=store.weights.device)
            return {"reference": reference, "alpha": store.weights[ids].to(reference.dtype)}
        alpha = alpha_schedule(round, self.rounds, self.alpha_start, self.alpha_end, self.alpha_endpoint)
        return {"reference": reference, "alpha": reference.new_full((len(client_ids),), alpha)}

    # -- client half -----------------------------------------------------------------------------------------
    def compute(self, represent, x, mask, client_ids, generator, augment=None):
        views_gen = [generator(c, "views") for c in client_ids]
        if x.shape[0] and x.shape[1]:  # H from one sample's representation, then the round's work, before it runs
            probe = represent(x[0, :1])
            m, h, size = x.shape[0], probe.shape[-1], probe.element_size()
            refuse_beyond_free(size * m * (4 * h * h + min(self.chunk, x.shape[1]) * self.views * h), probe.device)
        total = None
        for start, z in view_representations(represent, x, self.views, views_gen, augment, self.chunk):
            z = norm_clip(z, math.sqrt(self.mu))
            w = mask[:, start:start + z.shape[1]].to(z.dtype)
            part = torch.einsum("jn,jnvh,jnvk->jhk", w, z, z)
            total = part if total is None else total + part
        count = (mask.to(total.dtype).sum(1) * self.views).clamp(min=1)
        r = total / count.view(-1, 1, 1)
        sigmas = [self.sigma_of(c) for c in client_ids]
        if any(s > 0 for s in sigmas):
            noise_gen = [generator(c, "noise") for c in client_ids]
            r = torch.stack([add_matrix_noise(r[i], s, noise_gen[i]) for i, s in enumerate(sigmas)])
        return r
