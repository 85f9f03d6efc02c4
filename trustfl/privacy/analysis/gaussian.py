"""(ε, δ) of the (subsampled) Gaussian mechanism through dp_accounting, and noise calibration.

Pure functions: nothing here keeps state. The RDP and PLD analyses are dp_accounting's; this module only builds
the event, picks the accountant and inverts ε(z) for calibration.

- RDP (Mironov 2017, https://arxiv.org/abs/1702.07476; sampled Gaussian: Mironov, Talwar & Zhang 2019,
  https://arxiv.org/abs/1908.10530) with dp_accounting's default orders and its improved RDP → (ε, δ)
  conversion ε = min_α [RDP(α) + log(1 − 1/α) − log(δα)/(α − 1)] (Balle et al. 2020,
  https://arxiv.org/abs/2004.00010, Prop. 12).
- PLD (Koskela et al.; Doroshenko et al. 2022, https://arxiv.org/abs/2207.04380), value discretization 1e-4
  (1e-3 overstates small ε).
- μ-GDP (Dong, Roth & Su 2022, https://arxiv.org/abs/1905.02383): ``"gdp"`` (DPZV's Thm C.2 first-order form of
  the Poisson-subsampled Gaussian) and ``"gdp_clt"`` (Bu et al. 2020's CLT, Thm 4), both
  :class:`~trustfl.privacy.analysis.gdp_accountant.GdpAccountant`; Poisson sampling only.

Example:
  >>> eps = epsilon_subsampled_gaussian(1.1, 0.01, 1000, 1e-5)
  >>> z = calibrate_noise_multiplier(eps, 1e-5, 0.01, 1000)
  >>> abs(z - 1.1) < 1e-3
  True
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from trustfl.errors import PrivacyError, UnsupportedEventError
from trustfl.privacy.analysis.checked import checked

if TYPE_CHECKING:  # dp_accounting (and scipy behind it) is imported by the functions that use it
    from dp_accounting import dp_event
    from dp_accounting.privacy_accountant import PrivacyAccountant

ACCOUNTANTS = ("rdp", "pld", "gdp", "gdp_clt")
GDP_FORMS = {"gdp": "first_order", "gdp_clt": "clt"}
"""trustfl's GDP accountant names → the :class:`~trustfl.privacy.analysis.gdp_accountant.GdpAccountant` form."""
SAMPLINGS = ("poisson", "without_replacement")
NEIGHBORINGS = {"add_remove": "ADD_OR_REMOVE_ONE", "replace_one": "REPLACE_ONE"}
"""trustfl's name of each neighbouring relation → the member of dp_accounting's ``NeighboringRelation``."""
PLD_DISCRETIZATION = 1e-4
"""Value discretization interval of every PLD accountant trustfl builds."""

PLD_MAX_LOSS_RANGE = 200.0
"""Largest privacy-loss range ``1/(2z²) + 8/z`` (a Gaussian's loss over ±8σ) the PLD accountant is asked to
discretise: its grid holds about range / :data:`PLD_DISCRETIZATION` values per composition, and the time grows with
it (q = 0.01, 1000 steps, on a 2-core Xeon: z = 0.15, range 75, 14 s; z = 0.1, range 130, 31 s; z = 0.01, range 5800,
unfinished after 400 s). Beyond it ε is in the hundreds: refused, pointing to the RDP accountant."""
DEFAULT_RDP_ORDERS = tuple(range(2, 65)) + (80, 96, 128, 192, 256, 512, 1024)
"""Integer RDP orders. dp_accounting's fractional orders are a looser bound than the exact integer-order formula
(and fail to converge, slowly, at large sampling rates), so trustfl's ledgers and calibration use integer orders.
The price is at large ε over few steps, whose best order lies between 2 and 3: q = 16/450, z = 0.57, 28 steps,
δ = 1e-4 is ε = 8.55 at order 2 here, and 6.75 at order 2.5 with fractional orders added."""

__all__ = ["ACCOUNTANTS", "GDP_FORMS", "PLD_DISCRETIZATION", "SAMPLINGS", "calibrate_noise_multiplier",
           "epsilon_subsampled_gaussian", "make_accountant", "sampled_gaussian_event", "solve_decreasing"]


