"""Privacy of DP-CalR (trustfl.privacy.analysis.fedsc): closed form vs RDP composition, calibration round trips,
Table 6 of the FedSC paper under the replace-one sensitivity √2·μ/|D_j|, and input validation."""
from __future__ import annotations

import math

import pytest

from trustfl.errors import ConfigError, PrivacyError
from trustfl.privacy.analysis.fedsc import (calibrate_fedsc_sigma, fedsc_epsilon, fedsc_rdp, fedsc_sensitivity,
                                            fedsc_sigma_closed_form, release_event)
from trustfl.selfsup.share import FedSCCorrelation

# Table 6 rows: (μ, σ, T_j, |D_j|, δ, ε as computed with Δ = √2·μ/|D_j|); T_j = 100 for "t > 100", 50 for
# "t > 150" and for "t > 100, t % 2 = 0" (T = 200 rounds).
TABLE_6 = [(2, 0.0034, 100, 10_000, 1e-2, 2.87), (2, 0.0018, 100, 10_000, 1e-2, 6.00),
           (2, 0.0048, 100, 10_000, 1e-4, 2.70), (2, 0.0018, 100, 10_000, 1e-4, 7.98),
           (4, 0.01, 50, 5_000, 1e-2, 2.75), (4, 0.0052, 50, 5_000, 1e-2, 5.85),
           (4, 0.012, 50, 5_000, 1e-4, 3.08), (4, 0.0051, 50, 5_000, 1e-4, 7.96),
           (5, 0.013, 50, 2_500, 1e-2, 5.85), (5, 0.0075, 50, 2_500, 1e-2, 11.65),
           (5, 0.04, 50, 2_500, 1e-4, 2.27), (5, 0.013, 50, 2_500, 1e-4, 7.79)]


def test_sensitivities():
    assert fedsc_sensitivity(2.0, 10_000) == pytest.approx(math.sqrt(2) * 2e-4, rel=1e-15)
    assert fedsc_sensitivity(2.0, 10_000, "zero_out") == pytest.approx(2e-4, rel=1e-15)


def test_closed_form_is_the_rdp_bound_at_the_optimal_real_order():
    sigma, mu, n, t, delta = 0.003, 2.0, 10_000, 100, 1e-3
    rho = t * fedsc_sensitivity(mu, n) ** 2 / (2 * sigma ** 2)
    order = math.sqrt(math.log(1 / delta) / rho) + 1                     # argmin of ρα + log(1/δ)/(α − 1)
    assert fedsc_rdp(order, sigma, mu, n, t) == pytest.approx(rho * order, rel=1e-14)
    expected = fedsc_rdp(order, sigma, mu, n, t) + math.log(1 / delta) / (order - 1)
    assert fedsc_epsilon(sigma, mu, n, t, delta) == pytest.approx(expected, rel=1e-12)
    d2 = fedsc_sensitivity(mu, n)
    printed = t * d2 ** 2 / (2 * sigma ** 2) + math.sqrt(2 * t * d2 ** 2 * math.log(1 / delta) / sigma ** 2)
    assert fedsc_epsilon(sigma, mu, n, t, delta) == pytest.approx(printed, rel=1e-12)
    assert fedsc_epsilon(sigma, mu, n, 0, delta) == 0.0


def test_rdp_conversion_is_tighter_and_matches_the_release_event():
    from dp_accounting.rdp import rdp_privacy_accountant

    args = (0.004, 2.0, 10_000, 100, 1e-2)
    tight = fedsc_epsilon(*args, conversion="rdp")
    assert tight < fedsc_epsilon(*args)
    acc = rdp_privacy_accountant.RdpAccountant(list(range(2, 65)) + [80, 96, 128, 192, 256, 512, 1024])
    for _ in range(100):
        acc.compose(release_event(0.004, 2.0, 10_000))
    assert acc.get_epsilon(1e-2) == pytest.approx(tight, rel=1e-9)


@pytest.mark.parametrize("mu, sigma, t, n, delta, eps", TABLE_6)
def test_table_6_with_the_replace_one_sensitivity(mu, sigma, t, n, delta, eps):
    assert round(fedsc_epsilon(sigma, mu, n, t, delta), 2) == pytest.approx(eps, abs=1e-9)
    # the paper's own Δ = μ/|D_j| gives about 2/3 of it (e.g. 1.96 instead of 3 for SVHN, σ = 0.0034)
    assert fedsc_epsilon(sigma, mu, n, t, delta, "zero_out") < 0.75 * eps


def test_svhn_calibration_gives_sigma_0_00180():
    """SVHN, ε = 6, δ = 1e-2, T = 100, μ = 2, |D| = 10⁴: s = √(2 log(1/δ)), a = −s + √(s² + 2ε), σ = √T·Δ/a."""
    s = math.sqrt(2 * math.log(100))
    a = -s + math.sqrt(s * s + 12)
    by_hand = math.sqrt(100) * math.sqrt(2) * 2 / 10_000 / a
    sigma = calibrate_fedsc_sigma(6.0, 1e-2, 2.0, 10_000, 100)
    assert round(sigma, 5) == 0.00180
    assert sigma == pytest.approx(by_hand, rel=1e-9)
    assert fedsc_sigma_closed_form(6.0, 1e-2, 2.0, 10_000, 100) == pytest.approx(by_hand, rel=1e-12)


