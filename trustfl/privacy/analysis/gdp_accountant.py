"""A μ-Gaussian-DP accountant (Dong, Roth & Su 2022, https://arxiv.org/abs/1905.02383) for trustfl's ledgers.

A dp_accounting ``PrivacyAccountant``: :class:`~trustfl.privacy.accountant.PrivacyLedger` composes events into it
exactly as into the RDP and PLD accountants. GDP composes additively in μ² (Dong et al. Cor. 3.3):
μ_total = √(Σ_t μ_t²). Per step, with noise multiplier σ:

- ``GaussianDpEvent(σ)``: μ_t = 1/σ, exact in both forms (Dong et al. Thm 2.7).
- ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))``:
  ``form="first_order"``: μ_t² = q²/σ² (DPZV's Thm C.2, the σ ≫ 1 form; optimistic for small σ);
  ``form="clt"``: μ_t² = q²·(e^{1/σ²} − 1) (Bu, Dong, Long & Su 2020, https://arxiv.org/abs/1911.11607, Thm 4;
  the central-limit approximation, asymptotically exact for T → ∞ with q√T fixed, not a worst-case bound).

``NoOpDpEvent`` costs nothing, ``SelfComposedDpEvent`` and ``ComposedDpEvent`` are traversed recursively; every
other event (Laplace, sampling without replacement, nested sampling, a non-Gaussian sampled event, ...) is
unsupported, reported through dp_accounting's ``CompositionErrorDetails`` contract. ε(δ) is the exact μ-GDP
conversion (Dong et al. Cor. 2.13; DPZV eq. 11), :func:`~trustfl.privacy.analysis.gdp.epsilon_from_mu`.

Example:
  >>> from dp_accounting import dp_event
  >>> from trustfl.privacy.analysis.gdp_accountant import GdpAccountant
  >>> step = dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.0))
  >>> acc = GdpAccountant().compose(step, 10_000)
  >>> round(acc.mu(), 12)
  1.0
"""
from __future__ import annotations

import functools
import math
import numbers
from typing import TYPE_CHECKING, Any, Optional

from trustfl.errors import PrivacyError
from trustfl.privacy.analysis.gdp import delta_from_mu, epsilon_from_mu

if TYPE_CHECKING:
    from dp_accounting import dp_event
    from dp_accounting.privacy_accountant import NeighboringRelation, PrivacyAccountant

__all__ = ["FORMS", "GdpAccountant"]

FORMS = ("first_order", "clt")
"""``GdpAccountant`` forms of the Poisson-subsampled Gaussian step (see the module docstring)."""

_EXP_LIMIT = 700.0  # e^{1/σ²} overflows a float beyond ~709: that step's μ is infinite


def _step_mu2(noise_multiplier: float, sample_rate: float, form: str) -> float:
    """μ_t² of one Gaussian step (noise multiplier σ) on a Poisson sample of rate q; a plain Gaussian step is
    q = 1 in the ``"first_order"`` form (exactly 1/σ²)."""
    if sample_rate == 0.0:
        return 0.0
    if noise_multiplier == 0.0:
        return math.inf
    inv = (1.0 / noise_multiplier) * (1.0 / noise_multiplier)  # 1/σ²; inf rather than OverflowError
    if form == "first_order":
        return sample_rate * sample_rate * inv
    return sample_rate * sample_rate * (math.expm1(inv) if inv <= _EXP_LIMIT else math.inf)


