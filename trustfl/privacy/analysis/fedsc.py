"""Privacy of FedSC's shared correlation matrices (DP-CalR, Algorithm 2; Sec. 6.1 of the FedSC paper).

One release of client j is the Gaussian mechanism on the vectorised matrix (1/(|D_j|V)) Σ_{x̄,v} ž_v ž_vᵀ with
‖ž_v ž_vᵀ‖_F <= μ and noise N(0, σ² I_{H²}); |D_j| is public. Its L2 sensitivity Δ is

- ``"replace_one"`` (default): Δ = √2·μ/|D_j|. Replacing one sample changes one term A (PSD, ‖A‖_F <= μ) into
  another, B; ‖A − B‖_F² = ‖A‖² + ‖B‖² − 2Tr(AB) <= 2μ² since Tr(AB) >= 0. This Δ reproduces Table 6 of the
  paper (its ε values correspond to √2·μ/|D_j|).
- ``"zero_out"``: Δ = μ/|D_j|, one sample's term removed with |D_j| fixed (the proof of Prop. 6.6).

RDP of one release (Lemma 6.3): (α, αΔ²/(2σ²)); after client j's T_j releases (Lemma 6.4, t = 1 included):
(α, T_j αΔ²/(2σ²)), computed from the noise multiplier z = σ/Δ as T_j α/(2z²) (σ² alone underflows for σ below
about 1e-154, where σ/Δ need not). Conversions to (ε, δ):

- ``"closed_form"`` (Lemma 6.5 at the optimal real order, the proof of Prop. 6.6; the printed proposition omits
  |D_j|²): ε = T_jΔ²/(2σ²) + √(2T_jΔ² log(1/δ)/σ²). Inverse: with s = √(2 log(1/δ)) and a = −s + √(s² + 2ε),
  σ = √T_j·Δ/a (:func:`fedsc_sigma_closed_form`).
- ``"rdp"``: dp_accounting's RDP accountant (integer orders, the conversion of Balle et al. 2020, tighter) on the
  Gaussian event with noise multiplier σ/Δ composed T_j times (what trustfl's ledgers compute, :func:`release_event`).

Example:
  >>> round(calibrate_fedsc_sigma(6.0, 1e-2, mu=2.0, dataset_size=10_000, releases=100), 5)   # Table 6, SVHN
  0.0018
"""
from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

from trustfl.errors import PrivacyError
from trustfl.privacy.analysis.checked import checked
from trustfl.privacy.analysis.gaussian import epsilon_subsampled_gaussian, solve_decreasing
from trustfl.privacy.analysis.secldp import mironov_epsilon

if TYPE_CHECKING:
    from dp_accounting import dp_event

NEIGHBORINGS = ("replace_one", "zero_out")
CONVERSIONS = ("closed_form", "rdp")
_MIN_Z = 1e-150
"""The smallest σ/Δ whose closed-form ε float64 holds (1/(2z²) overflows below about 1e-154)."""

__all__ = ["CONVERSIONS", "NEIGHBORINGS", "calibrate_fedsc_sigma", "fedsc_epsilon", "fedsc_rdp",
           "fedsc_sensitivity", "fedsc_sigma_closed_form", "release_event"]


def _positive(name: str, value: float) -> float:
    v = float(value)
    if not v > 0 or math.isinf(v):
        raise PrivacyError(f"`{name}` must be a finite number > 0, found {value!r}.")
    return v


def _count(name: str, value: int, low: int) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
        raise PrivacyError(f"`{name}` must be an integer >= {low}, found {value!r}.")
    return int(value)


def _delta(delta: float) -> float:
    d = float(delta)
    if not 0.0 < d < 1.0:
        raise PrivacyError(f"`delta` must be in (0, 1), found {delta!r}.")
    return d


def fedsc_sensitivity(mu: float, dataset_size: int, neighboring: str = "replace_one") -> float:
    """Δ of one DP-CalR release: √2·μ/|D_j| (``"replace_one"``) or μ/|D_j| (``"zero_out"``)."""
    m = _positive("mu", mu)
    n = _count("dataset_size", dataset_size, 1)
    if neighboring not in NEIGHBORINGS:
        raise PrivacyError(f"`neighboring` must be one of {NEIGHBORINGS}, found {neighboring!r}.")
    return (math.sqrt(2.0) if neighboring == "replace_one" else 1.0) * m / n


