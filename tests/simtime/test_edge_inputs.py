"""Simulated time on edge input: closed forms at vanishing rates, `now` and `dt` checks, and step durations too
large for the machine (a ResourceError, not the allocator's RuntimeError)."""
import math

import pytest
import torch

from trustfl.errors import ConfigError, ResourceError
from trustfl.simtime import ClockState, Deterministic, ExponentialGroups, completed_steps, expected_steps, \
    prob_zero_steps

F64 = torch.float64


def test_closed_forms_at_vanishing_contact_probability():
    assert prob_zero_steps(1e-300, 0, 1) == 1.0                  # c = 0: no time passes, no step completes
    assert prob_zero_steps(5e-324, 0.0, 2.0) == 1.0
    assert prob_zero_steps(1e-300, 1e-300, 1) == pytest.approx(0.5)  # p·e / (p·e + 1 − e), λ = p
    assert prob_zero_steps(0.25, 4.0, 8.0) == 0.25 * math.exp(-0.5) / (1 - 0.75 * math.exp(-0.5))  # unchanged
    assert expected_steps(1e-300, 1, 1, 10) == pytest.approx(10.0)  # gaps ~1/p: every contact finds K steps
    assert expected_steps(5e-324, 1, 1, 10) == pytest.approx(10.0)
    with pytest.raises(ConfigError, match="terms"):              # 1e300 terms: refused, not a hang
        expected_steps(1e-300, 1e-300, 1, 10)
    with pytest.raises(ConfigError, match="tol"):
        expected_steps(0.25, 4.0, 8.0, 10, tol=0.0)


def test_closed_forms_when_c_over_m_overflows():
    """c/m = 10/1e-320 is inf: H was NaN (inf·0 in the series), and weighted QuAFL's η = H_min/H_i NaN rejected every
    message. Every contacted client has done its K steps."""
    assert expected_steps(0.5, 10.0, 1e-320, 3) == 3.0
    assert prob_zero_steps(0.5, 10.0, 1e-320) == 0.0
    assert expected_steps(0.5, 0.0, 1e-320, 3) == 0.0  # c = 0: no time passes


def test_completed_steps_refuses_a_now_of_the_wrong_shape_or_nan():
    start, durations = torch.zeros(2, dtype=F64), torch.ones(2, 3, dtype=F64)
    for now in (torch.tensor([1.0, 2.0, 3.0]), torch.ones(2, 1, dtype=F64), float("nan"), "soon"):
        with pytest.raises(ConfigError, match="`now`"):
            completed_steps(start, durations, now)
    assert completed_steps(start, durations, torch.tensor([1.5, 2.5])).tolist() == [1, 2]
    assert completed_steps(start, durations, math.inf).tolist() == [3, 3]


def test_advance_refuses_a_sum_that_overflows_and_leaves_the_clock():
    clock = ClockState.initial(2)
    clock.advance(1e308)
    with pytest.raises(ConfigError, match="`dt`"):
        clock.advance(1e308)
    assert clock.server_time == 1e308


@pytest.mark.parametrize("model", [Deterministic(duration=1.0), ExponentialGroups()])
def test_durations_too_large_for_the_machine_are_a_resource_error(model):
    speed = model.bind(2, seed=0)
    with pytest.raises(ResourceError, match="steps"):
        speed.durations(torch.tensor([0]), torch.tensor([-1]), 0, 10 ** 12)
    assert speed.durations(torch.tensor([0, 1]), torch.tensor([-1, -1]), 0, 3).shape == (2, 3)
