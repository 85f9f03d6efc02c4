"""Heterogeneous per-client privacy budgets: ε lists, Robust-HDP's Table 7 distributions, per-client σ.

Every client i has its own ε_i (and possibly its own sampling rate q_i and number of steps T_i); each gets the
noise multiplier z_i that makes *its own* schedule (ε_i, δ)-DP.

Example:
  >>> import numpy as np
  >>> eps = epsilons_from_distribution("dist5", 4, np.random.default_rng(0))
  >>> len(eps), all(0.2 <= e <= 2.0 for e in eps)
  (4, True)
  >>> z = calibrate_clients([1.0, 4.0], 1e-5, 1.0, 10)
  >>> z[0] > z[1]
  True
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

import numpy as np

from trustfl.core.checks import check_number
from trustfl.core.rng import numpy_rng
from trustfl.errors import ConfigError, PrivacyError
from trustfl.privacy.analysis.gaussian import calibrate_noise_multiplier
from trustfl.privacy.analysis.rhdp import calibrate_z

__all__ = ["EPSILON_DISTRIBUTIONS", "RHDP_FIXED_LISTS", "RHDP_UNIFORM_EPSILONS", "EpsilonDistribution",
           "calibrate_clients", "epsilons_from_distribution", "epsilons_from_list"]


@dataclass(frozen=True)
class EpsilonDistribution:
    """A distribution of ε over clients: a Gaussian mixture ((weight, mean, std), ...) or Uniform[low, high]."""

    name: str
    components: tuple[tuple[float, float, float], ...] = ()
    uniform: Optional[tuple[float, float]] = None

    def __post_init__(self) -> None:
        if (self.uniform is None) == (not self.components):
            raise ConfigError(f"Distribution {self.name!r} needs exactly one of `components` and `uniform`.")
        if self.components:
            weights = [w for w, _, _ in self.components]
            if any(w <= 0 for w in weights) or not math.isclose(sum(weights), 1.0, abs_tol=1e-9):
                raise ConfigError(f"Distribution {self.name!r}: mixture weights must be > 0 and sum to 1, "
                                  f"found {weights}.")
            if any(s < 0 for _, _, s in self.components):
                raise ConfigError(f"Distribution {self.name!r}: standard deviations must be >= 0.")
        if self.uniform is not None and not 0 <= self.uniform[0] <= self.uniform[1]:
            raise ConfigError(f"Distribution {self.name!r}: need 0 <= low <= high, found {self.uniform}.")

    def sample(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        """Raw draws (no floor) for ``num_clients`` clients."""
        if self.uniform is not None:
            return rng.uniform(self.uniform[0], self.uniform[1], size=num_clients)
        weights, means, stds = (np.array(col, dtype=np.float64) for col in zip(*self.components))
        which = rng.choice(len(weights), size=num_clients, p=weights / weights.sum())
        return rng.normal(means[which], stds[which])


# Robust-HDP Table 7. N(a, b): b is a standard deviation (the paper does not say; the code's draws fit a std).
EPSILON_DISTRIBUTIONS: Mapping[str, EpsilonDistribution] = MappingProxyType({
    "dist1": EpsilonDistribution("dist1", components=((1.0, 2.0, 1.0),)),
    "dist2": EpsilonDistribution("dist2", components=((0.2, 0.2, 0.01), (0.6, 1.0, 0.1), (0.2, 5.0, 1.0))),
    "dist3": EpsilonDistribution("dist3", uniform=(0.2, 5.0)),
    "dist4": EpsilonDistribution("dist4", components=((0.2, 0.2, 0.01), (0.6, 0.5, 0.1), (0.2, 2.0, 1.0))),
    "dist5": EpsilonDistribution("dist5", uniform=(0.2, 2.0)),
    "dist6": EpsilonDistribution("dist6", components=((0.3, 0.2, 0.01), (0.5, 0.5, 0.1), (0.2, 1.0, 0.1))),
    "dist7": EpsilonDistribution("dist7", uniform=(0.2, 1.0)),
    "dist8": EpsilonDistribution("dist8", components=((0.6, 0.2, 0.01), (0.4, 0.5, 0.1))),
    "dist9": EpsilonDistribution("dist9", uniform=(0.2, 0.5)),
})

# Robust-HDP code (utils/privacy_params.py), n = 20 clients: the per-client ε of each Dist and the batch sizes
# shared by all Dists. These lists reproduce the paper's Table 3.
RHDP_FIXED_LISTS: Mapping[str, tuple[float, ...]] = MappingProxyType({
    "batch_sizes": (32, 64, 16, 32, 16, 16, 16, 32, 32, 64, 32, 64, 16, 128, 16, 64, 32, 64, 16, 16),
    "dist1": (2.81, 1.69, 1.74, 1.46, 2.43, 0.85, 2.87, 1.62, 2.16, 1.88, 2.73, 0.97, 1.84, 1.81, 2.57, 1.45, 1.91,
              1.56, 2.02, 2.29),
    "dist2": (5.45, 1.0, 1.15, 0.2, 4.52, 4.88, 0.98, 0.2, 1.05, 0.93, 1.0, 0.21, 0.21, 1.27, 0.89, 1.17, 0.96, 0.89,
              1.04, 0.84),
    "dist3": (2.2, 3.66, 0.2, 1.65, 0.9, 0.64, 1.09, 1.86, 2.1, 2.79, 2.21, 3.49, 1.18, 4.41, 0.33, 3.42, 2.2, 2.88,
              0.87, 1.15),
    "dist4": (0.57, 0.66, 0.42, 3.97, 3.27, 0.45, 0.55, 2.58, 1.82, 0.64, 0.19, 2.38, 0.34, 0.44, 0.47, 0.5, 0.56,
              0.51, 0.68, 0.19),
    "dist5": (0.95, 1.5, 0.2, 0.74, 0.46, 0.37, 0.54, 0.82, 0.91, 1.17, 0.95, 1.43, 0.57, 1.78, 0.25, 1.41, 0.95,
              1.21, 0.45, 0.56),
    "dist6": (0.5, 0.46, 0.39, 0.44, 0.21, 0.36, 0.19, 0.51, 1.12, 0.2, 0.49, 0.19, 0.19, 0.2, 0.2, 0.18, 0.61, 0.15,
              0.38, 0.53),
    "dist7": (0.26, 0.82, 0.55, 0.78, 0.98, 0.63, 0.6, 0.26, 0.41, 0.6, 0.74, 0.84, 0.5, 0.25, 0.43, 0.93, 0.37, 0.56,
              0.94, 0.22),
    "dist8": (0.2, 0.2, 0.19, 0.44, 0.21, 0.19, 0.19, 0.51, 0.62, 0.2, 0.2, 0.19, 0.19, 0.2, 0.2, 0.18, 0.61, 0.17,
              0.38, 0.53),
    "dist9": (0.45, 0.25, 0.22, 0.31, 0.28, 0.36, 0.29, 0.29, 0.23, 0.27, 0.48, 0.28, 0.42, 0.46, 0.44, 0.26, 0.25,
              0.21, 0.21, 0.26),
})

RHDP_UNIFORM_EPSILONS = (2.6, 2.0, 1.1, 0.6, 0.35)
"""Robust-HDP App. G homogeneous settings (the "means of Dist1, 3, 5, 7, 9")."""


def _check_num_clients(num_clients: int) -> int:
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ConfigError(f"`num_clients` must be an integer >= 1, found {num_clients!r}.")
    return int(num_clients)


def epsilons_from_list(values: Union[float, Sequence[float]], num_clients: int) -> list[float]:
    """Per-client ε from an explicit list (length ``num_clients``) or one value for everyone.

    Raises:
      ConfigError: wrong length, or a value that is not a finite number > 0.
    """
    n = _check_num_clients(num_clients)
    vals = [values] if np.isscalar(values) else list(values)  # type: ignore[list-item]
    if len(vals) == 1:
        vals = vals * n
    if len(vals) != n:
        raise ConfigError(f"`epsilons` must have one value per client ({n}) or a single value, found {len(vals)}.")
    out = []
    for i, v in enumerate(vals):
        try:
            f = float(v)
        except (TypeError, ValueError):
            f = float("nan")
        if not f > 0 or math.isinf(f):
            raise ConfigError(f"`epsilons[{i}]` must be a finite number > 0, found {v!r}.")
        out.append(f)
    return out


def epsilons_from_distribution(name: str, num_clients: int, rng: np.random.Generator, floor: float = 0.15,
                               scale: float = 1.0) -> list[float]:
    """Draw per-client ε from Robust-HDP's Table 7 distribution ``name`` ("dist1" … "dist9").

    ε_i = scale · max(draw_i, floor): the paper does not say how negative or tiny draws are handled; the code's
    lists contain none below 0.15, hence the default floor. Use ``scale=10`` for the paper's CIFAR100 setting.

    Raises:
      ConfigError: unknown name (lists the valid ones), bad ``num_clients``, ``floor`` or ``scale``.
    """
    key = str(name).lower()
    if key not in EPSILON_DISTRIBUTIONS:
        raise ConfigError(f"Unknown epsilon distribution {name!r}; valid names: "
                          f"{', '.join(EPSILON_DISTRIBUTIONS)}.")
    n = _check_num_clients(num_clients)
    if not isinstance(rng, np.random.Generator):
        raise ConfigError(f"`rng` must be a numpy Generator (trustfl.core.rng.numpy_rng), found {type(rng).__name__}.")
    if not float(floor) > 0:
        raise ConfigError(f"`floor` must be > 0, found {floor!r}.")
    if not float(scale) > 0 or math.isinf(float(scale)):
        raise ConfigError(f"`scale` must be a finite number > 0, found {scale!r}.")
    draws = EPSILON_DISTRIBUTIONS[key].sample(n, rng)
    return (float(scale) * np.maximum(draws, float(floor))).tolist()


def client_epsilons(dp: Any, num_clients: int, seed: int) -> list[float] | None:
    """Per-client ε targets of a ``client.dp`` table (a list, a named distribution drawn with ``seed``, or one
    value), or ``None`` when it sets no budget."""
    key = "client.dp.epsilons" if dp.epsilons else "client.dp.epsilon_distribution"
    try:
        if dp.epsilons:
            return epsilons_from_list(dp.epsilons, num_clients)
        if dp.epsilon_distribution:
            return epsilons_from_distribution(dp.epsilon_distribution, num_clients, numpy_rng(seed, "epsilons"))
    except (PrivacyError, ConfigError) as err:
        raise ConfigError(f"`{key}`: {err}") from None
    if dp.epsilon > 0:
        return [dp.epsilon] * num_clients
    return None


def _broadcast(name: str, value: Union[float, Sequence[float]], n: int) -> list[float]:
    if np.isscalar(value):
        return [value] * n  # type: ignore[list-item]
    vals = list(value)  # type: ignore[arg-type]
    if len(vals) != n:
        raise PrivacyError(f"`{name}` must be a scalar or have one value per client ({n}), found {len(vals)}.")
    return vals


MAX_ROUND_DECIMALS = 15
"""Most decimals a noise multiplier is rounded to: a float holds no digit beyond (``client.dp.round_noise_to``)."""


def round_up(z: float, decimals: int) -> float:
    """``z`` rounded up to ``decimals`` decimals (``0 <= decimals <= MAX_ROUND_DECIMALS``): a larger noise multiplier
    spends less, so a rounded one never passes the budget its unrounded value meets."""
    if isinstance(decimals, bool) or not isinstance(decimals, int) or not 0 <= decimals <= MAX_ROUND_DECIMALS:
        raise PrivacyError(f"`round_decimals` must be an integer from 0 to {MAX_ROUND_DECIMALS}, found {decimals!r}.")
    scale = 10 ** decimals
    return math.ceil(z * scale - 1e-9) / scale


def calibrate_clients(epsilons: Sequence[float], delta: Union[float, Sequence[float]],
                      sample_rates: Union[float, Sequence[float]], steps: Union[float, Sequence[float]],
                      accountant: str = "rdp", sampling: str = "poisson", tol: float = 1e-4,
                      round_decimals: Optional[int] = None) -> list[float]:
    """Each client's own noise multiplier z_i, so that client i's schedule is (ε_i, δ_i)-DP.

    Clients with identical (ε, δ, q, T) share one calibration (the fixed lists repeat values a lot).

    Args:
      epsilons: ε_i per client.
      delta, sample_rates, steps: a scalar for everyone or one value per client.
      accountant: ``"rdp"`` or ``"pld"`` (:func:`~trustfl.privacy.analysis.gaussian.calibrate_noise_multiplier`,
        integer steps), or ``"rhdp"`` (Robust-HDP's classic conversion and bisection,
        :func:`~trustfl.privacy.analysis.rhdp.calibrate_z`; steps may be real).
      sampling: ``"poisson"`` or ``"without_replacement"`` (``rdp``/``pld`` only).
      round_decimals: round every z_i up to this many decimals (a larger z spends less: never past ε_i). ``None``:
        no rounding, except for ``rhdp``, which then keeps Robust-HDP's code: z rounded to the *nearest* 2
        decimals, which can spend up to about 1% past ε_i under that conversion (for reproducing the paper; a run
        rounds up and re-checks every schedule with its own accountant, refusing one that overspends).
    """
    if np.isscalar(epsilons) or not isinstance(epsilons, Iterable):
        raise PrivacyError(f"`epsilons` must be a sequence of one ε per client, found {epsilons!r}.")
    eps = [float(check_number(f"epsilons[{i}]", e, error=PrivacyError)) for i, e in enumerate(epsilons)]
    n = len(eps)
    if n == 0:
        return []
    if accountant not in ("rdp", "pld", "rhdp"):
        raise PrivacyError(f"`accountant` must be 'rdp', 'pld' or 'rhdp', found {accountant!r}.")
    deltas = _broadcast("delta", delta, n)
    rates = _broadcast("sample_rates", sample_rates, n)
    step_list = _broadcast("steps", steps, n)
    for name, values in (("delta", deltas), ("sample_rates", rates), ("steps", step_list)):
        for i, v in enumerate(values):  # numbers, not strings or flags that float() would take
            check_number(f"{name}[{i}]" if len(values) > 1 else name, v, error=PrivacyError)
    cache: dict[tuple[float, float, float, float], float] = {}
    out = []
    for key in zip(eps, (float(d) for d in deltas), (float(q) for q in rates), step_list):
        if key not in cache:
            e, d, q, t = key
            if accountant == "rhdp" and round_decimals is None:
                z = calibrate_z(e, q, float(t), d, 2)  # Robust-HDP's code: to the nearest 2 decimals
            else:
                if accountant == "rhdp":
                    z = calibrate_z(e, q, float(t), d, None)
                elif float(t) != int(t):
                    raise PrivacyError(f"`steps` must be integers for accountant={accountant!r}, found {t!r}.")
                else:
                    z = calibrate_noise_multiplier(e, d, q, int(t), accountant, sampling, tol)
                z = z if round_decimals is None else round_up(z, round_decimals)
            cache[key] = z
        out.append(cache[key])
    return out