def __getattr__(name: str) -> Any:
    # The class subclasses dp_accounting's PrivacyAccountant: defined on first use, so that importing this module
    # does not import dp_accounting (and scipy) - the same pattern as cached_rdp.
    if name == "GdpAccountant":
        return _define_accountant()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _define_accountant() -> type:
    from dp_accounting import dp_event
    from dp_accounting.privacy_accountant import NeighboringRelation, PrivacyAccountant

    details = PrivacyAccountant.CompositionErrorDetails
    relations = (NeighboringRelation.ADD_OR_REMOVE_ONE, NeighboringRelation.REPLACE_ONE)

    def _sigma_error(event: dp_event.GaussianDpEvent) -> Optional[PrivacyAccountant.CompositionErrorDetails]:
        z = event.noise_multiplier
        if isinstance(z, bool) or not isinstance(z, numbers.Real) or not z >= 0:
            return details(event, f"`noise_multiplier` must be a number >= 0, found {z!r}.")
        return None

    class GdpAccountant(PrivacyAccountant):
        """μ-GDP accountant: the running Σ μ_t² of the composed events (see the module docstring).

        Neighbouring relation: both ``ADD_OR_REMOVE_ONE`` and ``REPLACE_ONE`` are accepted and treated alike.
        The GDP of the Gaussian mechanism (Dong et al. Thm 2.7) is stated for the ℓ₂ sensitivity Δ₂ of the query
        under the chosen relation, and the event's noise multiplier σ = noise std / Δ₂ already carries that Δ₂
        (e.g. DPZV's replace-one sensitivity 2C/B): the caller is responsible for it. The subsampling formulas
        are applied as stated (Bu et al. 2020 Thm 4; DPZV Thm C.2).

        Args:
          form: ``"first_order"`` (DPZV Thm C.2: μ_t² = q²/σ²) or ``"clt"`` (Bu et al. Thm 4:
            μ_t² = q²·(e^{1/σ²} − 1)) for Poisson-subsampled Gaussian steps.
          neighboring_relation: dp_accounting's ``NeighboringRelation`` (add/remove or replace-one).

        Raises:
          PrivacyError: an unknown ``form`` or another neighbouring relation.
        """

        def __init__(self, form: str = "first_order",
                     neighboring_relation: NeighboringRelation = NeighboringRelation.ADD_OR_REMOVE_ONE) -> None:
            if form not in FORMS:
                raise PrivacyError(f"`form` must be one of {FORMS}, found {form!r}.")
            if neighboring_relation not in relations:
                raise PrivacyError(f"`neighboring_relation` must be one of {[r.name for r in relations]}, found "
                                   f"{neighboring_relation!r}.")
            super().__init__(neighboring_relation)
            self._form = form
            self._mu2 = 0.0

        @property
        def form(self) -> str:
            """``"first_order"`` or ``"clt"``."""
            return self._form

        def _maybe_compose(self, event: dp_event.DpEvent, count: int,
                           do_compose: bool) -> Optional[PrivacyAccountant.CompositionErrorDetails]:
            """dp_accounting's contract: check only (``do_compose=False``, no state change) or compose."""
            if isinstance(event, dp_event.NoOpDpEvent):
                return None
            if isinstance(event, dp_event.SelfComposedDpEvent):
                return self._maybe_compose(event.event, event.count * count, do_compose)
            if isinstance(event, dp_event.ComposedDpEvent):
                for sub in event.events:
                    error = self._maybe_compose(sub, count, do_compose)
                    if error is not None:
                        return error
                return None
            if isinstance(event, dp_event.GaussianDpEvent):
                error = _sigma_error(event)
                if error is None and do_compose:
                    self._add(count, event.noise_multiplier, 1.0, exact=True)
                return error
            if isinstance(event, dp_event.PoissonSampledDpEvent):
                q, inner = event.sampling_probability, event.event
                if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0.0 <= q <= 1.0:
                    return details(event, f"`sampling_probability` must be in [0, 1], found {q!r}.")
                if isinstance(inner, dp_event.NoOpDpEvent):
                    return None
                if not isinstance(inner, dp_event.GaussianDpEvent):
                    return details(inner, "The GDP accountant supports a PoissonSampledDpEvent only of a "
                                          f"GaussianDpEvent (or NoOpDpEvent); found {type(inner).__name__}.")
                error = _sigma_error(inner)
                if error is None and do_compose:
                    self._add(count, inner.noise_multiplier, q, exact=False)
                return error
            return details(event, f"Unsupported event for the GDP accountant: {type(event).__name__} (supported: "
                                  "NoOp, Gaussian, Poisson-sampled Gaussian, SelfComposed, Composed).")

        def _add(self, count: int, noise_multiplier: float, sample_rate: float, exact: bool) -> None:
            if count:
                form = "first_order" if exact else self._form  # a plain Gaussian is exactly 1/σ² in both forms
                self._mu2 += count * _step_mu2(float(noise_multiplier), float(sample_rate), form)

        def mu(self) -> float:
            """μ_total = √(Σ μ_t²) of everything composed so far (0 when nothing; ``math.inf`` if non-private)."""
            return math.sqrt(self._mu2)

        def get_epsilon(self, target_delta: float) -> float:
            """The smallest ε with δ(ε; μ_total) <= ``target_delta`` (Dong et al. Cor. 2.13); 0 when μ = 0."""
            mu = self.mu()
            if mu == 0.0:
                return 0.0
            if math.isinf(mu):
                return math.inf
            return epsilon_from_mu(mu, target_delta)

        def get_delta(self, target_epsilon: float) -> float:
            """δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) at μ_total (DPZV eq. 11)."""
            return delta_from_mu(target_epsilon, self.mu())

        def __repr__(self) -> str:
            return (f"GdpAccountant(form={self._form!r}, neighboring_relation={self.neighboring_relation.name}, "
                    f"mu={self.mu():.6g})")

    GdpAccountant.__qualname__ = "GdpAccountant"  # picklable as trustfl...gdp_accountant.GdpAccountant
    GdpAccountant.__module__ = __name__
    globals()["GdpAccountant"] = GdpAccountant
    return GdpAccountant
