"""Pure privacy math: (ε, δ) of mechanisms, conversions and calibrations. No state lives here.

- :mod:`.gaussian`: subsampled Gaussian through dp_accounting (RDP or PLD) and noise calibration.
- :mod:`.gdp`: μ-Gaussian DP (DPZV); :mod:`.gdp_accountant`: the μ-GDP accountant behind ``"gdp"`` / ``"gdp_clt"``.
- :mod:`.secldp`: CafCor's Lemma A.4 SecLDP accounting per threat model.
- :mod:`.rhdp`: Robust-HDP's ``compute_z`` (classic RDP conversion, bisection, rounding).
- :mod:`.cached_rdp`: dp_accounting's RDP accountant with each event's vector computed once per process;
  :mod:`.sampled_rdp`: the subsampled Gaussian's RDP at many orders, dp_accounting's bits, vectorized.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from trustfl.core.lazy import lazy_exports

if TYPE_CHECKING:
    from trustfl.privacy.analysis.gaussian import (calibrate_noise_multiplier, epsilon_subsampled_gaussian,
                                                   make_accountant, sampled_gaussian_event, solve_decreasing)
    from trustfl.privacy.analysis.gdp import (delta_from_mu, dpzv_noise_std, epsilon_from_mu, mu_from_epsilon,
                                              mu_gaussian, mu_poisson_clt, mu_poisson_clt_first_order)
    from trustfl.privacy.analysis.gdp_accountant import GdpAccountant
    from trustfl.privacy.analysis.rhdp import (RHDP_ORDERS, calibrate_z, classic_rdp_to_epsilon, compute_z,
                                               rdp_poisson_gaussian, rhdp_epsilon)
    from trustfl.privacy.analysis.secldp import (OPACUS_ORDERS, THREAT_MODELS, SecLdpNoise, calibrate_secldp,
                                                 calibrate_step, corollary_4_1_sigma, equivalent_noise_multiplier,
                                                 lemma_a4_step, mironov_epsilon, secldp_epsilon, step_event,
                                                 threat_model_step)

# Loaded on first access (dp_accounting and scipy are imported by the functions that use them).
__getattr__, __dir__ = lazy_exports(__name__, {
    "trustfl.privacy.analysis.gaussian": ("calibrate_noise_multiplier", "epsilon_subsampled_gaussian",
                                          "make_accountant", "sampled_gaussian_event", "solve_decreasing"),
    "trustfl.privacy.analysis.gdp": ("delta_from_mu", "dpzv_noise_std", "epsilon_from_mu", "mu_from_epsilon",
                                     "mu_gaussian", "mu_poisson_clt", "mu_poisson_clt_first_order"),
    "trustfl.privacy.analysis.gdp_accountant": ("GdpAccountant",),
    "trustfl.privacy.analysis.rhdp": ("RHDP_ORDERS", "calibrate_z", "classic_rdp_to_epsilon", "compute_z",
                                      "rdp_poisson_gaussian", "rhdp_epsilon"),
    "trustfl.privacy.analysis.secldp": ("OPACUS_ORDERS", "THREAT_MODELS", "SecLdpNoise", "calibrate_secldp",
                                        "calibrate_step", "corollary_4_1_sigma", "equivalent_noise_multiplier",
                                        "lemma_a4_step", "mironov_epsilon", "secldp_epsilon", "step_event",
                                        "threat_model_step"),
})

__all__ = ["GdpAccountant", "OPACUS_ORDERS", "RHDP_ORDERS", "THREAT_MODELS", "SecLdpNoise",
           "calibrate_noise_multiplier", "calibrate_secldp", "calibrate_step", "calibrate_z", "classic_rdp_to_epsilon",
           "compute_z", "corollary_4_1_sigma", "delta_from_mu", "dpzv_noise_std", "epsilon_from_mu",
           "epsilon_subsampled_gaussian", "equivalent_noise_multiplier", "lemma_a4_step", "make_accountant",
           "mironov_epsilon", "mu_from_epsilon", "mu_gaussian", "mu_poisson_clt", "mu_poisson_clt_first_order",
           "rdp_poisson_gaussian", "rhdp_epsilon", "sampled_gaussian_event", "secldp_epsilon", "solve_decreasing",
           "step_event", "threat_model_step"]
