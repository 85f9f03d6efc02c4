"""The virtual clock: a hand-worked schedule, the authors' loop as an oracle, checkpoints, closed forms."""
import io
import math

import numpy as np
import pytest
import torch
from scipy.stats import poisson

from trustfl.errors import CheckpointError, ConfigError
from trustfl.simtime import (ClockState, Deterministic, ExponentialGroups, Trace, completed_steps, expected_steps,
                             finish_times, prob_zero_steps)

F64 = torch.float64


@pytest.fixture
def three_client_trace(tmp_path):
    """client 0: every step 1.0; client 1: every step 3.0; client 2: 0.5, 2.5, 0.5, 2.5, ..."""
    path = tmp_path / "speeds.csv"
    path.write_text("client,duration\n2,0.5\n0,1.0\n1,3.0\n2,2.5\n")
    return Trace(path=str(path)).bind(3, seed=0)


# Worked by hand. K = 2; round r starts at T = 2r; after the round the server time advances by 2.0.
# Columns: round, T, polled clients, their last-contact times before the round, steps completed before T,
# and the times at which each would finish K = 2 steps (finish_times).
#   r0 T=0  {0}:     c0 from 0: ends 1, 2 -> 1 < 0? no                       -> 0 steps (zero-step contact)
#   r1 T=2  {0,1}:   c0 from 0: ends 1, 2 -> 2 < 2 is false (strict)         -> 1;  c1 from 0: ends 3, 6 -> 0
#   r2 T=4  {2}:     c2 from 0: ends 0.5, 3.0 (a 3rd would end at 3.5 < 4)   -> 2 (the K cap)
#   r3 T=6  {0,1,2}: c0 from 2: ends 3, 4 (a 3rd at 5 < 6) -> 2 (cap); c1 from 2: 5, 8 -> 1; c2 from 4: 4.5, 7 -> 1
#   r4 T=8  {1}:     c1 from 6: ends 9, 12                                   -> 0
#   r5 T=10 {1,2}:   c1 from 8: ends 11, 14 -> 0;  c2 from 6: ends 6.5, 9    -> 2
#   r6 T=12 {0}:     c0 from 6: ends 7, 8                                    -> 2
#   r7 T=14 {1}:     c1 from 10: ends 13, 16                                 -> 1
SCHEDULE = [
    (0, 0.0, [0], [0.0], [0], [2.0]),
    (1, 2.0, [0, 1], [0.0, 0.0], [1, 0], [2.0, 6.0]),
    (2, 4.0, [2], [0.0], [2], [3.0]),
    (3, 6.0, [0, 1, 2], [2.0, 2.0, 4.0], [2, 1, 1], [4.0, 8.0, 7.0]),
    (4, 8.0, [1], [6.0], [0], [12.0]),
    (5, 10.0, [1, 2], [8.0, 6.0], [0, 2], [14.0, 9.0]),
    (6, 12.0, [0], [6.0], [2], [8.0]),
    (7, 14.0, [1], [10.0], [1], [16.0]),
]


def test_hand_worked_schedule(three_client_trace):
    speed, clock, k = three_client_trace, ClockState.initial(3), 2
    for rnd, now, polled, starts, steps, finish in SCHEDULE:
        ids = torch.tensor(polled)
        assert clock.server_time == now
        assert clock.last_contact[ids].tolist() == starts
        d = clock.durations(ids, speed, seed=0, max_steps=k)
        assert completed_steps(clock.last_contact[ids], d, now).tolist() == steps, f"round {rnd}"
        assert finish_times(clock.last_contact[ids], d, k).tolist() == finish, f"round {rnd}"
        assert clock.poll(ids, rnd, speed, seed=0, max_steps=k).tolist() == steps, f"round {rnd}"
        assert clock.last_contact[ids].tolist() == [now] * len(polled)
        assert clock.last_round[ids].tolist() == [rnd] * len(polled)
        clock.advance(2.0)
    assert clock.server_time == 16.0
    assert clock.last_contact.tolist() == [12.0, 14.0, 10.0]
    assert clock.last_round.tolist() == [6, 7, 5]


