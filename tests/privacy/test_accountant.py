"""Per-client ledgers: composition, budget refusals that leave state untouched, checkpoints, LedgerBook."""
from __future__ import annotations

import copy
import json
import math
import re

import pytest
from dp_accounting import dp_event

from trustfl.errors import BudgetExceededError, CheckpointError, PrivacyError, UnsupportedEventError
from trustfl.privacy import events as ev
from trustfl.privacy.accountant import Budget, LedgerBook, PrivacyLedger, check_schedule
from trustfl.privacy.analysis.gaussian import epsilon_subsampled_gaussian

DELTA = 1e-5
STEP = ev.poisson_sampled(ev.gaussian_event(1.0), 0.05)     # one DP-SGD step
PLAIN = ev.gaussian_event(4.0)                               # one cheap full-batch step


def _snapshot(ledger: PrivacyLedger):
    return ledger.epsilon_spent(), ledger.events, json.dumps(ledger.state_dict())


def test_budget_validation():
    assert Budget(math.inf, 1e-5).unlimited
    for eps, delta in [(0.0, 1e-5), (-1.0, 1e-5), (1.0, 0.0), (1.0, 1.0), (float("nan"), 1e-5), ("1", 1e-5)]:
        with pytest.raises(PrivacyError):
            Budget(eps, delta)
    with pytest.raises(PrivacyError, match="accountant"):
        PrivacyLedger(0, Budget(1.0, DELTA), accountant="moments")


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_ledger_matches_the_analysis_functions(accountant):
    ledger = PrivacyLedger(0, Budget(10.0, DELTA), accountant)
    assert ledger.epsilon_spent() == 0.0
    ledger.compose(PLAIN, count=3)
    ledger.compose(PLAIN, count=2)
    expected = epsilon_subsampled_gaussian(4.0, 1.0, 5, DELTA, accountant)
    assert ledger.epsilon_spent() == pytest.approx(expected, abs=1e-3 if accountant == "pld" else 1e-9)


def test_ledger_refuses_over_budget_and_leaves_state_untouched():
    ledger = PrivacyLedger(3, Budget(3.0, DELTA))
    ledger.compose(PLAIN, count=2)
    before = _snapshot(ledger)
    assert not ledger.would_exceed(PLAIN)
    assert ledger.would_exceed(PLAIN, count=50)
    assert _snapshot(ledger) == before                          # would_exceed never mutates
    with pytest.raises(BudgetExceededError) as info:
        ledger.compose(PLAIN, count=50)
    msg = str(info.value)
    assert msg.startswith("client 3:") and "budget ε = 3.0" in msg and "δ = 1e-05" in msg
    assert _snapshot(ledger) == before
    ledger.compose(PLAIN)                                       # still usable afterwards
    assert ledger.epsilon_spent() > before[0]


def test_unsupported_events_are_refused_naming_the_sub_event():
    ledger = PrivacyLedger(1, Budget(5.0, DELTA))
    ledger.compose(PLAIN)
    before = _snapshot(ledger)
    wor = ev.without_replacement_sampled(ev.gaussian_event(1.0), 1000, 10)
    nested = ev.composed([PLAIN, dp_event.UnsupportedDpEvent()])
    for bad in (wor, nested, ev.poisson_sampled(dp_event.UnsupportedDpEvent(), 0.1)):
        assert not ledger.supports(bad)
        with pytest.raises(UnsupportedEventError) as info:
            ledger.compose(bad)
        assert "client 1" in str(info.value) and "caused by subevent" in str(info.value)
        assert _snapshot(ledger) == before
    with pytest.raises(UnsupportedEventError, match="UnsupportedDpEvent"):
        ledger.would_exceed(nested)
    with pytest.raises(UnsupportedEventError, match="DpEvent"):
        ledger.compose("gaussian")                               # type: ignore[arg-type]
    # Sampling without replacement needs the replace-one relation.
    replace_one = PrivacyLedger(1, Budget(50.0, DELTA), neighboring="replace_one")
    assert replace_one.supports(wor)
    replace_one.compose(wor, count=5)
    assert 0 < replace_one.epsilon_spent() < 50


