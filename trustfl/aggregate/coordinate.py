"""Coordinate-wise robust rules: trimmed mean (CWTM), median (CWMed) and mean around the median (Meamed).

Each coordinate is treated on its own: for every column of the ``(n, d)`` message matrix these rules select some of
its ``n`` values. Selection uses NumPy's introselect (``numpy.partition``, expected ``O(n)`` per column) on a
zero-copy view of the tensor: torch has no partial sort, and ``torch.sort``/``torch.kthvalue``/``torch.topk`` along
dim 0 were 1.5–3× slower on this 2-core machine at ``n = 100``. The rules have no weighted form and ignore
``ctx.weights``. Finite values up to the dtype's maximum never overflow: a mean whose sum overflows is recomputed by
:func:`~trustfl.aggregate.base.rescaled` (in float64, or rescaled by a power of two for float64 messages).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from trustfl.aggregate.base import AbstractAggregator, mean_rows, require_f, rescaled
from trustfl.core.finite import all_finite
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.types import RoundContext, StageOut


SORT_MAX_ROWS = 32
"""``partition`` sorts (``torch.sort``) matrices with at most this many rows and selects (NumPy) above."""


def partition(x: torch.Tensor, kth: Sequence[int]) -> torch.Tensor:
    """A copy of ``x`` partially sorted along dim 0: row ``k`` holds each column's ``(k+1)``-th smallest value
    for every ``k`` in ``kth``, smaller values above it and larger below (``numpy.partition``; NaN sorts last).

    Up to ``SORT_MAX_ROWS`` rows a full ``torch.sort`` along dim 0 is faster than NumPy's strided introselect
    (benchmarks/aggregators.py: n = 15, d = 1e6: 0.24 s vs 0.33 s); above, introselect wins (n = 100: 2.0 vs 2.6 s).
    A sorted copy is also a valid partition."""
    if x.shape[0] <= SORT_MAX_ROWS:
        return torch.sort(x.detach(), dim=0).values
    if x.dtype == torch.bfloat16:  # NumPy has no bfloat16; float32 holds every bfloat16 value exactly
        return partition(x.float(), kth).to(torch.bfloat16)
    arr = np.partition(x.detach().cpu().numpy(), list(kth), axis=0)
    return torch.from_numpy(arr).to(x.device)


def smallest_weights(scores: torch.Tensor, k: int, threshold: torch.Tensor, atol: float = 0.0) -> torch.Tensor:
    """Selection weights of the ``k`` smallest scores along dim 0, sharing ties at the boundary.

    With ``t`` the ``k``-th smallest score (``threshold``, broadcast along dim 0): weight 1 where
    ``score < t − atol``; where ``|score − t| <= atol`` (a tie, up to the scores' rounding error ``atol``) the
    remaining ``k − #{score < t − atol}`` units are split equally. Each column's weights sum to ``k``, and they do
    not depend on the order of the rows (permutation-equivariant), unlike an index-based top-k.
    """
    below = scores < threshold - atol
    tied = (scores - threshold).abs() <= atol if atol > 0 else scores == threshold
    # the share in the scores' dtype: an integer division gives float32, which float64 weights would carry
    share = (k - below.sum(dim=0)).to(scores.dtype) / tied.sum(dim=0).clamp_min(1).to(scores.dtype)
    return below.to(scores.dtype) + tied.to(scores.dtype) * share


USABLE = ("every message a rule receives is usable: non-finite or misshapen messages are rejected before it, by "
          "the engine's screening (its `rejected` metric) or with a MessageError on a direct call")
"""Why a rule-size error counts every row it received as usable (part of the message of those errors)."""


def check_n_vs_f(n: int, f: int, rule: str, minimum: int) -> None:
    """Raise :class:`ConfigError` unless ``n >= minimum`` (a rule's requirement such as ``n > 2f``)."""
    if n < minimum:
        raise ConfigError(f"{rule} needs at least {minimum} messages for f={f}, found n={n} usable messages "
                          f"({USABLE}); lower `f` or aggregate more clients.")


@register("aggregator", "cwtm")
@dataclass(frozen=True)
class CoordinateWiseTrimmedMean(AbstractAggregator):
    """Coordinate-wise trimmed mean (Yin et al. 2018, Def. 2): per coordinate, drop the ``f`` smallest and ``f``
    largest values and average the ``n − 2f`` others::

        CWTM(x)_k = (1/(n − 2f)) Σ_{r=f+1}^{n−f} x_{(r),k}     (x_{(r),k}: r-th smallest value of coordinate k)

    ``f = 0`` gives the mean. Requires ``n > 2f``. Ties need no rule (equal values). Cost: expected ``O(nd)`` time
    (introselect) and one ``(n, d)`` copy.

    Args:
      f: number of values trimmed at each end of every coordinate (the Byzantine bound).

    References:
      Yin, Chen, Ramchandran, Bartlett, "Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates",
      https://arxiv.org/abs/1803.01498.

    Example:
      >>> import torch
      >>> CoordinateWiseTrimmedMean(f=1)(torch.tensor([[0.0], [1.0], [2.0], [100.0]])).tolist()
      [1.5]
    """

    f: int

    def __post_init__(self) -> None:
        require_f(self.f)

    def min_messages(self) -> int:
        return 2 * self.f + 1  # n > 2f

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        n, f = x.shape[0], self.f
        check_n_vs_f(n, f, "cwtm (n > 2f)", self.min_messages())
        if f == 0:
            return StageOut(mean_rows(x), state)
        part = partition(x, (f, n - f - 1))
        return StageOut(mean_rows(part[f:n - f]), state)


@register("aggregator", "cwmed")
@dataclass(frozen=True)
class CoordinateWiseMedian(AbstractAggregator):
    """Coordinate-wise median (Yin et al. 2018, Def. 1): ``x_{((n+1)/2),k}`` for odd ``n``, the average of the two
    middle values for even ``n``. Cost: expected ``O(nd)`` time (introselect) and one ``(n, d)`` copy.

    References:
      Yin, Chen, Ramchandran, Bartlett, https://arxiv.org/abs/1803.01498.

    Example:
      >>> import torch
      >>> CoordinateWiseMedian()(torch.tensor([[0.0, 5.0], [1.0, 1.0], [3.0, -2.0], [100.0, 0.0]])).tolist()
      [2.0, 0.5]
    """

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        return StageOut(coordinate_median(x), state)


def coordinate_median(x: torch.Tensor) -> torch.Tensor:
    """Per-column median of ``(n, d)`` messages (mean of the two middle values when ``n`` is even)."""
    n = x.shape[0]
    if n == 1:
        return x[0].clone()
    lo, hi = (n - 1) // 2, n // 2
    part = partition(x, sorted({lo, hi}))
    # 0.5·a + 0.5·b is exact scaling, so it cannot overflow where (a + b)/2 would.
    return part[lo] if lo == hi else part[lo] * 0.5 + part[hi] * 0.5


@register("aggregator", "meamed")
@dataclass(frozen=True)
class Meamed(AbstractAggregator):
    """Mean around the median (Xie et al. 2018, Def. 5): per coordinate, average the ``n − f`` values closest to
    the coordinate-wise median::

        Meamed(x)_k = (1/(n − f)) Σ_{i ∈ N_k} x_{i,k},   N_k = the n − f indices with the smallest |x_{i,k} − med_k|

    Values tied at the boundary distance share the remaining slots equally (so the result does not depend on
    the order of the messages). ``f = 0`` gives the mean. Requires ``n > 2f``. Cost: two introselects, expected
    ``O(nd)`` time, and a few ``(n, d)`` temporaries.

    Args:
      f: number of values dropped per coordinate (the Byzantine bound).

    References:
      Xie, Koyejo, Gupta, "Generalized Byzantine-tolerant SGD", https://arxiv.org/abs/1802.10116.

    Example:
      >>> import torch
      >>> Meamed(f=1)(torch.tensor([[0.0], [1.0], [2.0], [100.0]])).tolist()
      [1.0]
    """

    f: int

    def __post_init__(self) -> None:
        require_f(self.f)

    def min_messages(self) -> int:
        return 2 * self.f + 1  # n > 2f

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        n, f = x.shape[0], self.f
        check_n_vs_f(n, f, "meamed (n > 2f)", self.min_messages())
        if f == 0:
            return StageOut(mean_rows(x), state)
        out = _meamed(x, f)
        if out is None:  # |x − median| or the sum overflowed: redo where neither can (same selection)
            out = rescaled(lambda z: _meamed(z, f, check=False), x)
        return StageOut(out, state)


def _meamed(x: torch.Tensor, f: int, check: bool = True) -> torch.Tensor | None:
    """Meamed of ``x`` for ``0 < f < n/2``; ``None`` (with ``check``) if a distance or the sum overflowed."""
    n = x.shape[0]
    k = n - f
    dist = (x - coordinate_median(x)).abs_()
    threshold = partition(dist, (k - 1,))[k - 1]
    if check and not all_finite(threshold):  # overflowed distances tie at inf: order lost
        return None
    below = dist < threshold
    tied = dist == threshold
    del dist
    share = (k - below.sum(dim=0)).to(x.dtype) / tied.sum(dim=0).clamp_min(1).to(x.dtype)  # not float32 for float64
    # Select with `where`, not by multiplying with 0/1 weights: 0·inf would turn a trimmed inf into NaN.
    out = (x.where(below, 0.0).sum(dim=0) + share * x.where(tied, 0.0).sum(dim=0)) / k
    return out if not check or all_finite(out) else None
