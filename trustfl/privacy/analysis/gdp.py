"""μ-Gaussian differential privacy (Dong, Roth & Su 2022, https://arxiv.org/abs/1905.02383), as DPZV uses it.

A mechanism is μ-GDP when distinguishing neighbours is no easier than telling N(0, 1) from N(μ, 1).

- Gaussian mechanism with noise multiplier σ (noise std σ·Δ₂), composed T times: μ = √T / σ
  (GDP composition: μ_tot = √(Σ μ_t²)).
- Conversion (Dong et al. Cor. 2.13; DPZV eq. 11), exact for μ-GDP:
  δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).
- Poisson-subsampled Gaussian, CLT form (Bu, Dong, Long & Su 2020, https://arxiv.org/abs/1911.11607):
  μ = q·√(T·(e^{1/σ²} − 1)); DPZV's Thm C.2 uses its first-order form μ = q·√T/σ (σ ≫ 1), which is
  optimistic for small σ.
- DPZV noise (Thm 6.1): σ_dp = 2C√T / (D·μ) for the released Δ scalars (sensitivity 2C/B, rate B/D).

Example:
  >>> round(mu_from_epsilon(1.0, 1e-5), 4)
  0.2681
  >>> abs(delta_from_mu(1.0, mu_from_epsilon(1.0, 1e-5)) - 1e-5) < 1e-12
  True
"""
from __future__ import annotations

import math

from trustfl.errors import PrivacyError
from trustfl.privacy.analysis.checked import checked

__all__ = ["delta_from_mu", "dpzv_noise_std", "epsilon_from_mu", "mu_from_epsilon", "mu_gaussian",
           "mu_poisson_clt", "mu_poisson_clt_first_order"]


def _positive(name: str, value: float) -> float:
    v = float(value)
    if not v > 0 or math.isinf(v):
        raise PrivacyError(f"`{name}` must be a finite number > 0, found {value!r}.")
    return v


def _delta_in_01(delta: float) -> float:
    d = float(delta)
    if not 0.0 < d < 1.0:
        raise PrivacyError(f"`delta` must be in (0, 1), found {delta!r}.")
    return d


@checked
def mu_gaussian(noise_multiplier: float, steps: int = 1) -> float:
    """μ of ``steps`` compositions of the Gaussian mechanism with noise multiplier σ: μ = √T / σ."""
    sigma = _positive("noise_multiplier", noise_multiplier)
    if int(steps) != steps or steps < 0:
        raise PrivacyError(f"`steps` must be an integer >= 0, found {steps!r}.")
    return math.sqrt(steps) / sigma


@checked
def mu_poisson_clt(noise_multiplier: float, sample_rate: float, steps: int) -> float:
    """CLT μ of T Poisson-subsampled Gaussian steps: μ = q·√(T·(e^{1/σ²} − 1)) (Bu et al. 2020, Thm 4)."""
    sigma = _positive("noise_multiplier", noise_multiplier)
    if not 0.0 <= float(sample_rate) <= 1.0:
        raise PrivacyError(f"`sample_rate` must be in [0, 1], found {sample_rate!r}.")
    return float(sample_rate) * math.sqrt(steps * math.expm1(1.0 / sigma**2))


@checked
def mu_poisson_clt_first_order(noise_multiplier: float, sample_rate: float, steps: int) -> float:
    """DPZV's Thm C.2 form μ = q·√T/σ: the σ → ∞ limit of :func:`mu_poisson_clt` (optimistic for small σ)."""
    sigma = _positive("noise_multiplier", noise_multiplier)
    return float(sample_rate) * math.sqrt(steps) / sigma


@checked
def delta_from_mu(epsilon: float, mu: float) -> float:
    """δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) for a μ-GDP mechanism (DPZV eq. 11).

    The second term is computed as exp(ε + log Φ(·)) so that large ε neither overflows nor cancels badly.
    """
    eps = float(epsilon)
    if not eps >= 0:
        raise PrivacyError(f"`epsilon` must be >= 0, found {epsilon!r}.")
    m = float(mu)
    if not m >= 0:
        raise PrivacyError(f"`mu` must be >= 0, found {mu!r}.")
    if m == 0.0:
        return 0.0
    if math.isinf(m):
        return 1.0
    if math.isinf(eps):  # no failure probability is left at ε = ∞
        return 0.0
    from scipy import special

    first = special.ndtr(-eps / m + m / 2.0)
    second = math.exp(eps + special.log_ndtr(-eps / m - m / 2.0))
    return float(min(1.0, max(0.0, first - second)))


@checked
def epsilon_from_mu(mu: float, delta: float) -> float:
    """The smallest ε with δ(ε; μ) <= ``delta``: a 1-D root find (δ is decreasing in ε)."""
    m = float(mu)
    if not m >= 0:
        raise PrivacyError(f"`mu` must be >= 0, found {mu!r}.")
    d = _delta_in_01(delta)
    if delta_from_mu(0.0, m) <= d:
        return 0.0
    hi = max(1.0, m * m)
    while math.isinf(hi) or delta_from_mu(hi, m) > d:
        if math.isinf(hi):  # μ = ∞ (no noise) or so large (μ² overflows) that no finite ε is found: no privacy
            return math.inf
        hi *= 2.0
    from scipy import optimize

    return float(optimize.brentq(lambda e: delta_from_mu(e, m) - d, 0.0, hi, xtol=1e-12, rtol=1e-12))


@checked
def mu_from_epsilon(epsilon: float, delta: float) -> float:
    """The largest μ whose mechanism is (ε, δ)-DP: root of δ(ε; μ) = δ on [1e-6, 50] (δ is increasing in μ)."""
    eps = float(epsilon)
    if not eps >= 0 or math.isinf(eps):
        raise PrivacyError(f"`epsilon` must be a finite number >= 0, found {epsilon!r}.")
    d = _delta_in_01(delta)
    lo, hi = 1e-6, 50.0
    if delta_from_mu(eps, hi) < d:
        raise PrivacyError(f"(ε, δ) = ({eps:g}, {d:g}) allows μ > 50; no useful GDP calibration.")
    if delta_from_mu(eps, lo) > d:
        raise PrivacyError(f"(ε, δ) = ({eps:g}, {d:g}) needs μ < 1e-6; raise ε or δ.")
    from scipy import optimize

    return float(optimize.brentq(lambda m: delta_from_mu(eps, m) - d, lo, hi, xtol=1e-14, rtol=1e-12))


@checked
def dpzv_noise_std(clip_norm: float, steps: int, dataset_size: int, mu: float) -> float:
    """DPZV's noise std σ_dp = 2C√T / (D·μ) (Thm 6.1), i.e. q·(2C/B)·√T/μ with q = B/D.

    Args:
      clip_norm: C, the clipping bound of each scalar δ_i (sensitivity 2C/B under replace-one).
      steps: T, the total number of server iterations.
      dataset_size: D, the number of training samples.
      mu: the target μ (see :func:`mu_from_epsilon`).
    """
    c = _positive("clip_norm", clip_norm)
    m = _positive("mu", mu)
    n = _positive("dataset_size", dataset_size)
    if int(steps) != steps or steps < 0:
        raise PrivacyError(f"`steps` must be an integer >= 0, found {steps!r}.")
    return 2.0 * c * math.sqrt(steps) / (n * m)
