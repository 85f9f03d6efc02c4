"""CafCor SecLDP accounting (Sec. 4.1, App. A): Lemma A.4, special cases, threat models, calibration, refusals."""
from __future__ import annotations

import math

import numpy as np
import pytest

from trustfl.errors import PrivacyError
from trustfl.privacy.analysis import secldp

C = 2.25


def _direct_step(clip, n, f, q, s_cor, s_ind):
    """½·ΔᵀΣ⁻¹Δ as in the proof of Lemma A.4 (Σ over the n − f honest workers, Δ = 2C·e₁)."""
    h = n - f
    sigma = ((n - q) * s_cor**2 + s_ind**2) * np.eye(h) - s_cor**2 * np.ones((h, h))
    delta = np.zeros(h)
    delta[0] = 2 * clip
    return 0.5 * float(delta @ np.linalg.solve(sigma, delta))


@pytest.mark.parametrize("n, f, q, s_cor, s_ind", [
    (6, 2, 1, 0.7, 0.3), (10, 4, 0, 1.3, 0.0), (10, 4, 4, 1.0, 1.0), (20, 3, 2, 0.5, 2.0), (7, 0, 0, 0.0, 1.5)])
def test_lemma_a4_matches_the_gaussian_divergence(n, f, q, s_cor, s_ind):
    assert secldp.lemma_a4_step(C, n, f, q, s_cor, s_ind) == pytest.approx(_direct_step(C, n, f, q, s_cor, s_ind),
                                                                           rel=1e-10)


def test_special_cases_of_lemma_a4():
    n, f, s = 100, 5, 0.8
    # LDP: σ_cor = 0.
    assert secldp.lemma_a4_step(C, n, f, 2, 0.0, s) == pytest.approx(2 * C**2 / s**2, rel=1e-12)
    # q = 0, σ_ind = 0.
    assert secldp.lemma_a4_step(C, n, f, 0, s, 0.0) == pytest.approx(2 * C**2 * (1 + 1 / f) / (n * s**2), rel=1e-12)
    # q = f, σ_ind = σ_cor = σ.
    assert secldp.lemma_a4_step(C, n, f, f, s, s) == pytest.approx(4 * C**2 / ((n - f + 1) * s**2), rel=1e-12)
    # CDP limit: f = q = 0, σ_cor → ∞ gives 2C²/(nσ_ind²): the "cdp" threat model with n honest workers.
    limit = 2 * C**2 / (n * s**2)
    assert secldp.lemma_a4_step(C, n, 0, 0, 1e5, s) == pytest.approx(limit, rel=1e-6)
    assert secldp.threat_model_step("cdp", C, n, 0, 0.0, s) == pytest.approx(limit, rel=1e-12)


def test_threat_models_order_and_ldp_ignores_correlated_noise():
    n, f, s_cor, s_ind = 100, 5, 0.6, 0.6
    steps = {tm: secldp.threat_model_step(tm, C, n, f, s_cor, s_ind) for tm in secldp.THREAT_MODELS}
    # More knowledge for the server means less privacy: CDP < SecLDP < ByzLDP < LDP.
    assert steps["cdp"] < steps["secldp"] < steps["byzldp"] < steps["ldp"]
    assert steps["ldp"] == secldp.threat_model_step("ldp", C, n, f, 10.0, s_ind)
    assert secldp.threat_model_step("secldp", C, n, f, s_cor, s_ind, num_colluding=f) == steps["byzldp"]


@pytest.mark.parametrize("kwargs", [
    dict(num_byzantine=5, num_colluding=5, sigma_cor=1.0, sigma_ind=0.0),   # f = q, σ_ind = 0
    dict(num_byzantine=0, num_colluding=0, sigma_cor=1.0, sigma_ind=0.0),   # f = 0, σ_ind = 0
    dict(num_byzantine=5, num_colluding=0, sigma_cor=0.0, sigma_ind=0.0),   # no noise at all
    dict(num_byzantine=5, num_colluding=6, sigma_cor=1.0, sigma_ind=1.0),   # q > f
    dict(num_byzantine=100, num_colluding=0, sigma_cor=1.0, sigma_ind=1.0),  # f = n
    dict(num_byzantine=5, num_colluding=0, sigma_cor=-1.0, sigma_ind=1.0),  # negative σ
])
def test_degenerate_settings_are_refused(kwargs):
    with pytest.raises(PrivacyError):
        secldp.lemma_a4_step(C, 100, **kwargs)


def test_degenerate_calibrations_are_refused():
    with pytest.raises(PrivacyError, match="No privacy"):
        secldp.calibrate_secldp("byzldp", 10.0, 1e-4, 30, C, 100, 5, ind_to_cor=0.0)
    with pytest.raises(PrivacyError, match="No privacy"):
        secldp.calibrate_secldp("secldp", 10.0, 1e-4, 30, C, 100, 0)            # f = 0 with σ_ind = 0
    with pytest.raises(PrivacyError, match="No privacy"):
        secldp.threat_model_step("ldp", C, 100, 5, 1.0, 0.0)
    with pytest.raises(PrivacyError, match="threat_model"):
        secldp.threat_model_step("trusted", C, 100, 5, 1.0, 1.0)


