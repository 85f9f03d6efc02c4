"""Correlated noise: exact pairwise cancellation, covariance of both samplers, the client-side stage."""
from __future__ import annotations

import math

import pytest
import torch

import trustfl
from trustfl.errors import ConfigError, PrivacyError
from trustfl.privacy.correlated import (CorrelatedNoise, PairwiseCorrelatedNoise, centered_pair_noise,
                                        correlated_noise, simulation_keys)
from trustfl.privacy.keys import ClientKeys, PublicKeyDirectory
from trustfl.types import RoundContext

F64 = torch.float64


def ctx(ids: tuple[int, ...], n: int, seed: int = 0, round: int = 0) -> RoundContext:
    return RoundContext(round=round, seed=seed, client_ids=ids, num_clients=n)


def assert_covariance(noise: torch.Tensor, target: torch.Tensor, k: float = 4.0) -> None:
    """``noise`` is (n, d) with i.i.d. zero-mean columns; compare ``N Nᵀ / d`` with ``target`` entrywise.

    For a zero-mean Gaussian pair, ``Var(N_i N_j) = C_ii C_jj + C_ij²``, so the standard error of each entry of
    the estimate is ``√((C_ii C_jj + C_ij²)/d)``; allow ``k`` of them.
    """
    d = noise.shape[1]
    est = noise @ noise.T / d
    diag = torch.diagonal(target)
    se = torch.sqrt((diag[:, None] * diag[None, :] + target ** 2) / d)
    assert bool(((est - target).abs() <= k * se).all()), (est, target, se)


def pair_law(n: int, sigma_cor: float, sigma_ind: float = 0.0) -> torch.Tensor:
    """``σ_cor²(nI − 11ᵀ) + σ_ind² I``: (n−1)σ_cor² + σ_ind² on the diagonal, −σ_cor² off it."""
    return sigma_cor ** 2 * (n * torch.eye(n, dtype=F64) - torch.ones(n, n, dtype=F64)) \
        + sigma_ind ** 2 * torch.eye(n, dtype=F64)


def test_exact_pairwise_noise_cancels_when_all_honest() -> None:
    keys, directory = simulation_keys(seed=11, n=8)
    rows = PairwiseCorrelatedNoise(1.3).cohort_noise(keys, directory, round=2, d=5000, dtype=F64)
    assert rows.shape == (8, 5000)
    assert float(rows.sum(0).abs().max()) <= 1e-9
    assert float(rows.std()) > 1.0  # the rows themselves are very noisy


def test_exact_row_uses_only_its_own_keys() -> None:
    seed = bytes(32)
    directory = PublicKeyDirectory.of([ClientKeys.generate(i, seed) for i in range(4)])
    mech = PairwiseCorrelatedNoise(0.5)
    own = mech.client_noise(ClientKeys.generate(2, seed), directory, 0, 16, F64)  # client 2 alone
    all_rows = mech.cohort_noise([ClientKeys.generate(i, seed) for i in range(4)], directory, 0, 16, dtype=F64)
    assert torch.equal(own, all_rows[2])
    with pytest.raises(PrivacyError, match="no key pair"):
        mech.cohort_noise({0: ClientKeys.generate(0, seed)}, directory, 0, 16, client_ids=[0, 1])


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_a_cohort_s_rows_are_each_client_s_own_noise_bitwise_however_drawn(draw_threads, dtype) -> None:
    # d spans several of the pieces a row is summed in on a draw thread, the last one short
    keys, directory = simulation_keys(seed=5, n=5)
    mech = PairwiseCorrelatedNoise(0.9)
    rows = mech.cohort_noise(keys, directory, 3, 40_001, client_ids=[4, 0, 2], dtype=dtype)
    own = torch.stack([mech.client_noise(keys[c], directory, 3, 40_001, dtype) for c in (4, 0, 2)])
    assert rows.dtype == dtype and torch.equal(rows, own)


@pytest.mark.parametrize("path", ["exact", "fast"])
def test_independent_noise_is_each_client_s_own_stream_however_drawn(draw_threads, path) -> None:
    n, d, ids = 6, 40_001, (5, 1, 3)
    context = ctx(ids, n, seed=7, round=4)
    stage = correlated_noise(0.4, sigma_ind=1.7, path=path)
    out = stage.apply(torch.zeros(len(ids), d, dtype=F64), None, context).x
    if path == "exact":
        keys, directory = simulation_keys(7, n)
        pair = torch.stack([PairwiseCorrelatedNoise(0.4).client_noise(keys[c], directory, 4, d, F64) for c in ids])
    else:
        pair = centered_pair_noise(n, d, 0.4, context.generator("correlated_noise_fast"), F64, rows=ids)
    for r, c in enumerate(ids):
        pair[r].add_(torch.randn(d, generator=context.generator("noise_ind", c), dtype=F64), alpha=1.7)
    assert torch.equal(out, pair)


def test_sign_convention_lower_index_adds() -> None:
    keys, directory = simulation_keys(seed=0, n=2)
    rows = PairwiseCorrelatedNoise(1.0).cohort_noise(keys, directory, 0, 8, dtype=F64)
    assert torch.equal(rows[0], -rows[1])


