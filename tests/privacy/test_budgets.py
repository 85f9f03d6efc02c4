"""Heterogeneous budgets: ε lists, Robust-HDP Table 7 distributions and fixed lists, per-client calibration."""
from __future__ import annotations

import numpy as np
import pytest

from trustfl.errors import ConfigError, PrivacyError
from trustfl.privacy import budgets
from trustfl.privacy.analysis.gaussian import epsilon_subsampled_gaussian
from trustfl.privacy.analysis.rhdp import compute_z


def test_epsilons_from_list():
    assert budgets.epsilons_from_list([1, 2.5, 3], 3) == [1.0, 2.5, 3.0]
    assert budgets.epsilons_from_list(2.0, 4) == [2.0] * 4
    assert budgets.epsilons_from_list([0.5], 2) == [0.5, 0.5]
    with pytest.raises(ConfigError, match="one value per client"):
        budgets.epsilons_from_list([1.0, 2.0], 3)
    with pytest.raises(ConfigError, match=r"epsilons\[1\]"):
        budgets.epsilons_from_list([1.0, -2.0], 2)
    with pytest.raises(ConfigError, match="num_clients"):
        budgets.epsilons_from_list([1.0], 0)


@pytest.mark.parametrize("name", list(budgets.EPSILON_DISTRIBUTIONS))
def test_every_distribution_draws_reproducibly_above_the_floor(name):
    a = budgets.epsilons_from_distribution(name, 50, np.random.default_rng(1))
    b = budgets.epsilons_from_distribution(name, 50, np.random.default_rng(1))
    assert a == b and len(a) == 50
    assert min(a) >= 0.15


def test_distribution_moments_match_table_7():
    rng = np.random.default_rng(0)
    n = 20000
    d1 = np.array(budgets.epsilons_from_distribution("dist1", n, rng, floor=1e-9))
    # N(2, 1) with b a std (clipping the ~2% of negative draws at ~0 barely moves the moments).
    assert d1.mean() == pytest.approx(2.0, abs=0.05) and d1.std() == pytest.approx(1.0, abs=0.05)
    d3 = np.array(budgets.epsilons_from_distribution("dist3", n, rng))
    assert d3.min() >= 0.2 and d3.max() <= 5.0 and d3.mean() == pytest.approx(2.6, abs=0.05)
    d2 = np.array(budgets.epsilons_from_distribution("dist2", n, rng))
    low = np.mean(np.abs(d2 - 0.2) < 0.05)                     # the N(0.2, 0.01) component, weight 0.2
    mid = np.mean(np.abs(d2 - 1.0) < 0.4)                      # N(1.0, 0.1), weight 0.6 (+ a little of N(5, 1))
    assert low == pytest.approx(0.2, abs=0.02) and mid == pytest.approx(0.6, abs=0.02)
    d8 = np.array(budgets.epsilons_from_distribution("dist8", n, rng))
    assert np.mean(d8 < 0.3) == pytest.approx(0.6, abs=0.02)
    cifar = budgets.epsilons_from_distribution("dist9", 100, np.random.default_rng(2), scale=10.0)
    assert min(cifar) >= 2.0 and max(cifar) <= 5.0


def test_distribution_errors():
    with pytest.raises(ConfigError, match="dist1, dist2"):
        budgets.epsilons_from_distribution("dist10", 5, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="rng"):
        budgets.epsilons_from_distribution("dist1", 5, 0)     # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        budgets.EpsilonDistribution("bad", components=((0.5, 1.0, 0.1),))


def test_fixed_lists_have_20_clients_and_fit_their_distributions():
    lists = budgets.RHDP_FIXED_LISTS
    assert set(lists) == {"batch_sizes"} | {f"dist{i}" for i in range(1, 10)}
    assert all(len(v) == 20 for v in lists.values())
    assert set(lists["batch_sizes"]) <= {16, 32, 64, 128}
    for name, (lo, hi) in {"dist3": (0.2, 5.0), "dist5": (0.2, 2.0), "dist7": (0.2, 1.0), "dist9": (0.2, 0.5)}.items():
        assert all(lo <= e <= hi for e in lists[name]), name
    assert min(min(v) for k, v in lists.items() if k != "batch_sizes") >= 0.15
    assert budgets.RHDP_UNIFORM_EPSILONS == (2.6, 2.0, 1.1, 0.6, 0.35)


