"""Robust PCA by Principal Component Pursuit (PCP), the noise estimator of Robust-HDP.

PCP splits a matrix ``M ∈ R^{p×n}`` into a low-rank part ``L`` and a sparse part ``S`` by solving

    min ‖L‖_* + λ‖S‖₁   s.t.  L + S = M,

with the inexact augmented-Lagrangian / ADMM iteration of Candès et al. (2011), Alg. 1 ("Alg. 3" in Robust-HDP):

    L_{k+1} = SVT_{1/μ}(M − S_k + Y_k/μ)
    S_{k+1} = shrink_{λ/μ}(M − L_{k+1} + Y_k/μ)
    Y_{k+1} = Y_k + μ (M − L_{k+1} − S_{k+1}),      stop when ‖M − L_{k+1} − S_{k+1}‖_F ≤ tol,

where ``shrink_τ(x) = sgn(x)·max(|x| − τ, 0)`` and ``SVT_τ(X) = U shrink_τ(Σ) Vᵀ``. An optional growth
``μ_{k+1} = min(ρ μ_k, μ_max)`` gives the inexact ALM of Lin, Chen & Ma (2010); ``ρ = 1`` (default) is Alg. 3.

Convergence on Robust-HDP's noise-dominated matrices (measured on synthetic DP updates, n = 20, Dist1/Dist6):
  * ``mu_rule="candes"``, fixed μ (the default): μ does not scale with p while the singular values of the noise
    grow like √p, so the iteration count grows like √p: ≈ 700–1000 iterations for good weights and ≈ 2700 to
    reach ``1e-7·‖M‖_F`` at p ≈ 3·10⁴; at p ≈ 3·10⁵, 300 iterations are still far off (weight error 0.4).
  * ``mu_rule="spectral"`` (μ₀ = 1.25/‖M‖₂, Lin et al.'s start) with ``mu_growth=1.1``: 75–90 iterations to
    ``1e-7·‖M‖_F`` at p from 10⁴ to 10⁶ and the same weights (within ≈ 0.001 L1); ``1.05``: 125–150 iterations,
    matching the fixed-μ optimum. Growth from the Candès μ (already large) stops at a useless split (L ≈ M).

Implementation notes (p ≫ n, e.g. p = 10⁶ parameters × n = 60 clients):
  * The solver works in float64 on the transposed, row-major layout ``W = Mᵀ`` of shape ``(n, p)`` (the layout
    of a message matrix), so no ``(p, n)`` copy is made when ``M`` is ``x.T`` of a float64 ``x``.
  * It keeps ``Z = M + Y/μ`` instead of ``Y``. Since ``B − shrink_τ(B) = clamp(B, −τ, τ)``, the dual update is
    ``C_{k+1} = Y_{k+1}/μ_k = clamp(B, ±λ/μ_k)`` with ``B = Z_k − L_{k+1}`` (computed in place in ``Z``), and the
    residual is ``R_{k+1} = M − Z_k + C_{k+1} = C_{k+1} − (μ_{k−1}/μ_k) C_k``, so no buffer holds it; one
    iteration is ≈ 15 passes over the matrix (+4 when the stopping rule is tested, see ``check_every``).
  * The thin SVD of the wide ``(n, p)`` iterate ``A`` comes from the eigendecomposition of its ``n×n`` Gram
    matrix ``A Aᵀ = U Σ² Uᵀ`` (``svd="gram"``), and ``SVT(A) = U diag(shrink(σ)/σ) Uᵀ A`` is one ``n×n`` by
    ``n×p`` product fused with the next subtraction (``addmm``). ``svd="direct"`` takes ``U, σ`` from
    ``torch.linalg.svd`` instead (about 20× slower at p = 10⁶, n = 60; the Gram route squares the condition
    number, which only matters when ``σ_max/τ`` exceeds ~10⁶).
  * Four ``(n, p)`` float64 buffers are allocated once (plus a float64 copy of ``M`` when it is not float64).

References:
  Candès, Li, Ma, Wright, "Robust Principal Component Analysis?", J. ACM 2011, https://arxiv.org/abs/0912.3599
  Lin, Chen, Ma, "The Augmented Lagrange Multiplier Method for Exact Recovery of Corrupted Low-Rank Matrices",
  https://arxiv.org/abs/1009.5055
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from trustfl.core.checks import check_number
from trustfl.core.finite import all_finite
from trustfl.errors import ConfigError, MessageError

MuRule = Literal["candes", "code", "spectral"]
TolMode = Literal["relative", "absolute"]
SvdMethod = Literal["gram", "direct"]

_MAX_NORM = 1e150
"""Largest Frobenius norm of ``M``: the Gram matrix ``M Mᵀ`` of the SVD step must fit in float64."""

DEFAULT_TOL = {"relative": 1e-7, "absolute": 5e-8}
"""Default tolerance per mode: ``1e-7·‖M‖_F`` (Candès) or the Robust-HDP code's absolute ``5e-8``."""


