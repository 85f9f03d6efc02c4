"""The μ-GDP accountant (``accountant="gdp"`` / ``"gdp_clt"``): closed forms, DPZV's numbers, ledger integration."""
from __future__ import annotations

import copy
import json
import math
import pickle

import pytest
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation

from trustfl.errors import BudgetExceededError, CheckpointError, PrivacyError, UnsupportedEventError
from trustfl.privacy.accountant import Budget, LedgerBook, PrivacyLedger, check_schedule
from trustfl.privacy.analysis.gaussian import (ACCOUNTANTS, calibrate_noise_multiplier, epsilon_subsampled_gaussian,
                                               make_accountant)
from trustfl.privacy.analysis.gdp import (dpzv_noise_std, epsilon_from_mu, mu_from_epsilon, mu_poisson_clt,
                                          mu_poisson_clt_first_order)
from trustfl.privacy.analysis.gdp_accountant import GdpAccountant
from trustfl.privacy.events import composed, gaussian_event, poisson_sampled, self_composed

GAUSS = dp_event.GaussianDpEvent
POISSON = dp_event.PoissonSampledDpEvent


def _step(sigma: float, q: float) -> dp_event.DpEvent:
    return POISSON(q, GAUSS(sigma))


# (a) closed forms -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sigma, q, steps", [(1.1, 0.01, 1000), (0.7, 0.2, 37), (5.0, 1e-3, 656600)])
def test_first_order_and_clt_match_closed_forms(sigma, q, steps):
    first = GdpAccountant("first_order").compose(_step(sigma, q), steps)
    assert math.isclose(first.mu(), q * math.sqrt(steps) / sigma, rel_tol=1e-12, abs_tol=0.0)
    assert math.isclose(first.mu(), mu_poisson_clt_first_order(sigma, q, steps), rel_tol=1e-12, abs_tol=0.0)
    clt = GdpAccountant("clt").compose(_step(sigma, q), steps)
    assert math.isclose(clt.mu(), mu_poisson_clt(sigma, q, steps), rel_tol=1e-12, abs_tol=0.0)
    assert first.get_epsilon(1e-5) == epsilon_from_mu(first.mu(), 1e-5)


def test_plain_gaussian_is_exact_in_both_forms_and_empty_is_zero():
    for form in ("first_order", "clt"):
        acc = GdpAccountant(form)
        assert acc.mu() == 0.0 and acc.get_epsilon(1e-5) == 0.0
        acc.compose(GAUSS(2.0), 9)
        assert math.isclose(acc.mu(), 1.5, rel_tol=1e-15)
        acc.compose(dp_event.NoOpDpEvent(), 5).compose(POISSON(0.3, dp_event.NoOpDpEvent()))
        assert math.isclose(acc.mu(), 1.5, rel_tol=1e-15)
        assert math.isclose(acc.get_delta(acc.get_epsilon(1e-4)), 1e-4, rel_tol=1e-8)


def test_non_private_and_zero_rate_steps():
    acc = GdpAccountant("clt").compose(_step(1.0, 0.0), 10)
    assert acc.mu() == 0.0
    assert GdpAccountant("clt").compose(_step(1e-3, 0.5)).get_epsilon(1e-5) == math.inf  # e^{1e6}: overflow → ∞
    assert GdpAccountant().compose(GAUSS(0.0)).get_epsilon(1e-5) == math.inf


# (b) DPZV's worked example ----------------------------------------------------------------------------------------
def test_dpzv_worked_example_spends_exactly_the_budget():
    D, B, T, C, eps, delta = 60000, 64, 656600, 10.0, 1.0, 1e-3
    mu = mu_from_epsilon(eps, delta)
    assert abs(mu - 0.3884) < 1e-4
    sigma_dp = dpzv_noise_std(C, T, D, mu)
    assert abs(sigma_dp - 0.695) < 1e-3
    s = sigma_dp * B / (2 * C)  # noise multiplier: std σ_dp over the replace-one sensitivity 2C/B
    ledger = PrivacyLedger(0, Budget(eps, delta), accountant="gdp", neighboring="replace_one")
    ledger.compose(poisson_sampled(gaussian_event(s), B / D), count=T)
    assert math.isclose(ledger.epsilon_spent(), eps, rel_tol=1e-9)
    assert math.isclose(ledger._acc.mu(), mu, rel_tol=1e-12)


