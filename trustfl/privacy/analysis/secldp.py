"""SecLDP accounting for CafCor (Allouah, Guerraoui & Stephan; Lemma A.4, Thm 4.1, Cor. 4.1).

User-level, replace-one adjacency (inputs differ by 2C). One step of CafCor, seen by a server that colludes with
q <= f of the f malicious workers, is (α, α·ε_step)-RDP for every α > 1 with (Lemma A.4)

    ε_step = 2C² / ((n−q)σ_cor² + σ_ind²) · [1 + σ_cor² / ((f−q)σ_cor² + σ_ind²)].

It is the Rényi divergence (α/2)·ΔᵀΣ⁻¹Δ of two Gaussians, so one step is *exactly* a Gaussian mechanism with
noise multiplier z_eff = 1/√(2ε_step) (:func:`equivalent_noise_multiplier`); that is how the step is handed to
dp_accounting (events, RDP and PLD accountants). Σ is positive definite iff (f−q)σ_cor² + σ_ind² > 0; otherwise
the server can cancel all noise and there is no privacy (refused with :class:`PrivacyError`).

Threat models (who knows which secrets):

- ``"secldp"``: q colluding workers (default q = 0); the paper's experiments use σ_ind = 0.
- ``"byzldp"``: q = f, all malicious workers collude; needs σ_ind > 0 (Cor. 4.1 uses σ_ind = σ_cor).
- ``"ldp"``: the server knows every secret, so correlated noise is removed: ε_step = 2C²/σ_ind².
- ``"cdp"``: a trusted server, only the aggregate is released: ε_step = 2C²/s² with s = √(n−f)·σ_ind the noise
  std on the honest sum (docs/papers/cafcor.md, "Central DP"; correlated noise is not counted, which can only
  overstate ε).

Composition over T steps is plain RDP composition, RDP(α) = Tαε_step, with no subsampling amplification
(Thm 4.1 uses the sensitivity of the whole clipped gradient). Conversions to (ε, δ):

- ``"mironov"`` (the paper's proof): ε = Tε_step + 2√(Tε_step·log(1/δ)), the optimum over real α > 1.
- ``"opacus"`` (the paper's Sec. 5, what the experiments ran): dp_accounting's RDP accountant at the Opacus orders
  {1 + x/10 : x = 1..99} ∪ {12..63} with ε = min_α [Tαε_step + log((α−1)/α) − (log δ + log α)/(α−1)].
- ``"pld"``: dp_accounting's PLD accountant on the equivalent Gaussian (exact up to discretization).

Example:
  >>> round(lemma_a4_step(1.0, 100, 5, 5, 1.0, 1.0), 6) == round(4 / 96, 6)   # q = f, σ_ind = σ_cor
  True
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from trustfl.errors import PrivacyError
from trustfl.privacy.analysis.checked import checked
from trustfl.privacy.analysis.gaussian import calibrate_noise_multiplier, epsilon_subsampled_gaussian

if TYPE_CHECKING:
    from dp_accounting import dp_event

THREAT_MODELS = ("cdp", "secldp", "byzldp", "ldp")
CONVERSIONS = ("mironov", "opacus", "pld")
OPACUS_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))
"""Opacus' default RDP orders, used by the ``"opacus"`` conversion."""

__all__ = ["CONVERSIONS", "OPACUS_ORDERS", "THREAT_MODELS", "SecLdpNoise", "calibrate_secldp", "calibrate_step",
           "corollary_4_1_sigma", "equivalent_noise_multiplier", "lemma_a4_step", "mironov_epsilon",
           "secldp_epsilon", "step_event", "threat_model_step"]


def _check_counts(num_workers: int, num_byzantine: int, num_colluding: int) -> None:
    for name, value in (("num_workers", num_workers), ("num_byzantine", num_byzantine),
                        ("num_colluding", num_colluding)):
        if not isinstance(value, numbers.Integral) or value < 0:
            raise PrivacyError(f"`{name}` must be an integer >= 0, found {value!r}.")
    if not 0 <= num_colluding <= num_byzantine < num_workers:
        raise PrivacyError(f"Need 0 <= num_colluding <= num_byzantine < num_workers, found q = {num_colluding}, "
                           f"f = {num_byzantine}, n = {num_workers}.")


