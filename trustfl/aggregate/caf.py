"""CAF, the Covariance-bound-Agnostic Filter (Allouah, Guerraoui, Stephan 2025, Algorithm 2), on the Gram matrix.

Algorithm 2 only ever needs inner products between centred messages, so it runs exactly on the ``n×n`` Gram matrix
``K = XXᵀ`` (docs/papers/cafcor.md, "Choices"): for weights ``w = c/Σc`` the centred Gram matrix is
``K_c = K − Kw1ᵀ − 1(Kw)ᵀ + (wᵀKw)11ᵀ`` and ``G = diag(√w) K_c diag(√w)`` has the nonzero spectrum of the weighted
covariance ``Σ̂_c``. With ``(λ, u)`` its top eigenpair, ``σ̂_c² = λ`` and ``⟨x_i − μ̂_c, v̂_c⟩ = (K_c(√w ⊙ u))_i / √λ``.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Iterator, Literal

import torch

from trustfl.aggregate.base import AbstractAggregator, mean_rows, require_f, weighted_rows
from trustfl.aggregate.coordinate import check_n_vs_f
from trustfl.aggregate.geometric import gram_matrix
from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.errors import ConfigError, MessageError
from trustfl.types import RoundContext, StageOut


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Run the ``n×n`` phase on one thread. Right after the big Gram GEMM the OpenMP workers are still spinning,
    and a threaded ``eigh`` of a 100×100 matrix then took ~0.8 s on a busy 2-core machine (1.5 ms serial)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _top_eigen_exact(kc: torch.Tensor, w: torch.Tensor) -> tuple[float, torch.Tensor]:
    """``(λ_max(Σ̂_c), a)`` with the top unit eigenvector ``v = Σ_j a_j (x_j − μ̂_c)``, from ``eigh`` of ``G``."""
    root = w.sqrt()
    try:
        evals, evecs = torch.linalg.eigh(root[:, None] * kc * root[None, :])
    except torch.linalg.LinAlgError as exc:  # LAPACK did not converge (e.g. NaN from inf − inf on unscreened rows)
        raise MessageError(f"caf: the eigendecomposition of the {w.numel()}×{w.numel()} covariance Gram matrix "
                           f"failed ({exc}); check that the messages are finite, or use method='power'.") from exc
    lam = float(evals[-1])
    if not lam > 0:
        return lam, torch.zeros_like(w)
    return lam, root * evecs[:, -1] / math.sqrt(lam)


def _top_eigen_power(kc: torch.Tensor, w: torch.Tensor, start: torch.Tensor, iters: int, tol: float
                     ) -> tuple[float, torch.Tensor, int]:
    """Power method on ``Σ̂_c`` from the start vector ``g`` (``start = (X − 1μ̂ᵀ)g``), in the coordinates
    ``v = Σ_j a_j (x_j − μ̂_c)``: ``Σ̂_c v`` has coordinates ``w ⊙ (K_c a)``, ``‖v‖² = aᵀK_c a``. Exactly the
    matrix-free ``d``-dimensional iteration ``v ← Σ̂_c v/‖Σ̂_c v‖``, at ``O(n²)`` per step."""
    a = w * start  # coordinates of Σ̂_c g
    lam, prev, steps = 0.0, None, 0
    for steps in range(1, iters + 1):
        ka = kc @ a
        norm2 = float(a @ ka)
        if not norm2 > 0:
            return 0.0, torch.zeros_like(w), steps
        a = a / math.sqrt(norm2)
        ka = ka / math.sqrt(norm2)
        lam = float(ka @ (w * ka))  # Rayleigh quotient vᵀΣ̂_c v with ‖v‖ = 1
        if prev is not None and abs(lam - prev) <= tol * lam:
            break
        prev = lam
        a = w * ka
    return lam, a, steps


@register("aggregator", "caf")
@dataclass(frozen=True)
class CAF(AbstractAggregator):
    """CAF (Allouah et al. 2025, Algorithm 2) with three safeguards, computed exactly on the Gram matrix::

        c = 1,  μ* = mean(x),  σ* = +∞
        while Σ_i c_i > n − 2f and iterations < max_iter:
            μ̂ = Σ c_i x_i / Σ c_i,   Σ̂ = Σ c_i (x_i − μ̂)(x_i − μ̂)ᵀ / Σ c_i,   (σ̂², v̂) = top eigenpair of Σ̂
            if σ̂ ≤ σ*:  μ*, σ* = μ̂, σ̂
            τ_i = ⟨v̂, x_i − μ̂⟩²;   stop if σ̂ = 0 or max_{j: c_j > 0} τ_j = 0
            c_i ← max(0, c_i (1 − τ_i / max_{j: c_j > 0} τ_j))
        return μ*

    Safeguards: the max is over still-weighted points (an already-removed far outlier cannot stall the filter),
    weights are clipped at 0, and the loop is capped. ``f = 0`` gives the mean (the loop never runs); so does a
    loop that stops after one pass (logged, not "fixed": that is the literal algorithm). ``ctx.weights`` are
    ignored (the algorithm has no weighted form).

    With ``method="power"`` the top eigenpair is found by the power method instead of ``eigh`` (the paper's
    experimental variant): one start vector ``g ~ N(0, I_d)`` per call from ``ctx.generator("caf")``, at most
    ``power_iters`` steps per CAF iteration, stopping when the eigenvalue estimate changes by ≤ ``power_tol``
    relatively. It runs in Gram coordinates, i.e. it is the usual matrix-free iteration at ``O(n²)`` per step.

    Metrics: ``iterations`` (filter passes), ``best_iteration`` (the pass whose mean is returned), ``sigma2``
    (``σ*²``) and, for the power method, ``power_steps`` (total).

    Cost: ``O(n²d)`` for the Gram matrix (plus ``O(nd)`` for the power start), ``O(n³)`` per pass (``O(n²)``
    per power step), at most ``max_iter`` passes (≈ 2f in practice), and ``O(nd)`` for the output.

    Guarantee (Prop. 4.1, exact variant): for every ``S`` with ``|S| = n − f``,
    ``‖CAF(x) − x̄_S‖² ≤ κ λ_max(Σ_S)`` with ``κ = (6f/(n−f))(1 + f/(n−2f))²``.

    Args:
      f: the Byzantine bound, ``n > 2f`` at apply time.
      method: ``"gram"`` (exact, ``eigh`` of the ``n×n`` matrix ``G``) or ``"power"`` (seeded power method).
      max_iter: cap on filter passes; ``None`` means ``n`` (each pass zeroes at least one weight, so ``n`` is
        never binding in exact arithmetic).
      power_iters: power-method steps per pass, ``>= 1``.
      power_tol: relative tolerance of the power method, ``>= 0``.

    Raises:
      ConfigError: at ``apply`` when ``n <= 2f``.
      MessageError: if ``eigh`` fails to converge (only seen on non-finite input, which the engine screens).

    References:
      Allouah, Guerraoui, Stephan, "Towards Trustworthy Federated Learning with Untrusted Participants", ICML 2025.
      Diakonikolas, Kamath, Kane, Li, Moitra, Stewart, "Being Robust (in High Dimensions) Can Be Practical",
      https://arxiv.org/abs/1703.00893.

    Example:
      >>> import torch
      >>> x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [50.0, 50.0]])
      >>> [round(v, 2) for v in CAF(f=1)(x).tolist()]  # the outlier's weight drops to 0 in the first pass
      [0.5, 0.5]
    """

    pairwise: ClassVar[bool] = True

    f: int
    method: Literal["gram", "power"] = "gram"
    max_iter: int | None = None
    power_iters: int = 50
    power_tol: float = 1e-6

    def __post_init__(self) -> None:
        require_f(self.f)
        if self.method not in ("gram", "power"):
            raise ConfigError(f"`method` must be 'gram' or 'power', found {self.method!r}.")
        check_number("max_iter", self.max_iter, integer=True, low=1, allow_none=True, note="n")
        check_number("power_iters", self.power_iters, integer=True, low=1)
        check_number("power_tol", self.power_tol, low=0)

    def min_messages(self) -> int:
        return 2 * self.f + 1  # n > 2f

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        n, d = x.shape
        check_n_vs_f(n, self.f, "caf (n > 2f)", self.min_messages())
        if self.f == 0:
            return StageOut(mean_rows(x), state, {"iterations": 0.0, "best_iteration": 0.0})
        project = None
        if self.method == "power":  # drawn on the CPU, so a run on any device starts from the same vector
            project = torch.randn(d, generator=ctx.generator("caf"), dtype=torch.float64).to(x.device)
        gram, start, _ = gram_matrix(x, project)  # the O(n²d) products on the messages' device
        # The n×n iteration below reads a scalar every step (and LAPACK's eigh): it runs on the CPU, where the
        # small matrix costs nothing to move; only the weights go back to the messages' device.
        gram = gram.cpu()
        start = None if start is None else start.cpu()
        c = torch.ones(n, dtype=torch.float64)
        best_w, best_lam, best_it = c / n, math.inf, 0
        cap = n if self.max_iter is None else self.max_iter
        it = power_steps = 0
        with _one_thread():
            while float(c.sum()) > n - 2 * self.f and it < cap:
                it += 1
                w = c / c.sum()
                kw = gram @ w
                kc = gram - kw[:, None] - kw[None, :] + w @ kw
                if start is None:
                    lam, a = _top_eigen_exact(kc, w)
                else:
                    lam, a, steps = _top_eigen_power(kc, w, start - w @ start, self.power_iters, self.power_tol)
                    power_steps += steps
                if lam <= best_lam:  # σ̂_c ≤ σ*: keep the weighted mean with the smallest top eigenvalue
                    best_w, best_lam, best_it = w, lam, it
                if not lam > 0:
                    break
                tau = (kc @ a).square()
                tau_max = float(tau[c > 0].max())
                if not tau_max > 0:
                    break
                c = (c * (1.0 - tau / tau_max)).clamp_min_(0.0)
        metrics = {"iterations": float(it), "best_iteration": float(best_it), "sigma2": max(best_lam, 0.0)}
        if self.method == "power":
            metrics["power_steps"] = float(power_steps)
        return StageOut(weighted_rows(best_w.to(x.device), x), state, metrics)
