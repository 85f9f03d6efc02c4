"""Simulated Byzantine attacks: formulas on hand-made inputs, dtypes, Baruch's z, line search, label flipping."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import trustfl
from trustfl.aggregate.base import AbstractAggregator, Mean
from trustfl.attacks import (ALittleIsEnough, FallOfEmpires, GaussianAttack, LabelFlip, Mimic, SignFlip, alie_ls,
                             baruch_z, flip_labels, foe_ls, line_maximize)
from trustfl.errors import ConfigError, DataError, MessageError
from trustfl.types import RoundContext, StageOut

H = torch.tensor([[1.0, -2.0, 0.0], [3.0, 0.0, 1.0], [5.0, 2.0, 5.0]])
MEAN = torch.tensor([3.0, 0.0, 2.0])
STD = torch.tensor([2.0, 2.0, math.sqrt(7.0)])  # ddof = 1 by hand: var = (4+0+4)/2, (4+0+4)/2, (4+1+9)/2
UPDATE_LEVEL = ["sign_flip", "foe", "alie", "mimic", "gaussian", "inf", "nan", "alie_ls", "foe_ls"]


def ctx(seed: int = 0, round: int = 0, n: int = 3) -> RoundContext:
    return RoundContext(round=round, seed=seed, client_ids=tuple(range(n)), num_clients=n)


@dataclass(frozen=True)
class CoordMedian(AbstractAggregator):
    """Test double: coordinate-wise median (lower middle for even n) that counts its calls."""

    calls: list = field(default_factory=list)

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        self.calls.append(1)
        return StageOut(x.median(dim=0).values, state)


# ---------------------------------------------------------------- formulas

def test_sign_flip_is_minus_mean() -> None:
    out = SignFlip().craft(H, 2, ctx())
    assert torch.equal(out, -MEAN.expand(2, 3))


def test_foe_default_tau_is_three() -> None:
    out = FallOfEmpires().craft(H, 2, ctx())
    assert torch.allclose(out, (-2.0 * MEAN).expand(2, 3))


def test_foe_equals_original_paper_minus_eps_mean() -> None:
    eps = 0.1  # Xie et al. send −ε·mean; τ = 1 + ε
    out = FallOfEmpires(tau=1.0 + eps).craft(H, 1, ctx())
    assert torch.allclose(out[0], -eps * MEAN)


def test_alie_explicit_z() -> None:
    out = ALittleIsEnough(z=1.5).craft(H, 3, ctx())
    assert out.shape == (3, 3)
    assert torch.allclose(out, (MEAN + 1.5 * STD).expand(3, 3))


@pytest.mark.parametrize("n,f,z", [(100, 5, 0.1004), (100, 10, 0.2275), (11, 1, 0.1142), (13, 3, 0.5024),
                                   (15, 5, 0.8416)])
def test_baruch_z_matches_spec(n: int, f: int, z: float) -> None:
    assert baruch_z(n, f) == pytest.approx(z, abs=5e-5)


def test_alie_default_z_is_baruch_with_n_equal_h_plus_f() -> None:
    honest = torch.randn(10, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    out = ALittleIsEnough().craft(honest, 5, ctx(n=10))  # n = 15, f = 5: z = 0.8416
    expected = honest.mean(0) + baruch_z(15, 5) * honest.std(0, correction=1)
    assert torch.allclose(out, expected.expand(5, 6))


def test_baruch_z_refuses_too_many_byzantine() -> None:
    with pytest.raises(ConfigError, match="pass `z` explicitly"):
        baruch_z(10, 6)


def test_mimic_configured_and_seeded() -> None:
    assert torch.equal(Mimic(index=2).craft(H, 2, ctx()), H[2].expand(2, 3))
    a = Mimic().craft(H, 1, ctx(seed=7))
    assert torch.equal(a, Mimic().craft(H, 1, ctx(seed=7)))
    assert any(torch.equal(a[0], row) for row in H)
    picked = {int((Mimic().craft(H, 1, ctx(seed=s))[0] == H).all(1).nonzero()) for s in range(30)}
    assert picked == {0, 1, 2}  # the seeded index covers every honest row
    with pytest.raises(ConfigError, match="index"):
        Mimic(index=3).craft(H, 1, ctx())


def test_gaussian_moments_and_determinism() -> None:
    honest = torch.zeros(3, 20_000)
    out = GaussianAttack(mu=0.5, sigma=2.0).craft(honest, 4, ctx(seed=3))
    n = out.numel()
    assert abs(float(out.mean()) - 0.5) < 3 * 2.0 / math.sqrt(n)
    assert abs(float(out.std()) - 2.0) < 3 * 2.0 / math.sqrt(2 * n)
    assert torch.equal(out, GaussianAttack(mu=0.5, sigma=2.0).craft(honest, 4, ctx(seed=3)))
    assert not torch.equal(out, GaussianAttack(mu=0.5, sigma=2.0).craft(honest, 4, ctx(seed=4)))
    assert not torch.equal(out[0], out[1])  # independent rows
    centred = GaussianAttack(sigma=0.0, around_honest_mean=True).craft(H, 2, ctx())
    assert torch.allclose(centred, MEAN.expand(2, 3))


def test_inf_and_nan() -> None:
    assert torch.isposinf(trustfl.build("attack", "inf").craft(H, 2, ctx())).all()
    assert torch.isnan(trustfl.build("attack", "nan").craft(H, 2, ctx())).all()


@pytest.mark.parametrize("name", UPDATE_LEVEL)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_every_update_attack_keeps_dtype_and_shape(name: str, dtype: torch.dtype) -> None:
    honest = torch.randn(6, 5, generator=torch.Generator().manual_seed(0)).to(dtype)
    attack = trustfl.build("attack", name)
    out = attack.craft(honest, 2, ctx(n=6), Mean())
    assert out.shape == (2, 5) and out.dtype == dtype
    assert attack.craft(honest, 0, ctx(n=6), Mean()).shape == (0, 5)


@pytest.mark.parametrize("name", UPDATE_LEVEL)
def test_every_update_attack_rejects_bad_input(name: str) -> None:
    attack = trustfl.build("attack", name)
    with pytest.raises(MessageError, match="2-D"):
        attack.craft(torch.zeros(3), 1, ctx(), Mean())
    with pytest.raises(ConfigError, match="num_byzantine"):
        attack.craft(H, -1, ctx(), Mean())
    with pytest.raises(ConfigError, match="update-level"):  # update-level attacks have no data form
        attack.poison(torch.zeros(2, 1), torch.zeros(2, dtype=torch.long), 10)


def test_config_errors() -> None:
    for bad in (lambda: FallOfEmpires(tau=float("nan")), lambda: ALittleIsEnough(z=float("inf")),
                lambda: Mimic(index=-1), lambda: GaussianAttack(sigma=-1.0)):
        with pytest.raises(ConfigError):
            bad()


# ---------------------------------------------------------------- label flipping

def test_flip_labels_is_nine_minus_y() -> None:
    y = torch.arange(10)
    assert torch.equal(flip_labels(y, 10), 9 - y)
    assert torch.equal(flip_labels(flip_labels(y, 10), 10), y)
    assert flip_labels(torch.tensor([0, 1], dtype=torch.int32), 2).dtype == torch.int32


def test_label_flip_is_data_level() -> None:
    attack = trustfl.build("attack", "label_flip")
    assert isinstance(attack, LabelFlip) and attack.data_level and not SignFlip.data_level
    x = torch.randn(3, 4)
    px, py = attack.poison(x, torch.tensor([0, 4, 9]), 10)
    assert px is x and py.tolist() == [9, 5, 0]
    assert torch.equal(attack.flip_labels(torch.tensor([2]), 3), torch.tensor([0]))
    with pytest.raises(ConfigError, match="data-level"):
        attack.craft(H, 1, ctx())
    with pytest.raises(DataError, match="labels must lie"):
        flip_labels(torch.tensor([10]), 10)
    with pytest.raises(DataError, match="integer"):
        flip_labels(torch.tensor([1.0]), 10)


# ---------------------------------------------------------------- line search

def test_line_maximize_budget_and_quality() -> None:
    for evals in (1, 2, 5, 16, 40):
        calls: list[float] = []

        def phi(t: float) -> float:
            calls.append(t)
            return -(t - 3.3) ** 2

        best, value, used = line_maximize(phi, evals=evals)
        assert used == evals == len(calls)
        assert all(t >= 0 for t in calls) and calls[0] == 0.0
        assert value == max(phi_t for phi_t in (-(t - 3.3) ** 2 for t in calls))
        if evals >= 16:
            assert abs(best - 3.3) < 0.3
    flat = line_maximize(lambda t: 1.0)
    assert flat[0] == 0.0  # ties keep the earlier point


def test_line_maximize_bad_parameters() -> None:
    for kwargs in ({"evals": 0}, {"start": -1.0}, {"delta": 0.0}, {"ratio": 0.5}, {"ratio": 1.0}):
        with pytest.raises(ConfigError):
            line_maximize(lambda t: t, **kwargs)


@pytest.mark.parametrize("factory", [alie_ls, foe_ls])
def test_line_search_beats_zero_factor_within_budget(factory) -> None:
    gen = torch.Generator().manual_seed(5)
    honest = torch.randn(12, 40, generator=gen, dtype=torch.float64) + 1.0
    agg = CoordMedian()
    attack = factory(evals=16)
    best, damage, used = attack.search(honest, 4, ctx(n=12), agg)
    assert used == 16 and len(agg.calls) == 16
    zero = torch.cat([honest, attack.vector(honest, 0.0).expand(4, -1)])
    damage0 = float(torch.linalg.vector_norm(zero.median(0).values - honest.mean(0)))
    assert best > 0 and damage > damage0
    out = attack.craft(honest, 4, ctx(n=12), agg)
    assert torch.allclose(out, attack.vector(honest, best).expand(4, -1))
    achieved = torch.linalg.vector_norm(torch.cat([honest, out]).median(0).values - honest.mean(0))
    assert float(achieved) == pytest.approx(damage)


def test_line_search_needs_an_aggregator() -> None:
    with pytest.raises(ConfigError, match="aggregator"):
        alie_ls().craft(H, 1, ctx())
    named = trustfl.build("attack", "foe_ls", aggregator="mean", evals=4)
    out = named.craft(H, 1, ctx())  # built from the registry at call time
    assert out.shape == (1, 3)
    with pytest.raises(ConfigError):
        foe_ls(ratio=2.0)