@pytest.mark.parametrize("conversion", ["closed_form", "rdp"])
@pytest.mark.parametrize("eps, delta, t, neighboring", [(6.0, 1e-2, 100, "replace_one"), (0.5, 1e-5, 7, "zero_out"),
                                                        (30.0, 1e-4, 1, "replace_one")])
def test_calibration_round_trips(conversion, eps, delta, t, neighboring):
    sigma = calibrate_fedsc_sigma(eps, delta, 3.0, 5_000, t, neighboring, conversion)
    assert fedsc_epsilon(sigma, 3.0, 5_000, t, delta, neighboring, conversion) == pytest.approx(eps, rel=1e-9)
    if conversion == "closed_form":
        assert sigma == pytest.approx(fedsc_sigma_closed_form(eps, delta, 3.0, 5_000, t, neighboring), rel=1e-9)


@pytest.mark.parametrize("conversion", ["closed_form", "rdp"])
def test_epsilon_depends_on_sigma_over_delta_only(conversion):
    """σ and μ scaled together leave ε as it was, even where σ² underflows (a ZeroDivisionError before)."""
    base = fedsc_epsilon(0.01, 2.0, 100, 10, 1e-2, conversion=conversion)
    assert fedsc_epsilon(1e-202, 2e-200, 100, 10, 1e-2, conversion=conversion) == pytest.approx(base, rel=1e-12)
    assert fedsc_rdp(8.0, 1e-202, 2e-200, 100, 10) == pytest.approx(fedsc_rdp(8.0, 0.01, 2.0, 100, 10), rel=1e-12)


@pytest.mark.parametrize("call, key", [
    (lambda: fedsc_epsilon(1e-200, 2.0, 100, 10, 1e-2), "sigma"),   # σ/Δ = 3.5e-199: ε beyond float64
    (lambda: fedsc_epsilon(0.0, 2.0, 100, 10, 1e-2), "sigma"),
    (lambda: fedsc_epsilon(-1.0, 2.0, 100, 10, 1e-2), "sigma"),
    (lambda: fedsc_epsilon(0.1, 0.0, 100, 10, 1e-2), "mu"),
    (lambda: fedsc_epsilon(0.1, 2.0, 100, 10, 0.0), "delta"),
    (lambda: fedsc_epsilon(0.1, 2.0, 100, 10, 1.0), "delta"),
    (lambda: fedsc_epsilon(0.1, 2.0, 0, 10, 1e-2), "dataset_size"),
    (lambda: fedsc_epsilon(0.1, 2.0, 100, -1, 1e-2), "releases"),
    (lambda: fedsc_epsilon(0.1, 2.0, 100, 10, 1e-2, "add_remove"), "neighboring"),
    (lambda: fedsc_epsilon(0.1, 2.0, 100, 10, 1e-2, conversion="pld"), "conversion"),
    (lambda: calibrate_fedsc_sigma(0.0, 1e-2, 2.0, 100, 10), "epsilon"),
    (lambda: calibrate_fedsc_sigma(-1.0, 1e-2, 2.0, 100, 10), "epsilon"),
    (lambda: calibrate_fedsc_sigma(6.0, 2.0, 2.0, 100, 10), "delta"),
    (lambda: calibrate_fedsc_sigma(6.0, 1e-2, -2.0, 100, 10), "mu"),
    (lambda: calibrate_fedsc_sigma(6.0, 1e-2, 2.0, 100, 0), "releases"),
    (lambda: calibrate_fedsc_sigma(1e-9, 1e-2, 2.0, 100, 100), "noise multiplier"),   # unreachable ε
    (lambda: fedsc_rdp(1.0, 0.1, 2.0, 100, 10), "order"),
])
def test_bad_inputs_raise_privacy_errors_naming_the_argument(call, key):
    with pytest.raises(PrivacyError, match=key):
        call()


@pytest.mark.parametrize("rounds", [1, 2, 7, 60, 61])
@pytest.mark.parametrize("share_from", [1, 2, 31, 60, 62])
@pytest.mark.parametrize("share_every", [1, 2, 3, 59])
def test_release_count_is_the_number_of_sharing_rounds(rounds, share_from, share_every):
    """T_j (what the accountant charges) equals the rounds t = 1..T in which the schedule shares, counted one by one."""
    stat = FedSCCorrelation(rounds=rounds, share_from=share_from, share_every=share_every)
    by_round = sum(1 for t in range(1, rounds + 1) if t >= share_from and (t - share_from) % share_every == 0)
    assert stat.releases() == by_round
    assert sum(stat.shares(r) for r in range(rounds)) == by_round


@pytest.mark.parametrize("kwargs, key", [({"sigma": 1e-300}, "sigma"), ({"sigma": [0.1, 1e300]}, "sigma"),
                                         ({"sigma": True}, "sigma"), ({"mu": 1e78}, "mu")])
def test_statistic_refuses_numbers_its_float32_noise_and_clip_cannot_carry(kwargs, key):
    with pytest.raises(ConfigError, match=f"`{key}` must be a number in"):
        FedSCCorrelation(**kwargs)
    assert FedSCCorrelation(sigma=[0, 0.0, 1e-30, 1e30]).sigma == (0.0, 0.0, 1e-30, 1e30)
