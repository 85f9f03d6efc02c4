"""Robust-HDP's per-client noise calibration ``compute_z`` (Malekmohammadi, Yu & Cao, ICML 2024).

Reproduces the authors' code (docs/papers/robust_hdp.md, "Noise calibration"): the RDP of the Poisson-sampled
Gaussian at the orders {1 + x/10 : x = 1..99} ∪ {12..64}, multiplied by the (real, not rounded up) number of
steps T = K·E·N/b, then the **classic** conversion (Mironov 2017, Prop. 3)

    ε = min_α [RDP(α) − log δ / (α − 1)],

then bisection on z ∈ [0.001, 1000] until |ε(z) − ε_target| <= 1e-6, and z rounded to 2 decimals.

Warning:
  The classic conversion differs from dp_accounting's default one (``RdpAccountant.get_epsilon`` uses
  ε = min_α [RDP(α) + log(1 − 1/α) − log(δα)/(α − 1)], Balle et al. 2020), which is tighter. Only the RDP
  values at the orders come from dp_accounting here; the conversion is done in :func:`classic_rdp_to_epsilon`
  because that is what the paper's code (TF-Privacy's old ``get_privacy_spent``) does. dp_accounting's RDP at
  fractional orders is a slightly looser bound than TF-Privacy's old series; it reproduces the tests' z table
  (N = 2400, δ = 1e-4, K = 1) exactly after rounding.

Example:
  >>> compute_z(2.0, dataset_size=2400, batch_size=16, global_rounds=20)
  1.1
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import Optional, Sequence

import numpy as np

from trustfl.errors import PrivacyError
from trustfl.privacy.analysis.checked import checked
from trustfl.privacy.analysis.gaussian import solve_decreasing

RHDP_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 65)))
"""The RDP orders of the Robust-HDP code."""
Z_BRACKET = (0.001, 1000.0)
EPS_TOL = 1e-6

__all__ = ["RHDP_ORDERS", "calibrate_z", "classic_rdp_to_epsilon", "compute_z", "rdp_poisson_gaussian",
           "rhdp_epsilon"]


@functools.lru_cache(maxsize=4096)
def _rdp_one_step(q: float, z: float, orders: tuple[float, ...]) -> tuple[float, ...]:
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant

    from trustfl.privacy.analysis.sampled_rdp import leaf_rdp

    acc = rdp_privacy_accountant.RdpAccountant(orders=list(orders))
    event: dp_event.DpEvent = dp_event.GaussianDpEvent(z)
    if q < 1.0:
        event = dp_event.PoissonSampledDpEvent(q, event)
    rdp = leaf_rdp(event, 1, acc.orders, acc.neighboring_relation)  # dp_accounting's bits, faster
    return tuple(float(r) for r in (acc.compose(event).rdp if rdp is None else rdp))


@checked
def rdp_poisson_gaussian(sample_rate: float, noise_multiplier: float,
                         orders: Sequence[float] = RHDP_ORDERS) -> np.ndarray:
    """RDP of **one** Poisson-sampled Gaussian step at ``orders``, from dp_accounting (cached per (q, z))."""
    q = float(sample_rate)
    if not 0.0 < q <= 1.0:
        raise PrivacyError(f"`sample_rate` must be in (0, 1], found {sample_rate!r}.")
    z = float(noise_multiplier)
    if not z > 0 or math.isinf(z):
        raise PrivacyError(f"`noise_multiplier` must be a finite number > 0, found {noise_multiplier!r}.")
    return np.asarray(_rdp_one_step(q, z, tuple(float(a) for a in orders)))


@checked
def classic_rdp_to_epsilon(orders: Sequence[float], rdp: Sequence[float], delta: float) -> float:
    """The classic RDP → (ε, δ) conversion ε = min_α [RDP(α) − log δ/(α − 1)] (Mironov 2017, Prop. 3)."""
    if not 0.0 < float(delta) < 1.0:
        raise PrivacyError(f"`delta` must be in (0, 1), found {delta!r}.")
    a = np.asarray(orders, dtype=np.float64)
    r = np.asarray(rdp, dtype=np.float64)
    if a.shape != r.shape or np.any(a <= 1):
        raise PrivacyError(f"`orders` must be > 1 and match `rdp` in length, found {a.size} orders, {r.size} RDP.")
    return float(np.nanmin(r - math.log(float(delta)) / (a - 1.0)))


@checked
def rhdp_epsilon(noise_multiplier: float, sample_rate: float, steps: float, delta: float,
                 orders: Sequence[float] = RHDP_ORDERS) -> float:
    """ε of ``steps`` (a real number, as in the paper's code) Poisson-sampled Gaussian steps, classic conversion."""
    if not float(steps) >= 0:
        raise PrivacyError(f"`steps` must be >= 0, found {steps!r}.")
    rdp = float(steps) * rdp_poisson_gaussian(sample_rate, noise_multiplier, orders)
    return classic_rdp_to_epsilon(orders, rdp, delta)


@checked
def calibrate_z(epsilon: float, sample_rate: float, steps: float, delta: float = 1e-4,
                round_decimals: Optional[int] = 2, method: str = "bisect") -> float:
    """The noise multiplier z with ε(z) = ``epsilon`` (within 1e-6) under :func:`rhdp_epsilon`.

    Args:
      method: ``"bisect"`` reproduces the paper's loop (midpoint of [0.001, 1000] until |ε − target| <= 1e-6);
        ``"secant"`` finds a z meeting the same stopping rule with Illinois regula falsi in a few times fewer
        evaluations (equal after rounding except when the root sits on a rounding boundary).
      round_decimals: z is rounded to this many decimals (paper: 2); ``None`` keeps the raw root.

    Raises:
      PrivacyError: bad arguments, or no z in [0.001, 1000] reaches ``epsilon``.
    """
    eps = float(epsilon)
    if not eps > 0 or math.isinf(eps):
        raise PrivacyError(f"`epsilon` must be a finite number > 0, found {epsilon!r}.")
    if method not in ("bisect", "secant"):
        raise PrivacyError(f"`method` must be 'bisect' or 'secant', found {method!r}.")

    def gap(z: float) -> float:
        return rhdp_epsilon(z, sample_rate, steps, delta) - eps

    lo, hi = Z_BRACKET
    if gap(hi) > EPS_TOL:
        raise PrivacyError(f"ε = {eps:g} is out of reach: even z = {hi:g} spends more (q = {sample_rate}, "
                           f"steps = {steps}, δ = {delta}).")
    if method == "secant":
        z = solve_decreasing(lambda x: gap(x) + eps, eps + EPS_TOL, tol=2 * EPS_TOL, lo=1.0, hi=4.0,
                             lo_limit=lo, hi_limit=hi, name="z")
    else:
        z = 0.5 * (lo + hi)
        g = gap(z)
        for _ in range(200):
            if abs(g) <= EPS_TOL:
                break
            if g > 0:
                lo = z
            else:
                hi = z
            z = 0.5 * (lo + hi)
            g = gap(z)
        else:
            raise PrivacyError(f"Bisection for ε = {eps:g} did not reach |ε(z) − ε| <= {EPS_TOL} in 200 steps; "
                               f"the target may need z < {Z_BRACKET[0]}.")
    return round(z, round_decimals) if round_decimals is not None else z


@checked
def compute_z(epsilon: float, dataset_size: int, batch_size: int, local_epochs: int = 1,
              global_rounds: int = 200, delta: float = 1e-4, round_decimals: Optional[int] = 2,
              method: str = "bisect") -> float:
    """Robust-HDP's ``compute_z``: q = b/N, steps = K·E·N/b (no ceil), then :func:`calibrate_z`.

    Args:
      epsilon: the client's target ε_i.
      dataset_size: N_i.
      batch_size: b_i (expected Poisson batch size).
      local_epochs: K_i.
      global_rounds: E, the total *planned* rounds (the paper's code uses 200 while running 199).
      delta: δ_i (paper: 1e-4).
    """
    for name, value in (("dataset_size", dataset_size), ("batch_size", batch_size),
                        ("local_epochs", local_epochs), ("global_rounds", global_rounds)):
        if not isinstance(value, numbers.Integral) or value < 1:
            raise PrivacyError(f"`{name}` must be an integer >= 1, found {value!r}.")
    if batch_size > dataset_size:
        raise PrivacyError(f"`batch_size` must be <= dataset_size = {dataset_size}, found {batch_size}.")
    q = batch_size / dataset_size
    steps = local_epochs * global_rounds * dataset_size / batch_size
    return calibrate_z(epsilon, q, steps, delta, round_decimals, method)