def test_calibrate_clients_gives_each_client_its_own_noise():
    eps = [0.5, 2.0, 0.5, 8.0]
    z = budgets.calibrate_clients(eps, 1e-5, 1.0, 10)
    assert z[0] == z[2] and z[0] > z[1] > z[3]
    for e, zi in zip(eps, z):
        assert e - 1e-3 <= epsilon_subsampled_gaussian(zi, 1.0, 10, 1e-5) <= e
    # Heterogeneous sampling rates and steps (one per client).
    z2 = budgets.calibrate_clients([1.0, 1.0], 1e-5, [1.0, 1.0], [10, 5])
    assert z2[0] > z2[1]
    with pytest.raises(PrivacyError, match="sample_rates"):
        budgets.calibrate_clients([1.0, 2.0], 1e-5, [1.0, 1.0, 1.0], 10)
    with pytest.raises(PrivacyError, match="accountant"):
        budgets.calibrate_clients([1.0], 1e-5, 1.0, 10, accountant="moments")


@pytest.mark.parametrize("args, fragment", [
    ((1.0, 1e-5, 0.1, 100), "`epsilons` must be a sequence of one ε per client, found 1.0"),
    ((["1"], 1e-5, 0.1, 100), "`epsilons[0]` must be a number, found '1'"),
    (([True, 2.0], 1e-5, 0.1, 100), "`epsilons[0]` must be a number, found True"),
    (([1.0], "1e-5", 0.1, 100), "`delta` must be a number, found '1e-5'"),
    (([1.0, 2.0], 1e-5, [0.1, True], 100), "`sample_rates[1]` must be a number, found True"),
])
def test_calibrate_clients_takes_numbers_only(args, fragment):
    # a float budget raised "'float' object is not iterable"; float() took '1' and True as budgets of 1.0
    with pytest.raises(PrivacyError) as err:
        budgets.calibrate_clients(*args)
    assert fragment in str(err.value)


def test_calibrate_clients_rhdp_matches_compute_z():
    # Robust-HDP style: q = b/N, steps = E·N/b (a real number), classic conversion, z rounded to 2 decimals.
    b, rounds = [16, 32], [200, 30]
    z = budgets.calibrate_clients([0.2, 1.0], 1e-4, [bi / 2400 for bi in b],
                                  [e * 2400 / bi for e, bi in zip(rounds, b)], accountant="rhdp")
    assert z == [compute_z(0.2, 2400, 16, global_rounds=200), compute_z(1.0, 2400, 32, global_rounds=30)]
    assert z == [28.18, 2.92]


@pytest.mark.parametrize("accountant, eps", [("rdp", 3.3), ("rdp", 2.5), ("pld", 3.3), ("rhdp", 3.0)])
def test_rounded_noise_multipliers_round_up_and_never_pass_the_budget(accountant, eps):
    """Rounding to the nearest decimal could lower z: ε = 3.3 came back as z = 0.8, which spends 3.73 (rdp)."""
    from trustfl.privacy.analysis.rhdp import rhdp_epsilon
    raw = budgets.calibrate_clients([eps], 1e-5, 0.01, 1000, accountant=accountant)[0] if accountant != "rhdp" else \
        None
    z = budgets.calibrate_clients([eps], 1e-5, 0.01, 1000, accountant=accountant, round_decimals=1)[0]
    spent = rhdp_epsilon(z, 0.01, 1000, 1e-5) if accountant == "rhdp" else \
        epsilon_subsampled_gaussian(z, 0.01, 1000, 1e-5, accountant)
    assert spent <= eps and abs(z * 10 - round(z * 10)) < 1e-9
    assert raw is None or raw <= z < raw + 0.1 + 1e-12


def test_round_up_and_its_range():
    assert budgets.round_up(0.8123, 2) == 0.82 and budgets.round_up(0.8, 1) == 0.8
    assert budgets.round_up(1.23, 15) == 1.23
    for bad in (-1, 16, 400, 1.5, True):
        with pytest.raises(PrivacyError, match="round_decimals"):
            budgets.round_up(1.0, bad)