@checked
def make_accountant(accountant: str = "rdp", neighboring: str = "add_remove",
                    orders: Optional[Sequence[float]] = None) -> PrivacyAccountant:
    """A fresh dp_accounting accountant.

    Args:
      accountant: ``"rdp"`` (a :class:`~trustfl.privacy.analysis.cached_rdp.CachedRdpAccountant`: dp_accounting's
        ``RdpAccountant`` to the bit, each distinct event's RDP computed once per process) or ``"pld"`` (PLD
        discretization :data:`PLD_DISCRETIZATION`), ``"gdp"`` / ``"gdp_clt"`` (a
        :class:`~trustfl.privacy.analysis.gdp_accountant.GdpAccountant`, form ``"first_order"`` / ``"clt"``).
      neighboring: ``"add_remove"`` (Opacus' and DP-SGD's convention) or ``"replace_one"`` (required by
        sampling without replacement).
      orders: RDP orders (RDP only); ``None`` uses :data:`DEFAULT_RDP_ORDERS`.
    """
    if not isinstance(accountant, str) or not isinstance(neighboring, str):
        raise PrivacyError(f"`accountant` and `neighboring` must be strings, found {accountant!r} and "
                           f"{neighboring!r}.")
    if neighboring not in NEIGHBORINGS:
        raise PrivacyError(f"`neighboring` must be one of {sorted(NEIGHBORINGS)}, found {neighboring!r}.")
    from dp_accounting.privacy_accountant import NeighboringRelation

    relation = NeighboringRelation[NEIGHBORINGS[neighboring]]
    if accountant == "rdp":
        from trustfl.privacy.analysis.cached_rdp import CachedRdpAccountant

        return CachedRdpAccountant(list(DEFAULT_RDP_ORDERS if orders is None else orders), relation)
    if accountant == "pld":
        if orders is not None:
            raise PrivacyError("`orders` applies to the RDP accountant only, found accountant='pld'.")
        from dp_accounting.pld import pld_privacy_accountant

        return pld_privacy_accountant.PLDAccountant(relation, value_discretization_interval=PLD_DISCRETIZATION)
    if accountant in GDP_FORMS:
        if orders is not None:
            raise PrivacyError(f"`orders` applies to the RDP accountant only, found accountant={accountant!r}.")
        from trustfl.privacy.analysis.gdp_accountant import GdpAccountant

        return GdpAccountant(GDP_FORMS[accountant], relation)
    raise PrivacyError(f"`accountant` must be one of {ACCOUNTANTS}, found {accountant!r}.")


def _check_common(sample_rate: float, steps: int, delta: float) -> None:
    """Ranges (the types are checked by :func:`~trustfl.privacy.analysis.checked.checked`)."""
    if not 0.0 <= float(sample_rate) <= 1.0:
        raise PrivacyError(f"`sample_rate` must be in [0, 1], found {sample_rate!r}.")
    if steps < 0:
        raise PrivacyError(f"`steps` must be an integer >= 0, found {steps!r}.")
    if not 0.0 < float(delta) < 1.0:
        raise PrivacyError(f"`delta` must be in (0, 1), found {delta!r}.")


@checked
def sampled_gaussian_event(noise_multiplier: float, sample_rate: float, steps: int, sampling: str = "poisson",
                           dataset_size: Optional[int] = None) -> dp_event.DpEvent:
    """``steps`` compositions of the Gaussian mechanism (noise multiplier z) on a sample of rate q.

    q = 1 is no subsampling (a plain Gaussian event). For ``sampling="without_replacement"`` dp_accounting needs
    integers (n, b) with b/n = q: pass ``dataset_size`` = n, or b/n is taken as the closest fraction to q with
    n <= 10⁶ (dp_accounting's analysis uses only the ratio).
    """
    from dp_accounting import dp_event

    if sampling not in SAMPLINGS:
        raise PrivacyError(f"`sampling` must be one of {SAMPLINGS}, found {sampling!r}.")
    z = float(noise_multiplier)
    if not z >= 0 or math.isinf(z):
        raise PrivacyError(f"`noise_multiplier` must be a finite number >= 0, found {noise_multiplier!r}.")
    q = float(sample_rate)
    event: dp_event.DpEvent = dp_event.GaussianDpEvent(z)
    if q < 1.0:
        if sampling == "poisson":
            event = dp_event.PoissonSampledDpEvent(q, event)
        else:
            if dataset_size is not None:
                n, b = int(dataset_size), int(round(q * int(dataset_size)))
            else:
                frac = Fraction(q).limit_denominator(1_000_000)
                n, b = frac.denominator, frac.numerator
            if not 0 < b <= n:
                raise PrivacyError(f"`sample_rate` {q!r} with `dataset_size` {dataset_size!r} gives no whole "
                                   f"batch (b = {b}, n = {n}); need 0 < b <= n.")
            event = dp_event.SampledWithoutReplacementDpEvent(n, b, event)
    return dp_event.SelfComposedDpEvent(event, int(steps))