# (c) CLT vs first order -------------------------------------------------------------------------------------------
def test_clt_spends_more_for_small_sigma_and_agrees_for_large_sigma():
    q, steps, delta = 0.01, 5000, 1e-5

    def eps(accountant, sigma):
        return epsilon_subsampled_gaussian(sigma, q, steps, delta, accountant)

    for sigma in (0.6, 0.8, 1.0):
        assert eps("gdp_clt", sigma) > 1.05 * eps("gdp", sigma)
    assert math.isclose(eps("gdp_clt", 50.0), eps("gdp", 50.0), rel_tol=1e-3)
    assert eps("gdp_clt", 50.0) > eps("gdp", 50.0)


# (d) composition structure ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("form", ["first_order", "clt"])
def test_composed_and_self_composed_equal_flat_composition(form):
    a, b, g = _step(1.2, 0.02), _step(0.9, 0.05), GAUSS(3.0)
    flat = GdpAccountant(form)
    for _ in range(4):
        flat.compose(a, 3).compose(b).compose(g, 2)
    nested = GdpAccountant(form).compose(self_composed(composed([self_composed(a, 3), b, self_composed(g, 2)]), 4))
    counted = GdpAccountant(form).compose(composed([self_composed(a, 3), b, self_composed(g, 2)]), 4)
    assert math.isclose(nested.mu(), flat.mu(), rel_tol=1e-13)
    assert math.isclose(counted.mu(), flat.mu(), rel_tol=1e-13)


# (e) unsupported events -------------------------------------------------------------------------------------------
UNSUPPORTED = [
    dp_event.LaplaceDpEvent(1.0),
    dp_event.SampledWithoutReplacementDpEvent(1000, 10, GAUSS(1.0)),
    POISSON(0.1, POISSON(0.5, GAUSS(1.0))),                                  # nested sampling
    POISSON(0.1, dp_event.LaplaceDpEvent(1.0)),
    dp_event.NonPrivateDpEvent(),
    composed([_step(1.0, 0.01), dp_event.LaplaceDpEvent(1.0)]),             # one bad leaf spoils the whole event
    GAUSS(-1.0),
]


