"""Perturbation directions (DPZV §2.4, eq. 3): norms, in-place perturb/restore, regeneration, and the two-point
estimator's unbiasedness for the smoothed objective."""
import math

import pytest
import torch

from trustfl.vertical import directions
from trustfl.vertical.directions import add_direction, direction, direction_scale, row_directions


@pytest.mark.parametrize("kind, radius", [("sphere", lambda d: math.sqrt(d)), ("unit_sphere", lambda d: 1.0)])
def test_sphere_directions_have_the_stated_norm(kind, radius):
    for d in (1, 7, 1000):
        u = direction(d, seed=d, kind=kind)
        assert u.norm().item() == pytest.approx(radius(d), rel=1e-5)


def test_gaussian_directions_are_unscaled_draws():
    u = direction(50_000, seed=3, kind="gaussian")
    assert u.pow(2).mean().item() == pytest.approx(1.0, abs=0.02)
    assert direction_scale(torch.zeros(4), 3, "gaussian").item() == 1.0


def test_regeneration_is_deterministic_and_seeded():
    assert torch.equal(direction(300, 5, "sphere"), direction(300, 5, "sphere"))
    assert not torch.equal(direction(300, 5, "sphere"), direction(300, 6, "sphere"))


def test_chunked_generation_equals_one_chunk(monkeypatch):
    whole = direction(1000, 9, "sphere")
    monkeypatch.setattr(directions, "CHUNK", 64)  # 16 chunks, the last one short
    chunked = direction(1000, 9, "sphere")
    assert chunked.norm().item() == pytest.approx(math.sqrt(1000), rel=1e-5)
    # different chunking draws the same stream in the same order: the same vector
    assert torch.allclose(whole, chunked)


def test_in_place_perturb_and_restore_returns_the_parameters():
    w = torch.randn(5000, generator=torch.Generator().manual_seed(0))
    before = w.clone()
    scale = direction_scale(w, 11, "sphere")
    lam = 1e-3
    add_direction(w, 11, lam * scale)
    assert not torch.equal(w, before)
    moved = (w - before).norm().item()
    assert moved == pytest.approx(lam * math.sqrt(5000), rel=1e-3)
    add_direction(w, 11, -2 * lam * scale)
    add_direction(w, 11, lam * scale)
    assert torch.allclose(w, before, atol=1e-6)


def test_row_directions_are_unit_rows():
    v = row_directions(6, 4, torch.Generator().manual_seed(0), "cpu")
    assert torch.allclose(v.norm(dim=1), torch.ones(6))


@pytest.mark.parametrize("difference, factor", [("two_lambda", 1.0), ("lambda", 2.0)])
def test_two_point_estimator_is_unbiased_for_a_quadratic(difference, factor):
    """For f(w) = ½wᵀAw + bᵀw the smoothed objective's gradient is ∇f(w) itself, and with u uniform on the sphere
    of radius √d, E[(f(w+λu) − f(w−λu))/(2λ)·u] = E[uuᵀ]∇f = ∇f. Eq. 7 divides by λ: twice that."""
    d, lam, draws = 6, 1e-2, 20_000
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(d, d, generator=gen, dtype=torch.float64)
    a, b, w = q @ q.T / d, torch.randn(d, generator=gen, dtype=torch.float64), torch.randn(d, generator=gen,
                                                                                          dtype=torch.float64)
    grad = a @ w + b
    u = torch.stack([direction(d, seed, "sphere", dtype=torch.float64) for seed in range(draws)])

    def f(x):
        return 0.5 * ((x @ a) * x).sum(-1) + x @ b

    divisor = 2 * lam if difference == "two_lambda" else lam
    estimates = ((f(w + lam * u) - f(w - lam * u)) / divisor)[:, None] * u
    mean, sem = estimates.mean(0), estimates.std(0) / math.sqrt(draws)
    z = (mean - factor * grad) / sem
    assert z.abs().max().item() < 4.5, z  # every coordinate within 4.5 standard errors
    assert (mean - factor * grad).norm() < 0.05 * factor * grad.norm()
