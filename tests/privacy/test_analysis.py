"""Pure privacy math: subsampled Gaussian (dp_accounting), μ-GDP and Robust-HDP's compute_z."""
from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from trustfl.errors import PrivacyError, UnsupportedEventError
from trustfl.privacy.analysis import gaussian, gdp, rhdp

# -------------------------------------------------------------------------------------------------------------
# Subsampled Gaussian: ε and calibration round trips
# -------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("z, q, steps, sampling, orders", [
    (1.1, 0.01, 300, "poisson", None),
    (0.7, 0.05, 100, "poisson", None),
    (3.0, 1.0, 10, "poisson", None),
    # Integer orders only: dp_accounting's without-replacement RDP is slow at its large default orders.
    (1.5, 0.02, 200, "without_replacement", tuple(range(2, 40))),
])
def test_rdp_calibration_round_trips(z, q, steps, sampling, orders):
    delta = 1e-5
    eps = gaussian.epsilon_subsampled_gaussian(z, q, steps, delta, "rdp", sampling, orders=orders)
    z_cal = gaussian.calibrate_noise_multiplier(eps, delta, q, steps, "rdp", sampling, orders=orders)
    eps_back = gaussian.epsilon_subsampled_gaussian(z_cal, q, steps, delta, "rdp", sampling, orders=orders)
    assert eps - 1e-3 <= eps_back <= eps          # within 1e-3 and on the private side
    assert z_cal == pytest.approx(z, rel=1e-3)


@pytest.mark.parametrize("z, q, steps", [(5.0, 1.0, 4), (3.0, 0.05, 20)])
def test_pld_calibration_round_trips(z, q, steps):
    delta = 1e-5
    eps = gaussian.epsilon_subsampled_gaussian(z, q, steps, delta, "pld")
    z_cal = gaussian.calibrate_noise_multiplier(eps, delta, q, steps, "pld")
    eps_back = gaussian.epsilon_subsampled_gaussian(z_cal, q, steps, delta, "pld")
    assert eps - 1e-3 <= eps_back <= eps
    assert z_cal == pytest.approx(z, rel=1e-2)
    # PLD is tighter than RDP on the same schedule.
    assert eps < gaussian.epsilon_subsampled_gaussian(z, q, steps, delta, "rdp")


def test_smaller_epsilon_needs_more_noise():
    targets = [0.5, 1.0, 2.0, 4.0, 8.0]
    sigmas = [gaussian.calibrate_noise_multiplier(e, 1e-5, 1.0, 10) for e in targets]
    assert all(a > b for a, b in zip(sigmas, sigmas[1:]))
    sub = [gaussian.calibrate_noise_multiplier(e, 1e-5, 0.05, 20) for e in (0.5, 2.0)]
    assert sub[0] > sub[1]


def test_epsilon_edge_cases_and_monotonicity():
    assert gaussian.epsilon_subsampled_gaussian(1.0, 0.1, 0, 1e-5) == 0.0
    assert gaussian.epsilon_subsampled_gaussian(1.0, 0.0, 10, 1e-5) == 0.0
    assert gaussian.epsilon_subsampled_gaussian(0.0, 0.1, 10, 1e-5) == math.inf
    e = [gaussian.epsilon_subsampled_gaussian(z, 1.0, 10, 1e-5) for z in (1.0, 2.0, 4.0)]
    assert e[0] > e[1] > e[2]
    # Subsampling amplifies: q < 1 spends less than q = 1.
    assert gaussian.epsilon_subsampled_gaussian(2.0, 0.1, 10, 1e-5) < e[1]


@pytest.mark.parametrize("kwargs", [
    dict(noise_multiplier=1.0, sample_rate=0.1, steps=10, delta=1.0),
    dict(noise_multiplier=1.0, sample_rate=1.5, steps=10, delta=1e-5),
    dict(noise_multiplier=-1.0, sample_rate=0.1, steps=10, delta=1e-5),
    dict(noise_multiplier=1.0, sample_rate=0.1, steps=-1, delta=1e-5),
    dict(noise_multiplier=1.0, sample_rate=0.1, steps=10, delta=1e-5, accountant="moments"),
    dict(noise_multiplier=1.0, sample_rate=0.1, steps=10, delta=1e-5, sampling="shuffle"),
    dict(noise_multiplier=None, sample_rate=0.1, steps=10, delta=1e-5),
    dict(noise_multiplier="1", sample_rate=0.1, steps=10, delta=1e-5),
    dict(noise_multiplier=1.0, sample_rate=None, steps=10, delta=1e-5),
    dict(noise_multiplier=1.0, sample_rate=True, steps=10, delta=1e-5),
    dict(noise_multiplier=1.0, sample_rate=0.1, steps=True, delta=1e-5),
    dict(noise_multiplier=1.0, sample_rate=0.1, steps=None, delta=1e-5),
    dict(noise_multiplier=1.0, sample_rate=0.1, steps=10, delta="x"),
    dict(noise_multiplier=1e-10, sample_rate=0.1, steps=1, delta=1e-5, accountant="pld"),  # PLD's grid overflows
])
def test_epsilon_rejects_bad_arguments(kwargs):
    with pytest.raises(PrivacyError):
        gaussian.epsilon_subsampled_gaussian(**kwargs)


