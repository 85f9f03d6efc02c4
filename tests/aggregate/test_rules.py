"""Robust aggregation rules: hand-computed cases (ties, outliers), f-vs-n errors, validation, bounded behaviour."""
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import trustfl
from trustfl.aggregate.base import Mean
from trustfl.aggregate.centered_clipping import CenteredClipping
from trustfl.aggregate.coordinate import CoordinateWiseMedian, CoordinateWiseTrimmedMean, Meamed
from trustfl.aggregate.geometric import GeometricMedian, gram_matrix, squared_distances
from trustfl.aggregate.krum import Krum, MultiKrum, krum_scores
from trustfl.aggregate.mda import MinimumDiameterAveraging
from trustfl.errors import ConfigError, MessageError
from trustfl.types import ParamLayout, RoundContext


def col(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)[:, None]


def ctx(n: int, weights=None, seed: int = 0) -> RoundContext:
    return RoundContext(round=0, seed=seed, client_ids=tuple(range(n)), weights=weights, num_clients=n)


# ----------------------------------------------------------------------------------------------- hand cases
def test_cwtm_hand_cases():
    assert CoordinateWiseTrimmedMean(f=1)(col(0, 1, 2, 100)).item() == 1.5
    # ties at both trimmed ends: equal values need no rule
    assert CoordinateWiseTrimmedMean(f=1)(col(1, 1, 1, 5, -5)).item() == 1.0
    x = torch.tensor([[0.0, 10.0], [1.0, -3.0], [2.0, 4.0], [3.0, 4.0], [1e9, -1e9]], dtype=torch.float64)
    assert CoordinateWiseTrimmedMean(f=0)(x).tolist() == x.mean(0).tolist()


def test_cwtm_column_values():
    x = torch.tensor([[0.0, 10.0], [1.0, -3.0], [2.0, 4.0], [3.0, 5.0], [1e9, -1e9]])
    # column 1 sorted: −1e9, −3, 4, 5, 10 → trim one each side → (−3 + 4 + 5)/3 = 2
    assert CoordinateWiseTrimmedMean(f=1)(x).tolist() == [2.0, 2.0]


def test_cwmed_odd_even_and_ties():
    assert CoordinateWiseMedian()(col(5, 1, 3)).item() == 3.0
    assert CoordinateWiseMedian()(col(5, 1, 3, 100)).item() == 4.0  # mean of the two middle values
    assert CoordinateWiseMedian()(col(2, 2, 2, 7)).item() == 2.0
    assert CoordinateWiseMedian()(col(7.0)).item() == 7.0


def test_meamed_hand_case_and_boundary_tie():
    # median 2, distances 2,1,1,98 → keep 0,1,3
    assert Meamed(f=1)(col(0, 1, 3, 100)).item() == pytest.approx(4 / 3)
    # median 4: keep 4 (d=0), 3 and 5 (d=1); one slot left for 2 and 6 (both at d=2) → shared: (12 + 4)/4
    x = col(1, 2, 3, 4, 5, 6, 100)
    assert Meamed(f=3)(x).item() == pytest.approx(4.0)
    assert Meamed(f=3)(x.flip(0)).item() == pytest.approx(4.0)


def test_meamed_trims_inf_without_nan():
    x = col(0, 1, 2, float("inf"))
    out = Meamed(f=1).apply(x, None, ctx(4)).x  # apply trusts the engine's screening; the direct call checks
    assert out.item() == pytest.approx(1.0)
    with pytest.raises(MessageError, match=r"aggregator 'meamed': rows \[3\] are not finite"):
        Meamed(f=1)(x)


def test_geometric_median_one_dimension_is_the_median():
    agg = GeometricMedian(tol=1e-12)
    out = agg.apply(col(0, 1, 10), None, ctx(3))
    assert out.x.item() == pytest.approx(1.0, abs=1e-5)
    assert out.metrics["iterations"] > 3  # runs to the tolerance, not a fixed 3 steps
    assert out.metrics["converged"] == 1.0


def test_geometric_median_fermat_point_of_triangle():
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.5, math.sqrt(3) / 2]], dtype=torch.float64)
    out = GeometricMedian(tol=1e-12)(x)  # all angles < 120°: the Fermat point is the centroid here
    assert torch.allclose(out, x.mean(0), atol=1e-7)


def test_geometric_median_weighted_majority_point():
    out = GeometricMedian(tol=1e-12)(col(0, 1, 10), torch.tensor([1.0, 1.0, 10.0]))
    assert out.item() == pytest.approx(10.0, abs=1e-4)