def _check_supported(accountant: str, sampling: str, sample_rate: float) -> None:
    if accountant in ("pld",) + tuple(GDP_FORMS) and sampling == "without_replacement" and float(sample_rate) < 1.0:
        who = "dp_accounting's PLD accountant" if accountant == "pld" else f"the {accountant} (μ-GDP) accountant"
        raise UnsupportedEventError(f"{who} cannot analyse the sub-event SampledWithoutReplacementDpEvent "
                                    f"(sampling='without_replacement'); use accountant='rdp' or sampling='poisson'.")


@checked
def epsilon_subsampled_gaussian(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                                accountant: str = "rdp", sampling: str = "poisson", *,
                                dataset_size: Optional[int] = None,
                                orders: Optional[Sequence[float]] = None) -> float:
    """ε at ``delta`` after ``steps`` steps of the subsampled Gaussian mechanism.

    Args:
      noise_multiplier: z = σ/Δ₂ (> 0; 0 gives ε = ∞).
      sample_rate: q in [0, 1]; q = 1 means no subsampling, q = 0 gives ε = 0.
      steps: number of steps T >= 0.
      delta: target δ in (0, 1).
      accountant: one of :data:`ACCOUNTANTS` (see :func:`make_accountant`).
      sampling: ``"poisson"`` (add/remove adjacency) or ``"without_replacement"`` (replace-one adjacency, as
        dp_accounting requires; RDP only).
      dataset_size: n for sampling without replacement (see :func:`sampled_gaussian_event`).
      orders: RDP orders (RDP only).

    Returns:
      ε (``math.inf`` when the mechanism gives no privacy).

    Raises:
      PrivacyError: an argument is out of range.
      UnsupportedEventError: the accountant cannot analyse this sampling (PLD or GDP without replacement).
    """
    _check_common(sample_rate, steps, delta)
    event = sampled_gaussian_event(noise_multiplier, sample_rate, steps, sampling, dataset_size)
    neighboring = "replace_one" if (sampling == "without_replacement" and float(sample_rate) < 1.0) else "add_remove"
    _check_supported(accountant, sampling, sample_rate)
    acc = make_accountant(accountant, neighboring, orders)
    if steps == 0 or float(sample_rate) == 0.0:
        return 0.0
    if float(noise_multiplier) == 0.0:
        return math.inf
    z = float(noise_multiplier)
    if accountant == "pld" and 1 / (2 * z * z) + 8 / z > PLD_MAX_LOSS_RANGE:
        raise PrivacyError(f"noise_multiplier = {noise_multiplier!r} is too small for the 'pld' accountant: its grid "
                           f"would span privacy losses up to about {1 / (2 * z * z) + 8 / z:.0f} in steps of "
                           f"{PLD_DISCRETIZATION:g} (minutes to hours), for an ε beyond any useful budget; use the "
                           "'rdp' accountant (an upper bound on the same ε).")
    if accountant == "pld" and steps > 1:
        _check_pld_span(noise_multiplier, sample_rate, steps, delta)
    try:
        acc.compose(event)
        return float(acc.get_epsilon(float(delta)))
    except PrivacyError:
        raise
    except (ArithmeticError, ValueError, MemoryError) as err:  # e.g. PLD's grid for a vanishing noise multiplier
        raise PrivacyError(f"the {accountant!r} accountant cannot analyse noise_multiplier = {noise_multiplier!r}, "
                           f"sample_rate = {sample_rate!r}, steps = {steps!r}, delta = {delta!r} ({type(err).__name__}:"
                           f" {err}); such a setting is outside what it computes (try the 'rdp' accountant).") from None


