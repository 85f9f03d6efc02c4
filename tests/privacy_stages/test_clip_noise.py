"""Clipping and Gaussian noise stages: norm bound, idempotence, noise moments, DP events, determinism."""
from __future__ import annotations

import math

import pytest
import torch
from dp_accounting.dp_event import GaussianDpEvent
from hypothesis import given, settings
from hypothesis import strategies as st

import trustfl
from trustfl.core.stage import chain
from trustfl.errors import ConfigError, PrivacyError
from trustfl.privacy.clip import ClipL2, clip_l2
from trustfl.privacy.noise import CentralGaussianNoise, GaussianNoise, central_gaussian_noise, gaussian_noise
from trustfl.types import RoundContext


def ctx(ids: tuple[int, ...], seed: int = 0, round: int = 0) -> RoundContext:
    return RoundContext(round=round, seed=seed, client_ids=ids, num_clients=max(ids, default=0) + 1)


# ---------------------------------------------------------------- clipping

@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), scale=st.floats(1e-3, 1e3), c=st.floats(1e-2, 1e2),
       dtype=st.sampled_from([torch.float32, torch.float64]))
def test_clip_bounds_norms_and_is_idempotent(seed: int, scale: float, c: float, dtype: torch.dtype) -> None:
    x = scale * torch.randn(7, 13, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    stage = clip_l2(c)
    once = stage.apply(x, None, ctx(tuple(range(7)))).x
    twice = stage.apply(once, None, ctx(tuple(range(7)))).x
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    assert once.dtype == dtype
    assert bool((torch.linalg.vector_norm(once.double(), dim=1) <= c).all())  # never past C, rounding included
    # a second pass rescales a clipped row by at most 1e-6/C (the guard in the factor), so it is a no-op
    # up to that and to rounding
    assert torch.allclose(twice, once, rtol=1e-6 / c + 4 * tol, atol=0.0)


def test_clip_factor_and_metrics() -> None:
    x = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [6.0, 8.0]], dtype=torch.float64)
    out = clip_l2(1.0).apply(x, None, ctx((0, 1, 2, 3)))
    assert torch.equal(out.x[1], x[1]) and torch.equal(out.x[2], x[2])  # inside the ball: unchanged
    assert torch.allclose(out.x[0], x[0] / (5.0 + 1e-6)) and torch.allclose(out.x[3], x[3] / (10.0 + 1e-6))
    assert out.metrics == {"fraction_clipped": 0.5, "mean_norm": pytest.approx((5.0 + 0.5 + 0.0 + 10.0) / 4)}
    assert out.events == ()


