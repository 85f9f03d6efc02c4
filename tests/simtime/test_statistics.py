"""The simulated clock against its closed forms (docs/papers/quafl.md, "Simulated time")."""
import math

import pytest
import torch

from trustfl.simtime import ClockState, ExponentialGroups, expected_steps, prob_zero_steps

N, P, C, K, ROUNDS, SEED = 40, 0.25, 4.0, 3, 2000, 2024


@pytest.fixture(scope="module")
def contacts():
    """Steps per contact of slow (means 8) and fast (mean 2) clients: each client is polled with probability
    P per round, rounds every C time units; first contacts (gap measured from time 0) are left out."""
    speed = ExponentialGroups(slow_share=0.25, fast_mean=2.0, slow_mean=8.0).bind(N, seed=SEED)
    clock = ClockState.initial(N)
    polling = torch.Generator().manual_seed(SEED)
    slow, fast = [], []
    for rnd in range(ROUNDS):
        ids = (torch.rand(N, generator=polling) < P).nonzero().flatten()
        seen = clock.last_round[ids] >= 0
        steps = clock.poll(ids, rnd, speed, SEED, K)
        is_slow = ids < 10   # ⌈0.25 · 40⌉ = 10 slow clients
        slow.append(steps[seen & is_slow])
        fast.append(steps[seen & ~is_slow])
        clock.advance(C)
    return torch.cat(slow).to(torch.float64), torch.cat(fast).to(torch.float64)


@pytest.mark.parametrize("group, mean", [(0, 8.0), (1, 2.0)])
def test_zero_step_frequency_matches_closed_form(contacts, group, mean):
    steps = contacts[group]
    n = steps.numel()
    assert n > (4500 if group == 0 else 14000)   # ≈ ROUNDS·P·(clients in the group) contacts
    expected = prob_zero_steps(P, C, mean)       # 0.278 (slow), 0.038 (fast)
    # Contacts are i.i.d. (geometric gaps, fresh durations), so the count is binomial: 4 standard errors.
    tolerance = 4 * math.sqrt(expected * (1 - expected) / n)
    assert abs((steps == 0).double().mean().item() - expected) < tolerance


@pytest.mark.parametrize("group, mean", [(0, 8.0), (1, 2.0)])
def test_mean_steps_matches_closed_form(contacts, group, mean):
    steps = contacts[group]
    expected = expected_steps(P, C, mean, K)     # 1.485 (slow), 2.617 (fast)
    # Steps lie in [0, K]; 4 standard errors of the mean, from the sample's standard deviation.
    tolerance = 4 * steps.std().item() / math.sqrt(steps.numel())
    assert abs(steps.mean().item() - expected) < tolerance
    # The cap matters here: without it the mean would be c/(m p) = 2.0 (slow) or 8.0 (fast).
    assert abs(C / (mean * P) - expected) > 5 * tolerance