@dataclass(frozen=True)
class PCPResult:
    """Output of :func:`pcp`.

    Attributes:
      low_rank: ``L``, shape ``(p, n)``, float64 (a transposed view of an ``(n, p)`` buffer).
      sparse: ``S``, shape ``(p, n)``, float64 (a transposed view of an ``(n, p)`` buffer).
      iterations: number of iterations run.
      converged: whether ``‖M − L − S‖_F ≤ tol`` was reached within ``max_iter``.
      residual: the final ``‖M − L − S‖_F``.
      mu: the initial ``μ`` used.
      lam: the ``λ`` used.
      rank: the rank of ``L`` at the last iteration.
    """

    low_rank: torch.Tensor
    sparse: torch.Tensor
    iterations: int
    converged: bool
    residual: float
    mu: float
    lam: float
    rank: int


def check_pcp_options(*, lam: float | None, mu: float | None, mu_rule: str, tol: float | None, tol_mode: str,
                      max_iter: int, mu_growth: float, mu_max: float | None, svd: str,
                      check_every: int = 1) -> None:
    """Validate PCP options (shared by :func:`pcp` and the aggregators that wrap it); raise ``ConfigError``."""
    for name, value in (("lam", lam), ("mu", mu), ("tol", tol), ("mu_max", mu_max)):
        check_number(name, value, low=0, low_open=True, finite=True, allow_none=True, note="default")
    if mu_rule not in ("candes", "code", "spectral"):
        raise ConfigError(f"`mu_rule` must be 'candes', 'code' or 'spectral', found {mu_rule!r}.")
    if tol_mode not in ("relative", "absolute"):
        raise ConfigError(f"`tol_mode` must be 'relative' or 'absolute', found {tol_mode!r}.")
    check_number("max_iter", max_iter, integer=True, low=1)
    check_number("mu_growth", mu_growth, low=1, finite=True, note="1 = fixed μ, Alg. 3")
    check_number("check_every", check_every, integer=True, low=1)
    if svd not in ("gram", "direct"):
        raise ConfigError(f"`svd` must be 'gram' or 'direct', found {svd!r}.")


def _svt_operator(a: torch.Tensor, tau: float, svd: str) -> tuple[torch.Tensor, int]:
    """``P (n×n)`` with ``P a = SVT_τ(a)`` for a wide ``a`` of shape ``(n, p)``, and the rank of the result."""
    if svd == "gram":
        evals, u = torch.linalg.eigh(a @ a.T)
        sigma = evals.clamp_min(0.0).sqrt()
    else:
        u, sigma, _ = torch.linalg.svd(a, full_matrices=False)
    keep = sigma > tau
    factor = torch.where(keep, (sigma - tau) / torch.where(keep, sigma, torch.ones_like(sigma)), 0.0)
    return (u * factor) @ u.T, int(keep.sum())