def test_exact_path_covariance() -> None:
    n, sigma = 5, 0.7
    keys, directory = simulation_keys(seed=3, n=n)
    rows = PairwiseCorrelatedNoise(sigma).cohort_noise(keys, directory, 0, 40_000, dtype=F64)
    assert_covariance(rows, pair_law(n, sigma))


def test_fast_path_covariance_and_zero_sum() -> None:
    n, sigma = 5, 0.7
    rows = centered_pair_noise(n, 40_000, sigma, torch.Generator().manual_seed(4), F64)
    assert_covariance(rows, pair_law(n, sigma))
    assert float(rows.sum(0).abs().max()) <= 1e-9


@pytest.mark.parametrize("path", ["exact", "fast"])
def test_stage_covariance_with_independent_noise(path: str) -> None:
    n, s_cor, s_ind = 4, 0.6, 0.9
    out = correlated_noise(s_cor, s_ind, path).apply(torch.zeros(n, 40_000, dtype=F64), None, ctx((0, 1, 2, 3), n))
    assert_covariance(out.x, pair_law(n, s_cor, s_ind))
    assert out.metrics["message_noise_std"] == pytest.approx(math.sqrt(3 * s_cor ** 2 + s_ind ** 2))


@pytest.mark.parametrize("path", ["exact", "fast"])
def test_stage_cancels_in_the_sum_when_all_participate(path: str) -> None:
    n = 6
    x = torch.randn(n, 3000, generator=torch.Generator().manual_seed(0), dtype=F64)
    out = correlated_noise(2.0, 0.0, path).apply(x, None, ctx(tuple(range(n)), n))
    assert float((out.x.sum(0) - x.sum(0)).abs().max()) <= 1e-9
    assert float((out.x - x).std()) > 3.0
    assert out.metrics["sum_noise_std"] == 0.0


@pytest.mark.parametrize("path", ["exact", "fast"])
def test_byzantine_pair_terms_never_cancel(path: str) -> None:
    n, m, sigma, d = 6, 4, 0.8, 40_000  # clients 4 and 5 are Byzantine: they never add their share
    out = correlated_noise(sigma, 0.0, path).apply(torch.zeros(m, d, dtype=F64), None, ctx((0, 1, 2, 3), n))
    target = m * (n - m) * sigma ** 2
    var = float(out.x.sum(0).pow(2).mean())
    assert abs(var - target) <= 4 * target * math.sqrt(2 / d)
    assert out.metrics["sum_noise_std"] == pytest.approx(math.sqrt(target))


@pytest.mark.parametrize("path", ["exact", "fast"])
def test_stage_rows_do_not_depend_on_the_cohort(path: str) -> None:
    stage = correlated_noise(1.0, 0.5, path)
    full = stage.apply(torch.zeros(3, 32, dtype=F64), None, ctx((0, 2, 5), 6)).x
    alone = stage.apply(torch.zeros(1, 32, dtype=F64), None, ctx((2,), 6)).x
    assert torch.equal(full[1], alone[0])


@pytest.mark.parametrize("path", ["exact", "fast"])
def test_stage_is_deterministic_per_seed_and_round(path: str) -> None:
    stage = correlated_noise(1.0, 0.5, path)
    x = torch.zeros(3, 64)
    a = stage.apply(x, None, ctx((0, 1, 2), 3, seed=1, round=4)).x
    assert a.dtype == torch.float32
    assert torch.equal(a, stage.apply(x, None, ctx((0, 1, 2), 3, seed=1, round=4)).x)
    assert not torch.equal(a, stage.apply(x, None, ctx((0, 1, 2), 3, seed=1, round=5)).x)
    assert not torch.equal(a, stage.apply(x, None, ctx((0, 1, 2), 3, seed=2, round=4)).x)


def test_registered_and_validated() -> None:
    assert isinstance(trustfl.build("client_stage", "correlated_noise", sigma_cor=1.0), CorrelatedNoise)
    for bad in (lambda: correlated_noise(-1.0), lambda: correlated_noise(1.0, float("nan")),
                lambda: correlated_noise(1.0, path="matrix")):
        with pytest.raises(ConfigError):
            bad()
    stage = correlated_noise(1.0)
    with pytest.raises(PrivacyError, match="num_clients"):
        stage.apply(torch.zeros(2, 3), None, ctx((0, 1), 0))
    with pytest.raises(PrivacyError, match="distinct ids"):
        stage.apply(torch.zeros(2, 3), None, ctx((0, 4), 3))
    with pytest.raises(PrivacyError, match="name each"):
        stage.apply(torch.zeros(2, 3), None, ctx((0,), 3))


def test_covariance_check_has_power() -> None:
    """Independent noise with the right variance but no correlation must fail the covariance check."""
    n, sigma = 5, 0.7
    iid = math.sqrt(n - 1) * sigma * torch.randn(n, 40_000, generator=torch.Generator().manual_seed(1), dtype=F64)
    with pytest.raises(AssertionError):
        assert_covariance(iid, pair_law(n, sigma))