@checked
def fedsc_rdp(order: float, sigma: float, mu: float, dataset_size: int, releases: int,
              neighboring: str = "replace_one") -> float:
    """RDP of ``releases`` = T_j releases at order α > 1: T_j·α·Δ²/(2σ²) (Lemmas 6.3-6.4)."""
    a = float(order)
    if not a > 1 or math.isinf(a):
        raise PrivacyError(f"`order` must be a finite number > 1, found {order!r}.")
    s = _positive("sigma", sigma)
    t = _count("releases", releases, 0)
    z = s / fedsc_sensitivity(mu, dataset_size, neighboring)
    return t * a / (2.0 * z * z)


def release_event(sigma: float, mu: float, dataset_size: int, neighboring: str = "replace_one") -> dp_event.DpEvent:
    """One release as a dp_accounting event: ``GaussianDpEvent(σ/Δ)`` (RDP α/(2(σ/Δ)²), as Lemma 6.3)."""
    from dp_accounting import dp_event

    return dp_event.GaussianDpEvent(_positive("sigma", sigma) / fedsc_sensitivity(mu, dataset_size, neighboring))


@checked
def fedsc_epsilon(sigma: float, mu: float, dataset_size: int, releases: int, delta: float,
                  neighboring: str = "replace_one", conversion: str = "closed_form") -> float:
    """ε at ``delta`` of a client's ``releases`` DP-CalR releases (T_j; 0 gives ε = 0).

    Args:
      sigma: σ > 0, the noise std per matrix entry.
      mu: μ > 0, the clipping bound of each term's Frobenius norm (representations clipped to √μ).
      dataset_size: |D_j| >= 1.
      releases: T_j >= 0, the rounds in which client j ran DP-CalR (t = 1 included).
      delta: δ in (0, 1).
      neighboring: ``"replace_one"`` or ``"zero_out"`` (see the module notes).
      conversion: ``"closed_form"`` (Lemma 6.5) or ``"rdp"`` (dp_accounting).

    Raises:
      PrivacyError: an argument is out of range, or the closed form's ε is beyond float64 (σ/Δ < 1e-150).
    """
    s = _positive("sigma", sigma)
    d = _delta(delta)
    t = _count("releases", releases, 0)
    z = s / fedsc_sensitivity(mu, dataset_size, neighboring)
    if conversion not in CONVERSIONS:
        raise PrivacyError(f"`conversion` must be one of {CONVERSIONS}, found {conversion!r}.")
    if t == 0:
        return 0.0
    if conversion == "closed_form":
        if z < _MIN_Z:
            raise PrivacyError(f"`sigma` = {sigma!r} is {z:g} times Δ: the closed form's ε is beyond float64 (σ/Δ "
                               f"must be >= {_MIN_Z:g}).")
        return mironov_epsilon(1.0 / (2.0 * z * z), t, d)
    return epsilon_subsampled_gaussian(z, 1.0, t, d, "rdp")


@checked
def fedsc_sigma_closed_form(epsilon: float, delta: float, mu: float, dataset_size: int, releases: int,
                            neighboring: str = "replace_one") -> float:
    """σ = √T_j·Δ/a with a = −s + √(s² + 2ε), s = √(2 log(1/δ)): the exact inverse of the closed form."""
    eps = _positive("epsilon", epsilon)
    s = math.sqrt(2.0 * math.log(1.0 / _delta(delta)))
    a = 2.0 * eps / (s + math.sqrt(s * s + 2.0 * eps))   # = −s + √(s² + 2ε), without cancellation
    t = _count("releases", releases, 1)
    return math.sqrt(t) * fedsc_sensitivity(mu, dataset_size, neighboring) / a


@checked
def calibrate_fedsc_sigma(epsilon: float, delta: float, mu: float, dataset_size: int, releases: int,
                          neighboring: str = "replace_one", conversion: str = "closed_form",
                          rtol: float = 1e-12) -> float:
    """The σ whose ε (same conversion) lies in [ε(1 − rtol), ε]: a 1-D root find on the noise multiplier σ/Δ.

    Raises:
      PrivacyError: an argument is out of range, or no σ/Δ in [1e-3, 1e6] reaches ``epsilon``.
    """
    eps = _positive("epsilon", epsilon)
    d = _delta(delta)
    t = _count("releases", releases, 1)
    tol = _positive("rtol", rtol) * eps
    delta_2 = fedsc_sensitivity(mu, dataset_size, neighboring)
    if conversion not in CONVERSIONS:
        raise PrivacyError(f"`conversion` must be one of {CONVERSIONS}, found {conversion!r}.")

    def eps_of(z: float) -> float:
        return fedsc_epsilon(z * delta_2, mu, dataset_size, t, d, neighboring, conversion)

    z = solve_decreasing(eps_of, eps, tol=tol, lo=1.0, hi=4.0, name="noise multiplier σ/Δ")
    return z * delta_2
