"""Krum and Multi-Krum (Blanchard et al. 2017): select the messages closest to their neighbours.

Both rules score every message by its squared distances to its ``n − f − 2`` nearest other messages (the original
count; ByzFL uses ``n − f − 1``) and average the best-scored ones. Distances come from the float64 Gram matrix, so
the cost is ``O(n²d)`` for the Gram matrix, ``O(n² log n)`` for the scores and ``O(nd)`` for the output. Neither rule
has a weighted form; ``ctx.weights`` are ignored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from trustfl.aggregate.base import AbstractAggregator, require_f, weighted_rows
from trustfl.aggregate.coordinate import USABLE, check_n_vs_f, smallest_weights
from trustfl.aggregate.geometric import gram_matrix, squared_distances
from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.types import RoundContext, StageOut


def krum_minimum(f: int) -> int:
    """The fewest messages Krum's scores take: ``n > 2f + 2`` when ``f > 0``, any ``n >= 1`` otherwise."""
    return 2 * f + 3 if f > 0 else 1


def krum_scores(x: torch.Tensor, f: int) -> tuple[torch.Tensor, float]:
    """Krum scores ``s_i = Σ_{j ∈ N_i} ‖x_i − x_j‖²`` (Blanchard et al. 2017, §4), float64, shape ``(n,)``, and
    their rounding-error scale (scores closer than it are ties).

    ``N_i`` holds the ``n − f − 2`` messages ``j ≠ i`` closest to ``x_i`` (``max(n − 2, 0)`` when ``f = 0``).
    Requires ``n > 2f + 2`` when ``f > 0``.
    """
    n = x.shape[0]
    check_n_vs_f(n, f, "krum (n > 2f + 2)", krum_minimum(f))
    neighbours = max(n - f - 2, 0)
    gram = gram_matrix(x)
    dist = squared_distances(gram.matrix)
    dist.fill_diagonal_(float("inf"))
    return dist.sort(dim=1).values[:, :neighbours].sum(dim=1), gram.tolerance


def _average_best(x: torch.Tensor, scores: torch.Tensor, m: int, atol: float) -> torch.Tensor:
    """Average of the ``m`` rows with the smallest scores; rows tied at the boundary share the last slots."""
    threshold = scores.kthvalue(m).values
    weights = smallest_weights(scores, m, threshold, atol) / m
    return weighted_rows(weights, x)


@register("aggregator", "krum")
@dataclass(frozen=True)
class Krum(AbstractAggregator):
    """Krum (Blanchard et al. 2017, §4): the message with the smallest Krum score::

        Krum(x) = x_{i*},   i* = argmin_i Σ_{j ∈ N_i} ‖x_i − x_j‖²,   |N_i| = n − f − 2

    Messages tied at the smallest score (up to the rounding error of the Gram matrix) are averaged; they are
    equal in the usual case of duplicates, and averaging keeps the result independent of the message order.
    Requires ``n > 2f + 2`` (any ``n`` when ``f = 0``; with ``n ≤ 2`` all scores are 0 and the rule returns the
    mean). Cost ``O(n²d)``.

    Args:
      f: the Byzantine bound.

    References:
      Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine Learning with Adversaries: Byzantine Tolerant Gradient
      Descent", NeurIPS 2017, https://papers.nips.cc/paper/6617.

    Example:
      >>> import torch
      >>> x = torch.tensor([[0.0], [1.0], [1.5], [2.0], [50.0]])
      >>> Krum(f=1)(x).tolist()
      [1.5]
    """

    pairwise: ClassVar[bool] = True

    f: int

    def __post_init__(self) -> None:
        require_f(self.f)

    def min_messages(self) -> int:
        return krum_minimum(self.f)

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        scores, atol = krum_scores(x, self.f)
        return StageOut(_average_best(x, scores, 1, atol), state, {"min_score": float(scores.min())})


@register("aggregator", "multi_krum")
@dataclass(frozen=True)
class MultiKrum(AbstractAggregator):
    """Multi-Krum (Blanchard et al. 2017, §4; El Mhamdi et al. 2018): the average of the ``m`` messages with the
    smallest Krum scores (``|N_i| = n − f − 2`` neighbours each)::

        MultiKrum(x) = (1/m) Σ_{i ∈ M} x_i,   M = the m indices with the smallest scores

    Messages tied at the ``m``-th score share the remaining slots equally. ``m = 1`` is Krum. Requires
    ``n > 2f + 2`` (any ``n`` when ``f = 0``) and ``m <= n``. Cost ``O(n²d)``.

    Args:
      f: the Byzantine bound.
      m: number of messages averaged, ``>= 1``; ``None`` means ``n − f`` (the usual choice).

    References:
      Blanchard et al., NeurIPS 2017, https://papers.nips.cc/paper/6617.
      El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of Distributed Learning in Byzantium",
      https://arxiv.org/abs/1802.07927.

    Example:
      >>> import torch
      >>> x = torch.tensor([[0.0], [1.0], [1.5], [2.0], [50.0]])
      >>> MultiKrum(f=1)(x).tolist()
      [1.125]
    """

    pairwise: ClassVar[bool] = True

    f: int
    m: int | None = None

    def __post_init__(self) -> None:
        require_f(self.f)
        check_number("m", self.m, integer=True, low=1, allow_none=True, note="messages averaged; None: n − f")

    def min_messages(self) -> int:
        return krum_minimum(self.f)

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        n = x.shape[0]
        m = n - self.f if self.m is None else self.m
        if m > n:
            raise ConfigError(f"multi_krum averages `m`={m} messages but only n={n} usable messages were received "
                              f"({USABLE}); lower `m`.")
        scores, atol = krum_scores(x, self.f)
        return StageOut(_average_best(x, scores, m, atol), state)
