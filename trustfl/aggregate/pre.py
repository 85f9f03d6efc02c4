"""Pre-aggregators ``(n, d) -> (m, d)`` that wrap any rule: NNM, bucketing, static clipping and ARC.

Use them through :class:`~trustfl.aggregate.base.PreAggregated`, e.g.
``PreAggregated((NNM(f=2),), CoordinateWiseTrimmedMean(f=2))``. None of them modifies its input; all are
permutation-equivariant (bucketing in the sense that the multiset of bucket means does not depend on the row order).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from trustfl.aggregate.base import AbstractPreAggregator, mean_rows, require_f, weighted_rows
from trustfl.aggregate.coordinate import USABLE, smallest_weights
from trustfl.aggregate.geometric import gram_matrix, squared_distances
from trustfl.core.checks import check_number
from trustfl.core.finite import all_finite
from trustfl.core.norms import row_norms
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.types import RoundContext, StageOut


def _scale_rows(x: torch.Tensor, scale: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """``x_i · scale_i``; returns ``x`` itself (no copy) when every scale is 1. ``in_place``: scale only the rows
    whose scale is not 1, in ``x`` itself (for callers that own ``x`` and want no ``(n, d)`` output buffer)."""
    if bool((scale == 1).all()):
        return x
    if in_place:
        rows = torch.nonzero(scale != 1).flatten()
        if 2 * rows.numel() > x.shape[0]:  # most rows: one multiply over the matrix beats gathering them
            return x.mul_(scale.to(x.dtype)[:, None])
        return x.index_copy_(0, rows, x.index_select(0, rows).mul_(scale[rows].to(x.dtype)[:, None]))
    return x * scale.to(x.dtype)[:, None]


def _check_in_place(value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"`in_place` must be true or false, found {value!r}.")


@register("pre_aggregator", "nnm")
@dataclass(frozen=True)
class NNM(AbstractPreAggregator):
    """Nearest-neighbour mixing (Allouah et al. 2023, Alg. 1): replace each message by the mean of its ``n − f``
    nearest messages (itself included)::

        y_i = (1/(n − f)) Σ_{j ∈ N_i} x_j,   N_i = the n − f indices j with the smallest ‖x_i − x_j‖

    Neighbours tied at the boundary distance share the remaining slots. Rows keep their clients (weights are kept).
    Requires ``n > f``. Cost: ``O(n²d)`` (float64 Gram matrix, then one ``n×n`` by ``n×d`` product).

    Args:
      f: the Byzantine bound.

    References:
      Allouah, Farhadkhani, Guerraoui, Gupta, Pinot, Stephan, "Fixing by Mixing: A Recipe for Optimal Byzantine ML
      under Heterogeneity", AISTATS 2023, https://arxiv.org/abs/2302.01772.

    Example:
      >>> import torch
      >>> NNM(f=1)(torch.tensor([[0.0], [1.0], [10.0]])).tolist()
      [[0.5], [0.5], [5.5]]
    """

    pairwise: ClassVar[bool] = True

    f: int

    def __post_init__(self) -> None:
        require_f(self.f)

    def min_messages(self) -> int:
        return self.f + 1  # n > f

    def rows_out(self, n: int) -> int:
        return n

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        n = x.shape[0]
        if n < self.min_messages():
            raise ConfigError(f"nnm needs n > f, found f={self.f} and n={n} usable messages ({USABLE}); lower `f`.")
        if self.f == 0:
            return StageOut(mean_rows(x)[None].expand(n, -1).clone(), state)
        k = n - self.f
        gram = gram_matrix(x)
        dist = squared_distances(gram.matrix)
        threshold = dist.kthvalue(k, dim=1, keepdim=True).values
        # dist is symmetric, so column i holds i's distances: select along dim 0, then row i = i's neighbours
        mixing = smallest_weights(dist, k, threshold.T, gram.tolerance).T / k
        return StageOut(weighted_rows(mixing, x), state)


@register("pre_aggregator", "bucketing")
@dataclass(frozen=True)
class Bucketing(AbstractPreAggregator):
    """Bucketing (Karimireddy et al. 2022, Alg. 1): shuffle the messages, split them into ``⌈n/s⌉`` buckets of
    ``s`` (the last one smaller when ``s`` does not divide ``n``) and return the bucket means, shape ``(⌈n/s⌉, d)``.

    The shuffle comes from ``ctx.generator("bucketing")``. It is applied to the messages in a canonical order
    (sorted by their projection on a random Gaussian direction from the same generator), so the bucket means
    depend on the set of messages and the seed, not on the row order. Rows no longer belong to clients, so
    :class:`PreAggregated` passes uniform weights on. Cost: ``O(nd)``.

    Args:
      bucket_size: ``s >= 1`` (``s = 1`` returns the messages unchanged: shuffling singletons changes nothing
        for an order-free rule, and keeping the order keeps the client weights aligned).

    References:
      Karimireddy, He, Jaggi, "Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing", ICLR 2022,
      https://arxiv.org/abs/2006.09365.

    Example:
      >>> import torch
      >>> Bucketing(bucket_size=2)(torch.tensor([[1.0], [1.0], [3.0], [3.0]])).shape
      torch.Size([2, 1])
    """

    bucket_size: int

    def __post_init__(self) -> None:
        check_number("bucket_size", self.bucket_size, integer=True, low=1)

    def rows_out(self, n: int) -> int:
        return -(-n // self.bucket_size)

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        n, d = x.shape
        if self.bucket_size == 1:  # singleton buckets: the same multiset; keep the rows aligned with their weights
            return StageOut(x, state)
        gen = ctx.generator("bucketing")
        key_dtype = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
        # The direction and the shuffle are drawn on the CPU (the server's small host-side draws), so the buckets
        # are the same on every device; the keys and the sums are computed on the messages' device.
        direction = torch.randn(d, generator=gen, dtype=key_dtype).to(x.device)
        key = x.to(key_dtype) @ direction
        bad = ~torch.isfinite(key)
        if key_dtype != torch.float64 and bool(bad.any()):  # float32 overflow: those keys in float64
            key = key.to(torch.float64)
            key[bad] = x[bad].to(torch.float64) @ direction.to(torch.float64)
        canonical = key.argsort(stable=True).cpu()
        order = canonical[torch.randperm(n, generator=gen)]
        buckets = math.ceil(n / self.bucket_size)
        assign = torch.empty(n, dtype=torch.long)
        assign[order] = torch.arange(n) // self.bucket_size  # row order[p] goes to bucket p // s
        assign = assign.to(x.device)
        sizes = torch.bincount(assign, minlength=buckets).to(x.dtype)
        # Segment sums in one O(nd) pass (a dense buckets×n mixing GEMM would cost O(n²d/s)).
        sums = torch.zeros(buckets, d, dtype=x.dtype, device=x.device).index_add_(0, assign, x)
        means = sums.div_(sizes[:, None])
        if not all_finite(means):  # a sum overflowed: divide first (each term <= max/s)
            means = torch.zeros(buckets, d, dtype=x.dtype, device=x.device).index_add_(0, assign,
                                                                                     x / sizes[assign][:, None])
        return StageOut(means, state)


@register("pre_aggregator", "static_clip")
@dataclass(frozen=True)
class StaticClip(AbstractPreAggregator):
    """Static clipping: ``x_i · min(1, C/‖x_i‖₂)`` for every message. Metric ``clipped`` (count).

    Cost: ``O(nd)`` (one pass for the norms, one for the scaling; no copy if nothing is clipped).

    Args:
      max_norm: the clipping norm ``C > 0``.
      in_place: scale the clipped rows in the input itself instead of returning a new matrix (off by default:
        stages never modify their input; for a caller that owns the messages and wants no extra ``(n, d)``).

    Example:
      >>> import torch
      >>> StaticClip(max_norm=1.0)(torch.tensor([[3.0, 4.0], [0.3, 0.4]])).tolist()
      [[0.6000000238418579, 0.800000011920929], [0.30000001192092896, 0.4000000059604645]]
    """

    max_norm: float
    in_place: bool = False

    def __post_init__(self) -> None:
        check_number("max_norm", self.max_norm, low=0, low_open=True, finite=True)
        _check_in_place(self.in_place)

    def rows_out(self, n: int) -> int:
        return n

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        norms = row_norms(x)
        scale = (self.max_norm / norms.clamp_min(self.max_norm)).where(norms > self.max_norm, 1.0)
        return StageOut(_scale_rows(x, scale, self.in_place), state,
                        {"clipped": float((norms > self.max_norm).sum())})


@register("pre_aggregator", "arc")
@dataclass(frozen=True)
class ARC(AbstractPreAggregator):
    """Adaptive robust clipping (Allouah et al. 2024, Alg. 1): clip the ``k = ⌊2(f/n)(n − f)⌋`` largest messages
    to the norm of the ``(k+1)``-th largest::

        C = ‖x_{π(k+1)}‖ (π sorts the norms in decreasing order),   y_i = x_i · min(1, C/‖x_i‖)

    ``k = 0`` (e.g. ``f = 0``) leaves the messages unchanged. Metrics: ``threshold`` (``C``), ``clipped``.
    Requires ``n > f``. Cost: ``O(nd)``.

    Args:
      f: the Byzantine bound.
      in_place: as for :class:`StaticClip`.

    References:
      Allouah, Guerraoui, Gupta, Jellouli, Rizk, Stephan, "Adaptive Gradient Clipping for Robust Federated
      Learning", ICLR 2025, https://arxiv.org/abs/2405.14432.

    Example:
      >>> import torch
      >>> ARC(f=1)(torch.tensor([[1.0], [2.0], [3.0], [100.0]])).tolist()
      [[1.0], [2.0], [3.0], [3.0]]
    """

    f: int
    in_place: bool = False

    def __post_init__(self) -> None:
        require_f(self.f)
        _check_in_place(self.in_place)

    def min_messages(self) -> int:
        return self.f + 1  # n > f

    def rows_out(self, n: int) -> int:
        return n

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        n = x.shape[0]
        if n < self.min_messages():
            raise ConfigError(f"arc needs n > f, found f={self.f} and n={n} usable messages ({USABLE}); lower `f`.")
        k = (2 * self.f * (n - self.f)) // n
        if k == 0:
            return StageOut(x, state, {"clipped": 0.0})
        norms = row_norms(x)
        threshold = norms.sort(descending=True).values[k]
        over = norms > threshold
        scale = (threshold / norms.clamp_min(threshold)).where(over, 1.0)
        return StageOut(_scale_rows(x, scale, self.in_place), state,
                        {"threshold": float(threshold), "clipped": float(over.sum())})