def test_unlimited_budget_only_tracks():
    ledger = PrivacyLedger(0, Budget(math.inf, DELTA))
    ledger.compose(ev.gaussian_event(0.5), count=100)
    ledger.compose(dp_event.NonPrivateDpEvent())
    assert ledger.epsilon_spent() == math.inf
    assert not ledger.would_exceed(PLAIN)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_state_dict_round_trip_resumes_exactly(accountant):
    # Subsampled for RDP; a plain Gaussian for PLD (PLD composition of subsampled events is slow).
    sub = ev.poisson_sampled(ev.gaussian_event(2.0), 0.1) if accountant == "rdp" else ev.gaussian_event(6.0)
    full = PrivacyLedger(7, Budget(20.0, DELTA), accountant)
    for _ in range(3):
        full.compose(sub, count=5)
    state = json.loads(json.dumps(full.state_dict()))           # through JSON, as a checkpoint would
    resumed = PrivacyLedger(7, Budget(20.0, DELTA), accountant)
    resumed.load_state_dict(state)
    assert resumed.epsilon_spent() == full.epsilon_spent()
    full.compose(sub, count=5)
    resumed.compose(sub, count=5)
    assert resumed.epsilon_spent() == full.epsilon_spent()
    with pytest.raises(CheckpointError, match="client 7"):
        PrivacyLedger(8, Budget(20.0, DELTA), accountant).load_state_dict(state)
    broken = copy.deepcopy(state)
    broken["events"][0]["event"]["type"] = "NoSuchEvent"
    with pytest.raises(CheckpointError):
        resumed.load_state_dict(broken)
    assert resumed.epsilon_spent() == full.epsilon_spent()     # a failed load changes nothing


def test_describe_round_trips_nested_events():
    event = ev.self_composed(ev.composed([STEP, ev.without_replacement_sampled(PLAIN, 100, 5),
                                          dp_event.LaplaceDpEvent(2.0)]), 7)
    text = json.dumps(ev.describe(event))
    assert ev.event_from_dict(json.loads(text)) == event
    assert ev.describe(PLAIN) == {"type": "GaussianDpEvent", "noise_multiplier": 4.0}
    assert ev.poisson_sampled(PLAIN, 1.0) is PLAIN               # q = 1 is no subsampling
    with pytest.raises(PrivacyError):
        ev.poisson_sampled(PLAIN, 1.5)
    with pytest.raises(PrivacyError):
        ev.gaussian_event(-1.0)
    with pytest.raises(PrivacyError):
        ev.without_replacement_sampled(PLAIN, 10, 20)


@pytest.mark.parametrize("build, fragment", [
    (lambda: ev.gaussian_event(True), "`noise_multiplier` must be a finite number >= 0, found True"),
    (lambda: ev.gaussian_event("1"), "`noise_multiplier` must be a finite number >= 0, found '1'"),
    (lambda: ev.poisson_sampled(PLAIN, True), "`q` must be a number in [0, 1] (the sampling probability), found True"),
    (lambda: ev.poisson_sampled(PLAIN, "0.1"), "found '0.1'"),
    (lambda: ev.self_composed(PLAIN, True), "`count` must be an integer >= 0, found True"),
    (lambda: ev.without_replacement_sampled(PLAIN, True, 1), "found n=True, b=1"),
    (lambda: ev.composed(PLAIN), "`events` must be a list of dp_accounting DpEvents, found GaussianDpEvent"),
])
def test_event_builders_take_numbers_not_flags_or_strings(build, fragment):
    # float() took True as 1.0 (poisson_sampled(ev, True) dropped the subsampling) and '1' as 1.0
    with pytest.raises(PrivacyError) as err:
        build()
    assert fragment in str(err.value)


@pytest.mark.parametrize("description, fragment", [
    ({"type": "GaussianDpEvent", "noise_multiplier": -1}, "`noise_multiplier` must be a finite number >= 0"),
    ({"type": "SelfComposedDpEvent", "event": {"type": "GaussianDpEvent", "noise_multiplier": 1.0}, "count": -3},
     "`count` must be an integer >= 0, found -3"),
    ({"type": "PoissonSampledDpEvent", "sampling_probability": 2.0,
      "event": {"type": "GaussianDpEvent", "noise_multiplier": 1.0}}, "`q` must be a number in [0, 1]"),
])
def test_a_described_event_is_checked_as_its_builder_checks(description, fragment):
    # a ledger restored from a checkpoint rebuilt GaussianDpEvent(noise_multiplier=-1) unchecked
    with pytest.raises(PrivacyError) as err:
        ev.event_from_dict(description)
    assert str(err.value).startswith(f"Cannot rebuild {description['type']} from ") and fragment in str(err.value)