@pytest.mark.parametrize("kwargs", [
    dict(epsilon=None, delta=1e-5, sample_rate=0.1, steps=10),
    dict(epsilon=1.0, delta=None, sample_rate=0.1, steps=10),
    dict(epsilon=1.0, delta=1e-5, sample_rate="x", steps=10),
    dict(epsilon=1.0, delta=1e-5, sample_rate=0.1, steps=None),
    dict(epsilon=1.0, delta=1e-5, sample_rate=0.1, steps=10, tol=None),
])
def test_calibration_rejects_arguments_that_are_not_numbers(kwargs):
    with pytest.raises(PrivacyError, match="must be"):
        gaussian.calibrate_noise_multiplier(**kwargs)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # dp_accounting's, at z = 1e-153
@pytest.mark.parametrize("q", [1e-4, 0.1, 0.99])
def test_a_vanishing_noise_multiplier_never_reads_as_private(q):
    # below about 1e-152 dp_accounting's RDP series fails (NaN orders) and its conversion returned ε = 0
    eps = [gaussian.epsilon_subsampled_gaussian(z, q, 10, 1e-5) for z in (1e-3, 1e-100, 1e-150, 1e-153, 1e-160)]
    assert eps[0] < eps[1] < eps[2] < eps[3] <= eps[4] == math.inf


def test_pld_refuses_sampling_without_replacement():
    with pytest.raises(UnsupportedEventError, match="SampledWithoutReplacementDpEvent"):
        gaussian.epsilon_subsampled_gaussian(1.0, 0.1, 10, 1e-5, "pld", "without_replacement")


def test_calibration_rejects_unreachable_targets():
    with pytest.raises(PrivacyError, match="epsilon"):
        gaussian.calibrate_noise_multiplier(0.0, 1e-5, 0.1, 10)
    with pytest.raises(PrivacyError, match="too loose|reaches"):
        gaussian.calibrate_noise_multiplier(1e6, 1e-5, 0.001, 1)


# -------------------------------------------------------------------------------------------------------------
# μ-GDP (DPZV)
# -------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sigma, steps", [(2.0, 16), (5.0, 30)])
def test_gdp_closed_form_matches_pld_for_the_plain_gaussian(sigma, steps):
    """ε at fixed δ = 1e-5: μ-GDP with μ = √T/σ is exact for T Gaussian steps, so it must match PLD."""
    mu = gdp.mu_gaussian(sigma, steps)
    assert mu == pytest.approx(math.sqrt(steps) / sigma)
    eps_gdp = gdp.epsilon_from_mu(mu, 1e-5)
    eps_pld = gaussian.epsilon_subsampled_gaussian(sigma, 1.0, steps, 1e-5, "pld")
    assert eps_pld == pytest.approx(eps_gdp, abs=1e-3)


# DPZV (App. C, Thm C.4): μ at (ε, δ), our computation.
@pytest.mark.parametrize("eps, mu_1e3, mu_1e5", [
    (0.1, 0.0575, 0.0325), (0.5, 0.2169, 0.1422), (1.0, 0.3884, 0.2681), (5.0, 1.4496, 1.1212),
    (10.0, 2.4627, 2.0004)])
def test_gdp_mu_table(eps, mu_1e3, mu_1e5):
    assert gdp.mu_from_epsilon(eps, 1e-3) == pytest.approx(mu_1e3, abs=1e-4)
    assert gdp.mu_from_epsilon(eps, 1e-5) == pytest.approx(mu_1e5, abs=1e-4)


def test_gdp_conversions_invert_each_other():
    for mu in (0.1, 0.5, 1.0, 3.0):
        for delta in (1e-3, 1e-5):
            eps = gdp.epsilon_from_mu(mu, delta)
            assert gdp.delta_from_mu(eps, mu) == pytest.approx(delta, rel=1e-6)
            assert gdp.mu_from_epsilon(eps, delta) == pytest.approx(mu, rel=1e-6)
    # δ(ε) decreases in ε and increases in μ; δ(0) = 2Φ(μ/2) − 1.
    assert gdp.delta_from_mu(1.0, 1.0) > gdp.delta_from_mu(2.0, 1.0)
    assert gdp.delta_from_mu(1.0, 2.0) > gdp.delta_from_mu(1.0, 1.0)
    assert gdp.delta_from_mu(0.0, 1.0) == pytest.approx(math.erf(0.5 / math.sqrt(2)), rel=1e-12)
    assert gdp.delta_from_mu(500.0, 1.0) == 0.0                  # no overflow at large ε