def test_geometric_median_robust_to_outlier():
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1e6, 1e6]], dtype=torch.float64)
    out = GeometricMedian(tol=1e-12)(x)
    assert float((out - torch.tensor([0.5, 0.5], dtype=torch.float64)).norm()) < 0.5


def test_krum_scores_hand_computed():
    x = col(0, 1, 1.5, 2, 50)
    # n − f − 2 = 2 nearest neighbours (original Krum), squared distances
    expected = [1 + 2.25, 0.25 + 1, 0.25 + 0.25, 0.25 + 1, 48 ** 2 + 48.5 ** 2]
    assert krum_scores(x, 1)[0].tolist() == pytest.approx(expected)
    assert Krum(f=1)(x).item() == 1.5
    assert MultiKrum(f=1)(x).item() == pytest.approx((0 + 1 + 1.5 + 2) / 4)
    assert MultiKrum(f=1, m=3)(x).item() == pytest.approx((1 + 1.5 + 2) / 3)


def test_krum_ties_are_averaged_so_order_does_not_matter():
    x = col(-1, 1, -1, 1)  # every score is 0 + 4: all tied
    assert Krum(f=0)(x).item() == 0.0
    # Multi-Krum with m = 3: scores 1→(0,4)... here with a far point so that two messages tie at the boundary
    y = col(-1, 1, 0, 30, 31)
    s, _ = krum_scores(y, 1)  # 2 neighbours: −1: 1+4, 1: 1+4, 0: 1+1, 30: 1+29², 31: 1+30²
    assert s.tolist() == pytest.approx([5, 5, 2, 842, 901])
    assert MultiKrum(f=1, m=2)(y).item() == pytest.approx(0.0)  # 0 plus half of −1 and half of 1
    assert MultiKrum(f=1, m=2)(y.flip(0)).item() == pytest.approx(0.0)


def test_mda_hand_case_and_ties():
    assert MinimumDiameterAveraging(f=1)(col(0, 1, 2, 10)).item() == pytest.approx(1.0)
    # {0,1} and {1,2} both have diameter 1: their means 0.5 and 1.5 are averaged
    out = MinimumDiameterAveraging(f=1).apply(col(0, 1, 2), None, ctx(3))
    assert out.x.item() == pytest.approx(1.0)
    assert out.metrics["diameter"] == pytest.approx(1.0)
    assert out.metrics["subsets"] == 3.0


def test_mda_matches_brute_force():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(9, 4, generator=gen, dtype=torch.float64)
    x[:2] += 5
    scored = []
    for subset in itertools.combinations(range(9), 6):
        pts = x[list(subset)]
        scored.append((float(torch.cdist(pts, pts).max()), pts.mean(0)))
    best = min(d for d, _ in scored)
    winners = [m for d, m in scored if d <= best + 1e-12]
    assert len(winners) == 2  # this draw has two optimal subsets (the diameter pair survives both removals)
    assert torch.allclose(MinimumDiameterAveraging(f=3)(x), torch.stack(winners).mean(0), atol=1e-12)


def test_mda_refuses_when_subset_count_is_out_of_reach():
    with pytest.raises(ConfigError, match=r"f=10 and n=100.*max_subsets"):
        MinimumDiameterAveraging(f=10)(torch.zeros(100, 2))
    assert MinimumDiameterAveraging(f=2, max_subsets=45)(torch.zeros(10, 2)).tolist() == [0.0, 0.0]


def test_centered_clipping_hand_case_and_explicit_state():
    cc = CenteredClipping(tau=1.0)
    x = torch.tensor([[0.5, 0.0], [100.0, 0.0]], dtype=torch.float64)
    state = cc.init(ParamLayout(("x",), ((2,),)))
    assert state == {"center": None}
    out1 = cc.apply(x, state, ctx(2))
    assert out1.x.tolist() == [0.75, 0.0]  # (0.5 + clip(100 → 1)) / 2
    assert out1.metrics["clipped"] == 1.0
    out2 = cc.apply(x, out1.state, ctx(2))  # from v = 0.75: x1 − v = −0.25 (kept), x2 − v clipped to 1
    assert out2.x.tolist() == pytest.approx([0.75 + (-0.25 + 1.0) / 2, 0.0])
    assert state == {"center": None}  # the input state is not modified
    # same instance, fresh state: same first result (nothing lives on the object)
    assert cc.apply(x, cc.init(ParamLayout(("x",), ((2,),))), ctx(2)).x.tolist() == [0.75, 0.0]


def test_centered_clipping_float32_rows_whose_square_overflows():
    x = torch.tensor([[0.5, 0.0], [3e30, 4e30]])
    out = CenteredClipping(tau=1.0)(x)
    assert out.tolist() == pytest.approx([(0.5 + 0.6) / 2, 0.8 / 2])