# Calibration table (our computation at the paper's Sec. 5 settings): T = 30, δ = 1e-4, n = 100.
# (LDP σ_ind, SecLDP σ_cor, ByzLDP σ, CDP sum-std) × (pap, opa).
TABLE = [
    (2.25, 5, 27.8, (5.72, 5.51), (0.626, 0.603), (0.825, 0.795), (5.72, 5.51)),
    (2.25, 10, 26.4, (5.94, 5.72), (0.623, 0.600), (0.881, 0.848), (5.94, 5.72)),
    (1.0, 5, 39.6, (1.96, 1.91), (0.215, 0.209), (0.283, 0.275), (1.96, 1.91)),
    (1.0, 10, 39.6, (1.96, 1.91), (0.206, 0.200), (0.291, 0.283), (1.96, 1.91)),
]


@pytest.mark.parametrize("clip, f, eps, ldp, sec, byz, cdp", TABLE)
def test_calibration_table(clip, f, eps, ldp, sec, byz, cdp):
    n, n_h = 100, 100 - f
    for k, conversion in enumerate(("mironov", "opacus")):
        kw = dict(epsilon=eps, delta=1e-4, steps=30, clip_norm=clip, num_workers=n, num_byzantine=f,
                  conversion=conversion)
        got_ldp = secldp.calibrate_secldp("ldp", **kw)
        got_sec = secldp.calibrate_secldp("secldp", **kw)
        got_byz = secldp.calibrate_secldp("byzldp", **kw)
        got_cdp = secldp.calibrate_secldp("cdp", **kw)
        assert round(got_ldp.sigma_ind, 2) == ldp[k] and got_ldp.sigma_cor == 0.0
        assert round(got_sec.sigma_cor, 3) == sec[k] and got_sec.sigma_ind == 0.0
        assert round(got_byz.sigma_cor, 3) == byz[k] and got_byz.sigma_ind == got_byz.sigma_cor
        assert round(got_cdp.sigma_ind * math.sqrt(n_h), 2) == cdp[k]      # per-worker std × √(n−f) = sum std


@pytest.mark.parametrize("eps, z_eff", [(27.8, 1.224), (26.4, 1.271), (39.6, 0.953)])
def test_implied_effective_noise_multipliers(eps, z_eff):
    step = secldp.calibrate_step(eps, 1e-4, 30, "opacus")
    assert round(secldp.equivalent_noise_multiplier(step), 3) == z_eff


@pytest.mark.parametrize("threat_model", secldp.THREAT_MODELS)
@pytest.mark.parametrize("conversion", ["mironov", "opacus"])
def test_calibration_round_trips(threat_model, conversion):
    eps, delta, steps, n, f = 8.0, 1e-5, 50, 30, 3
    noise = secldp.calibrate_secldp(threat_model, eps, delta, steps, 1.0, n, f, conversion=conversion)
    step = secldp.threat_model_step(threat_model, 1.0, n, f, noise.sigma_cor, noise.sigma_ind)
    assert step == pytest.approx(noise.step, rel=1e-9)
    back = secldp.secldp_epsilon(step, steps, delta, conversion)
    assert eps - 1e-3 <= back <= eps + 1e-9


def test_pld_conversion_round_trip_and_ordering():
    step = secldp.lemma_a4_step(1.0, 30, 3, 0, 0.9, 0.0)
    pap = secldp.secldp_epsilon(step, 20, 1e-5, "mironov")
    opa = secldp.secldp_epsilon(step, 20, 1e-5, "opacus")
    pld = secldp.secldp_epsilon(step, 20, 1e-5, "pld")
    assert pld < opa < pap                          # each conversion is tighter than the previous one
    back = secldp.calibrate_step(1.0, 1e-5, 4, "pld")
    assert 1.0 - 1e-3 <= secldp.secldp_epsilon(back, 4, 1e-5, "pld") <= 1.0


def test_mironov_closed_form_and_corollary_4_1():
    step, steps, delta = 0.01, 30, 1e-4
    assert secldp.mironov_epsilon(step, steps, delta) == pytest.approx(
        steps * step + 2 * math.sqrt(steps * step * math.log(1 / delta)))
    assert secldp.calibrate_step(secldp.mironov_epsilon(step, steps, delta), delta, steps, "mironov") == \
        pytest.approx(step, rel=1e-12)
    # Cor. 4.1 noise is sufficient for (ε, δ) whenever ε < log(1/δ).
    eps = 5.0
    sigma = secldp.corollary_4_1_sigma(eps, delta, steps, C, 100, 5)
    step41 = secldp.threat_model_step("byzldp", C, 100, 5, sigma, sigma)
    assert step41 <= eps**2 / (8 * steps * math.log(1 / delta))
    assert secldp.secldp_epsilon(step41, steps, delta, "mironov") <= eps


def test_step_event_is_the_equivalent_gaussian():
    step = secldp.lemma_a4_step(1.0, 10, 2, 1, 1.0, 0.5)
    assert secldp.step_event(step).noise_multiplier == pytest.approx(1 / math.sqrt(2 * step))
