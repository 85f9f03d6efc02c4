"""Privacy: DP event descriptions, per-client ledgers, heterogeneous budgets and the accounting math.

Mechanisms describe what they did as dp_accounting events (:mod:`.events`); :class:`PrivacyLedger` /
:class:`LedgerBook` compose them per client (:mod:`.accountant`); :mod:`.budgets` turns per-client ε into
per-client noise; :mod:`.analysis` holds the pure math (subsampled Gaussian, μ-GDP, SecLDP, Robust-HDP).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from trustfl.core.lazy import lazy_exports

if TYPE_CHECKING:
    from trustfl.privacy.accountant import Budget, LedgerBook, PrivacyLedger, check_schedule
    from trustfl.privacy.analysis.gaussian import calibrate_noise_multiplier, epsilon_subsampled_gaussian
    from trustfl.privacy.budgets import (EPSILON_DISTRIBUTIONS, RHDP_FIXED_LISTS, calibrate_clients,
                                         epsilons_from_distribution, epsilons_from_list)
    from trustfl.privacy.events import (composed, describe, event_from_dict, gaussian_event, poisson_sampled,
                                        self_composed, without_replacement_sampled)

# Loaded on first access, so that e.g. `trustfl privacy --help` or a run without DP never imports dp_accounting.
__getattr__, __dir__ = lazy_exports(__name__, {
    "trustfl.privacy.accountant": ("Budget", "LedgerBook", "PrivacyLedger", "check_schedule"),
    "trustfl.privacy.analysis.gaussian": ("calibrate_noise_multiplier", "epsilon_subsampled_gaussian"),
    "trustfl.privacy.budgets": ("EPSILON_DISTRIBUTIONS", "RHDP_FIXED_LISTS", "calibrate_clients",
                                "epsilons_from_distribution", "epsilons_from_list"),
    "trustfl.privacy.events": ("composed", "describe", "event_from_dict", "gaussian_event", "poisson_sampled",
                               "self_composed", "without_replacement_sampled"),
})

__all__ = ["Budget", "EPSILON_DISTRIBUTIONS", "LedgerBook", "PrivacyLedger", "RHDP_FIXED_LISTS",
           "calibrate_clients", "calibrate_noise_multiplier", "check_schedule", "composed", "describe",
           "epsilon_subsampled_gaussian", "epsilons_from_distribution", "epsilons_from_list", "event_from_dict",
           "gaussian_event", "poisson_sampled", "self_composed", "without_replacement_sampled"]
