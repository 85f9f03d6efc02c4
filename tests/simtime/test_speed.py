"""Speed models: keyed determinism, group assignment, moments, validation of parameters and trace files."""
import math
import re

import pytest
import torch

from trustfl.core.registry import build, names
from trustfl.core.rng import make_generator
from trustfl.errors import ConfigError
from trustfl.simtime import (ClockState, Deterministic, ExponentialGroups, ExponentialUniformMeans, Trace,
                             completed_steps)

F64 = torch.float64


def test_registered_names_build_the_models(tmp_path):
    assert {"exponential_groups", "exponential_uniform_means", "deterministic", "trace"} <= set(names("speed_model"))
    assert build("speed_model", "exponential_groups", slow_share=0.3) == ExponentialGroups(slow_share=0.3)
    assert build("speed_model", "deterministic", duration=2.0) == Deterministic(duration=2.0)


@pytest.mark.parametrize("model", [ExponentialGroups(slow_share=0.4), ExponentialUniformMeans(low=1.0, high=5.0)])
def test_draws_depend_only_on_seed_round_and_client(model):
    speed = model.bind(12, seed=7)
    alone = speed.durations(torch.tensor([5]), torch.tensor([3]), 7, 6)
    crowd = speed.durations(torch.tensor([9, 5, 0, 11]), torch.tensor([2, 3, -1, 8]), 7, 6)
    assert torch.equal(alone[0], crowd[1])
    assert torch.equal(speed.durations(torch.tensor([5]), torch.tensor([3]), 7, 6), alone)   # repeatable
    # The stream is exactly make_generator(seed, round, client, "step_times"), scaled by the client's mean.
    unit = torch.empty(6, dtype=F64).exponential_(1.0, generator=make_generator(7, 3, 5, "step_times"))
    assert torch.equal(alone[0], unit * speed.mean_step(torch.tensor([5]))[0])
    other_round = speed.durations(torch.tensor([5]), torch.tensor([4]), 7, 6)
    other_seed = model.bind(12, seed=8).durations(torch.tensor([5]), torch.tensor([3]), 8, 6)
    assert not torch.equal(alone, other_round) and not torch.equal(alone, other_seed)
    assert alone.dtype == F64 and alone.shape == (1, 6) and bool((alone >= 0).all())


def test_slow_clients_are_the_lowest_ids_as_in_the_authors_code():
    for share, n, slow in [(0.25, 20, 5), (0.3, 20, 6), (0.3, 7, 3), (0.5, 1, 1), (0.0, 10, 0), (1.0, 4, 4)]:
        means = ExponentialGroups(slow_share=share).bind(n, seed=0).mean_step(torch.arange(n))
        assert means.tolist() == [8.0] * slow + [2.0] * (n - slow), (share, n)


def test_exponential_moments():
    # One slow client, 20000 steps: mean 8, standard deviation 8 (exponential), each within 5 standard errors.
    d = ExponentialGroups(slow_share=0.5).bind(2, seed=3).durations(torch.tensor([0]), torch.tensor([-1]), 3, 20000)
    n = d.numel()
    assert abs(d.mean().item() - 8.0) < 5 * 8.0 / math.sqrt(n)
    # Var of the sample variance of Exp(mean 8) is (μ4 − σ⁴)/n = (9·8⁴ − 8⁴)/n.
    assert abs(d.var().item() - 64.0) < 5 * math.sqrt(8 * 8.0 ** 4 / n)


def test_uniform_means_are_drawn_once_per_seed():
    a = ExponentialUniformMeans(low=2.0, high=9.0).bind(5000, seed=1).mean_step(torch.arange(5000))
    b = ExponentialUniformMeans(low=2.0, high=9.0).bind(5000, seed=1).mean_step(torch.arange(5000))
    c = ExponentialUniformMeans(low=2.0, high=9.0).bind(5000, seed=2).mean_step(torch.arange(5000))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert 2.0 <= a.min().item() and a.max().item() <= 9.0
    assert abs(a.mean().item() - 5.5) < 5 * 7.0 / math.sqrt(12 * 5000)   # U[2, 9]: sd 7/√12
    fixed = ExponentialUniformMeans(low=3.0, high=3.0).bind(4, seed=0).mean_step(torch.arange(4))
    assert fixed.tolist() == [3.0] * 4


def test_deterministic_and_trace_durations(tmp_path):
    d = Deterministic(duration=0.5).bind(3, seed=0).durations(torch.tensor([2, 0]), torch.tensor([1, -1]), 0, 3)
    assert d.tolist() == [[0.5] * 3] * 2
    path = tmp_path / "t.csv"
    path.write_text("client,duration\n1,4\n0,1.5\n1,0\n\n1,2\n")   # interleaved rows, a blank line, a zero step
    speed = Trace(path=path).bind(2, seed=0)
    got = speed.durations(torch.tensor([1, 0]), torch.tensor([5, 5]), 0, 7)
    assert got.tolist() == [[4.0, 0.0, 2.0, 4.0, 0.0, 2.0, 4.0], [1.5] * 7]
    assert speed.mean_step(torch.tensor([0, 1])).tolist() == [1.5, 2.0]


