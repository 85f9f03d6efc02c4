"""Client batch samplers: coverage, batch sizes, Poisson statistics, determinism and validation."""
from __future__ import annotations

import math

import pytest
import torch

import trustfl
from trustfl.data import AbstractBatchSampler, FixedSizeSampler, PoissonSampler, ShuffleSampler
from trustfl.errors import ConfigError

SAMPLERS = [ShuffleSampler(), FixedSizeSampler(), PoissonSampler()]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_shuffle_covers_each_index_once_per_epoch() -> None:
    n, b, epochs = 103, 10, 3
    batches = ShuffleSampler().steps(n, b, _gen(0), epochs=epochs)
    per_epoch = math.ceil(n / b)
    assert len(batches) == epochs * per_epoch
    for e in range(epochs):
        epoch = batches[e * per_epoch:(e + 1) * per_epoch]
        assert [len(x) for x in epoch] == [10] * 10 + [3]
        assert torch.equal(torch.cat(epoch).sort().values, torch.arange(n))
    assert not torch.equal(torch.cat(batches[:per_epoch]), torch.cat(batches[per_epoch:2 * per_epoch]))


def test_shuffle_num_steps_runs_across_epochs_and_large_batches() -> None:
    batches = ShuffleSampler().steps(25, 10, _gen(1), num_steps=5)
    assert [len(x) for x in batches] == [10, 10, 5, 10, 10]
    assert torch.equal(torch.cat(batches[:3]).sort().values, torch.arange(25))
    whole = ShuffleSampler().steps(4, 32, _gen(1), epochs=2)
    assert len(whole) == 2 and all(torch.equal(x.sort().values, torch.arange(4)) for x in whole)
    assert ShuffleSampler().sample_rate(4, 32) == 1.0


def test_fixed_batches_distinct_and_of_size_b() -> None:
    n, b = 50, 8
    batches = FixedSizeSampler().steps(n, b, _gen(0), epochs=40)
    assert len(batches) == 40 * math.ceil(n / b)
    for x in batches:
        assert x.dtype == torch.int64 and len(x) == b and len(torch.unique(x)) == b
        assert int(x.min()) >= 0 and int(x.max()) < n
    # Each index is in a batch with probability b/n: the counts over 280 steps are Binomial(280, 0.16).
    counts = torch.bincount(torch.cat(batches), minlength=n).double()
    expected, sd = 280 * b / n, math.sqrt(280 * b / n * (1 - b / n))
    assert (counts - expected).abs().max() < 4.5 * sd


@pytest.mark.parametrize("n", [12, 7])  # 4b < n takes the O(b) path, 4b >= n the permutation path
def test_fixed_subsets_uniform(n: int) -> None:
    from scipy.stats import chi2

    steps = 6_000
    batches = torch.stack(FixedSizeSampler().steps(n, 2, _gen(4), num_steps=steps))
    pairs = torch.bincount(batches.sort(dim=1).values @ torch.tensor([n, 1]), minlength=n * n).reshape(n, n)
    counts = pairs[torch.triu_indices(n, n, offset=1).unbind()].double()  # every unordered pair
    expected = steps / counts.numel()
    statistic = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2.sf(statistic, counts.numel() - 1) > 1e-4
    first = torch.bincount(batches[:, 0], minlength=n).double()  # the order within a batch is random too
    assert chi2.sf((((first - steps / n) ** 2) / (steps / n)).sum().item(), n - 1) > 1e-4


def test_poisson_mean_batch_size() -> None:
    n, b, steps = 200, 20, 2000
    batches = PoissonSampler().steps(n, b, _gen(0), num_steps=steps)
    sizes = torch.tensor([len(x) for x in batches], dtype=torch.float64)
    q = b / n
    standard_error = math.sqrt(n * q * (1 - q) / steps)
    assert abs(sizes.mean().item() - b) < 3 * standard_error
    assert abs(sizes.var().item() - n * q * (1 - q)) < 0.15 * n * q * (1 - q)  # Binomial variance, not fixed size
    assert all(len(torch.unique(x)) == len(x) for x in batches)
    inclusion = torch.bincount(torch.cat(batches), minlength=n).double() / steps
    assert (inclusion - q).abs().max() < 4.5 * math.sqrt(q * (1 - q) / steps)


