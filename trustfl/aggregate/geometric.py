"""Geometric median (smoothed Weiszfeld) and the Gram-matrix helpers of the distance-based rules.

Every distance-based rule (geometric median, Krum, MDA, NNM, CAF) only needs inner products between messages, so it
computes the ``n×n`` Gram matrix once (``O(n²d)``, no ``(n, d)`` copy) and then works on float64 ``n×n``
matrices. The output is always a combination ``aᵀX`` of the rows, computed in the input dtype (by
:func:`~trustfl.aggregate.base.weighted_rows`, which cannot overflow for finite rows).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch

from trustfl.aggregate.base import AbstractAggregator, list_rows, normalized_weights, weighted_rows
from trustfl.core.checks import check_number
from trustfl.core.finite import all_finite
from trustfl.core.memory import refuse_beyond_free
from trustfl.core.registry import register
from trustfl.errors import MessageError
from trustfl.types import RoundContext, StageOut

_CHUNK_ELEMENTS = 1 << 20  # ≈ 4–8 MB per chunk: stays in cache, big enough for an efficient GEMM
# Distances read off K lose about 15ε/resolution of their relative precision (measured at n = 100, d = 431,080):
# at resolution ≥ 1e-2 that is ≤ 2e-4 for float32 products and ≤ 4e-13 for float64 ones.
_MIN_RESOLUTION = 1e-2
# Largest squared norm accepted in the float64 Gram matrix: distances, Krum scores (sums of n distances) and CAF's
# centred products stay far below the float64 maximum (1.8e308). Float32 values give at most 1.2e77·d.
_MAX_SQUARED_NORM = 1e290
GRAM_BYTES = 3 * 8
"""Bytes per pair of rows a Gram pass holds at once (three ``n × n`` float64 matrices: the product, its float64
copy, the distances made from it). A cohort whose Gram matrices would not fit in the free memory is refused before
the product (a MemoryError); ``engine.chunking.check_cohort_fits`` refuses it when the run is built."""


class Gram(NamedTuple):
    """The Gram matrix of the messages shifted by a centre ``c``, the optional projection computed with it, and
    its rounding-error scale."""

    matrix: torch.Tensor
    """``K = (X − 1cᵀ)(X − 1cᵀ)ᵀ`` of shape ``(n, n)``, float64."""
    projection: torch.Tensor | None
    """``(X − 1cᵀ) @ project`` (float64), or ``None``."""
    tolerance: float
    """Rounding-error scale of sums of up to ``n`` squared distances read off ``K`` among the majority of the
    messages (it scales with the median squared norm): scores closer than this are ties (e.g. the equal Krum scores
    of a symmetric configuration)."""


def _gram_pass(x: torch.Tensor, project: torch.Tensor | None, dtype: torch.dtype, center: int | None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One pass streamed over column chunks (no ``(n, d)`` copy): ``K = (X − 1cᵀ)(X − 1cᵀ)ᵀ`` with ``c`` the
    column mean (``center=None``), row ``center``, or 0 (``center=-1``), products in ``dtype``, accumulated in
    float64."""
    n, d = x.shape
    chunk = max(1024, min(65536, _CHUNK_ELEMENTS // max(n, 1)))
    gram = torch.zeros(n, n, dtype=torch.float64, device=x.device)
    proj = None
    if project is not None:
        proj = torch.zeros((n,) + tuple(project.shape[1:]), dtype=torch.float64, device=x.device)
    for start in range(0, d, chunk):
        block = x[:, start:start + chunk].to(dtype)
        # The column mean is taken in float64 and rounded once, so equal rows centre to exact zeros. The
        # subtraction makes a fresh block: the input is never modified.
        if center == -1:
            centred = block
        else:
            ref = block.mean(dim=0, dtype=torch.float64).to(dtype) if center is None else block[center]
            centred = block - ref
        if dtype == torch.float64:
            gram.addmm_(centred, centred.T)
        else:
            gram += (centred @ centred.T).to(torch.float64)
        if proj is not None:
            proj += (centred @ project[start:start + chunk].to(dtype)).to(torch.float64)
    return gram, proj


def _resolution(gram: torch.Tensor) -> float:
    """Median over rows of ``min_j D_ij / (K_ii + K_jj)``: the typical nearest-neighbour distance as a share of
    the squared norms the products were formed from (1 for isotropic noise, small when a common offset dominates)."""
    n = gram.shape[0]
    if n < 2:
        return math.inf
    diag = gram.diagonal()
    dist = squared_distances(gram).fill_diagonal_(math.inf)
    nearest, idx = dist.min(dim=1)
    scale = diag + diag[idx]
    ratio = torch.where(scale > 0, nearest / scale.clamp_min(1e-300), torch.full_like(scale, math.inf))
    return float(ratio.median())


def gram_matrix(x: torch.Tensor, project: torch.Tensor | None = None) -> Gram:
    """Float64 Gram matrix of the messages, shifted by a centre chosen for accuracy.

    Distances ``‖x_i − x_j‖² = K_ii + K_jj − 2K_ij`` and weighted centred covariances do not depend on the
    centre ``c`` of ``K = (X − 1cᵀ)(X − 1cᵀ)ᵀ``, but rounding does, so the centre is picked by need:

    1. ``c = 0``: one GEMM ``XXᵀ`` in float32 (float64 for float64 messages), the fastest route. Kept when the
       typical nearest-neighbour distance is at least 1% of the squared norms (noisy or spread-out messages):
       distances are then within ≈2e-4 (float32) or ≈4e-13 (float64) relative error. If a float32 product
       overflows (norms above ≈1.8e19, e.g. a Byzantine message of float32-maximum entries), the products are
       formed in float64 instead, where float32 values cannot overflow.
    2. Otherwise (a common offset much larger than the spread) ``c = x̄``, streamed over column chunks, products in
       the same precision, accumulated in float64.
    3. If a few huge messages drag ``x̄`` far from everyone (still below 1%), ``c`` = the medoid row (smallest
       median distance: a majority member), then, for float32 messages, once more in float64 if needed.

    The tolerance is ``32·n·ε·median_i K_ii``: the rounding error of the distances among the majority of the
    messages, which is where ties are decided; a few huge messages do not widen it (their own scores are far
    from the ties anyway).

    Cost ``O(n²d)`` per pass (one pass in the usual case); passes 2–3 need only ``O(n·chunk)`` extra memory.

    Args:
      x: messages, shape ``(n, d)``, any floating dtype, finite.
      project: optional ``(d,)`` or ``(d, p)`` float64 matrix; if given, ``(X − 1cᵀ) @ project`` is computed with
        ``K`` (for CAF's power method).

    Returns:
      A :class:`Gram` ``(matrix, projection, tolerance)``.

    Raises:
      MessageError: if a squared norm exceeds ``1e290`` (float64 messages of norm above ``1e145``: their
        distances would overflow float64). Values in the float32 range are always accepted.
    """
    refuse_beyond_free(GRAM_BYTES * x.shape[0] ** 2, x.device)  # n² grows past the messages' n·d at large n
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    xs = x.to(dtype)
    gram = (xs @ xs.T).to(torch.float64)
    proj = None if project is None else (xs @ project.to(dtype)).to(torch.float64)
    if dtype != torch.float64 and not _finite(gram, proj):  # float32 products overflowed: redo them in float64
        gram, proj, dtype = _safe_pass(x, project, torch.float64, -1)
    _check_range(gram, x)
    if _resolution(gram) < _MIN_RESOLUTION:
        gram, proj, dtype = _safe_pass(x, project, dtype, None)
        if _resolution(gram) < _MIN_RESOLUTION:
            medoid = int(squared_distances(gram).median(dim=1).values.argmin())
            gram, proj, dtype = _safe_pass(x, project, dtype, medoid)
            if dtype != torch.float64 and _resolution(gram) < _MIN_RESOLUTION:
                gram, proj, dtype = _safe_pass(x, project, torch.float64, medoid)
    eps = torch.finfo(dtype).eps
    n = gram.shape[0]
    scale = float(gram.diagonal().median()) if n else 0.0
    return Gram(gram, proj, 32.0 * n * eps * scale)


def _safe_pass(x: torch.Tensor, project: torch.Tensor | None, dtype: torch.dtype, center: int | None
               ) -> tuple[torch.Tensor, torch.Tensor | None, torch.dtype]:
    """:func:`_gram_pass`, redone with float64 products if float32 ones overflowed; also returns the dtype used."""
    gram, proj = _gram_pass(x, project, dtype, center)
    if dtype != torch.float64 and not _finite(gram, proj):
        dtype = torch.float64
        gram, proj = _gram_pass(x, project, dtype, center)
    return gram, proj, dtype


def _finite(gram: torch.Tensor, proj: torch.Tensor | None) -> bool:
    return all_finite(gram) and (proj is None or all_finite(proj))


def _check_range(gram: torch.Tensor, x: torch.Tensor) -> None:
    """Raise :class:`MessageError` if squared norms are too large for float64 distances (float64 messages only)."""
    diag = gram.diagonal()
    bad = ~(diag <= _MAX_SQUARED_NORM)
    if bool(bad.any()):
        raise MessageError(f"rows {list_rows(torch.nonzero(bad).flatten())} have norms above "
                           f"{math.sqrt(_MAX_SQUARED_NORM):.0e}: their squared distances do not fit in float64 "
                           f"({x.dtype} messages); distance-based rules need smaller messages (any float32 value "
                           f"is fine).")


def squared_distances(gram: torch.Tensor) -> torch.Tensor:
    """Pairwise squared distances ``D_ij = K_ii + K_jj − 2K_ij`` (clamped at 0, zero diagonal) from a Gram matrix."""
    diag = gram.diagonal()
    dist = (diag[:, None] + diag[None, :] - 2.0 * gram).clamp_min_(0.0)
    dist.fill_diagonal_(0.0)
    return dist


def _weighted_median(values: torch.Tensor, w: torch.Tensor) -> float:
    """The smallest value whose cumulative weight (values sorted) reaches half the total weight."""
    order = values.argsort()
    cum = w[order].cumsum(0)
    return float(values[order][int(torch.searchsorted(cum, 0.5 * cum[-1]))])


@register("aggregator", "geometric_median")
@dataclass(frozen=True)
class GeometricMedian(AbstractAggregator):
    """Geometric median ``argmin_z Σ_i w_i ‖z − x_i‖₂`` by the smoothed Weiszfeld algorithm, run to a tolerance.

    Starting from the weighted mean ``z_0 = Σ_i w_i x_i``, iterate (Pillutla et al. 2022, Alg. 3; Chen et al. 2017)::

        β_i = w_i / max(ν, ‖z_t − x_i‖),    z_{t+1} = Σ_i β_i x_i / Σ_i β_i

    until ``‖z_{t+1} − z_t‖ ≤ tol · max(ν, med_w ‖z_t − x_i‖)`` or ``max_iter`` steps, with ``med_w`` the
    ``w``-weighted median of the distances: a scale that far outliers cannot inflate (a tolerance relative to the
    objective ``Σ_i w_i ‖z_t − x_i‖`` would let a message of norm R stop the loop ``≈ tol·R`` from the median).
    Every iterate is a convex combination ``z = Xᵀa``, so the loop runs on the float64 Gram matrix:
    ``‖x_i − z‖² = K_ii − 2(Ka)_i + aᵀKa``.
    ``ctx.weights`` (uniform when absent) are the ``w_i``. Metrics: ``iterations``, ``converged`` (1.0 or 0.0).

    Cost: ``O(n²d)`` for the Gram matrix, ``O(n²)`` per iteration, ``O(nd)`` for the output.

    Args:
      nu: smoothing ``ν > 0``; distances below it count as ``ν`` (avoids dividing by zero at a data point).
      tol: relative step tolerance ``> 0``.
      max_iter: iteration cap ``>= 1``.

    References:
      Pillutla, Kakade, Harchaoui, "Robust Aggregation for Federated Learning", https://arxiv.org/abs/1912.13445.
      Chen, Su, Xu, "Distributed Statistical Machine Learning in Adversarial Settings",
      https://arxiv.org/abs/1705.05491.

    Example:
      >>> import torch
      >>> x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [100.0, 100.0]])
      >>> z = GeometricMedian()(x)
      >>> bool(z.norm() < 1.0)
      True
    """

    pairwise: ClassVar[bool] = True

    nu: float = 1e-6
    tol: float = 1e-8
    max_iter: int = 1000

    def __post_init__(self) -> None:
        check_number("nu", self.nu, low=0, low_open=True, finite=True)
        check_number("tol", self.tol, low=0, low_open=True)
        check_number("max_iter", self.max_iter, integer=True, low=1)

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        n = x.shape[0]
        w = normalized_weights(ctx, n, x).to(torch.float64)
        gram = gram_matrix(x).matrix
        diag = gram.diagonal()
        a = w.clone()
        converged = False
        iterations = 0
        for iterations in range(1, self.max_iter + 1):
            ka = gram @ a
            dist = (diag - 2.0 * ka + a @ ka).clamp_min(0.0).sqrt()
            beta = w / dist.clamp_min(self.nu)
            a_next = beta / beta.sum()
            step_vec = a_next - a
            step = float((step_vec @ gram @ step_vec).clamp_min(0.0).sqrt())
            a = a_next
            if step <= self.tol * max(_weighted_median(dist, w), self.nu):
                converged = True
                break
        out = weighted_rows(a, x)
        return StageOut(out, state, {"iterations": float(iterations), "converged": float(converged)})
