"""Minimum-diameter averaging (MDA): the mean of the ``n − f`` messages with the smallest diameter, computed exactly.

The rule scores all ``C(n, f)`` ways of removing ``f`` messages, so it refuses (with a clear error) when that count
exceeds ``max_subsets`` instead of running for hours.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from trustfl.aggregate.base import AbstractAggregator, mean_rows, require_f, weighted_rows
from trustfl.aggregate.coordinate import check_n_vs_f
from trustfl.aggregate.geometric import gram_matrix, squared_distances
from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.types import RoundContext, StageOut

_BATCH_ELEMENTS = 1 << 22


def _subset_diameters(removed: torch.Tensor, n: int, pair_i: torch.Tensor, pair_j: torch.Tensor,
                      pair_d: torch.Tensor) -> torch.Tensor:
    """Squared diameter of the complement of each removal set (rows of ``removed``).

    ``pair_*`` list candidate pairs by decreasing distance; the diameter of a complement is the distance of the
    first pair with neither end removed (0 if the complement has no pair).
    """
    gone = torch.zeros(removed.shape[0], n, dtype=torch.bool)
    gone.scatter_(1, removed, True)
    alive = ~(gone[:, pair_i] | gone[:, pair_j])
    first = alive.to(torch.uint8).argmax(dim=1)
    return torch.where(alive.any(dim=1), pair_d[first], torch.zeros((), dtype=pair_d.dtype))


@register("aggregator", "mda")
@dataclass(frozen=True)
class MinimumDiameterAveraging(AbstractAggregator):
    """Minimum-diameter averaging (El Mhamdi et al. 2020; Rousseeuw 1985)::

        MDA(x) = (1/(n − f)) Σ_{i ∈ S*} x_i,   S* = argmin_{|S| = n − f} max_{i,j ∈ S} ‖x_i − x_j‖

    Exact: every one of the ``C(n, f)`` removal sets is scored. The diameter of a complement is read off the
    pairs sorted by decreasing distance (only the first ``f(n − 1) + 1`` pairs can matter), vectorised over batches
    of removal sets. When several subsets reach the minimum diameter (up to the Gram matrix's rounding error) their
    means are averaged, so the result does not depend on the message order. ``f = 0``
    gives the mean. Requires ``n > 2f``. Metrics: ``subsets`` (count scored), ``diameter``.

    Cost: ``O(n²d)`` for the Gram matrix, ``O(C(n, f) · f·n)`` for the search, ``O(nd)`` for the output.

    Args:
      f: number of messages removed (the Byzantine bound).
      max_subsets: refuse when ``C(n, f)`` exceeds this (default 10⁶, a few seconds).

    Raises:
      ConfigError: at ``apply`` when ``n <= 2f`` or ``C(n, f) > max_subsets``.

    References:
      El Mhamdi, Guerraoui, Guirguis, Hoang, Rouault, "Distributed Momentum for Byzantine-resilient Stochastic
      Gradient Descent", ICLR 2021, https://arxiv.org/abs/2003.00010.

    Example:
      >>> import torch
      >>> MinimumDiameterAveraging(f=1)(torch.tensor([[0.0], [1.0], [2.0], [10.0]])).tolist()
      [1.0]
    """

    pairwise: ClassVar[bool] = True

    f: int
    max_subsets: int = 1_000_000

    def __post_init__(self) -> None:
        require_f(self.f)
        check_number("max_subsets", self.max_subsets, integer=True, low=1)

    def min_messages(self) -> int:
        return 2 * self.f + 1  # n > 2f

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        n, f = x.shape[0], self.f
        check_n_vs_f(n, f, "mda (n > 2f)", self.min_messages())
        count = math.comb(n, f)
        if count > self.max_subsets:
            raise ConfigError(f"mda with f={f} and n={n} must score C({n}, {f}) = {count:.3g} subsets, above "
                              f"`max_subsets`={self.max_subsets}; raise `max_subsets`, lower `f`, or use another "
                              f"rule (e.g. krum, cwtm, caf).")
        if f == 0:
            return StageOut(mean_rows(x), state, {"subsets": 1.0})
        gram = gram_matrix(x)
        # The subset search is host-side (a scalar per chunk of subsets): the (n, n) distances go to the CPU once
        # and the weights come back to the messages' device.
        dist = squared_distances(gram.matrix).cpu()
        atol = gram.tolerance
        rows, cols = torch.triu_indices(n, n, offset=1)
        order = dist[rows, cols].argsort(descending=True)[: f * (n - 1) + 1]
        pair_i, pair_j, pair_d = rows[order], cols[order], dist[rows, cols][order]
        batch = max(1, _BATCH_ELEMENTS // len(order))
        best = float("inf")
        kept = torch.zeros(n, dtype=torch.float64)  # Σ over the best subsets of their membership indicator
        ties = 0
        combos = itertools.combinations(range(n), f)
        while chunk := list(itertools.islice(combos, batch)):
            removed = torch.tensor(chunk, dtype=torch.long)
            diam = _subset_diameters(removed, n, pair_i, pair_j, pair_d)
            low = float(diam.min())
            if low > best + atol:
                continue
            if low < best - atol:  # a strictly better diameter: forget the previous ties
                kept, ties = torch.zeros(n, dtype=torch.float64), 0
            best = min(best, low)
            winners = removed[diam <= best + atol]
            members = torch.ones(winners.shape[0], n, dtype=torch.float64).scatter_(1, winners, 0.0)
            kept += members.sum(dim=0)
            ties += winners.shape[0]
        weights = kept / (ties * (n - f))
        out = weighted_rows(weights, x)
        return StageOut(out, state, {"subsets": float(count), "diameter": best ** 0.5})