def _nonneg(name: str, value: float) -> float:
    v = float(value)
    if not v >= 0 or math.isinf(v):
        raise PrivacyError(f"`{name}` must be a finite number >= 0, found {value!r}.")
    return v


@checked
def lemma_a4_step(clip_norm: float, num_workers: int, num_byzantine: int, num_colluding: int,
                  sigma_cor: float, sigma_ind: float) -> float:
    """ε_step of Lemma A.4: one step is (α, α·ε_step)-SecRDP against a server colluding with q workers.

    ε_step = 2C² / ((n−q)σ_cor² + σ_ind²) · [1 + σ_cor² / ((f−q)σ_cor² + σ_ind²)].

    Raises:
      PrivacyError: invalid counts (need 0 <= q <= f < n), C <= 0, negative σ, or a degenerate setting with
        (f−q)σ_cor² + σ_ind² = 0 (e.g. f = q or f = 0 with σ_ind = 0), where Σ is singular and there is no
        privacy.
    """
    _check_counts(num_workers, num_byzantine, num_colluding)
    c = float(clip_norm)
    if not c > 0 or math.isinf(c):
        raise PrivacyError(f"`clip_norm` must be a finite number > 0, found {clip_norm!r}.")
    s_cor2 = _nonneg("sigma_cor", sigma_cor) ** 2
    s_ind2 = _nonneg("sigma_ind", sigma_ind) ** 2
    residual = (num_byzantine - num_colluding) * s_cor2 + s_ind2
    if not residual > 0:
        raise PrivacyError(
            f"No privacy: (f − q)·σ_cor² + σ_ind² = 0 with f = {num_byzantine}, q = {num_colluding}, "
            f"σ_cor = {sigma_cor!r}, σ_ind = {sigma_ind!r}; the server can cancel all correlated noise. Use "
            f"σ_ind > 0 (or q < f with σ_cor > 0).")
    return 2.0 * c * c / ((num_workers - num_colluding) * s_cor2 + s_ind2) * (1.0 + s_cor2 / residual)


@checked
def threat_model_step(threat_model: str, clip_norm: float, num_workers: int, num_byzantine: int,
                      sigma_cor: float, sigma_ind: float, num_colluding: Optional[int] = None) -> float:
    """ε_step (RDP slope per step) under a named threat model; see the module docstring.

    Args:
      threat_model: ``"secldp"`` (q = ``num_colluding``, default 0), ``"byzldp"`` (q = f), ``"ldp"`` or
        ``"cdp"`` (n − f honest workers, noise std √(n−f)·σ_ind on the sum).
      num_colluding: q for ``"secldp"`` only.
    """
    if threat_model not in THREAT_MODELS:
        raise PrivacyError(f"`threat_model` must be one of {THREAT_MODELS}, found {threat_model!r}.")
    if num_colluding is not None and threat_model != "secldp":
        raise PrivacyError(f"`num_colluding` applies to threat_model='secldp' only, found {threat_model!r}.")
    if threat_model == "secldp":
        return lemma_a4_step(clip_norm, num_workers, num_byzantine, num_colluding or 0, sigma_cor, sigma_ind)
    if threat_model == "byzldp":
        return lemma_a4_step(clip_norm, num_workers, num_byzantine, num_byzantine, sigma_cor, sigma_ind)
    _check_counts(num_workers, num_byzantine, 0)
    s_ind = _nonneg("sigma_ind", sigma_ind)
    if s_ind == 0:
        raise PrivacyError(f"No privacy: threat_model={threat_model!r} needs sigma_ind > 0, found {sigma_ind!r}.")
    c = float(clip_norm)
    if not c > 0 or math.isinf(c):
        raise PrivacyError(f"`clip_norm` must be a finite number > 0, found {clip_norm!r}.")
    honest = num_workers - num_byzantine if threat_model == "cdp" else 1
    return 2.0 * c * c / (honest * s_ind**2)


