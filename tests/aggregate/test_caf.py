"""CAF (Algorithm 2 with trustfl's safeguards): Gram route vs a direct d×d oracle, Prop. 4.1, power method, edge
cases."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trustfl.aggregate.base import Mean
from trustfl.aggregate.caf import CAF
from trustfl.types import RoundContext


def ctx(n: int, seed: int = 0) -> RoundContext:
    return RoundContext(round=0, seed=seed, client_ids=tuple(range(n)), num_clients=n)


def direct_caf(x: torch.Tensor, f: int, literal_max: bool = False, cap: int | None = None):
    """Oracle: Algorithm 2 on the d×d covariance with eigh (float64). ``literal_max`` takes max τ over all points
    (the paper as printed) instead of over still-weighted points (trustfl's safeguard)."""
    n = x.shape[0]
    c = torch.ones(n, dtype=torch.float64)
    mu_best, sigma_best, it = x.mean(0), math.inf, 0
    cap = n if cap is None else cap
    while float(c.sum()) > n - 2 * f and it < cap:
        it += 1
        mu = (c @ x) / c.sum()
        diff = x - mu
        cov = (diff.T * c) @ diff / c.sum()
        evals, evecs = torch.linalg.eigh(cov)
        lam, v = float(evals[-1]), evecs[:, -1]
        if lam <= sigma_best:
            mu_best, sigma_best = mu, lam
        if lam <= 0:
            break
        tau = (diff @ v) ** 2
        tau_max = float(tau.max() if literal_max else tau[c > 0].max())
        if tau_max <= 0:
            break
        c = (c * (1 - tau / tau_max)).clamp_min(0)
    return mu_best, it


def planted(seed: int, n: int, f: int, d: int, mode: str, scale: float = 20.0):
    gen = torch.Generator().manual_seed(seed)
    honest = torch.randn(n - f, d, generator=gen, dtype=torch.float64)
    if mode == "same":
        byz = (scale * torch.randn(1, d, generator=gen, dtype=torch.float64)).repeat(f, 1)
    elif mode == "spread":
        byz = scale * torch.randn(f, d, generator=gen, dtype=torch.float64)
    elif mode == "shift":  # ALIE-like: a small shift along the coordinate-wise std
        byz = (honest.mean(0) + 1.5 * honest.std(0)).repeat(f, 1)
    else:  # sign flip
        byz = (-3.0 * honest.mean(0) - 2.0).repeat(f, 1)
    return torch.cat([byz, honest]), honest


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("n,f,d", [(7, 2, 3), (12, 3, 8), (20, 6, 20), (15, 5, 40)])
@pytest.mark.parametrize("mode", ["same", "spread", "shift", "flip"])
def test_gram_route_equals_direct_implementation(seed, n, f, d, mode):
    x, _ = planted(seed, n, f, d, mode)
    out = CAF(f=f).apply(x, None, ctx(n))
    expected, iterations = direct_caf(x, f)
    assert torch.allclose(out.x, expected, rtol=0, atol=1e-10)
    assert out.metrics["iterations"] == iterations


def kappa(n: int, f: int) -> float:
    return (6 * f / (n - f)) * (1 + f / (n - 2 * f)) ** 2


def honest_bound(honest: torch.Tensor, n: int, f: int) -> float:
    diff = honest - honest.mean(0)
    return kappa(n, f) * float(torch.linalg.eigvalsh(diff.T @ diff / honest.shape[0])[-1])


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("mode", ["same", "spread", "shift", "flip"])
@pytest.mark.parametrize("n,f,d", [(11, 1, 5), (13, 3, 10), (15, 5, 30), (30, 9, 6)])
def test_prop_4_1_bound_with_planted_outliers(seed, mode, n, f, d):
    x, honest = planted(seed, n, f, d, mode)
    x = x[torch.randperm(n, generator=torch.Generator().manual_seed(seed))]
    err2 = float((CAF(f=f)(x) - honest.mean(0)).square().sum())
    assert err2 <= honest_bound(honest, n, f)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(3, 16), d=st.integers(1, 8),
       scale=st.sampled_from([0.5, 3.0, 1e3, 1e6]), mode=st.sampled_from(["same", "spread", "shift", "flip"]),
       frac=st.floats(0.0, 0.49))