def test_gdp_clt_and_dpzv_worked_example():
    first = gdp.mu_poisson_clt_first_order(3.0, 0.01, 1000)
    clt = gdp.mu_poisson_clt(3.0, 0.01, 1000)
    assert clt > first                                            # the paper's form is optimistic
    assert gdp.mu_poisson_clt(300.0, 0.01, 1000) == pytest.approx(gdp.mu_poisson_clt_first_order(300.0, 0.01, 1000),
                                                                   rel=1e-4)
    # DPZV (Sec. 6, App. C), MNIST: D = 60000, B = 64, M = 7, 100 epochs, C = 10, ε = 1, δ = 1e-3 → σ_dp ≈ 0.695.
    steps = 100 * 7 * math.ceil(60000 / 64)
    sigma_dp = gdp.dpzv_noise_std(10.0, steps, 60000, gdp.mu_from_epsilon(1.0, 1e-3))
    assert sigma_dp == pytest.approx(0.695, abs=5e-4)
    assert sigma_dp * 64 / 20 == pytest.approx(2.2, abs=0.05)     # noise multiplier s = σ_dp·B/(2C)
    with pytest.raises(PrivacyError):
        gdp.mu_from_epsilon(1.0, 1.5)


# -------------------------------------------------------------------------------------------------------------
# Robust-HDP compute_z (z table of the authors' compute_z: N = 2400, δ = 1e-4, K = 1; ε = 0.2, 0.5, 1, 2, 5)
# -------------------------------------------------------------------------------------------------------------

RHDP_EPS = (0.2, 0.5, 1.0, 2.0, 5.0)
RHDP_TABLE = {
    200: {16: (28.18, 10.08, 5.15, 2.71, 1.31), 32: (39.84, 14.24, 7.25, 3.77, 1.73),
          64: (56.34, 20.13, 10.22, 5.28, 2.35), 128: (79.67, 28.45, 14.44, 7.43, 3.25)},
    30: {16: (10.95, 3.98, 2.12, 1.24, 0.78), 32: (15.47, 5.59, 2.92, 1.62, 0.92),
         64: (21.86, 7.87, 4.06, 2.19, 1.13), 128: (30.91, 11.11, 5.70, 3.02, 1.46)},
    20: {16: (8.96, 3.29, 1.79, 1.10, 0.73), 32: (12.65, 4.60, 2.43, 1.40, 0.84),
         64: (17.87, 6.47, 3.37, 1.86, 1.02), 128: (25.26, 9.11, 4.70, 2.53, 1.27)},
}
RHDP_CELLS = [(E, b, eps, z) for E, row in RHDP_TABLE.items() for b, zs in row.items()
              for eps, z in zip(RHDP_EPS, zs)]


def test_rhdp_table_every_cell_brackets_the_root():
    """All 60 cells, two ε evaluations each: the exact root lies within ±0.005 of the table's rounded z.

    ε(z) is decreasing, so ε(z − 0.005) > ε_target >= ε(z + 0.005) means round(root, 2) = z. All 60 table values
    are reproduced exactly by dp_accounting's RDP + the classic conversion (no cell differs).
    """
    for E, b, eps, z in RHDP_CELLS:
        q, steps = b / 2400, E * 2400 / b
        above = rhdp.rhdp_epsilon(z - 0.005, q, steps, 1e-4)
        below = rhdp.rhdp_epsilon(z + 0.005, q, steps, 1e-4)
        assert above > eps >= below, (E, b, eps, z, above, below)


@pytest.mark.parametrize("E, b, eps, z", [RHDP_CELLS[0], RHDP_CELLS[27]])
def test_rhdp_compute_z_bisection_reproduces_spec_cells(E, b, eps, z):
    assert rhdp.compute_z(eps, dataset_size=2400, batch_size=b, global_rounds=E) == z
    assert rhdp.compute_z(eps, dataset_size=2400, batch_size=b, global_rounds=E, method="secant") == z


@pytest.mark.slow
def test_rhdp_full_table_with_the_papers_bisection():
    for E, b, eps, z in RHDP_CELLS:
        assert rhdp.compute_z(eps, 2400, b, global_rounds=E) == pytest.approx(z, abs=0.01 + 1e-9), (E, b, eps)