@pytest.mark.parametrize("dtype, value", [(torch.float32, 1e37), (torch.float64, 1e306)])
def test_a_finite_row_whose_norm_overflows_is_clipped_not_zeroed(dtype, value) -> None:
    """Its norm in ``dtype`` is inf, so the factor C/inf zeroed the row: safe, but not the clip of Eq. 1."""
    x = torch.stack([torch.full((1000,), value, dtype=dtype), torch.tensor([3.0, 4.0] + [0.0] * 998, dtype=dtype)])
    assert torch.isinf(torch.linalg.vector_norm(x[0]))  # the case: a finite row beyond the dtype's norm
    out = clip_l2(2.0).apply(x, None, ctx((0, 1)))
    norms = torch.linalg.vector_norm(out.x.double(), dim=1)
    assert out.x.dtype == dtype and torch.allclose(norms, torch.tensor([2.0, 2.0], dtype=torch.float64), rtol=1e-6)
    assert torch.allclose(out.x[0], out.x[0, :1].expand(1000)) and bool((out.x[0] > 0).all())  # the direction kept
    factor = torch.tensor(2.0 / (5.0 + 1e-6) * (1 - 2 * torch.finfo(dtype).eps), dtype=torch.float64).to(dtype)
    assert torch.equal(out.x[1], x[1] * factor)  # an ordinary row: bit for bit the plain clip (its margin included)
    expected = (value * math.sqrt(1000) + 5.0) / 2
    assert out.metrics["fraction_clipped"] == 1.0 and out.metrics["mean_norm"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("d", [1000, 431_080])
def test_clipped_rows_never_pass_c_on_long_rows_or_in_any_dtype(d, dtype) -> None:
    # float32's vector_norm of a 431,080-entry row is 4.6e-6 low: every clipped row exceeded C by that much; and
    # rounding the product to the dtype took about half the rows of 1,000 entries past C (bfloat16: by 0.5%)
    rows = 4 if d > 1000 else 200
    x = (5 * torch.randn(rows, d, generator=torch.Generator().manual_seed(d))).to(dtype)
    out = clip_l2(1.0).apply(x, None, ctx(tuple(range(rows)))).x
    norms = torch.linalg.vector_norm(out.double(), dim=1)
    assert out.dtype == dtype and bool((norms <= 1.0).all())
    assert bool((norms >= 1.0 - 6 * torch.finfo(dtype).eps - 1e-6).all())  # to C, not far below (1e-6: the guard)


def test_clip_validation() -> None:
    assert isinstance(trustfl.build("client_stage", "clip_l2", max_norm=2.0), ClipL2)
    for bad in (0.0, -1.0, float("inf"), True):
        with pytest.raises(ConfigError, match="max_norm"):
            clip_l2(bad)
    with pytest.raises(PrivacyError):
        clip_l2(1.0).apply(torch.zeros(3), None, ctx((0,)))


# ---------------------------------------------------------------- local Gaussian noise

def test_local_noise_std_within_three_standard_errors() -> None:
    m, d, z, c = 4, 50_000, 1.3, 0.5
    out = gaussian_noise(noise_multiplier=z, sensitivity=c).apply(torch.zeros(m, d, dtype=torch.float64), None,
                                                                  ctx((2, 3, 5, 8), seed=9))
    target, n = z * c, m * d
    assert out.metrics["std"] == pytest.approx(target)
    assert abs(float(out.x.std()) - target) < 3 * target / math.sqrt(2 * n)  # SE of a sample std: σ/√(2N)
    assert abs(float(out.x.mean())) < 3 * target / math.sqrt(n)
    for row in out.x:  # each client's row has the target std too
        assert abs(float(row.std()) - target) < 3 * target / math.sqrt(2 * d)


def test_local_noise_events_per_client() -> None:
    out = gaussian_noise(std=3.0, sensitivity=2.0).apply(torch.zeros(3, 5), None, ctx((7, 1, 4)))
    assert [c for c, _ in out.events] == [7, 1, 4]
    assert all(isinstance(e, GaussianDpEvent) and e.noise_multiplier == pytest.approx(1.5) for _, e in out.events)
    silent = gaussian_noise(std=3.0).apply(torch.zeros(3, 5), None, ctx((7, 1, 4)))
    assert silent.events == ()  # no sensitivity: not accounted as a DP mechanism


def test_local_noise_rows_come_from_their_own_client_only(draw_threads) -> None:
    stage = gaussian_noise(std=1.0)
    full = stage.apply(torch.zeros(3, 20), None, ctx((0, 4, 9), seed=5)).x
    alone = stage.apply(torch.zeros(1, 20), None, ctx((4,), seed=5)).x
    assert torch.equal(full[1], alone[0])
    other_stream = gaussian_noise(std=1.0, stream="second").apply(torch.zeros(3, 20), None, ctx((0, 4, 9), seed=5))
    assert not torch.equal(full, other_stream.x)


def test_local_noise_is_deterministic_per_seed(device) -> None:
    stage = gaussian_noise(std=0.5)
    x = torch.ones(2, 10, dtype=torch.float32, device=device)
    a = stage.apply(x, None, ctx((0, 1), seed=1, round=2)).x
    assert a.dtype == torch.float32 and a.device == x.device
    assert torch.equal(a, stage.apply(x, None, ctx((0, 1), seed=1, round=2)).x)
    assert not torch.equal(a, stage.apply(x, None, ctx((0, 1), seed=2, round=2)).x)
    assert not torch.equal(a, stage.apply(x, None, ctx((0, 1), seed=1, round=3)).x)


def test_local_noise_validation() -> None:
    assert isinstance(trustfl.build("client_stage", "gaussian_noise", std=1.0), GaussianNoise)
    for kwargs in ({}, {"std": 1.0, "noise_multiplier": 1.0, "sensitivity": 1.0}, {"noise_multiplier": 1.0},
                   {"std": -1.0}, {"std": 1.0, "sensitivity": 0.0}, {"std": float("nan")}):
        with pytest.raises(ConfigError):
            gaussian_noise(**kwargs)
    with pytest.raises(PrivacyError, match="name each"):
        gaussian_noise(std=1.0).apply(torch.zeros(2, 3), None, ctx((0,)))


def test_clip_then_noise_chain() -> None:
    pipeline = chain(("clip", clip_l2(1.0)), ("noise", gaussian_noise(noise_multiplier=0.8, sensitivity=1.0)))
    out = pipeline.apply(10 * torch.ones(2, 4), pipeline.init(None), ctx((0, 1)))
    assert out.metrics["clip/fraction_clipped"] == 1.0 and out.metrics["noise/std"] == pytest.approx(0.8)
    assert [(c, e.noise_multiplier) for c, e in out.events] == [(0, 0.8), (1, 0.8)]


# ---------------------------------------------------------------- central Gaussian noise

def test_central_noise_std_is_z_c_over_m() -> None:
    z, c, ids, d = 1.1, 2.0, (0, 3, 4, 6, 9), 200_000
    out = central_gaussian_noise(z, c).apply(torch.zeros(d, dtype=torch.float64), None, ctx(ids, seed=3))
    target = z * c / len(ids)
    assert out.metrics["std"] == pytest.approx(target) and out.metrics["sum_std"] == pytest.approx(z * c)
    assert abs(float(out.x.std()) - target) < 3 * target / math.sqrt(2 * d)
    assert [cid for cid, _ in out.events] == list(ids)
    assert all(isinstance(e, GaussianDpEvent) and e.noise_multiplier == pytest.approx(z) for _, e in out.events)


def test_central_noise_on_the_mean_equals_dp_fedavg_on_the_sum() -> None:
    """Noise std z·C on the sum of m clipped updates, then ÷ m, is the stage applied to the mean."""
    z, c, m = 0.9, 1.5, 4
    clipped = clip_l2(c).apply(torch.randn(m, 30_000, generator=torch.Generator().manual_seed(0),
                                           dtype=torch.float64) * 10, None, ctx(tuple(range(m)))).x
    mean = clipped.sum(0) / m
    out = central_gaussian_noise(z, c).apply(mean, None, ctx(tuple(range(m)), seed=1))
    implied_sum_noise = (out.x - mean) * m
    assert abs(float(implied_sum_noise.std()) - z * c) < 3 * z * c / math.sqrt(2 * 30_000)


def test_central_noise_determinism_and_validation() -> None:
    stage = trustfl.build("server_stage", "central_gaussian_noise", noise_multiplier=1.0, clip_norm=1.0)
    assert isinstance(stage, CentralGaussianNoise)
    a = stage.apply(torch.zeros(50), None, ctx((0, 1), seed=4)).x
    assert a.dtype == torch.float32
    assert torch.equal(a, stage.apply(torch.zeros(50), None, ctx((0, 1), seed=4)).x)
    assert not torch.equal(a, stage.apply(torch.zeros(50), None, ctx((0, 1), seed=5)).x)
    with pytest.raises(PrivacyError, match=r"\(d,\) aggregate"):
        stage.apply(torch.zeros(2, 50), None, ctx((0, 1)))
    with pytest.raises(PrivacyError, match="client_ids"):
        stage.apply(torch.zeros(50), None, RoundContext(0, 0, ()))
    for args in ((-1.0, 1.0), (1.0, 0.0)):
        with pytest.raises(ConfigError):
            central_gaussian_noise(*args)
