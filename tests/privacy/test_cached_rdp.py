"""The cached RDP accountant equals dp_accounting's ``RdpAccountant`` bit for bit, and trustfl patches nothing."""
from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation, UnsupportedEventError
from dp_accounting.rdp import rdp_privacy_accountant
from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

from trustfl.privacy.accountant import Budget, LedgerBook, PrivacyLedger
from trustfl.privacy.analysis.cached_rdp import CachedRdpAccountant, clear_caches
from trustfl.privacy.analysis.gaussian import DEFAULT_RDP_ORDERS, epsilon_subsampled_gaussian, make_accountant

ROOT = Path(__file__).resolve().parents[2]
ADD_REMOVE, REPLACE_ONE = NeighboringRelation.ADD_OR_REMOVE_ONE, NeighboringRelation.REPLACE_ONE
FRACTIONAL = [1.25, 1.5, 2.0, 3.5, 8.0, 16.0, 64.0, 256.0]


def poisson(z: float, q: float, steps: int = 1) -> dp_event.DpEvent:
    return dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), steps)


SEQUENCES = {
    "rounds of one event": (ADD_REMOVE, DEFAULT_RDP_ORDERS, [(poisson(1.1, 0.02, 10), 1)] * 7),
    "counts and nesting": (ADD_REMOVE, DEFAULT_RDP_ORDERS, [
        (poisson(0.9, 0.05, 3), 4), (dp_event.GaussianDpEvent(5.0), 2),
        (dp_event.ComposedDpEvent([poisson(1.3, 0.01, 2), dp_event.SelfComposedDpEvent(
            dp_event.ComposedDpEvent([dp_event.GaussianDpEvent(3.0), poisson(2.0, 0.1)]), 3)]), 2),
        (poisson(0.9, 0.05, 3), 4), (dp_event.NoOpDpEvent(), 5), (dp_event.LaplaceDpEvent(2.0), 1)]),
    "fractional orders": (ADD_REMOVE, FRACTIONAL, [(poisson(0.8, 0.03, 50), 1), (poisson(1.7, 0.2, 5), 3)] * 3),
    "without replacement": (REPLACE_ONE, DEFAULT_RDP_ORDERS, [
        (dp_event.SelfComposedDpEvent(dp_event.SampledWithoutReplacementDpEvent(
            1000, 20, dp_event.GaussianDpEvent(1.2)), 10), 1)] * 4),
    "zcdp and repeat-and-select": (ADD_REMOVE, DEFAULT_RDP_ORDERS, [
        (dp_event.ZCDpEvent(0.01, 0.0), 3),
        (dp_event.RepeatAndSelectDpEvent(poisson(1.5, 0.1, 2), 4.0, 1.0), 2), (poisson(1.1, 0.02), 2)]),
    "non-private": (ADD_REMOVE, DEFAULT_RDP_ORDERS, [(poisson(1.1, 0.02), 3), (dp_event.NonPrivateDpEvent(), 1)]),
}


@pytest.mark.parametrize("cold", [True, False], ids=["cold cache", "warm cache"])
@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_equals_a_fresh_rdp_accountant_bit_for_bit(name, cold):
    relation, orders, events = SEQUENCES[name]
    if cold:
        clear_caches()
    ours = CachedRdpAccountant(list(orders), relation)
    theirs = RdpAccountant(list(orders), relation)
    for event, count in events:
        ours.compose(event, count)
        theirs.compose(event, count)
        assert ours.rdp.tobytes() == theirs.rdp.tobytes()
        for delta in (1e-5, 1e-3, 0.0):
            mine, order = ours.get_epsilon_and_optimal_order(delta)
            assert (mine, order) == theirs.get_epsilon_and_optimal_order(delta) or (
                math.isnan(mine) and math.isnan(theirs.get_epsilon(delta)))
        assert ours.get_delta(3.0) == theirs.get_delta(3.0)
    assert np.array_equal(ours.orders, theirs.orders)
    assert ours.ledger == theirs.ledger


def test_unhashable_events_are_composed_uncached():
    event = dp_event.SingleEpochTreeAggregationDpEvent(2.0, [3, 2])
    with pytest.raises(TypeError):
        hash(event)
    relation = NeighboringRelation.REPLACE_SPECIAL
    ours = CachedRdpAccountant(list(DEFAULT_RDP_ORDERS), relation).compose(event, 2).compose(event)
    theirs = RdpAccountant(list(DEFAULT_RDP_ORDERS), relation).compose(event, 2).compose(event)
    assert ours.rdp.tobytes() == theirs.rdp.tobytes() and ours.get_epsilon(1e-5) == theirs.get_epsilon(1e-5)