class BeyondPldSpan(PrivacyError):
    """A composition whose privacy losses reach beyond what the PLD accountant's grid is asked to span."""


def _check_pld_span(noise_multiplier: float, sample_rate: float, steps: int, delta: float) -> None:
    """Refuse a composition whose privacy losses reach beyond :data:`PLD_MAX_LOSS_RANGE`: the PLD grid grows with
    them (q = 0.01, z = 1.1 on a 2-core Xeon: 1e6 steps, ε 111, 1.8 s; 1e7 steps, 17 s; 1e9 steps, over 16 GB and
    uninterruptible). The RDP ε, an upper bound computed in milliseconds, tells."""
    bound = epsilon_subsampled_gaussian(noise_multiplier, sample_rate, steps, delta, "rdp")
    if bound > PLD_MAX_LOSS_RANGE:
        raise BeyondPldSpan(f"steps = {steps!r} at noise_multiplier = {noise_multiplier!r}, sample_rate = "
                           f"{sample_rate!r} spend ε <= {bound:.4g} (RDP), beyond the {PLD_MAX_LOSS_RANGE:g} the 'pld' "
                           "accountant's grid is asked to span (its memory and time grow with the steps); use the "
                           "'rdp' accountant for such an ε.")


@checked
def solve_decreasing(fn: Callable[[float], float], target: float, *, tol: float, lo: float, hi: float,
                     lo_limit: float = 1e-3, hi_limit: float = 1e6, name: str = "noise_multiplier") -> float:
    """Find x with ``target − tol <= fn(x) <= target`` for a decreasing ``fn`` (e.g. ε as a function of σ).

    Brackets the root by expanding [lo, hi] geometrically, then runs Illinois regula falsi in log x (falling
    back to geometric bisection when ``fn`` is infinite). The result errs on the private side: fn(x) <= target.

    Raises:
      PrivacyError: no x in [lo_limit, hi_limit] reaches the target.
    """
    tol = min(tol, target / 2.0)
    f_hi = fn(hi)
    f_lo: Optional[float] = None
    while not f_hi <= target:
        if hi >= hi_limit:
            raise PrivacyError(f"No {name} <= {hi_limit:g} reaches ε = {target:g} (found ε = {f_hi:g} at "
                               f"{hi_limit:g}); raise ε or δ, or lower the sampling rate or steps.")
        lo, f_lo = hi, f_hi
        hi = min(hi * 4.0, hi_limit)
        f_hi = fn(hi)
    if f_lo is None:
        f_lo = fn(lo)
    while f_lo <= target:
        if target - f_lo <= tol:
            return lo
        if lo <= lo_limit:
            raise PrivacyError(f"ε = {target:g} is already met by {name} = {lo_limit:g} (ε = {f_lo:g}); the "
                               f"target is too loose to calibrate.")
        hi, f_hi = lo, f_lo
        lo = max(lo / 4.0, lo_limit)
        f_lo = fn(lo)
    if target - f_hi <= tol:
        return hi
    # Illinois regula falsi on g(log x) = log fn(x) − log(target − tol/2) (ε is close to a power law in σ);
    # (ta, tb) are the true g values used to stop, (ga, gb) the Illinois-damped ones used to interpolate.
    shift = target - tol / 2.0
    log_shift = math.log(shift)
    lo_ok, hi_ok = math.log(target - tol) - log_shift, math.log(target) - log_shift   # stop window for g

    def g_of(value: float) -> float:
        return math.log(value) - log_shift if value > 0 else -math.inf

    a, b = math.log(lo), math.log(hi)
    ta, tb = g_of(f_lo), g_of(f_hi)
    ga, gb = ta, tb
    side = 0
    for _ in range(200):
        if lo_ok <= tb:
            return math.exp(b)
        if ta <= hi_ok:
            return math.exp(a)
        c = (a * gb - b * ga) / (gb - ga) if math.isfinite(ga) and math.isfinite(gb) else 0.5 * (a + b)
        if not a < c < b:
            c = 0.5 * (a + b)
        gc = g_of(fn(math.exp(c)))
        if gc <= 0.0:
            b, gb, tb = c, gc, gc
            if side == -1:
                ga /= 2.0
            side = -1
        else:
            a, ga, ta = c, gc, gc
            if side == 1:
                gb /= 2.0
            side = 1
        if b - a < 1e-14:
            break
    return math.exp(b)