def test_centered_clipping_weights_and_iterations():
    x = torch.tensor([[1.0], [3.0]], dtype=torch.float64)
    out = CenteredClipping(tau=100.0)(x, torch.tensor([3.0, 1.0]))
    assert out.item() == pytest.approx(1.5)  # no clipping: the weighted mean
    many = CenteredClipping(tau=0.5, iterations=200)(col(0, 1, 2))
    assert many.item() == pytest.approx(1.0, abs=1e-6)  # fixed point of the clipped mean


# ----------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("make,n,f", [
    (lambda f: CoordinateWiseTrimmedMean(f=f), 4, 2),
    (lambda f: Meamed(f=f), 6, 3),
    (lambda f: Krum(f=f), 6, 2),
    (lambda f: MultiKrum(f=f), 4, 1),
    (lambda f: MinimumDiameterAveraging(f=f), 4, 2),
    (lambda f: trustfl.build("aggregator", "caf", f=f), 5, 3),
])
def test_f_too_large_names_f_and_n(make, n, f):
    with pytest.raises(ConfigError) as info:
        make(f)(torch.randn(n, 3))
    assert isinstance(info.value, ValueError)
    assert f"f={f}" in str(info.value) and f"n={n}" in str(info.value)


@pytest.mark.parametrize("name,params,field", [
    ("cwtm", {"f": -1}, "f"), ("meamed", {"f": 1.5}, "f"), ("krum", {"f": True}, "f"),
    ("multi_krum", {"f": 1, "m": 0}, "m"), ("mda", {"f": 1, "max_subsets": 0}, "max_subsets"),
    ("geometric_median", {"nu": 0.0}, "nu"), ("geometric_median", {"max_iter": 0}, "max_iter"),
    ("geometric_median", {"tol": -1.0}, "tol"), ("centered_clipping", {"tau": 0.0}, "tau"),
    ("centered_clipping", {"tau": 1.0, "iterations": 0}, "iterations"), ("caf", {"f": 1, "method": "svd"}, "method"),
    ("caf", {"f": 1, "max_iter": 0}, "max_iter"), ("caf", {"f": 1, "power_iters": 0}, "power_iters"),
])
def test_invalid_parameters_name_the_field(name, params, field):
    with pytest.raises(ConfigError, match=f"`{field}`"):
        trustfl.build("aggregator", name, **params)


def test_multi_krum_m_larger_than_n():
    with pytest.raises(ConfigError, match="`m`=9.*n=5"):
        MultiKrum(f=1, m=9)(torch.randn(5, 2))


def test_centered_clipping_state_of_wrong_size():
    with pytest.raises(ConfigError, match="d=3"):
        CenteredClipping(tau=1.0).apply(torch.randn(4, 3), {"center": torch.zeros(5)}, ctx(4))


# ----------------------------------------------------------------------------------------------- degenerate
DEGENERATE = [CoordinateWiseTrimmedMean(f=0), CoordinateWiseMedian(), Meamed(f=0), GeometricMedian(), Krum(f=0),
              MultiKrum(f=0), MinimumDiameterAveraging(f=0), CenteredClipping(tau=1e9)]


@pytest.mark.parametrize("agg", DEGENERATE + [CoordinateWiseTrimmedMean(f=2), Meamed(f=2), Krum(f=1),
                                              MultiKrum(f=1), MinimumDiameterAveraging(f=2)], ids=repr)
def test_all_rows_equal_give_that_row(agg):
    x = torch.tensor([[1.5, -2.0, 3.0]]).repeat(7, 1)
    out = agg(x)
    assert out.dtype == x.dtype
    assert torch.allclose(out, x[0])


@pytest.mark.parametrize("agg", DEGENERATE, ids=repr)
def test_single_message_with_f_zero(agg):
    x = torch.tensor([[1.5, -2.0, 3.0]], dtype=torch.float64)
    assert torch.allclose(agg(x), x[0])


@pytest.mark.parametrize("agg", [CoordinateWiseTrimmedMean(f=0), Meamed(f=0), MultiKrum(f=0, m=6),
                                 MinimumDiameterAveraging(f=0)], ids=repr)
def test_f_zero_gives_the_mean(agg):
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.allclose(agg(x), Mean()(x))


def centre(k: torch.Tensor) -> torch.Tensor:
    p = torch.eye(k.shape[0], dtype=k.dtype) - 1.0 / k.shape[0]
    return p @ k @ p