@pytest.mark.parametrize("event", UNSUPPORTED, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("neighboring", ["add_remove", "replace_one"])
def test_unsupported_event_raises_and_leaves_the_ledger_unchanged(event, neighboring):
    ledger = PrivacyLedger(3, Budget(5.0, 1e-5), accountant="gdp", neighboring=neighboring)
    ledger.compose(_step(1.0, 0.01), 100)
    before, eps, mu = ledger.state_dict(), ledger.epsilon_spent(), ledger._acc.mu()
    assert not ledger.supports(event)
    with pytest.raises(UnsupportedEventError, match="client 3"):
        ledger.compose(event)
    with pytest.raises(UnsupportedEventError):
        ledger.would_exceed(event)
    assert ledger.state_dict() == before and ledger.epsilon_spent() == eps and ledger._acc.mu() == mu


def test_unsupported_message_names_the_sub_event():
    with pytest.raises(UnsupportedEventError, match="LaplaceDpEvent"):
        PrivacyLedger(0, Budget(1.0, 1e-5), accountant="gdp_clt").compose(
            composed([_step(1.0, 0.01), dp_event.LaplaceDpEvent(2.0)]))


# (f) budget -------------------------------------------------------------------------------------------------------
def test_budget_refuses_the_overspending_step_and_keeps_the_state():
    ledger = PrivacyLedger(1, Budget(1.0, 1e-3), accountant="gdp")
    sigma, q = 1.0, 0.01
    mu_budget = mu_from_epsilon(1.0, 1e-3)
    fits = int((mu_budget * sigma / q) ** 2)  # the largest T with q√T/σ <= μ(ε = 1)
    ledger.compose(_step(sigma, q), fits)
    before, eps = ledger.state_dict(), ledger.epsilon_spent()
    assert eps <= 1.0
    assert ledger.would_exceed(_step(sigma, q), 10)
    with pytest.raises(BudgetExceededError, match="client 1"):
        ledger.compose(_step(sigma, q), 10)
    assert ledger.state_dict() == before and ledger.epsilon_spent() == eps
    with pytest.raises(BudgetExceededError):
        check_schedule(1, Budget(1.0, 1e-3), _step(sigma, q), fits + 10, accountant="gdp")
    assert check_schedule(1, Budget(1.0, 1e-3), _step(sigma, q), fits, accountant="gdp") == eps


def test_ledger_book_charge_is_all_or_nothing():
    book = LedgerBook({0: Budget(1.0, 1e-5), 1: Budget(10.0, 1e-5)}, accountant="gdp_clt")
    book.charge([(0, _step(1.0, 0.01)), (1, _step(1.0, 0.01))])
    before = book.state_dict()
    with pytest.raises(BudgetExceededError):
        book.charge([(1, _step(1.0, 0.01)), (0, GAUSS(0.1))])
    assert book.state_dict() == before


# (g) checkpoints --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("accountant", ["gdp", "gdp_clt"])
def test_state_dict_round_trip_gives_the_same_epsilon(accountant):
    ledger = PrivacyLedger(7, Budget(8.0, 1e-5), accountant=accountant)
    ledger.compose(_step(1.1, 0.02), 300)
    ledger.compose(composed([GAUSS(20.0), self_composed(_step(0.9, 0.01), 5)]), 2)
    state = json.loads(json.dumps(ledger.state_dict()))
    restored = PrivacyLedger(7, Budget(8.0, 1e-5), accountant=accountant)
    restored.load_state_dict(state)
    assert restored.epsilon_spent() == ledger.epsilon_spent() > 0
    assert restored._acc.mu() == ledger._acc.mu()
    book = LedgerBook({7: Budget(8.0, 1e-5)}, accountant=accountant)
    book[7].compose(_step(1.1, 0.02), 300)
    other = LedgerBook({}, accountant=accountant)
    other.load_state_dict(json.loads(json.dumps(book.state_dict())))
    assert other.epsilons() == book.epsilons()
    with pytest.raises(CheckpointError):
        PrivacyLedger(7, Budget(8.0, 1e-5), accountant="rdp").load_state_dict(state)


def test_deepcopy_and_pickle_are_independent():
    acc = GdpAccountant("clt", NeighboringRelation.REPLACE_ONE).compose(_step(1.0, 0.1), 10)
    twin = copy.deepcopy(acc)
    twin.compose(GAUSS(1.0))
    assert twin.mu() > acc.mu() and twin.form == acc.form == "clt"
    assert twin.neighboring_relation is NeighboringRelation.REPLACE_ONE
    assert pickle.loads(pickle.dumps(acc)).mu() == acc.mu()
    assert acc.ledger == dp_event.SelfComposedDpEvent(_step(1.0, 0.1), 10)


# (h) DPZV's μ table -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eps, mu", [(0.1, 0.0575), (1.0, 0.3884), (10.0, 2.4627)])
def test_mu_at_delta_1e3_matches_dpzv(eps, mu):
    assert abs(mu_from_epsilon(eps, 1e-3) - mu) < 1e-4
    acc = GdpAccountant().compose(GAUSS(1.0 / mu_from_epsilon(eps, 1e-3)))
    assert math.isclose(acc.get_epsilon(1e-3), eps, rel_tol=1e-9)


# wiring -----------------------------------------------------------------------------------------------------------
def test_make_accountant_and_arguments():
    assert {"gdp", "gdp_clt"} <= set(ACCOUNTANTS)
    assert make_accountant("gdp").form == "first_order"
    clt = make_accountant("gdp_clt", "replace_one")
    assert isinstance(clt, GdpAccountant) and clt.form == "clt"
    assert clt.neighboring_relation is NeighboringRelation.REPLACE_ONE
    with pytest.raises(PrivacyError, match="orders"):
        make_accountant("gdp", orders=[2, 3])
    with pytest.raises(PrivacyError, match="form"):
        GdpAccountant("exact")
    with pytest.raises(PrivacyError, match="neighboring_relation"):
        GdpAccountant("clt", NeighboringRelation.REPLACE_SPECIAL)
    with pytest.raises(UnsupportedEventError, match="without_replacement"):
        epsilon_subsampled_gaussian(1.0, 0.1, 10, 1e-5, "gdp", "without_replacement", dataset_size=100)
    import trustfl.privacy.analysis as analysis
    assert analysis.GdpAccountant is GdpAccountant


@pytest.mark.parametrize("accountant", ["gdp", "gdp_clt"])
@pytest.mark.parametrize("q, steps", [(0.01, 1000), (1.0, 20)])
def test_calibration_round_trip(accountant, q, steps):
    z = calibrate_noise_multiplier(2.0, 1e-5, q, steps, accountant)
    eps = epsilon_subsampled_gaussian(z, q, steps, 1e-5, accountant)
    assert 2.0 - 1e-4 <= eps <= 2.0
    if accountant == "gdp" or q == 1.0:
        assert math.isclose(z, q * math.sqrt(steps) / mu_from_epsilon(2.0, 1e-5), rel_tol=1e-6)