@checked
def equivalent_noise_multiplier(step: float) -> float:
    """z_eff = 1/√(2ε_step): the Gaussian mechanism with the same Rényi divergences as one step."""
    s = float(step)
    if not s > 0 or math.isinf(s):
        raise PrivacyError(f"`step` (ε_step) must be a finite number > 0, found {step!r}.")
    return 1.0 / math.sqrt(2.0 * s)


@checked
def step_event(step: float) -> dp_event.GaussianDpEvent:
    """The dp_accounting event of one CafCor step: a Gaussian with noise multiplier z_eff (exact)."""
    from dp_accounting import dp_event

    return dp_event.GaussianDpEvent(equivalent_noise_multiplier(step))


@checked
def mironov_epsilon(step: float, steps: int, delta: float) -> float:
    """ε = Tε_step + 2√(Tε_step·log(1/δ)) (Mironov's conversion at the optimal real order)."""
    if not 0.0 < float(delta) < 1.0:
        raise PrivacyError(f"`delta` must be in (0, 1), found {delta!r}.")
    x = _nonneg("step", step) * steps
    return x + 2.0 * math.sqrt(x * math.log(1.0 / float(delta)))


@checked
def secldp_epsilon(step: float, steps: int, delta: float, conversion: str = "opacus") -> float:
    """ε at ``delta`` after ``steps`` CafCor steps of RDP slope ``step`` (Thm 4.1 composition)."""
    if conversion not in CONVERSIONS:
        raise PrivacyError(f"`conversion` must be one of {CONVERSIONS}, found {conversion!r}.")
    if not isinstance(steps, numbers.Integral) or steps < 0:
        raise PrivacyError(f"`steps` must be an integer >= 0, found {steps!r}.")
    if conversion == "mironov":
        return mironov_epsilon(step, steps, delta)
    z = equivalent_noise_multiplier(step)
    if conversion == "opacus":
        return epsilon_subsampled_gaussian(z, 1.0, steps, delta, "rdp", orders=OPACUS_ORDERS)
    return epsilon_subsampled_gaussian(z, 1.0, steps, delta, "pld")


@checked
def calibrate_step(epsilon: float, delta: float, steps: int, conversion: str = "opacus",
                   tol: float = 1e-4) -> float:
    """The largest ε_step whose T-step composition is (ε, δ)-DP (ε within ``tol`` below the target).

    ``"mironov"`` inverts in closed form: ε_step = (√(log(1/δ) + ε) − √log(1/δ))² / T.
    """
    if conversion not in CONVERSIONS:
        raise PrivacyError(f"`conversion` must be one of {CONVERSIONS}, found {conversion!r}.")
    eps = float(epsilon)
    if not eps > 0 or math.isinf(eps):
        raise PrivacyError(f"`epsilon` must be a finite number > 0, found {epsilon!r}.")
    if not 0.0 < float(delta) < 1.0:
        raise PrivacyError(f"`delta` must be in (0, 1), found {delta!r}.")
    if not isinstance(steps, numbers.Integral) or steps < 1:
        raise PrivacyError(f"`steps` must be an integer >= 1, found {steps!r}.")
    if conversion == "mironov":
        log_inv = math.log(1.0 / float(delta))
        return (math.sqrt(log_inv + eps) - math.sqrt(log_inv)) ** 2 / steps
    accountant, orders = ("rdp", OPACUS_ORDERS) if conversion == "opacus" else ("pld", None)
    z = calibrate_noise_multiplier(eps, delta, 1.0, steps, accountant, tol=tol, orders=orders)
    return 1.0 / (2.0 * z * z)