def _default_mu(m: torch.Tensor, rule: str) -> float:
    """The initial ``μ`` for the wide ``(n, p)`` layout ``m = Mᵀ``."""
    p, n = m.shape[1], m.shape[0]
    if rule == "candes":
        return p * n / (4.0 * float(torch.linalg.vector_norm(m, ord=1)))
    if rule == "code":
        return p * n / (4.0 * float(torch.linalg.vector_norm(m, ord=1, dim=1).max()))
    return 1.25 / math.sqrt(float(torch.linalg.eigvalsh(m @ m.T)[-1]))


def pcp(M: torch.Tensor, *, lam: float | None = None, mu: float | None = None, mu_rule: MuRule = "candes",
        tol: float | None = None, tol_mode: TolMode = "relative", max_iter: int = 1000, mu_growth: float = 1.0,
        mu_max: float | None = None, svd: SvdMethod = "gram", check_every: int = 1) -> PCPResult:
    """Principal Component Pursuit ``M = L + S`` by inexact ALM (Candès et al. 2011, Alg. 1).

    Args:
      M: the ``(p, n)`` matrix (Robust-HDP: one column per client update). Any floating dtype; computed in
        float64. Passing ``x.T`` of a float64 ``(n, p)`` tensor avoids any copy of ``M``.
      lam: sparsity weight ``λ``; default ``1/√max(p, n)``.
      mu: initial penalty ``μ``; default from ``mu_rule``.
      mu_rule: ``"candes"``: ``μ = p·n/(4‖M‖₁)`` with the entrywise ℓ1 norm ``Σ_ij |M_ij|``; ``"code"``: the
        Robust-HDP code's ``μ = p·n/(4·max_j Σ_i |M_ij|)`` (max absolute column sum, ≈ n× larger, slower);
        ``"spectral"``: ``μ = 1.25/‖M‖₂`` (Lin et al. 2010; use with ``mu_growth > 1``, see the module notes).
      tol: stopping tolerance on ``‖M − L − S‖_F``; default ``DEFAULT_TOL[tol_mode]``.
      tol_mode: ``"relative"``: stop at ``tol·‖M‖_F``; ``"absolute"``: stop at ``tol``.
      max_iter: iteration cap (the code uses 10000). Check ``converged``: with the Candès μ and large p the
        cap is usually hit.
      mu_growth: ``ρ ≥ 1``; ``μ_{k+1} = min(ρ μ_k, μ_max)``. ``1`` is Alg. 3 (fixed μ).
      mu_max: cap on ``μ`` when ``ρ > 1``; default ``1e7·μ_0``.
      svd: ``"gram"`` (eigendecomposition of the ``n×n`` Gram matrix) or ``"direct"`` (``torch.linalg.svd``).
      check_every: test the stopping rule every ``k`` iterations (and at the cap): each test is one more pass
        over the matrix; ``k > 1`` may run up to ``k − 1`` iterations past the first one that met ``tol``.

    Returns:
      A :class:`PCPResult`. An all-zero ``M`` returns ``L = S = 0`` after 0 iterations.

    Raises:
      ConfigError: for invalid options.
      MessageError: (a ``ValueError``) if ``M`` is not a non-empty 2-D floating tensor with finite entries, or
        its Frobenius norm exceeds ``1e150`` (float64 only: ``M Mᵀ`` would overflow).

    Example:
      >>> g = torch.Generator().manual_seed(0)
      >>> low = torch.randn(200, 1, generator=g, dtype=torch.float64) @ torch.ones(1, 20, dtype=torch.float64)
      >>> sparse = torch.zeros(200, 20, dtype=torch.float64); sparse[3, 5] = 10.0
      >>> res = pcp(low + sparse)
      >>> res.converged, round(float(res.sparse[3, 5]), 3), res.rank
      (True, 10.0, 1)
    """
    check_pcp_options(lam=lam, mu=mu, mu_rule=mu_rule, tol=tol, tol_mode=tol_mode, max_iter=max_iter,
                      mu_growth=mu_growth, mu_max=mu_max, svd=svd, check_every=check_every)
    if M.ndim != 2 or M.numel() == 0 or not M.is_floating_point():
        raise MessageError(f"`M` must be a non-empty floating (p, n) matrix, found shape {tuple(M.shape)} and "
                         f"dtype {M.dtype}.")
    p, n = M.shape
    m = M.detach().t().to(torch.float64).contiguous()  # (n, p), no copy for x.T of a float64 x
    norm_f = float(torch.linalg.vector_norm(m))
    if not math.isfinite(norm_f):
        if not all_finite(m):
            raise MessageError("`M` has non-finite entries (inf or nan); PCP needs a finite matrix.")
        peak = m.abs().max()  # finite entries whose sum of squares overflowed: the norm for the message below
        norm_f = float(peak * torch.linalg.vector_norm(m / peak))
    if norm_f > _MAX_NORM:
        raise MessageError(f"`M` has Frobenius norm {norm_f:.3g} > {_MAX_NORM:.0e}: PCP forms M Mᵀ, whose entries "
                           "would overflow float64 (any float32 matrix is fine); rescale `M`.")
    lam_ = lam if lam is not None else 1.0 / math.sqrt(max(p, n))
    if norm_f == 0.0:
        zero = torch.zeros_like(m)
        return PCPResult(zero.t(), zero.clone().t(), 0, True, 0.0, float("inf") if mu is None else mu, lam_, 0)
    if mu is None:
        mu = _default_mu(m, mu_rule)
    mu_cap = mu_max if mu_max is not None else 1e7 * mu
    tol_ = tol if tol is not None else DEFAULT_TOL[tol_mode]
    threshold = tol_ * norm_f if tol_mode == "relative" else tol_

    # Buffers, all (n, p): z = Z_k = M + γ_k C_k (γ_k = μ_{k-1}/μ_k, C_0 = 0), then B = Z − L in place;
    # s = S_k; a = A = Z − S, then C_{k+1} = clamp(B); c = C_k. The residual needs no buffer of its own:
    # R_{k+1} = M − L − S = M − Z_k + C_{k+1} = C_{k+1} − γ_k C_k.
    z = m.clone()
    s = torch.zeros_like(m)
    a = torch.empty_like(m)
    c = torch.zeros_like(m)
    mu_k, gamma, err, rank, k, converged = mu, 1.0, float("inf"), 0, 0, False
    while k < max_iter:
        torch.sub(z, s, out=a)                              # A = Z − S
        proj, rank = _svt_operator(a, 1.0 / mu_k, svd)
        z.addmm_(proj, a, alpha=-1.0)                       # B = Z − SVT(A)
        thr = lam_ / mu_k
        torch.clamp(z, -thr, thr, out=a)                    # C_{k+1} = B − shrink(B) = Y_{k+1}/μ_k
        torch.sub(z, a, out=s)                              # S_{k+1} = shrink_{λ/μ}(B)
        k += 1
        if k % check_every == 0 or k == max_iter:
            c.mul_(-gamma).add_(a)                          # c ← R_{k+1} (C_k is not needed any more)
            err = float(torch.linalg.vector_norm(c))
            converged = err <= threshold
            if converged or k == max_iter:
                break
        mu_next = min(mu_k * mu_growth, mu_cap)
        gamma = mu_k / mu_next
        torch.add(m, a, alpha=gamma, out=z)                 # Z_{k+1} = M + Y_{k+1}/μ_{k+1}
        a, c = c, a
        mu_k = mu_next
    t = torch.sub(m, s, out=z)
    t.sub_(c)                                               # L = M − S − R
    return PCPResult(t.t(), s.t(), k, converged, err, mu, lam_, rank)
