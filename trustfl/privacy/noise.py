"""Gaussian noise stages: local (each client noises its own row) and central (the server noises the aggregate).

Both describe what they did with dp_accounting events (``GaussianDpEvent(z)``, one per client, charged to that
client's ledger); the accountant computes ε. Clipping is a separate stage (:mod:`trustfl.privacy.clip`) that must
run first, with the sensitivity the noise is calibrated to.

References:
  Abadi et al. Deep Learning with Differential Privacy. CCS 2016. https://arxiv.org/abs/1607.00133
  McMahan, Ramage, Talwar, Zhang. Learning Differentially Private Recurrent Language Models (DP-FedAvg).
  ICLR 2018. https://arxiv.org/abs/1710.06963
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.core.rng import normal_rows
from trustfl.core.stage import AbstractStage
from trustfl.errors import ConfigError, PrivacyError
from trustfl.privacy.events import gaussian_event
from trustfl.types import RoundContext, StageOut


def _check_nonneg(value: float | None, name: str, positive: bool = False) -> None:
    if value is not None:
        check_number(name, value, low=0, low_open=positive, finite=True)


def client_rows_noise(ctx: RoundContext, stream: str, d: int, dtype: torch.dtype,
               device: torch.device | str = "cpu") -> torch.Tensor:
    """One standard-normal ``(d,)`` row per client of ``ctx``, each from ``ctx.generator(stream, client_id)`` on
    ``device`` (the message's)."""
    draw = torch.float64 if dtype == torch.float64 else torch.float32
    out = torch.empty((len(ctx.client_ids), d), dtype=draw, device=device)
    normal_rows([out], [ctx.generator(stream, c, device) for c in ctx.client_ids])
    return out


@dataclass(frozen=True)
class GaussianNoise(AbstractStage):
    """Local placement: row ``i`` gets ``N(0, std² I_d)`` from client ``i``'s own generator.

    ``std`` is given directly or as ``noise_multiplier · sensitivity``. With a ``sensitivity`` the stage emits one
    event per row, ``(client_id, GaussianDpEvent(std / sensitivity))``; without one it emits none (the noise is then
    not accounted for as a DP mechanism).

    Attributes:
      std, noise_multiplier, sensitivity: see :func:`gaussian_noise`.
      stream: the generator key, ``ctx.generator(stream, client_id)``; give two noise stages of one chain
        different streams, or their noise is identical.
    """

    privacy_noise: ClassVar[bool] = True

    std: float | None = None
    noise_multiplier: float | None = None
    sensitivity: float | None = None
    stream: str = "gaussian_noise"

    def __post_init__(self) -> None:
        _check_nonneg(self.std, "std")
        _check_nonneg(self.noise_multiplier, "noise_multiplier")
        _check_nonneg(self.sensitivity, "sensitivity", positive=True)
        if (self.std is None) == (self.noise_multiplier is None):
            raise ConfigError(f"give exactly one of `std` and `noise_multiplier`, found std={self.std!r}, "
                              f"noise_multiplier={self.noise_multiplier!r}.")
        if self.noise_multiplier is not None and self.sensitivity is None:
            raise ConfigError("`noise_multiplier` needs `sensitivity` (the clip norm, or 2C under replace-one "
                              "adjacency), found sensitivity=None.")
        if not isinstance(self.stream, str) or not self.stream:
            raise ConfigError(f"`stream` must be a non-empty string, found {self.stream!r}.")

    @property
    def effective_std(self) -> float:
        """The per-coordinate std ``σ``."""
        if self.std is not None:
            return float(self.std)
        return float(self.noise_multiplier) * float(self.sensitivity)  # type: ignore[arg-type]

    def round_event(self) -> Any:
        return None if self.sensitivity is None else gaussian_event(self.effective_std / float(self.sensitivity))

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        if x.ndim != 2 or not x.is_floating_point():
            raise PrivacyError(f"gaussian_noise takes a floating (m, d) tensor, found shape {tuple(x.shape)} and "
                               f"dtype {x.dtype}.")
        if len(ctx.client_ids) != x.shape[0]:
            raise PrivacyError(f"`ctx.client_ids` must name each of the {x.shape[0]} rows, found "
                               f"{len(ctx.client_ids)} ids.")
        sigma = self.effective_std
        noisy = x + (sigma * client_rows_noise(ctx, self.stream, x.shape[1], x.dtype, x.device)).to(x.dtype)
        events: tuple = ()
        if self.sensitivity is not None:
            event = gaussian_event(sigma / float(self.sensitivity))
            events = tuple((c, event) for c in ctx.client_ids)
        return StageOut(noisy, state, {"std": sigma}, events)


@register("client_stage", "gaussian_noise")
def gaussian_noise(std: float | None = None, noise_multiplier: float | None = None,
                   sensitivity: float | None = None, stream: str = "gaussian_noise") -> GaussianNoise:
    """Local Gaussian mechanism: each client adds ``N(0, σ² I_d)`` to its own row.

    Args:
      std: ``σ`` per coordinate, ``>= 0``.
      noise_multiplier: ``z``; then ``σ = z · sensitivity``. Give exactly one of ``std`` and ``noise_multiplier``.
      sensitivity: ``Δ``, the L2 sensitivity of one row (the clip norm ``C`` under add/remove adjacency, ``2C``
        under replace-one as in CafCor's Lemma A.4). Each client is charged ``GaussianDpEvent(σ/Δ)``.
      stream: the generator key (see :class:`GaussianNoise`).

    Raises:
      ConfigError: on a negative or missing value, or both ``std`` and ``noise_multiplier``.

    Example:
      >>> from trustfl.types import RoundContext
      >>> out = gaussian_noise(noise_multiplier=1.1, sensitivity=2.0).apply(
      ...     torch.zeros(2, 3), None, RoundContext(0, 0, (4, 7)))
      >>> out.metrics["std"], [(c, e.noise_multiplier) for c, e in out.events]
      (2.2, [(4, 1.1), (7, 1.1)])
    """
    return GaussianNoise(std, noise_multiplier, sensitivity, stream)


@dataclass(frozen=True)
class CentralGaussianNoise(AbstractStage):
    """Central placement (DP-FedAvg): the server adds ``N(0, (z·C/m)² I_d)`` to the mean of ``m`` clipped updates.

    DP-FedAvg (McMahan et al. 2018, Alg. 1 with the fixed denominator) adds ``N(0, (z·C)² I_d)`` to the *sum* of the
    ``m`` updates clipped to ``C``; the sum has L2 sensitivity ``C`` when one user is added or removed. The stage
    receives the aggregate ``Σ_i x_i / m`` (shape ``(d,)``), so it adds std ``z·C/m`` with
    ``m = len(ctx.client_ids)``, and charges ``GaussianDpEvent(z)`` (user level) to each client of
    ``ctx.client_ids``. Draws come from the server generator ``ctx.generator("central_gaussian_noise")``.

    Warning:
      The engine must (1) clip every update to ``clip_norm`` with a client stage, (2) aggregate with the
      *unweighted* mean ``sum / m`` (a weighted mean or a robust rule has another sensitivity), and (3) pass the
      context whose ``client_ids`` are exactly the ``m`` clients summed. ``m`` is public (a fixed cohort size);
      with Poisson sampling use the expected cohort size instead, which this stage does not do.
    """

    privacy_noise: ClassVar[bool] = True

    noise_multiplier: float
    clip_norm: float

    def __post_init__(self) -> None:
        _check_nonneg(self.noise_multiplier, "noise_multiplier")
        _check_nonneg(self.clip_norm, "clip_norm", positive=True)

    def round_event(self) -> Any:
        return gaussian_event(float(self.noise_multiplier))

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        if x.ndim != 1 or not x.is_floating_point():
            raise PrivacyError(f"central_gaussian_noise takes the floating (d,) aggregate, found shape "
                               f"{tuple(x.shape)} and dtype {x.dtype}.")
        m = len(ctx.client_ids)
        if m == 0:
            raise PrivacyError("central_gaussian_noise needs the clients of the aggregate in `ctx.client_ids`, "
                               "found none.")
        std = float(self.noise_multiplier) * float(self.clip_norm) / m
        draw = torch.float64 if x.dtype == torch.float64 else torch.float32
        noise = torch.randn(x.shape[0], generator=ctx.generator("central_gaussian_noise", device=x.device),
                            dtype=draw, device=x.device)
        event = gaussian_event(float(self.noise_multiplier))
        return StageOut(x + (std * noise).to(x.dtype), state, {"std": std, "sum_std": std * m},
                        tuple((c, event) for c in ctx.client_ids))


@register("server_stage", "central_gaussian_noise")
def central_gaussian_noise(noise_multiplier: float, clip_norm: float) -> CentralGaussianNoise:
    """Server-side Gaussian noise on the mean of clipped updates (DP-FedAvg): std ``z·C`` on the sum.

    Args:
      noise_multiplier: ``z >= 0``.
      clip_norm: ``C > 0``, the norm the client updates were clipped to.

    Example:
      >>> from trustfl.types import RoundContext
      >>> out = central_gaussian_noise(1.0, 0.5).apply(torch.zeros(4), None, RoundContext(0, 0, (0, 1, 2, 3, 4)))
      >>> out.metrics["std"], len(out.events)
      (0.1, 5)
    """
    return CentralGaussianNoise(noise_multiplier, clip_norm)