def test_deterministic_groups_schedule():
    # ceil(1/3 · 3) = 1 slow client (id 0, 3.0 per step); clients 1, 2 take 1.0 per step. K = 3, rounds every 2.5.
    speed, clock = Deterministic(slow_share=1 / 3, fast=1.0, slow=3.0).bind(3, seed=0), ClockState.initial(3)
    clock.advance(2.5)
    assert clock.poll(torch.tensor([0, 1]), 0, speed, seed=0, max_steps=3).tolist() == [0, 2]
    # T = 5: c0 from 2.5 ends 5.5 -> 0; c1 from 2.5 ends 3.5, 4.5 (5.5) -> 2; c2 from 0 ends 1, 2, 3 (4) -> 3 (cap)
    clock.advance(2.5)
    assert clock.poll(torch.tensor([0, 1, 2]), 1, speed, seed=0, max_steps=3).tolist() == [0, 2, 3]
    clock.advance(3.0)   # T = 8: c0 from 5 ends exactly at 8 -> 0 (strict); c2 from 5 ends 6, 7 (8) -> 2
    assert clock.poll(torch.tensor([0, 2]), 2, speed, seed=0, max_steps=3).tolist() == [0, 2]


def _authors_loop(start, durations, now):
    """``Client.run_until`` of the QuAFL code: while taken < K and time + next < now: time += next."""
    out = []
    for t, row in zip(start.tolist(), durations.tolist()):
        taken = 0
        while taken < len(row) and t + row[taken] < now:
            t += row[taken]
            taken += 1
        out.append(taken)
    return out


def test_completed_steps_matches_authors_loop():
    gen = torch.Generator().manual_seed(11)
    for _ in range(50):
        m, k = 7, int(torch.randint(1, 6, (), generator=gen))
        # Multiples of 0.5 make many completion times land exactly on `now`; some zero-length steps too.
        durations = torch.randint(0, 7, (m, k), generator=gen).to(F64) / 2
        start = torch.randint(0, 9, (m,), generator=gen).to(F64) / 2
        now = float(torch.randint(0, 20, (), generator=gen)) / 2
        assert completed_steps(start, durations, now).tolist() == _authors_loop(start, durations, now)
    # Real-valued durations, per-client contact times.
    durations = torch.rand(20, 4, generator=gen, dtype=F64) * 3
    start, now = torch.rand(20, generator=gen, dtype=F64), torch.rand(20, generator=gen, dtype=F64) * 8
    got = completed_steps(start, durations, now).tolist()
    assert got == [_authors_loop(start[i:i + 1], durations[i:i + 1], float(now[i]))[0] for i in range(20)]


def test_finish_times_and_argument_checks():
    start = torch.tensor([1.0, 2.0], dtype=F64)
    d = torch.tensor([[1.0, 2.0, 4.0], [0.5, 0.5, 0.5]], dtype=F64)
    assert finish_times(start, d, 0).tolist() == [1.0, 2.0]
    assert finish_times(start, d, torch.tensor([3, 2])).tolist() == [8.0, 3.0]
    with pytest.raises(ConfigError, match=r"`steps` must lie in \[0, 3\]"):
        finish_times(start, d, 4)
    with pytest.raises(ConfigError, match="shape"):
        completed_steps(start, d[:1], 1.0)


def test_state_dict_round_trip_is_bitwise_and_resume_exact():
    speed = ExponentialGroups(slow_share=0.5).bind(10, seed=5)
    clock = ClockState.initial(10)
    polls = [torch.tensor(p) for p in ([1, 4, 7], [0, 4], [2, 3, 9], [4, 7, 8], [1, 5], [0, 6, 9])]
    for rnd, ids in enumerate(polls[:3]):
        clock.poll(ids, rnd, speed, seed=5, max_steps=4)
        clock.advance(1.0 / 3.0)   # not a dyadic number: server_time is inexact
    buf = io.BytesIO()
    torch.save(clock.state_dict(), buf)
    buf.seek(0)
    resumed = ClockState.from_state_dict(torch.load(buf, weights_only=True))
    assert resumed.server_time == clock.server_time
    assert torch.equal(resumed.last_contact, clock.last_contact) and torch.equal(resumed.last_round, clock.last_round)
    snapshot = clock.state_dict()
    for rnd, ids in enumerate(polls[3:], start=3):
        a = clock.poll(ids, rnd, speed, seed=5, max_steps=4)
        b = resumed.poll(ids, rnd, speed, seed=5, max_steps=4)
        assert torch.equal(a, b)
        clock.advance(0.7)
        resumed.advance(0.7)
    assert torch.equal(clock.last_contact, resumed.last_contact) and clock.server_time == resumed.server_time
    assert float(snapshot["server_time"]) != clock.server_time   # state_dict is a snapshot, not a view
    assert not torch.equal(snapshot["last_round"], clock.last_round)


