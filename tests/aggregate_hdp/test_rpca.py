"""PCP / Robust PCA (trustfl.aggregate.rpca): planted recovery, stopping rules, μ rules, layouts, validation."""
import math

import pytest
import torch

from trustfl.aggregate.rpca import DEFAULT_TOL, pcp
from trustfl.errors import ConfigError, MessageError



pytestmark = pytest.mark.usefixtures("one_torch_thread")

def planted(p: int = 500, n: int = 40, rank: int = 2, density: float = 0.05, seed: int = 0):
    """``M = L0 + S0``: rank-``rank`` Gaussian factors plus ``density`` of entries set to ±10."""
    g = torch.Generator().manual_seed(seed)
    low = torch.randn(p, rank, generator=g, dtype=torch.float64) @ torch.randn(rank, n, generator=g,
                                                                              dtype=torch.float64)
    mask = torch.rand(p, n, generator=g) < density
    sparse = torch.where(mask, 10.0 * torch.sign(torch.randn(p, n, generator=g, dtype=torch.float64)), 0.0)
    return low + sparse, low, sparse


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("options", [{}, {"svd": "direct"}, {"mu_rule": "spectral", "mu_growth": 1.1},
                                     {"mu_rule": "spectral"}])
def test_planted_low_rank_plus_sparse_is_recovered(options):
    M, low, sparse = planted()
    res = pcp(M, **options)
    assert res.converged and res.rank == 2
    assert res.low_rank.shape == res.sparse.shape == M.shape
    assert rel(res.low_rank, low) < 1e-5 and rel(res.sparse, sparse) < 1e-5
    # the support of S0 is found exactly
    assert torch.equal(res.sparse.abs() > 1.0, sparse != 0)


def test_code_mu_reaches_tolerance_but_slower():
    M, low, _ = planted()
    candes, code = pcp(M), pcp(M, mu_rule="code")
    assert code.converged and code.iterations > 5 * candes.iterations
    assert rel(code.low_rank, low) < 0.05


def test_residual_and_default_tolerances():
    M, _, _ = planted(seed=1)
    res = pcp(M)
    assert res.residual == pytest.approx(float((M - res.low_rank - res.sparse).norm()), rel=1e-6, abs=1e-12)
    assert res.residual <= DEFAULT_TOL["relative"] * float(M.norm())
    absolute = pcp(M, tol_mode="absolute", tol=1e-9)
    assert absolute.converged and absolute.residual <= 1e-9
    assert absolute.iterations >= res.iterations


@pytest.mark.parametrize("options", [{}, {"mu_rule": "spectral", "mu_growth": 1.1}])
def test_sparse_stopping_tests_give_the_same_split(options):
    M, _, _ = planted(seed=2)
    every, sparse = pcp(M, **options), pcp(M, check_every=4, **options)
    assert every.converged and sparse.converged
    # The test runs at multiples of 4 only: at most 3 iterations past the first that met the tolerance.
    assert sparse.iterations % 4 == 0 and every.iterations <= sparse.iterations < every.iterations + 4
    assert sparse.residual == pytest.approx(float((M - sparse.low_rank - sparse.sparse).norm()), rel=1e-6)
    assert rel(sparse.sparse, every.sparse) < 1e-5 and rel(sparse.low_rank, every.low_rank) < 1e-5


def test_max_iter_stops_unconverged():
    M, _, _ = planted()
    res = pcp(M, max_iter=3)
    assert res.iterations == 3 and not res.converged
    assert res.residual == pytest.approx(float((M - res.low_rank - res.sparse).norm()), rel=1e-6)


def test_default_lambda_and_mu_rules():
    M, _, _ = planted(p=300, n=20)
    p, n = M.shape
    assert pcp(M, max_iter=1).lam == pytest.approx(1 / math.sqrt(300))
    assert pcp(M, max_iter=1).mu == pytest.approx(p * n / (4 * float(M.abs().sum())))
    assert pcp(M, max_iter=1, mu_rule="code").mu == pytest.approx(p * n / (4 * float(M.abs().sum(0).max())))
    assert pcp(M, max_iter=1, mu_rule="spectral").mu == pytest.approx(1.25 / float(torch.linalg.matrix_norm(M, 2)))
    assert pcp(M, max_iter=1, mu=3.0, lam=0.5).mu == 3.0


def test_layout_and_dtype_do_not_change_the_result():
    M, _, _ = planted(p=300, n=20)
    a = pcp(M)
    b = pcp(M.T.contiguous().T)            # the transposed (message-matrix) layout
    c = pcp(M.to(torch.float32))
    assert torch.allclose(a.sparse, b.sparse, atol=1e-10) and a.iterations == b.iterations
    assert a.sparse.dtype == c.sparse.dtype == torch.float64
    assert rel(c.sparse, a.sparse) < 1e-5


def test_column_permutation_equivariance():
    M, _, _ = planted(p=300, n=20, seed=2)
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(0))
    a, b = pcp(M), pcp(M[:, perm])
    assert torch.allclose(a.sparse[:, perm], b.sparse, atol=1e-9)
    assert torch.allclose(a.low_rank[:, perm], b.low_rank, atol=1e-9)


def test_does_not_modify_input():
    M, _, _ = planted(p=200, n=10)
    copy = M.clone()
    pcp(M)
    assert torch.equal(M, copy)


def test_zero_matrix():
    res = pcp(torch.zeros(50, 4))
    assert res.converged and res.iterations == 0 and res.residual == 0.0
    assert not res.low_rank.any() and not res.sparse.any()


@pytest.mark.parametrize("kwargs", [{"lam": 0.0}, {"mu": -1.0}, {"tol": float("nan")}, {"mu_rule": "l1"},
                                    {"tol_mode": "rel"}, {"max_iter": 0}, {"max_iter": 2.5},
                                    {"mu_growth": 0.9}, {"svd": "qr"}, {"mu_max": 0.0}, {"check_every": 0}])
def test_invalid_options(kwargs):
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        pcp(torch.ones(5, 2), **kwargs)


def test_invalid_matrices():
    with pytest.raises(MessageError, match="non-empty floating"):
        pcp(torch.ones(5, dtype=torch.float64))
    with pytest.raises(MessageError, match="non-empty floating"):
        pcp(torch.ones(5, 2, dtype=torch.int64))
    bad = torch.ones(5, 2)
    bad[0, 0] = float("inf")
    with pytest.raises(MessageError, match="non-finite"):
        pcp(bad)
    # finite entries whose sum of squares overflows float64: called non-finite before, now their norm is given
    with pytest.raises(MessageError, match=r"^`M` has Frobenius norm 3e\+160 > 1e\+150"):
        pcp(torch.full((3, 3), 1e160, dtype=torch.float64))