def test_prop_4_1_bound_property(seed, n, d, scale, mode, frac):
    f = min(int(frac * n), (n - 1) // 2)
    x, honest = planted(seed, n, f, d, mode, scale)
    if f == 0:
        assert torch.allclose(CAF(f=0)(x), x.mean(0))
        return
    err2 = float((CAF(f=f)(x) - honest.mean(0)).square().sum())
    assert err2 <= honest_bound(honest, n, f) * (1 + 1e-9) + 1e-12


def test_f_zero_gives_the_mean_without_iterating():
    x = torch.randn(9, 5, generator=torch.Generator().manual_seed(0))
    out = CAF(f=0).apply(x, None, ctx(9))
    assert torch.allclose(out.x, Mean()(x), rtol=1e-6, atol=1e-7)
    assert out.metrics["iterations"] == 0.0


def test_one_pass_returns_the_plain_mean_and_reports_it():
    x, _ = planted(1, 12, 3, 6, "spread")
    out = CAF(f=3, max_iter=1).apply(x, None, ctx(12))
    assert torch.allclose(out.x, x.mean(0))
    assert out.metrics["iterations"] == 1.0 and out.metrics["best_iteration"] == 1.0


def test_max_over_still_weighted_points_shortens_the_filter():
    # A far outlier along e1 is zeroed in pass 1; the honest spread is also largest along e1, so with the literal
    # max over all points (the zeroed outlier keeps the max τ) the weights barely move and the loop drags on.
    gen = torch.Generator().manual_seed(0)
    honest = torch.randn(20, 4, generator=gen, dtype=torch.float64) * torch.tensor([3.0, 1.0, 1.0, 1.0],
                                                                                 dtype=torch.float64)
    byz = torch.tensor([[1e4, 0, 0, 0], [0.0, 8.0, 0, 0], [0.0, -8.0, 0, 0]], dtype=torch.float64)
    x = torch.cat([byz, honest])
    out = CAF(f=3).apply(x, None, ctx(23))
    _, literal_iterations = direct_caf(x, 3, literal_max=True, cap=50)
    fixed, fixed_iterations = direct_caf(x, 3)
    assert literal_iterations == 50  # still running at the cap (it needs thousands of passes)
    assert out.metrics["iterations"] == fixed_iterations <= 2 * 3
    assert torch.allclose(out.x, fixed, atol=1e-10)


def test_power_method_matches_exact_and_is_seeded():
    x, honest = planted(2, 30, 6, 50, "spread", scale=30.0)
    exact = CAF(f=6)(x)
    power = CAF(f=6, method="power")
    out1 = power.apply(x, None, ctx(30, seed=7))
    out2 = power.apply(x, None, ctx(30, seed=7))
    assert torch.equal(out1.x, out2.x)  # deterministic for a seed
    assert out1.metrics["power_steps"] >= out1.metrics["iterations"]
    assert float((out1.x - exact).norm()) < 1e-3 * float(exact.norm() + 1)
    err2 = float((out1.x - honest.mean(0)).square().sum())
    assert err2 <= honest_bound(honest, 30, 6)


def test_power_method_with_one_step_depends_on_the_seed_but_stays_robust():
    x, honest = planted(3, 20, 5, 40, "same", scale=50.0)
    agg = CAF(f=5, method="power", power_iters=1)
    a = agg.apply(x, None, ctx(20, seed=1)).x
    b = agg.apply(x, None, ctx(20, seed=2)).x
    assert not torch.equal(a, b)
    for out in (a, b):
        assert float((out - honest.mean(0)).norm()) < 1.0


@pytest.mark.parametrize("method", ["gram", "power"])
def test_degenerate_inputs(method):
    same = torch.tensor([[2.0, -1.0, 0.5]]).repeat(9, 1)
    out = CAF(f=3, method=method).apply(same, None, ctx(9))
    assert torch.allclose(out.x, same[0])
    assert out.metrics["iterations"] == 1.0  # λ = 0: stop at once
    one = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    assert torch.equal(CAF(f=0, method=method)(one), one[0])
    # two distinct points repeated: rank-one covariance, the filter must still terminate
    two = torch.tensor([[0.0], [1.0]]).repeat(5, 1)
    assert torch.isfinite(CAF(f=2, method=method)(two)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dtype_preserved_and_float32_close_to_float64(dtype):
    x, _ = planted(4, 25, 7, 30, "spread")
    out = CAF(f=7)(x.to(dtype))
    assert out.dtype == dtype
    assert torch.allclose(out.double(), CAF(f=7)(x), atol=1e-4)