def _gdp_noise_guess(epsilon: float, delta: float, sample_rate: float, steps: int, form: str) -> Optional[float]:
    """The z whose μ-GDP spend is (ε, δ): μ* = μ(ε, δ), then z = q√T/μ* (first order, or q = 1) or
    z = 1/√(log(1 + μ*²/(q²T))) (CLT); ``None`` when μ* or z is out of range (the search then brackets itself)."""
    from trustfl.privacy.analysis.gdp import mu_from_epsilon

    try:
        mu = mu_from_epsilon(epsilon, delta)
    except PrivacyError:
        return None
    if form == "first_order" or sample_rate == 1.0:
        z = sample_rate * math.sqrt(steps) / mu
    else:
        z = 1.0 / math.sqrt(math.log1p(mu * mu / (sample_rate * sample_rate * steps)))
    return z if 1e-3 <= z <= 1e6 else None


@checked
def calibrate_noise_multiplier(epsilon: float, delta: float, sample_rate: float, steps: int,
                               accountant: str = "rdp", sampling: str = "poisson", tol: float = 1e-4, *,
                               dataset_size: Optional[int] = None,
                               orders: Optional[Sequence[float]] = None) -> float:
    """The noise multiplier z whose ε (same accountant) lies in [epsilon − tol, epsilon].

    ε(z) is decreasing, so a smaller target ε gives a larger z. The search runs on ε itself (not on z), so the
    round trip ``epsilon_subsampled_gaussian(calibrate_noise_multiplier(ε, ...), ...)`` returns ε within ``tol``
    wherever ε(z) takes values in that window; where it jumps past it (a δ so large that ε drops to 0, say), z is
    one whose ε is below ``epsilon − tol``: never above ``epsilon``.

    Raises:
      PrivacyError: an argument is out of range or no z in [1e-3, 1e6] reaches ``epsilon``.
    """
    _check_common(sample_rate, steps, delta)
    if not float(epsilon) > 0 or math.isinf(float(epsilon)):
        raise PrivacyError(f"`epsilon` must be a finite number > 0, found {epsilon!r}.")
    if not float(tol) > 0:
        raise PrivacyError(f"`tol` must be > 0, found {tol!r}.")
    if steps == 0 or float(sample_rate) == 0.0:
        raise PrivacyError(f"Nothing to calibrate: with steps = {steps} and sample_rate = {sample_rate} no "
                           f"privacy is spent; need steps >= 1 and sample_rate > 0.")

    def eps_of(z: float) -> float:
        try:
            return epsilon_subsampled_gaussian(z, sample_rate, steps, delta, accountant, sampling,
                                               dataset_size=dataset_size, orders=orders)
        except BeyondPldSpan:  # beyond what the PLD grid spans (_check_pld_span): more noise is needed
            return math.inf

    lo, hi = 0.5, 2.0
    if accountant == "pld":
        # PLD evaluations are slow (about 0.3-3 s); RDP is an upper bound on PLD's ε, so the RDP calibration
        # brackets the PLD root from above and the search needs only a few PLD evaluations.
        _check_supported(accountant, sampling, sample_rate)
        z_rdp = calibrate_noise_multiplier(epsilon, delta, sample_rate, steps, "rdp", sampling,
                                           tol=max(float(tol), 1e-3 * float(epsilon)), dataset_size=dataset_size)
        lo, hi = 0.8 * z_rdp, z_rdp
    elif accountant in GDP_FORMS:
        _check_supported(accountant, sampling, sample_rate)
        z_gdp = _gdp_noise_guess(float(epsilon), float(delta), float(sample_rate), int(steps), GDP_FORMS[accountant])
        if z_gdp is not None:  # the closed-form root: the search only confirms it on the accountant
            lo, hi = z_gdp * (1.0 - 1e-9), z_gdp * (1.0 + 1e-9)
    return solve_decreasing(eps_of, float(epsilon), tol=float(tol), lo=lo, hi=hi)
