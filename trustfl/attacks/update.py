"""Update-level Byzantine attacks (simulation only): every rule maps the honest messages to the Byzantine rows.

With ``H`` the ``(h, d)`` honest matrix, ``μ = mean_rows(H)``, ``s = std_rows(H)`` (coordinate-wise, ddof = 1)
and ``f`` Byzantine rows:

========== =====================================================================================
sign_flip  ``−μ`` (Allen-Zhu et al. 2020)
foe        ``(1 − τ)·μ``, τ = 3 (fall of empires / inner-product manipulation, Xie et al. 2020)
alie       ``μ + z·s`` (a little is enough, Baruch et al. 2019), z from Baruch's formula
mimic      ``H[k]``, one honest row (Karimireddy et al. 2022)
gaussian   ``N(c, σ²)`` per coordinate, c = 0 or μ (ByzFL's Gaussian attack)
inf, nan   ``+inf`` / ``NaN`` vectors, to exercise the server's rejection of invalid messages
========== =====================================================================================

All rules except ``gaussian`` send the same vector from every Byzantine client (CafCor, Sec. 5); all keep the dtype
of ``H``. The line-search versions of ``alie`` and ``foe`` live in :mod:`trustfl.attacks.line_search`.

References:
  Baruch, Baruch, Goldberg. A Little Is Enough. NeurIPS 2019. https://arxiv.org/abs/1902.06156
  Xie, Koyejo, Gupta. Fall of Empires. UAI 2020. https://arxiv.org/abs/1903.03936
  Allen-Zhu, Ebrahimian, Li, Alistarh. Byzantine-Resilient Non-Convex SGD. ICLR 2021.
  https://arxiv.org/abs/2012.14368
  Karimireddy, He, Jaggi. Byzantine-Robust Learning on Heterogeneous Datasets via Bucketing. ICLR 2022.
  https://arxiv.org/abs/2006.09365
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, ClassVar

import torch

from trustfl.attacks.base import (AbstractAttack, check_finite_number, check_honest, repeat_row, round_context,
                                  saturate, without_overflow)
from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.types import RoundContext

if TYPE_CHECKING:
    from trustfl.aggregate.base import AbstractAggregator


def baruch_z(n: int, f: int) -> float:
    """Baruch et al.'s ALIE factor: ``s = ⌊n/2 + 1⌋ − f``, ``z = Φ⁻¹((n − s)/n)`` (Baruch et al. 2019, §3).

    ``s`` is the number of honest clients the attacker needs on its side for a majority; ``z`` is the largest
    shift (in standard deviations) that keeps the Byzantine value closer to the mean than ``s`` honest values.

    Args:
      n: total number of clients ``h + f``.
      f: number of Byzantine clients.

    Raises:
      ConfigError: if ``s < 1`` (too many Byzantine clients for the formula) or the arguments are out of range.

    Example:
      >>> round(baruch_z(100, 5), 4), round(baruch_z(15, 5), 4)
      (0.1004, 0.8416)
    """
    if not isinstance(n, int) or not isinstance(f, int) or n < 1 or not 0 <= f < n:
        raise ConfigError(f"`n` and `f` must be integers with 0 <= f < n, found n={n!r}, f={f!r}.")
    s = math.floor(n / 2 + 1) - f
    if s < 1:
        raise ConfigError(f"Baruch's ALIE factor needs s = floor(n/2 + 1) - f >= 1, found s={s} for n={n}, f={f}; "
                          "pass `z` explicitly.")
    return NormalDist().inv_cdf((n - s) / n)


def _honest_mean(honest: torch.Tensor) -> torch.Tensor:
    return without_overflow(lambda h: h.mean(dim=0), honest)


@register("attack", "sign_flip")
@dataclass(frozen=True)
class SignFlip(AbstractAttack):
    """Send ``−mean(H)`` (sign flipping, Allen-Zhu et al. 2020; CafCor, Sec. 5, "SF").

    Example:
      >>> import torch; from trustfl.types import RoundContext
      >>> SignFlip().craft(torch.tensor([[1.0, 2.0], [3.0, 4.0]]), 1, RoundContext(0, 0, (0, 1))).tolist()
      [[-2.0, -3.0]]
    """

    def craft(self, honest: torch.Tensor, num_byzantine: int, ctx: RoundContext,
              aggregator: AbstractAggregator | None = None) -> torch.Tensor:
        check_honest(honest, num_byzantine, attack=self)
        return repeat_row(-_honest_mean(honest), num_byzantine)


@register("attack", "foe")
@dataclass(frozen=True)
class FallOfEmpires(AbstractAttack):
    """Send ``(1 − τ)·mean(H)`` (fall of empires / inner-product manipulation; ByzFL's convention).

    Xie et al. (2020) send ``−ε·mean(H)`` with a small ``ε > 0`` (e.g. 0.1); that is this attack with
    ``τ = 1 + ε``. The default ``τ = 3`` (i.e. ``−2·mean``) is ByzFL's (docs/papers/cafcor.md,
    "Attack parameters").

    Args:
      tau: the factor ``τ``; any finite number (``τ = 0`` sends the honest mean, a no-op).

    Example:
      >>> import torch; from trustfl.types import RoundContext
      >>> FallOfEmpires(tau=3.0).craft(torch.tensor([[1.0], [3.0]]), 2, RoundContext(0, 0, (0, 1))).tolist()
      [[-4.0], [-4.0]]
    """

    tau: float = 3.0

    def __post_init__(self) -> None:
        check_finite_number(self.tau, "tau")

    def craft(self, honest: torch.Tensor, num_byzantine: int, ctx: RoundContext,
              aggregator: AbstractAggregator | None = None) -> torch.Tensor:
        check_honest(honest, num_byzantine, attack=self)
        tau = self.tau
        return repeat_row(without_overflow(lambda h: (1.0 - tau) * h.mean(dim=0), honest), num_byzantine)


def alie_vector(honest: torch.Tensor, z: float) -> torch.Tensor:
    """``mean(H) + z·std(H)``, coordinate-wise with ddof = 1 (Baruch et al. 2019, Alg. 3); shape ``(d,)``.

    Overflow-safe (:func:`~trustfl.attacks.base.without_overflow`): saturates at ``±finfo(dtype).max``."""
    return without_overflow(lambda h: h.mean(dim=0) + z * h.std(dim=0, correction=1), honest)


@register("attack", "alie")
@dataclass(frozen=True)
class ALittleIsEnough(AbstractAttack):
    """Send ``mean(H) + z·std(H)`` (ALIE, Baruch et al. 2019), coordinate-wise std with ddof = 1.

    Args:
      z: the factor; ``None`` (default) uses :func:`baruch_z` with ``n = h + f`` for the round's ``h`` and ``f``.
        ByzFL's default is a fixed ``z = 1.5``.

    Raises:
      MessageError: at :meth:`craft` time, with fewer than 2 honest rows (the std needs two).
    """

    min_honest: ClassVar[int] = 2  # the standard deviation of the honest rows
    z: float | None = None

    def __post_init__(self) -> None:
        if self.z is not None:
            check_finite_number(self.z, "z")

    def craft(self, honest: torch.Tensor, num_byzantine: int, ctx: RoundContext,
              aggregator: AbstractAggregator | None = None) -> torch.Tensor:
        check_honest(honest, num_byzantine, min_rows=self.min_honest, attack=self)
        if num_byzantine == 0:
            return honest.new_empty((0, honest.shape[1]))
        z = baruch_z(honest.shape[0] + num_byzantine, num_byzantine) if self.z is None else self.z
        return repeat_row(alie_vector(honest, z), num_byzantine)


@register("attack", "mimic")
@dataclass(frozen=True)
class Mimic(AbstractAttack):
    """Every Byzantine client copies one honest message ``H[k]`` (Karimireddy et al. 2022).

    Args:
      index: ``k``; ``None`` (default) draws ``k`` uniformly from ``ctx.generator("attack")`` each round.

    Raises:
      ConfigError: at :meth:`craft` time if ``index >= h``.
    """

    index: int | None = None

    def __post_init__(self) -> None:
        check_number("index", self.index, integer=True, low=0, allow_none=True)

    def craft(self, honest: torch.Tensor, num_byzantine: int, ctx: RoundContext,
              aggregator: AbstractAggregator | None = None) -> torch.Tensor:
        check_honest(honest, num_byzantine, attack=self)
        h = honest.shape[0]
        if self.index is None:
            ctx = round_context(ctx, self, "it draws the copied row from the round's generator; or set `index`")
            k = int(torch.randint(h, (1,), generator=ctx.generator("attack")))
        elif self.index >= h:
            raise ConfigError(f"mimic: `index` must be < the number of honest rows {h}, found {self.index}.")
        else:
            k = self.index
        return repeat_row(honest[k], num_byzantine)


@register("attack", "gaussian")
@dataclass(frozen=True)
class GaussianAttack(AbstractAttack):
    """Each Byzantine row is an independent draw of ``N(c, σ²·I_d)`` from ``ctx.generator("attack")``.

    ``c = mu·1`` by default (ByzFL's Gaussian attack: ``mu = 0``, ``sigma = 1``); with ``around_honest_mean``
    ``c = mean(H) + mu``. Draws are made in float64 for float64 inputs and float32 otherwise, then cast.

    Args:
      mu: the centre offset.
      sigma: the per-coordinate standard deviation, ``>= 0``.
      around_honest_mean: centre the draws on the honest mean.
    """

    mu: float = 0.0
    sigma: float = 1.0
    around_honest_mean: bool = False

    def __post_init__(self) -> None:
        check_finite_number(self.mu, "mu")
        check_finite_number(self.sigma, "sigma")
        if self.sigma < 0:
            raise ConfigError(f"`sigma` must be >= 0, found {self.sigma!r}.")

    def craft(self, honest: torch.Tensor, num_byzantine: int, ctx: RoundContext,
              aggregator: AbstractAggregator | None = None) -> torch.Tensor:
        check_honest(honest, num_byzantine, attack=self)
        ctx = round_context(ctx, self, "it draws its rows from the round's generator")
        draw_dtype = torch.float64 if honest.dtype == torch.float64 else torch.float32
        noise = torch.randn((num_byzantine, honest.shape[1]), generator=ctx.generator("attack", device=honest.device),
                            dtype=draw_dtype, device=honest.device)
        centre = self.mu + (_honest_mean(honest).to(draw_dtype) if self.around_honest_mean else 0.0)
        return saturate((centre + self.sigma * noise).to(honest.dtype))


@register("attack", "inf")
@dataclass(frozen=True)
class InfAttack(AbstractAttack):
    """Send ``+inf`` in every coordinate: the server must reject non-finite messages."""

    def craft(self, honest: torch.Tensor, num_byzantine: int, ctx: RoundContext,
              aggregator: AbstractAggregator | None = None) -> torch.Tensor:
        check_honest(honest, num_byzantine, attack=self)
        return honest.new_full((num_byzantine, honest.shape[1]), float("inf"))


@register("attack", "nan")
@dataclass(frozen=True)
class NanAttack(AbstractAttack):
    """Send ``NaN`` in every coordinate: the server must reject non-finite messages."""

    def craft(self, honest: torch.Tensor, num_byzantine: int, ctx: RoundContext,
              aggregator: AbstractAggregator | None = None) -> torch.Tensor:
        check_honest(honest, num_byzantine, attack=self)
        return honest.new_full((num_byzantine, honest.shape[1]), float("nan"))