def test_calls_are_checked():
    speed = ExponentialGroups()
    with pytest.raises(ConfigError, match=r"bind\(num_clients, seed=seed\)"):
        speed.durations(torch.tensor([0]), torch.tensor([0]), 0, 2)
    bound = speed.bind(4, seed=1)
    with pytest.raises(ConfigError, match=r"`seed` must be the seed given to bind\(\) \(1\), found 2"):
        bound.durations(torch.tensor([0]), torch.tensor([0]), 2, 2)
    with pytest.raises(ConfigError, match=r"\[0, 4\)"):
        bound.mean_step(torch.tensor([4]))
    with pytest.raises(ConfigError, match="`last_round`"):
        bound.durations(torch.tensor([0, 1]), torch.tensor([0]), 1, 2)
    with pytest.raises(ConfigError, match="`last_round` must be >= -1"):
        bound.durations(torch.tensor([0]), torch.tensor([-2]), 1, 2)
    with pytest.raises(ConfigError, match="`steps`"):
        bound.durations(torch.tensor([0]), torch.tensor([0]), 1, -1)
    with pytest.raises(ConfigError, match="`num_clients`"):
        speed.bind(0, seed=1)


@pytest.mark.parametrize("cls, params, key", [
    (ExponentialGroups, dict(slow_share=-0.1), "slow_share"),
    (ExponentialGroups, dict(slow_share=1.5), "slow_share"),
    (ExponentialGroups, dict(slow_share=float("nan")), "slow_share"),
    (ExponentialGroups, dict(fast_mean=0.0), "fast_mean"),
    (ExponentialGroups, dict(fast_mean=float("inf")), "fast_mean"),
    (ExponentialGroups, dict(slow_mean=-1), "slow_mean"),
    (ExponentialGroups, dict(slow_mean="8"), "slow_mean"),
    (ExponentialGroups, dict(slow_mean=True), "slow_mean"),
    # step times above MAX_TIME = 1e100 overflowed the clock after a round (synchronous and buffered schedules)
    (ExponentialGroups, dict(slow_mean=1e308), "slow_mean"),
    (ExponentialUniformMeans, dict(high=1e101), "high"),
    (Deterministic, dict(duration=1e308), "duration"),
    (Deterministic, dict(slow=1e200), "slow"),
    (ExponentialUniformMeans, dict(low=0.0), "low"),
    (ExponentialUniformMeans, dict(low=float("nan")), "low"),
    (ExponentialUniformMeans, dict(high=float("inf")), "high"),
    (ExponentialUniformMeans, dict(low=5.0, high=4.0), "high"),
    (Deterministic, dict(duration=0.0), "duration"),
    (Deterministic, dict(duration=-1.0), "duration"),
    (Deterministic, dict(duration=float("nan")), "duration"),
    (Deterministic, dict(fast=float("inf")), "fast"),
    (Deterministic, dict(slow=-2.0), "slow"),
    (Deterministic, dict(slow_share=2.0), "slow_share"),
    (Deterministic, dict(duration=1.0, fast=2.0), "duration"),
])
def test_invalid_parameters_name_the_key(cls, params, key):
    with pytest.raises(ConfigError, match=f"`engine.speed.{key}`"):
        cls(**params)


@pytest.mark.parametrize("body, where, what", [
    ("client,duration\n0,1.0\n1,abc\n", "row 2 (line 3)", "`duration` must be a finite number in [0, 1e+100]"),
    # beyond MAX_TIME the clock's sums overflowed after a round
    ("client,duration\n0,1.0\n1,1e308\n", "row 2 (line 3)", "in [0, 1e+100] (simulated time; larger ones overflow"),
    ("client,duration\n0,1.0\n1,-0.5\n", "row 2 (line 3)", "found '-0.5'"),
    ("client,duration\n0,nan\n1,1\n", "row 1 (line 2)", "found 'nan'"),
    ("client,duration\n0,1\n1,1\n0,inf\n", "row 3 (line 4)", "found 'inf'"),
    ("client,duration\n0,1\nx,1\n", "row 2 (line 3)", "`client` must be an integer >= 0 and below 2**63, found 'x'"),
    ("client,duration\n0,1\n-1,1\n", "row 2 (line 3)", "`client` must be an integer >= 0"),
    # beyond int64: "Overflow when unpacking long long", naming neither file nor row
    ("client,duration\n0,1\n99999999999999999999999,1\n", "row 2 (line 3)",
     "`client` must be an integer >= 0 and below 2**63, found '99999999999999999999999'"),
    ("client,duration\n0,1\n1,1,2\n", "row 2 (line 3)", "expected 2 columns"),
    ("client,duration\n1,1\n0,0\n0,0.0\n", "row 2 (line 3)", "client 0 has only zero durations"),
    ("id,duration\n0,1\n", "line 1", "header must be `client,duration`"),
    ("", "line 1", "header must be `client,duration`"),
    ("client,duration\n\n", "", "no data rows"),
])
def test_malformed_trace_names_file_and_row(tmp_path, body, where, what):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(ConfigError) as info:
        Trace(path=str(path))
    message = str(info.value)
    assert "`engine.speed.path`" in message and str(path) in message and where in message and what in message