def test_unsupported_events_are_refused_as_dp_accounting_refuses_them_and_change_nothing():
    acc = CachedRdpAccountant(list(DEFAULT_RDP_ORDERS))
    acc.compose(poisson(1.0, 0.1))
    before = acc.rdp
    bad = dp_event.SampledWithoutReplacementDpEvent(100, 5, dp_event.GaussianDpEvent(1.0))  # needs replace-one
    assert not acc.supports(bad) and not RdpAccountant(list(DEFAULT_RDP_ORDERS)).supports(bad)
    with pytest.raises(UnsupportedEventError) as ours:
        acc.compose(bad)
    with pytest.raises(UnsupportedEventError) as theirs:
        RdpAccountant(list(DEFAULT_RDP_ORDERS)).compose(bad)
    assert str(ours.value) == str(theirs.value)
    assert acc.rdp.tobytes() == before.tobytes()


def test_copies_are_independent_and_cached_vectors_are_never_written():
    acc = make_accountant("rdp")
    acc.compose(poisson(1.1, 0.02, 10))
    twin = copy.deepcopy(acc)
    twin.compose(poisson(1.1, 0.02, 10))
    assert acc.get_epsilon(1e-5) < twin.get_epsilon(1e-5)
    fresh = RdpAccountant(list(DEFAULT_RDP_ORDERS)).compose(poisson(1.1, 0.02, 10))
    assert acc.rdp.tobytes() == fresh.rdp.tobytes()
    # a third accountant composing the same event (a cache hit) starts from zero, not from the others' sums
    assert make_accountant("rdp").compose(poisson(1.1, 0.02, 10)).rdp.tobytes() == fresh.rdp.tobytes()


def test_ledgers_and_epsilon_equal_dp_accounting_composing_the_same_history():
    budgets = {c: Budget(math.inf if c % 2 else 50.0, 1e-5) for c in range(6)}
    book = LedgerBook(budgets)
    events = {c: poisson(1.0 + 0.1 * (c % 3), 0.02, 10) for c in budgets}
    for _ in range(5):
        book.charge([(c, events[c]) for c in budgets])
    for c, eps in book.epsilons().items():
        reference = RdpAccountant(list(DEFAULT_RDP_ORDERS))
        for _ in range(5):
            reference.compose(events[c])
        assert eps == reference.get_epsilon(1e-5)
    ledger = PrivacyLedger(0, Budget(50.0, 1e-5))
    ledger.compose(events[0], count=5)
    assert ledger.epsilon_spent() == RdpAccountant(list(DEFAULT_RDP_ORDERS)).compose(events[0], 5).get_epsilon(1e-5)
    for steps, sampling in [(100, "poisson"), (40, "without_replacement")]:
        event = dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(1.3), steps) if sampling == "poisson" else \
            dp_event.SelfComposedDpEvent(dp_event.SampledWithoutReplacementDpEvent(
                1000, 50, dp_event.GaussianDpEvent(1.3)), steps)
        relation = ADD_REMOVE if sampling == "poisson" else REPLACE_ONE
        expected = RdpAccountant(list(DEFAULT_RDP_ORDERS), relation).compose(event).get_epsilon(1e-5)
        q = 1.0 if sampling == "poisson" else 0.05
        assert epsilon_subsampled_gaussian(1.3, q, steps, 1e-5, sampling=sampling, dataset_size=1000) == expected


def test_trustfl_writes_no_attribute_of_dp_accounting():
    """No monkeypatching: importing every trustfl module leaves every dp_accounting module attribute as it was."""
    script = """
import importlib, importlib.util, pkgutil, sys
import dp_accounting, dp_accounting.rdp.rdp_privacy_accountant, dp_accounting.pld.pld_privacy_accountant
import dp_accounting.privacy_accountant, dp_accounting.dp_event
def snapshot():
    return {(m, k): id(v) for m, mod in list(sys.modules.items()) if m.startswith("dp_accounting")
            for k, v in vars(mod).items()}
before = snapshot()
import trustfl
for info in pkgutil.walk_packages(trustfl.__path__, "trustfl."):
    if info.name == "trustfl.deploy.flower" and importlib.util.find_spec("flwr") is None:
        continue  # the Flower adapter needs the optional extra
    if info.name != "trustfl.__main__":
        importlib.import_module(info.name)
after = snapshot()
changed = sorted(k for k in before if k in after and after[k] != before[k])
added = sorted(k for k in after if k not in before and k[0] in {m for m, _ in before})
assert not changed and not added, (changed, added)
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
    # and in this process, after trustfl was imported by the tests above
    fn = rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian
    assert fn.__module__ == "dp_accounting.rdp.rdp_privacy_accountant" and not hasattr(fn, "__wrapped__")
    assert not hasattr(rdp_privacy_accountant._compute_rdp_sample_wor_gaussian, "__wrapped__")
