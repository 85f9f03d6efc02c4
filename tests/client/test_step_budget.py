"""Per-client step budgets (trustfl.client.step_budget): full work and FedProx-style stragglers."""
from __future__ import annotations

from collections import Counter

import pytest

import trustfl
from trustfl.client.step_budget import FullWork, Stragglers
from trustfl.errors import ConfigError


def test_full_work_never_limits():
    fw = FullWork()
    assert all(fw.max_steps(c, planned, 0, r) is None for c in range(20) for planned in (0, 1, 5) for r in (0, 3))


def test_zero_fraction_never_limits():
    s = Stragglers(fraction=0)
    assert all(s.max_steps(c, 10, 1, r) is None for c in range(200) for r in range(3))


def test_all_stragglers_get_budgets_in_range():
    s = Stragglers(1.0)
    for planned in (2, 3, 10):
        budgets = [s.max_steps(c, planned, 0, 0) for c in range(300)]
        assert all(isinstance(b, int) and 1 <= b <= planned for b in budgets)
        assert set(budgets) == set(range(1, planned + 1))  # every value is reached
    for planned in (0, 1):
        assert all(s.max_steps(c, planned, 0, 0) is None for c in range(50))


def test_straggler_share_and_uniform_budgets():
    s = Stragglers(0.3)
    n, planned = 20000, 10
    budgets = [s.max_steps(c, planned, 7, 2) for c in range(n)]
    stragglers = [b for b in budgets if b is not None]
    assert abs(len(stragglers) / n - 0.3) < 0.05
    counts = Counter(stragglers)
    assert set(counts) == set(range(1, planned + 1))
    for k in range(1, planned + 1):
        assert abs(counts[k] / len(stragglers) - 0.1) < 0.04, (k, counts[k])


def test_uniform_budgets_when_everyone_straggles():
    s = Stragglers(1.0)
    n, planned = 20000, 4
    counts = Counter(s.max_steps(c, planned, 3, 0) for c in range(n))
    for k in range(1, planned + 1):
        assert abs(counts[k] / n - 0.25) < 0.02


def test_deterministic_and_varying_across_rounds_seeds_and_clients():
    s = Stragglers(0.5)
    ids = range(500)
    r0 = [s.max_steps(c, 8, 1, 0) for c in ids]
    assert r0 == [s.max_steps(c, 8, 1, 0) for c in ids]
    assert r0 == [Stragglers(0.5).max_steps(c, 8, 1, 0) for c in ids]
    r1 = [s.max_steps(c, 8, 1, 1) for c in ids]
    other_seed = [s.max_steps(c, 8, 2, 0) for c in ids]
    assert r0 != r1 and r0 != other_seed
    # rounds are independent draws: about half the clients change straggler status between rounds
    flips = sum((a is None) != (b is None) for a, b in zip(r0, r1)) / len(r0)
    assert 0.35 < flips < 0.65


def test_budget_does_not_depend_on_the_other_clients():
    s = Stragglers(0.5)
    alone = s.max_steps(42, 6, 9, 3)
    for c in range(100):
        s.max_steps(c, 6, 9, 3)
    assert s.max_steps(42, 6, 9, 3) == alone


@pytest.mark.parametrize("fraction", [1.5, -0.1, float("nan")])
def test_invalid_fraction_raises(fraction):
    with pytest.raises(ConfigError):
        Stragglers(fraction)


def test_step_budgets_are_registered():
    assert isinstance(trustfl.build("step_budget", "full"), FullWork)
    assert trustfl.build("step_budget", "stragglers", fraction=0.25) == Stragglers(0.25)