def test_check_schedule_message_and_value():
    eps = check_schedule(3, Budget(100.0, DELTA), PLAIN, 10)
    assert eps == pytest.approx(epsilon_subsampled_gaussian(4.0, 1.0, 10, DELTA))
    with pytest.raises(BudgetExceededError) as info:
        check_schedule(3, Budget(3.0, DELTA), PLAIN, 100)
    spent = epsilon_subsampled_gaussian(4.0, 1.0, 100, DELTA)
    assert str(info.value) == (f"client 3: the schedule would spend ε = {spent:.3g} at δ = 1e-05, over its budget "
                               f"ε = 3.0")
    assert re.fullmatch(r"client 3: the schedule would spend ε = [\d.]+ at δ = 1e-05, over its budget ε = 3\.0",
                        str(info.value))


def test_ledger_book_is_all_or_nothing():
    # RDP ε of k steps of PLAIN at δ = 1e-5: 1.01 (k=1), 1.48 (2), 2.45 (5), 3.4 (9), 6.8 (30).
    book = LedgerBook({0: Budget(3.0, DELTA), 1: Budget(5.0, DELTA), 2: Budget(math.inf, DELTA)})
    book.charge([(0, PLAIN), (1, PLAIN), (2, PLAIN)])
    before = book.epsilons()
    state = json.dumps(book.state_dict())
    big = ev.self_composed(PLAIN, 30)
    # Client 1 would overspend: nobody is charged.
    with pytest.raises(BudgetExceededError, match="client 1"):
        book.charge([(0, PLAIN), (1, big), (2, PLAIN)])
    # Several events of one client are checked together: each alone fits, both together do not.
    half = ev.self_composed(PLAIN, 4)
    assert not book[0].would_exceed(half)
    with pytest.raises(BudgetExceededError, match="client 0"):
        book.charge([(0, half), (1, PLAIN), (0, half)])
    with pytest.raises(UnsupportedEventError):
        book.charge([(0, PLAIN), (1, dp_event.UnsupportedDpEvent())])
    with pytest.raises(PrivacyError, match="no ledger"):
        book.charge([(0, PLAIN), (9, PLAIN)])
    assert book.epsilons() == before
    assert json.dumps(book.state_dict()) == state
    # A valid charge updates everyone.
    book.charge([(0, PLAIN), (1, PLAIN), (1, PLAIN), (2, PLAIN)])
    after = book.epsilons()
    assert all(after[c] > before[c] for c in before)
    assert after[1] > after[0]


def test_ledger_book_summary_and_checkpoint():
    book = LedgerBook({c: Budget(10.0, DELTA) for c in range(3)})
    book.charge([(0, PLAIN), (1, ev.self_composed(PLAIN, 2)), (2, ev.self_composed(PLAIN, 3))])
    eps = book.epsilons()
    summary = book.summary()
    assert summary["min"] == eps[0] and summary["median"] == eps[1] and summary["max"] == eps[2]
    assert summary["clients"] == 3
    restored = LedgerBook({})
    restored.load_state_dict(json.loads(json.dumps(book.state_dict())))
    assert restored.epsilons() == eps
    assert restored.client_ids == [0, 1, 2]
    with pytest.raises(CheckpointError):
        LedgerBook({}, accountant="pld").load_state_dict(book.state_dict())


@pytest.mark.parametrize("client_id", ["a", None, 1.5, True, [1]])
def test_a_client_id_that_is_not_an_integer_is_a_privacy_error(client_id):
    with pytest.raises(PrivacyError, match="client_id"):
        PrivacyLedger(client_id, Budget(1.0, DELTA))
    with pytest.raises(PrivacyError, match="client_id"):
        LedgerBook({}).add_client(client_id, Budget(1.0, DELTA))
    if not isinstance(client_id, list):                       # hashable: a key of the budgets
        with pytest.raises(PrivacyError, match="client_id"):
            LedgerBook({client_id: Budget(1.0, DELTA)})


def test_malformed_ledger_book_arguments_are_privacy_errors():
    for budgets in (None, [Budget(1.0, DELTA)]):
        with pytest.raises(PrivacyError, match="budgets"):
            LedgerBook(budgets)
    with pytest.raises(PrivacyError, match="accountant"):
        LedgerBook({}, accountant="moments")
    with pytest.raises(PrivacyError, match="neighboring"):
        LedgerBook({}, neighboring="swap")
    book = LedgerBook({0: Budget(1.0, DELTA)})
    with pytest.raises(PrivacyError, match="no ledger"):
        book["a"]
    assert [0] not in book and 0 in book