def test_rhdp_classic_conversion_is_looser_than_dp_accountings_default():
    orders = rhdp.RHDP_ORDERS
    rdp = 7500 * rhdp.rdp_poisson_gaussian(64 / 2400, 5.28, orders)
    classic = rhdp.classic_rdp_to_epsilon(orders, rdp, 1e-4)
    improved, _ = rdp_privacy_accountant.compute_epsilon(orders, rdp, 1e-4)
    assert classic == pytest.approx(2.0, abs=0.01)
    assert improved < classic
    assert classic == pytest.approx(float(np.min(rdp - math.log(1e-4) / (np.asarray(orders) - 1))))


def test_rhdp_rounding_and_errors():
    raw = rhdp.compute_z(2.0, 2400, 16, global_rounds=20, round_decimals=None, method="secant")
    assert abs(rhdp.rhdp_epsilon(raw, 16 / 2400, 20 * 150, 1e-4) - 2.0) <= 1e-6
    assert round(raw, 2) == 1.10
    with pytest.raises(PrivacyError, match="batch_size"):
        rhdp.compute_z(1.0, 100, 200)
    with pytest.raises(PrivacyError, match="epsilon"):
        rhdp.compute_z(-1.0, 2400, 16)
    with pytest.raises(PrivacyError, match="out of reach"):
        rhdp.compute_z(1e-4, 2400, 128, global_rounds=200)


@pytest.mark.parametrize("z", [1e-200, 1e200])
def test_a_noise_multiplier_the_rdp_series_cannot_take_is_a_privacy_error(z):
    # σ² under- or overflows inside dp_accounting: a ZeroDivisionError / OverflowError crashed the run's ledger
    with pytest.raises(PrivacyError, match="cannot analyse .*GaussianDpEvent"):
        gaussian.epsilon_subsampled_gaussian(z, 0.1, 10, 1e-5)
    ledger = gaussian.make_accountant("rdp")
    with pytest.raises(PrivacyError, match="outside what it computes"):
        ledger.compose(gaussian.sampled_gaussian_event(z, 0.1, 10))


def test_pld_refuses_a_noise_multiplier_whose_grid_would_take_hours():
    """z = 0.01 (q = 0.01, 1000 steps) ran for more than 400 s; such a z is refused at once, naming the rdp
    accountant, whose ε (an upper bound) it still computes."""
    from trustfl.errors import PrivacyError
    from trustfl.privacy.analysis.gaussian import epsilon_subsampled_gaussian
    with pytest.raises(PrivacyError, match=r"too small for the 'pld' accountant.*use the 'rdp' accountant"):
        epsilon_subsampled_gaussian(0.01, 0.01, 1000, 1e-5, "pld")
    assert epsilon_subsampled_gaussian(0.01, 0.01, 1000, 1e-5, "rdp") > 1e3


def test_pld_refuses_steps_whose_losses_reach_past_its_grid_and_calibration_steps_around_them(monkeypatch):
    """q = 0.01, z = 1.1, 1e9 steps grew past 16 GB without answering (or yielding to SIGTERM); the RDP bound
    (1.3e5 there) refuses such a composition at once. 1e5 steps (ε 21) still run on the PLD grid, and a PLD
    calibration whose search passes through such a z treats it as not private enough, not as an error."""
    from trustfl.errors import PrivacyError
    from trustfl.privacy.analysis.gaussian import (PLD_MAX_LOSS_RANGE, calibrate_noise_multiplier,
                                                   epsilon_subsampled_gaussian)
    with pytest.raises(PrivacyError, match=r"^steps = 1000000000 at noise_multiplier = 1.1, sample_rate = 0.01 spend "
                                           r"ε <= 1.28\de\+05 \(RDP\), beyond the 200 .*use the 'rdp' accountant"):
        epsilon_subsampled_gaussian(1.1, 0.01, 10**9, 1e-5, "pld")
    pld = epsilon_subsampled_gaussian(1.1, 0.01, 10**5, 1e-5, "pld")
    assert 20 < pld < epsilon_subsampled_gaussian(1.1, 0.01, 10**5, 1e-5, "rdp") < PLD_MAX_LOSS_RANGE
    from trustfl.privacy.analysis import gaussian
    monkeypatch.setattr(gaussian, "PLD_MAX_LOSS_RANGE", 3.5)  # a span the search crosses, at PLD's cheap ε
    z = calibrate_noise_multiplier(3.0, 1e-5, 1.0, 4, "pld", tol=0.01)
    assert epsilon_subsampled_gaussian(0.8 * z, 1.0, 4, 1e-5, "rdp") > 3.5  # the search started past the span
    assert 2.99 <= epsilon_subsampled_gaussian(z, 1.0, 4, 1e-5, "pld") <= 3.0