@pytest.mark.parametrize("offset", [0.0, 100.0])
def test_gram_helpers_match_cdist(offset):
    x = torch.randn(7, 1000, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + offset
    gram, proj, tol = gram_matrix(x, torch.ones(1000, dtype=torch.float64))
    xc = x - x.mean(0)
    assert torch.allclose(centre(gram), xc @ xc.T, rtol=1e-12, atol=1e-9)  # K is XXᵀ up to the centre
    assert torch.allclose(proj - proj.mean(), xc.sum(1), atol=1e-9)
    assert torch.allclose(squared_distances(gram), torch.cdist(x, x) ** 2, atol=1e-8)
    assert 0 < tol < 1e-9 * float(gram.diagonal().max())
    # float32 messages: float32 products accumulated in float64, ≈1e-6 relative error on the distances
    g32 = gram_matrix(x.float())
    assert torch.allclose(squared_distances(g32.matrix), torch.cdist(x, x) ** 2, rtol=1e-5)
    assert g32.tolerance > tol


@pytest.mark.parametrize("dtype,offset,rtol", [(torch.float32, 1e6, 1e-5), (torch.float64, 1e9, 1e-9)])
def test_gram_recentres_when_huge_outliers_drag_the_mean(dtype, offset, rtol):
    gen = torch.Generator().manual_seed(2)
    honest = torch.randn(8, 500, generator=gen, dtype=torch.float64)
    x = torch.cat([torch.full((3, 500), offset, dtype=torch.float64), honest]).to(dtype)
    dist = squared_distances(gram_matrix(x).matrix)[3:, 3:]
    exact = torch.cdist(x[3:].double(), x[3:].double()) ** 2
    # centred at the mean row (≈ 0.27·offset away from every honest row) these would be lost to rounding
    assert torch.allclose(dist, exact, rtol=rtol, atol=0)


# ----------------------------------------------------------------------------------------------- bounded under attack
def _attacked(seed: int, n: int, f: int, d: int, scale: float, same: bool):
    gen = torch.Generator().manual_seed(seed)
    honest = torch.rand(n - f, d, generator=gen, dtype=torch.float64) * 2 - 1
    if same:  # omniscient attackers all send one vector
        byz = (torch.randn(1, d, generator=gen, dtype=torch.float64) * scale).repeat(f, 1)
    else:
        byz = torch.randn(f, d, generator=gen, dtype=torch.float64) * scale
    x = torch.cat([byz, honest])
    return x[torch.randperm(n, generator=gen)], honest


attack = dict(seed=st.integers(0, 2**31), n=st.integers(5, 11), d=st.integers(1, 5),
              scale=st.sampled_from([1e3, 1e5, 1e6]), same=st.booleans())


@settings(max_examples=40, deadline=None)
@given(**attack)
def test_coordinate_rules_stay_inside_the_honest_range(seed, n, d, scale, same):
    f = (n - 1) // 2
    x, honest = _attacked(seed, n, f, d, scale, same)
    lo, hi = honest.min(0).values, honest.max(0).values
    for agg in (CoordinateWiseTrimmedMean(f=f), CoordinateWiseMedian()):
        out = agg(x)
        assert bool(((out >= lo - 1e-12) & (out <= hi + 1e-12)).all())
    width = hi - lo  # Meamed may keep attackers as close to the median as the farthest kept honest value
    out = Meamed(f=f)(x)
    assert bool(((out >= lo - width - 1e-12) & (out <= hi + width + 1e-12)).all())


@settings(max_examples=40, deadline=None)
@given(**attack)
def test_distance_rules_stay_near_the_honest_mean(seed, n, d, scale, same):
    f = (n - 3) // 2
    x, honest = _attacked(seed, n, f, d, scale, same)
    radius = float((honest - honest.mean(0)).norm(dim=1).max())
    kappa = (6 * f / (n - f)) * (1 + f / (n - 2 * f)) ** 2
    bounds = [  # far attackers are never selected: the output lies in the honest hull
        (Krum(f=f), radius), (MultiKrum(f=f), radius), (MinimumDiameterAveraging(f=f), radius),
        # breakdown-point bound of the geometric median (Minsker 2015, Lemma 2.1 with α = f/n)
        (GeometricMedian(), 2 * (n - f) / (n - 2 * f) * radius),
        # Prop. 4.1 with λ_max(Σ_S) ≤ radius²
        (trustfl.build("aggregator", "caf", f=f), math.sqrt(kappa) * radius),
    ]
    for agg, bound in bounds:
        err = float((agg(x) - honest.mean(0)).norm())
        assert err <= bound + 1e-6, (agg, err, bound)
    # centered clipping from 0: every step moves by at most τ
    assert float(CenteredClipping(tau=2.0)(x).norm()) <= 2.0 + 1e-12
