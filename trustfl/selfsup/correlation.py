"""Correlation matrices of FedSC: a client's R_j, DP-CalR (Algorithm 2) and the server's store (Algorithm 1).

- R_j = E_{x̄∼D_j} E_{x∼𝒜(·|x̄)}[z(x) z(x)ᵀ] ∈ ℝ^{H×H}, estimated from V views of every sample.
- DP-CalR (Algorithm 2): R̃_j = (1/(|D_j|·V)) Σ_{x̄,v} ž_v ž_vᵀ + N(0, σ² I_{H²}) with ž = NormClip(z, √μ), so
  every term has ‖ž žᵀ‖_F = ‖ž‖² <= μ. The noise is iid on all H² entries, as Algorithm 2 and the privacy analysis
  (Sec. 6.1; :mod:`trustfl.privacy.analysis.fedsc`) state; ``symmetrize=True`` returns (R̃ + R̃ᵀ)/2 instead, a
  post-processing (same privacy) that leaves Tr(R R̃) unchanged for every symmetric R (diagonal noise std σ,
  off-diagonal σ/√2).
- The server (Algorithm 1) keeps every client's last upload R̃_j and R̃ = Σ_j q_j R̃_j: all J clients upload at
  t = 1, later only the participants, whose matrices replace their old ones (R̃ ← R̃ − q_j R̃_j^{old} + q_j R̃_j);
  absent clients' matrices are kept (stale). Client j trains with R̃_{−j} = (R̃ − q_j R̃_j)/(1 − q_j), the
  q-weighted mean of the other clients' matrices. Non-finite matrices are refused (MessageError; the engine screens
  them out before). Where a subtraction cancels (a huge matrix replaced by an ordinary one: the result's largest
  entry below 2⁻¹⁰ of its operands'), R̃ or R̃_{−j} is summed afresh from the stored matrices; otherwise the
  incremental forms are used unchanged.

Example:
  >>> z = torch.ones(4, 2, 3)                            # 4 samples, V = 2 views, H = 3
  >>> r = dp_calr(z, mu=3.0, sigma=0.0, generator=torch.Generator())
  >>> torch.allclose(r, torch.ones(3, 3))
  True
  >>> store = CorrelationStore.init(torch.stack([torch.eye(2), 3 * torch.eye(2)]), client_weights([1, 1]))
  >>> store.others(torch.tensor([0]))[0].diagonal().tolist()
  [3.0, 3.0]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from trustfl.core.checks import check_number
from trustfl.core.finite import all_finite, finite_rows
from trustfl.core.rng import normal_rows
from trustfl.errors import ConfigError, MessageError, PrivacyError
from trustfl.objectives.spectral import norm_clip

__all__ = ["CorrelationStore", "add_matrix_noise", "client_weights", "correlation", "dp_calr"]


def _as_views(z: torch.Tensor, lead: int) -> torch.Tensor:
    """``(..., N, H)`` → ``(..., N, 1, H)``; ``(..., N, V, H)`` unchanged (``lead`` leading client dims)."""
    if not isinstance(z, torch.Tensor) or not z.is_floating_point() or z.dim() not in (lead + 2, lead + 3):
        found = tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
        raise ConfigError(f"`z` must be floating-point representations of shape (N, H) or (N, V, H) (with a "
                          f"leading client dimension for several clients), found {found}.")
    return z.unsqueeze(-2) if z.dim() == lead + 2 else z


def correlation(z: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """R = (1/(N·V)) Σ_{n,v} z_{n,v} z_{n,v}ᵀ over the real samples (the empirical R_j).

    Args:
      z: ``(N, V, H)`` or ``(N, H)`` representations, or ``(J, N, V, H)`` for J clients at once (``(J, N, H)``
        only with a ``(J, N)`` mask: without one a 3-D ``z`` is read as ``(N, V, H)``).
      mask: ``(N,)`` or ``(J, N)``; nonzero marks a real sample (padding rows count nothing). ``None``: all real.

    Returns:
      ``(H, H)`` or ``(J, H, H)``; a client without samples gets zeros.
    """
    lead = 0 if mask is None else mask.dim() - 1
    if mask is None and z.dim() == 4:
        lead = 1
    v = _as_views(z, lead)
    if mask is None:
        return torch.einsum("...nvh,...nvk->...hk", v, v) / (v.shape[-3] * v.shape[-2])
    if tuple(mask.shape) != tuple(v.shape[:-2]):
        raise ConfigError(f"`mask` must have the shape {tuple(v.shape[:-2])} of the samples, found "
                          f"{tuple(mask.shape)}.")
    w = (mask != 0).to(v.dtype)
    count = (w.sum(-1) * v.shape[-2]).clamp(min=1)
    return torch.einsum("...n,...nvh,...nvk->...hk", w, v, v) / count[..., None, None]


def dp_calr(z: torch.Tensor, mu: float, sigma: float, generator: torch.Generator | Sequence[torch.Generator], *,
            mask: Optional[torch.Tensor] = None, symmetrize: bool = False) -> torch.Tensor:
    """DP-CalR (Algorithm 2): the clipped correlation matrix plus N(0, σ²) on each of its H² entries.

    Args:
      z: representations z(x_v; θ) of the V views of every sample of D_j, ``(N, V, H)`` (or ``(N, H)``); several
        clients at once as ``(J, N, V, H)`` with ``mask``.
      mu: μ > 0; representations are clipped to norm √μ, so each term ž žᵀ has Frobenius norm <= μ.
      sigma: σ >= 0, the noise std per entry (calibrate it with
        :func:`trustfl.privacy.analysis.fedsc.calibrate_fedsc_sigma`); 0 draws nothing.
      generator: on ``z``'s device; for J clients, a sequence of J generators (client j's noise from its own).
      mask: real samples, as in :func:`correlation` (``(J, N)`` for several clients).
      symmetrize: return (R̃ + R̃ᵀ)/2 (post-processing; see the module notes).

    Returns:
      R̃_j ``(H, H)``, or ``(J, H, H)``.

    Raises:
      PrivacyError: ``mu <= 0`` or ``sigma < 0``. ConfigError: bad shapes or generators.
    """
    check_number("mu", mu, low=0, low_open=True, finite=True, error=PrivacyError)
    check_number("sigma", sigma, low=0, finite=True, error=PrivacyError)
    return add_matrix_noise(correlation(norm_clip(z, float(mu) ** 0.5), mask), sigma, generator,
                            symmetrize=symmetrize)


def add_matrix_noise(r: torch.Tensor, sigma: float, generator: torch.Generator | Sequence[torch.Generator], *,
                     symmetrize: bool = False) -> torch.Tensor:
    """R + N(0, σ² I_{H²}), the last line of Algorithm 2, for a matrix ``(H, H)`` or J matrices ``(J, H, H)``.

    For a client's data set too large for one pass, sum ``correlation(norm_clip(z_c, √μ)) · n_c / N`` over chunks
    c of its samples and noise the result once with this function: that is :func:`dp_calr`.

    Args:
      r: the clipped correlation matrix (or J of them).
      sigma: σ >= 0; 0 draws nothing.
      generator: on ``r``'s device; for J matrices, J generators (matrix j's noise from ``generator[j]``).
      symmetrize: return (R̃ + R̃ᵀ)/2 (post-processing).
    """
    check_number("sigma", sigma, low=0, finite=True, error=PrivacyError)
    if sigma > 0:
        h = r.shape[-1]
        kw = {"device": r.device, "dtype": r.dtype}
        if r.dim() == 2:
            if not isinstance(generator, torch.Generator):
                raise ConfigError("`generator` must be one torch.Generator for one client's matrix.")
            noise = torch.randn((h, h), generator=generator, **kw)
        else:
            if isinstance(generator, torch.Generator) or len(generator) != r.shape[0]:
                raise ConfigError(f"`generator` must hold one generator per client ({r.shape[0]}).")
            noise = torch.empty(r.shape, **kw)
            normal_rows([noise], generator)
        r = r + sigma * noise
    return 0.5 * (r + r.transpose(-1, -2)) if symmetrize else r


def client_weights(sizes: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """q_j = |D_j| / Σ_j' |D_j'| (float64); equal sizes give the authors' q_j = 1/J.

    A sum that overflows (or underflows below the normal range) is taken over ``sizes / max(sizes)`` instead.

    Raises:
      ConfigError: fewer than 2 sizes, a size not finite and > 0, or sizes so far apart that a weight is 0.
    """
    s = torch.as_tensor(sizes, dtype=torch.float64)
    if s.dim() != 1 or s.numel() < 2 or not bool((s > 0).all()) or not bool(torch.isfinite(s).all()):
        raise ConfigError(f"`sizes` must hold at least 2 positive client data set sizes, found {sizes!r}.")
    total = s.sum()
    if not bool(torch.isfinite(total)) or float(total) < torch.finfo(torch.float64).tiny:
        s = s / s.max()
        total = s.sum()
    q = s / total
    if not bool((q > 0).all()):
        raise ConfigError(f"`sizes` must lie within a factor of about 1e308 of each other (a weight would be 0), "
                          f"found {sizes!r}.")
    return q


_CANCELLED = 2.0 ** -10
"""A sum or difference whose largest entry is below this share of its operands' is recomputed (see the notes)."""