ALL_SLOW = "`slow_share` makes every one of the 6 clients slow"


@pytest.mark.parametrize("model, key, why", [
    (Deterministic(fast=1.0, slow=3.0), "slow", "`slow_share` is 0"),  # every client ran at `fast`
    (Deterministic(duration=1.0, slow_share=0.5), "slow_share", "`duration` gives every client"),
    (Deterministic(slow_share=0.5), "slow_share", "no `slow` is given"),
    (Deterministic(slow_share=0.5, fast=2.0, slow=2.0), "slow_share", "`slow` and `fast` are equal"),
    (Deterministic(slow_share=0.9, fast=3.0, slow=2.0), "fast", ALL_SLOW),
    (ExponentialGroups(slow_share=0.0, slow_mean=5.0), "slow_mean", "`slow_share` is 0"),
    (ExponentialGroups(slow_share=1.0, fast_mean=3.0), "fast_mean", ALL_SLOW),
    (ExponentialGroups(slow_share=0.5, slow_mean=2.0), "slow_share", "`fast_mean` and `slow_mean` are equal"),
])
def test_a_group_setting_the_groups_make_do_nothing_is_refused(model, key, why):
    """Each drew the same step times as without the key (e.g. `slow` without `slow_share`: every client fast)."""
    with pytest.raises(ConfigError, match=f"^`engine.speed.{key}` is set but does nothing: {re.escape(why)}.*; "
                                          "remove it\\.$"):
        model.bind(6, seed=0)
    for acting in (Deterministic(slow_share=0.5, slow=2.0), Deterministic(slow_share=0.5, fast=3.0, slow=2.0),
                   ExponentialGroups(slow_share=0.5, fast_mean=3.0), Deterministic(duration=1.0)):
        acting.bind(6, seed=0)


def test_trace_must_cover_exactly_the_clients(tmp_path):
    path = tmp_path / "gaps.csv"
    path.write_text("client,duration\n0,1\n2,1\n3,1\n")
    trace = Trace(path=path)
    with pytest.raises(ConfigError, match=r"no rows for client\(s\) 1 \(1 missing\)") as info:
        trace.bind(4, seed=0)
    assert str(path) in str(info.value)
    with pytest.raises(ConfigError, match=r"row 3 \(line 4\): client 3 is out of range for num_clients=3"):
        trace.bind(3, seed=0)
    far = tmp_path / "far.csv"  # tables were sized by the largest id: 10^12 asked for 8 TB, a RuntimeError
    far.write_text("client,duration\n0,1\n1000000000000,2\n")
    with pytest.raises(ConfigError, match=r"row 2 \(line 3\): client 1000000000000 is out of range"):
        Trace(path=far).bind(2, seed=0)
    with pytest.raises(ConfigError, match="cannot be read"):
        Trace(path=tmp_path / "absent.csv")


@pytest.mark.parametrize("path", [1, True, 0, None, "", 2.5])
def test_a_trace_path_that_is_not_a_string_is_refused(path):
    # open(1) is the process's stdout: reading it as a trace, then closing it, silenced everything printed after
    with pytest.raises(ConfigError, match=r"^`engine.speed.path` must be the path of a CSV file"):
        Trace(path=path)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_draws_and_clock():
    dev = torch.device("cuda")
    speed = ExponentialGroups(slow_share=0.5).bind(10, seed=4)
    ids, rounds = torch.tensor([3, 8, 1], device=dev), torch.tensor([2, -1, 0], device=dev)
    d = speed.durations(ids, rounds, 4, 5)
    assert d.device.type == "cuda" and d.dtype == F64 and d.shape == (3, 5) and bool((d >= 0).all())
    assert torch.equal(d[1], speed.durations(ids[1:2], rounds[1:2], 4, 5)[0])   # keyed, on the device too
    assert speed.mean_step(ids).device.type == "cuda"
    start = torch.tensor([0.0, 1.0, 2.0], dtype=F64, device=dev)
    assert torch.equal(completed_steps(start, d, 20.0).cpu(), completed_steps(start.cpu(), d.cpu(), 20.0))
    clock = ClockState.initial(10, device=dev)
    clock.advance(6.0)
    steps = clock.poll(ids, 0, speed, seed=4, max_steps=5)
    assert steps.device.type == "cuda" and clock.last_round.device.type == "cuda"
    moved = ClockState.from_state_dict(clock.state_dict(), device="cpu")
    assert torch.equal(moved.last_contact, clock.last_contact.cpu()) and moved.server_time == 6.0