@dataclass(frozen=True)
class SecLdpNoise:
    """Calibrated CafCor noise: per-coordinate stds of each pairwise term and of the independent term."""

    sigma_cor: float
    sigma_ind: float
    step: float
    """ε_step (RDP slope per step) of this noise under its threat model."""

    def __post_init__(self) -> None:
        for name in ("sigma_cor", "sigma_ind", "step"):
            _nonneg(name, getattr(self, name))


_DEFAULT_RATIO = {"secldp": 0.0, "byzldp": 1.0}


@checked
def calibrate_secldp(threat_model: str, epsilon: float, delta: float, steps: int, clip_norm: float,
                     num_workers: int, num_byzantine: int, *, num_colluding: Optional[int] = None,
                     ind_to_cor: Optional[float] = None, conversion: str = "opacus",
                     tol: float = 1e-4) -> SecLdpNoise:
    """Noise that makes T CafCor steps (ε, δ)-private under ``threat_model``.

    ε_step is homogeneous of degree −2 in (σ_cor, σ_ind), so with a fixed ratio r = σ_ind/σ_cor the scale is
    σ_cor = √(ε_step(1, r) / ε_step*) where ε_step* = :func:`calibrate_step`.

    Args:
      threat_model: ``"secldp"``, ``"byzldp"``, ``"ldp"`` or ``"cdp"``.
      ind_to_cor: r = σ_ind/σ_cor for ``secldp`` (default 0, the paper's Fig. 1) and ``byzldp`` (default 1,
        Cor. 4.1). ``ldp`` and ``cdp`` use σ_cor = 0 (for ``cdp`` σ_ind is per worker: sum std / √(n−f)).

    Raises:
      PrivacyError: invalid arguments, or a degenerate setting (``byzldp`` with r = 0; ``secldp`` with r = 0
        and f = q, including f = 0).
    """
    if threat_model not in THREAT_MODELS:
        raise PrivacyError(f"`threat_model` must be one of {THREAT_MODELS}, found {threat_model!r}.")
    if threat_model in _DEFAULT_RATIO:
        ratio = _DEFAULT_RATIO[threat_model] if ind_to_cor is None else _nonneg("ind_to_cor", ind_to_cor)
        unit = threat_model_step(threat_model, clip_norm, num_workers, num_byzantine, 1.0, ratio, num_colluding)
        target = calibrate_step(epsilon, delta, steps, conversion, tol)
        scale = math.sqrt(unit / target)
        return SecLdpNoise(sigma_cor=scale, sigma_ind=ratio * scale, step=target)
    if ind_to_cor is not None:
        raise PrivacyError(f"`ind_to_cor` applies to 'secldp' and 'byzldp' only, found {threat_model!r}.")
    unit = threat_model_step(threat_model, clip_norm, num_workers, num_byzantine, 0.0, 1.0, num_colluding)
    target = calibrate_step(epsilon, delta, steps, conversion, tol)
    return SecLdpNoise(sigma_cor=0.0, sigma_ind=math.sqrt(unit / target), step=target)


@checked
def corollary_4_1_sigma(epsilon: float, delta: float, steps: int, clip_norm: float, num_workers: int,
                        num_byzantine: int) -> float:
    """Cor. 4.1's closed-form worst-case (q = f) calibration σ_cor = σ_ind = √(32C²T·log(1/δ) / (ε²(n−f))).

    A sufficient condition from Thm 4.1 (stated for ε < log(1/δ)); looser than :func:`calibrate_secldp`.
    """
    _check_counts(num_workers, num_byzantine, 0)
    eps = float(epsilon)
    if not eps > 0:
        raise PrivacyError(f"`epsilon` must be > 0, found {epsilon!r}.")
    if not 0.0 < float(delta) < 1.0:
        raise PrivacyError(f"`delta` must be in (0, 1), found {delta!r}.")
    c = float(clip_norm)
    return math.sqrt(32.0 * c * c * steps * math.log(1.0 / float(delta)) / (eps**2 * (num_workers - num_byzantine)))