def test_bad_state_dicts_and_contacts():
    with pytest.raises(CheckpointError, match="last_round"):
        ClockState.from_state_dict({"server_time": torch.tensor(0.0), "last_contact": torch.zeros(3, dtype=F64)})
    with pytest.raises(CheckpointError, match="Corrupt"):
        ClockState.from_state_dict({"server_time": torch.tensor(0.0), "last_contact": torch.zeros(3),
                                    "last_round": torch.zeros(3, dtype=torch.int64)})
    clock = ClockState.initial(4)
    clock.contact(torch.tensor([1, 2]), 0)
    with pytest.raises(ConfigError, match="at most once per round"):
        clock.contact(torch.tensor([2]), 0)
    with pytest.raises(ConfigError, match="distinct"):
        clock.contact(torch.tensor([3, 3]), 1)
    with pytest.raises(ConfigError, match=r"\[0, 4\)"):
        clock.contact(torch.tensor([4]), 1)
    with pytest.raises(ConfigError, match="`dt`"):
        clock.advance(-1.0)


def test_million_clients_state_is_16_bytes_each():
    clock = ClockState.initial(1_000_000)
    assert clock.last_contact.nbytes + clock.last_round.nbytes == 16_000_000
    speed = ExponentialGroups().bind(1_000_000, seed=0)
    ids = torch.tensor([0, 249_999, 250_000, 999_999])
    assert speed.mean_step(ids).tolist() == [8.0, 8.0, 2.0, 2.0]
    assert clock.poll(ids, 0, speed, seed=0, max_steps=3).tolist() == [0, 0, 0, 0]   # T = 0: nothing is done yet


def _brute_expected_steps(p, c, m, k):
    """The series summed directly over 400 gaps and the Poisson pmf, no closed form for E[min(K, N)]."""
    g = np.arange(1, 401, dtype=np.float64)[:, None]
    n = np.arange(0, 200)[None, :]
    e_min = (np.minimum(k, n) * poisson.pmf(n, g * c / m)).sum(axis=1, keepdims=True)
    return float((p * (1 - p) ** (g - 1) * e_min).sum())


@pytest.mark.parametrize("p, c, m, k", [(0.25, 4.0, 8.0, 3), (0.1, 1.0, 2.0, 5), (0.5, 10.0, 8.0, 1),
                                        (1.0, 3.0, 2.0, 4)])
def test_expected_steps_against_direct_sum(p, c, m, k):
    assert expected_steps(p, c, m, k) == pytest.approx(_brute_expected_steps(p, c, m, k), rel=1e-10, abs=1e-12)


def test_closed_form_identities():
    for p, c, m in [(0.25, 4.0, 8.0), (0.05, 1.0, 2.0), (1.0, 2.0, 9.0)]:
        # K = 1: a contact yields one step unless it yields none.
        assert expected_steps(p, c, m, 1) == pytest.approx(1 - prob_zero_steps(p, c, m), abs=1e-11)
        # No cap in effect: E[G]·c/m = c/(m p).
        assert expected_steps(p, c, m, 10_000) == pytest.approx(c / (m * p), rel=1e-9)
    # p = 1: a single gap of one round.
    assert prob_zero_steps(1.0, 4.0, 8.0) == pytest.approx(math.exp(-0.5))
    assert expected_steps(0.5, 0.0, 8.0, 3) == 0.0 and prob_zero_steps(0.5, 0.0, 8.0) == 1.0
    for bad in [dict(p=0.0), dict(p=1.5), dict(c=-1.0), dict(mean=0.0), dict(mean=float("nan"))]:
        args = dict(p=0.25, c=4.0, mean=8.0) | bad
        with pytest.raises(ConfigError, match=f"`{next(iter(bad))}`"):
            prob_zero_steps(**args)
    with pytest.raises(ConfigError, match="`max_steps`"):
        expected_steps(0.25, 4.0, 8.0, -1)