def test_poisson_large_n_small_rate() -> None:
    n, b, steps = 50_000, 5, 3000
    sizes = torch.tensor([len(x) for x in PoissonSampler().steps(n, b, _gen(2), num_steps=steps)], dtype=torch.float64)
    q = b / n
    assert abs(sizes.mean().item() - b) < 3 * math.sqrt(n * q * (1 - q) / steps)
    assert PoissonSampler().steps(9, 9, _gen(0), num_steps=1)[0].tolist() == list(range(9))  # q = 1


def test_poisson_allows_empty_batches() -> None:
    batches = PoissonSampler().steps(50, 1, _gen(3), epochs=4)
    assert len(batches) == 200
    empty = [x for x in batches if len(x) == 0]
    assert empty and all(x.dtype == torch.int64 and x.shape == (0,) for x in empty)  # P(empty) = 0.98^50 ≈ 0.36


@pytest.mark.parametrize("sampler", SAMPLERS, ids=repr)
def test_deterministic_for_generator_seed(sampler: AbstractBatchSampler) -> None:
    a = sampler.steps(60, 7, _gen(11), epochs=2)
    b = sampler.steps(60, 7, _gen(11), epochs=2)
    c = sampler.steps(60, 7, _gen(12), epochs=2)
    assert len(a) == len(b) == 2 * math.ceil(60 / 7)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


@pytest.mark.parametrize("sampler", SAMPLERS, ids=repr)
def test_validation(sampler: AbstractBatchSampler) -> None:
    g = _gen(0)
    with pytest.raises(ConfigError, match="batch_size"):
        sampler.steps(10, 0, g, epochs=1)
    with pytest.raises(ConfigError, match="num_samples"):
        sampler.steps(0, 1, g, epochs=1)
    with pytest.raises(ConfigError, match="exactly one"):
        sampler.steps(10, 2, g)
    with pytest.raises(ConfigError, match="exactly one"):
        sampler.steps(10, 2, g, epochs=1, num_steps=3)
    with pytest.raises(ConfigError, match="epochs"):
        sampler.steps(10, 2, g, epochs=0)
    assert sampler.sample_rate(100, 10) == pytest.approx(0.1)


@pytest.mark.parametrize("sampler", [FixedSizeSampler(), PoissonSampler()], ids=repr)
def test_batch_larger_than_data_rejected(sampler: AbstractBatchSampler) -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        sampler.steps(5, 6, _gen(0), num_steps=1)


def test_registry_and_accounting() -> None:
    built = {name: trustfl.build("batch_sampler", name) for name in ("shuffle", "fixed", "poisson")}
    assert {name: s.accounting for name, s in built.items()} == {
        "shuffle": "shuffle", "fixed": "without_replacement", "poisson": "poisson"}
    assert all(isinstance(s, AbstractBatchSampler) for s in built.values())


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("n,b,count", [(64, 32, {"epochs": 1}), (70, 32, {"epochs": 2}), (25, 10, {"num_steps": 7}),
                                       (5, 5, {"epochs": 3}), (40, 3, {"num_steps": 1}), (300, 4, {"epochs": 1})])
def test_step_matrix_rows_are_the_batches_of_steps(sampler: AbstractBatchSampler, n: int, b: int, count: dict) -> None:
    """The stacked form the vectorized executor reads holds the same draws as the list: row s = batch s, then -1s."""
    batches = sampler.steps(n, b, _gen(11), **count)
    matrix = sampler.step_matrix(n, b, _gen(11), **count)
    assert matrix.dtype == torch.int64 and matrix.shape == (len(batches), max(1, max(x.numel() for x in batches)))
    for row, batch in zip(matrix, batches):
        assert torch.equal(row[:batch.numel()], batch) and bool((row[batch.numel():] == -1).all())


def test_shuffle_matrix_with_a_batch_larger_than_the_data_is_one_full_row_per_epoch() -> None:
    matrix = ShuffleSampler().step_matrix(4, 32, _gen(1), epochs=2)
    assert matrix.shape == (2, 4) and all(sorted(row.tolist()) == [0, 1, 2, 3] for row in matrix)