def _cancelled(result: torch.Tensor, *operands: torch.Tensor) -> torch.Tensor:
    """Per leading row of ``(…, H, H)`` tensors: ``result`` not finite, or its largest |entry| below
    ``_CANCELLED`` times the operands' largest (most of its digits lost to cancellation)."""
    big = torch.stack([o.abs().amax(dim=(-2, -1)) for o in operands]).amax(dim=0)
    size = result.abs().amax(dim=(-2, -1))
    return ~(size >= _CANCELLED * big) | ~(size < float("inf"))


def _check_finite(uploads: torch.Tensor, clients: list[int]) -> None:
    """MessageError naming the clients whose matrices hold NaN or ±inf."""
    if all_finite(uploads):
        return
    bad = ~finite_rows(uploads.reshape(uploads.shape[0], -1))
    if bool(bad.any()):
        rows = [clients[i] for i in torch.nonzero(bad).flatten().tolist()]
        raise MessageError(f"CorrelationStore: `uploads` of clients {rows} are not finite (NaN or ±inf); the "
                           f"store is unchanged (screen such uploads out, as the engine does).")


@dataclass(frozen=True, eq=False)
class CorrelationStore:
    """The server's matrices of Algorithm 1 (explicit state: every method returns a new store).

    Attributes:
      matrices: ``(J, H, H)``, R̃_j, client j's last upload.
      weights: ``(J,)``, q_j (positive, summing to 1).
      total: ``(H, H)``, R̃ = Σ_j q_j R̃_j, maintained incrementally (summed afresh where that cancels).
    """

    matrices: torch.Tensor
    weights: torch.Tensor
    total: torch.Tensor

    @classmethod
    def init(cls, uploads: torch.Tensor, weights: torch.Tensor) -> "CorrelationStore":
        """The store after round t = 1, where all J clients upload (Algorithm 1, lines 5-7).

        Raises:
          ConfigError: ``uploads`` is not ``(J, H, H)`` with J >= 2, or ``weights`` is not ``(J,)`` positive and
            summing to 1. MessageError: a matrix (or their weighted sum) is not finite.
        """
        if uploads.dim() != 3 or uploads.shape[1] != uploads.shape[2] or uploads.shape[0] < 2:
            raise ConfigError(f"`uploads` must be (J, H, H) with J >= 2 clients, found {tuple(uploads.shape)}.")
        w = torch.as_tensor(weights, dtype=uploads.dtype, device=uploads.device)
        if tuple(w.shape) != (uploads.shape[0],) or not bool((w > 0).all()) \
                or abs(float(w.sum()) - 1.0) > 1e-6:
            raise ConfigError(f"`weights` must be {uploads.shape[0]} positive numbers summing to 1 (see "
                              f"client_weights), found {weights!r}.")
        _check_finite(uploads, list(range(uploads.shape[0])))
        total = torch.einsum("j,jhk->hk", w, uploads)
        if not all_finite(total):
            raise MessageError("CorrelationStore: the weighted sum of `uploads` overflows.")
        return cls(uploads.clone(), w, total)

    def _rows(self, clients: torch.Tensor) -> torch.Tensor:
        idx = torch.as_tensor(clients, dtype=torch.long, device=self.matrices.device).reshape(-1)
        j = self.matrices.shape[0]
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= j):
            raise ConfigError(f"`clients` must be client ids in 0..{j - 1}, found {idx.tolist()}.")
        return idx

    def update(self, clients: torch.Tensor, uploads: torch.Tensor) -> "CorrelationStore":
        """Replace the participants' matrices: R̃ ← R̃ + Σ_{j∈𝒥} q_j (R̃_j^{new} − R̃_j^{old}) (Algorithm 1, line 13).

        Args:
          clients: ``(m,)`` distinct client ids (row order of ``uploads``).
          uploads: ``(m, H, H)``, their new matrices (from :func:`dp_calr`).

        Raises:
          ConfigError: bad ids or shape. MessageError: a non-finite matrix (in the store's dtype); the store is
            unchanged.
        """
        idx = self._rows(clients)
        if idx.unique().numel() != idx.numel():
            raise ConfigError(f"`clients` must be distinct, found {idx.tolist()}.")
        if tuple(uploads.shape) != (idx.numel(), *self.matrices.shape[1:]):
            raise ConfigError(f"`uploads` must have the shape {(idx.numel(), *self.matrices.shape[1:])}, found "
                              f"{tuple(uploads.shape)}.")
        uploads = uploads.to(self.matrices.dtype)
        _check_finite(uploads, idx.tolist())
        delta = torch.einsum("j,jhk->hk", self.weights[idx], uploads - self.matrices[idx])
        total = self.total + delta
        matrices = self.matrices.index_copy(0, idx, uploads)
        if bool(_cancelled(total, self.total, delta)):
            total = torch.einsum("j,jhk->hk", self.weights, matrices)
            if not all_finite(total):
                raise MessageError("CorrelationStore: the weighted sum of the matrices overflows; the store is "
                                   "unchanged.")
        return CorrelationStore(matrices, self.weights, total)

    def others(self, clients: torch.Tensor) -> torch.Tensor:
        """R̃_{−j} = (R̃ − q_j R̃_j)/(1 − q_j) for each j in ``clients`` ``(m,)``: ``(m, H, H)`` (rows where the
        difference cancels: Σ_{k≠j} q_k R̃_k / (1 − q_j) from the stored matrices)."""
        idx = self._rows(clients)
        q = self.weights[idx].view(-1, 1, 1)
        own = q * self.matrices[idx]
        diff = self.total - own
        redo = _cancelled(diff, self.total.expand_as(own), own)
        if bool(redo.any()):
            rows = torch.nonzero(redo).flatten()
            w = self.weights.expand(rows.numel(), -1).clone()
            w[torch.arange(rows.numel(), device=w.device), idx[rows]] = 0
            diff = diff.index_copy(0, rows, torch.einsum("mj,jhk->mhk", w, self.matrices))
        return diff / (1.0 - q)
