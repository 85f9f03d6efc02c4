"""Pre-aggregators (NNM, bucketing, static clipping, ARC) with test-double inner rules, and PreAggregated ordering."""
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trustfl.aggregate.base import AbstractAggregator, Mean, PreAggregated
from trustfl.aggregate.coordinate import CoordinateWiseTrimmedMean
from trustfl.aggregate.pre import ARC, NNM, Bucketing, StaticClip
from trustfl.errors import ConfigError
from trustfl.types import ParamLayout, RoundContext, StageOut


def ctx(n: int, seed: int = 0, round_: int = 0, weights=None) -> RoundContext:
    return RoundContext(round=round_, seed=seed, client_ids=tuple(range(n)), weights=weights, num_clients=n)


@dataclass(frozen=True)
class RowsSeen(AbstractAggregator):
    """Test double: the plain sum of what it receives, reporting the row count and whether weights survived."""

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        return StageOut(x.sum(dim=0), state, {"rows": float(x.shape[0]), "weighted": float(ctx.weights is not None)})


def run(stage, x, **kw):
    return stage.apply(x, stage.init(ParamLayout(("x",), ((x.shape[1],),))), ctx(x.shape[0], **kw))


# ----------------------------------------------------------------------------------------------- NNM
def test_nnm_hand_cases():
    assert NNM(f=1)(torch.tensor([[0.0], [1.0], [10.0]])).tolist() == [[0.5], [0.5], [5.5]]
    # row 0 (value 0) is equally far from 1 and −1: they share its last neighbour slot
    out = NNM(f=1)(torch.tensor([[0.0], [1.0], [-1.0]], dtype=torch.float64))
    assert out.squeeze(1).tolist() == pytest.approx([0.0, 0.5, -0.5])


def test_nnm_f_zero_mixes_everything_and_is_equivariant():
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.allclose(NNM(f=0)(x), x.mean(0).expand(6, 3))
    perm = torch.tensor([3, 1, 5, 0, 2, 4])
    assert torch.allclose(NNM(f=2)(x[perm]), NNM(f=2)(x)[perm])


def test_nnm_mixing_then_rule():
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [100.0]], dtype=torch.float64)
    mixed = NNM(f=1)(x)  # each row: mean of its 4 nearest (itself included)
    assert mixed.squeeze(1).tolist() == pytest.approx([1.5, 1.5, 1.5, 1.5, 26.5])
    out = PreAggregated((NNM(f=1),), CoordinateWiseTrimmedMean(f=1))(x)
    assert out.item() == pytest.approx(1.5)


def test_nnm_needs_n_greater_than_f():
    with pytest.raises(ConfigError, match=r"f=3 and n=3"):
        NNM(f=3)(torch.randn(3, 2))


# ----------------------------------------------------------------------------------------------- bucketing
def members(out: torch.Tensor) -> list[list[int]]:
    return [sorted(torch.nonzero(row).squeeze(1).tolist()) for row in out]


@pytest.mark.parametrize("n,s", [(8, 2), (9, 2), (10, 3), (5, 5), (4, 7)])
def test_bucketing_partitions_the_messages(n, s):
    eye = torch.eye(n, dtype=torch.float64)  # bucket means of one-hot rows reveal the buckets
    out = Bucketing(bucket_size=s)(eye)
    groups = members(out)
    assert out.shape == (-(-n // s), n)
    assert sorted(i for g in groups for i in g) == list(range(n))
    assert all(len(g) == s for g in groups[:-1]) and 1 <= len(groups[-1]) <= s
    for row, g in zip(out, groups):
        assert row[g].tolist() == pytest.approx([1 / len(g)] * len(g))


def test_bucketing_is_seeded_and_order_free():
    x = torch.randn(12, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    agg = Bucketing(bucket_size=3)
    a = run(agg, x, seed=5).x
    assert torch.equal(a, run(agg, x, seed=5).x)  # deterministic for a seed
    assert not torch.allclose(a, run(agg, x, seed=5, round_=1).x)  # a new shuffle every round
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(run(agg, x[perm], seed=5).x, a)  # depends on the set of messages, not the order
    assert torch.allclose(a.mean(0), x.mean(0))  # equal buckets: the mean of bucket means is the mean


def test_bucketing_size_one_is_the_identity():
    x = torch.randn(5, 2)
    assert run(Bucketing(bucket_size=1), x).x is x


# ----------------------------------------------------------------------------------------------- clipping
@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 8), d=st.integers(1, 6),
       scale=st.sampled_from([1e-3, 1.0, 1e3, 1e20]), c=st.floats(0.1, 10.0))
def test_static_clip_properties(seed, n, d, scale, c):
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed)) * scale
    clip = StaticClip(max_norm=c)
    y = clip(x)
    norms, ynorms = x.double().norm(dim=1), y.double().norm(dim=1)
    assert y.dtype == x.dtype
    assert bool((ynorms <= c * (1 + 1e-6)).all())  # norm ≤ C, also for float32 rows whose square overflows
    small = norms <= c
    assert torch.equal(y[small], x[small])  # rows inside the ball are untouched
    assert torch.allclose(y.double()[~small], (x.double() * (c / norms)[:, None])[~small], rtol=1e-5)
    assert torch.allclose(clip(y), y, rtol=1e-6)  # idempotent


def test_static_clip_metric_and_no_copy():
    x = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    out = run(StaticClip(max_norm=1.0), x)
    assert out.metrics["clipped"] == 1.0
    assert run(StaticClip(max_norm=10.0), x).x is x
    assert torch.equal(x, torch.tensor([[3.0, 4.0], [0.3, 0.4]]))  # input untouched


@pytest.mark.parametrize("make", [lambda: StaticClip(max_norm=2.0), lambda: ARC(f=3)],
                         ids=["static_clip", "arc"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_in_place_clipping_equals_the_copying_one(make, dtype):
    x = torch.randn(12, 50, generator=torch.Generator().manual_seed(4), dtype=dtype)
    x[[1, 7]] *= 10.0
    stage = make()
    in_place = type(stage)(**{**stage.__dict__, "in_place": True})
    expected = run(stage, x)
    y = x.clone()
    out = run(in_place, y)
    assert out.x is y and out.metrics == expected.metrics
    assert torch.equal(out.x, expected.x)          # same rows scaled by the same factors
    with pytest.raises(ConfigError, match="in_place"):
        type(stage)(**{**stage.__dict__, "in_place": 1})


def test_arc_clips_the_k_largest_to_the_next_norm():
    # n = 10, f = 2: k = ⌊2·(2/10)·8⌋ = 3 → the 3 largest are clipped to the 4th largest norm (7)
    x = torch.arange(1.0, 11.0)[:, None]
    out = run(ARC(f=2), x)
    assert out.x.squeeze(1).tolist() == [1, 2, 3, 4, 5, 6, 7, 7, 7, 7]
    assert out.metrics == {"threshold": 7.0, "clipped": 3.0}
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ARC(f=2)(x[perm]), out.x[perm])


def test_arc_f_zero_and_small_k_leave_messages_alone():
    x = torch.randn(5, 3)
    assert run(ARC(f=0), x).x is x
    assert run(ARC(f=1), x[:3]).metrics["clipped"] == 1.0  # k = ⌊2·1·2/3⌋ = 1
    assert run(ARC(f=1), torch.tensor([[1.0], [-1.0], [2.0], [3.0], [4.0], [5.0]])).metrics["clipped"] == 1.0
    assert run(ARC(f=0), torch.ones(1, 3)).metrics["clipped"] == 0.0  # n = 1
    with pytest.raises(ConfigError, match=r"f=4 and n=4"):
        ARC(f=4)(x[:4])


def test_arc_ties_at_the_threshold():
    x = torch.tensor([[1.0], [5.0], [5.0], [-5.0], [9.0]])  # n=5, f=1: k = ⌊2·4/5⌋ = 1, threshold 5
    assert ARC(f=1)(x).squeeze(1).tolist() == [1.0, 5.0, 5.0, -5.0, 5.0]


@pytest.mark.parametrize("name,params,field", [
    (NNM, {"f": -2}, "f"), (ARC, {"f": 0.5}, "f"), (Bucketing, {"bucket_size": 0}, "bucket_size"),
    (StaticClip, {"max_norm": 0.0}, "max_norm"), (StaticClip, {"max_norm": float("inf")}, "max_norm"),
])
def test_invalid_parameters_name_the_field(name, params, field):
    with pytest.raises(ConfigError, match=f"`{field}`"):
        name(**params)


# ----------------------------------------------------------------------------------------------- PreAggregated
def test_pre_aggregated_applies_stages_in_order():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.1], [6.0, 8.0], [0.3, 0.0]], dtype=torch.float64)
    clip, bucket = StaticClip(max_norm=1.0), Bucketing(bucket_size=2)
    kw = {"seed": 3}
    c = ctx(4, **kw)

    def manual(stages):
        y = x
        for stage in stages:
            y = stage.apply(y, None, c).x
        return y.sum(0)

    clip_then_bucket = run(PreAggregated((clip, bucket), RowsSeen()), x, **kw)
    bucket_then_clip = run(PreAggregated((bucket, clip), RowsSeen()), x, **kw)
    assert torch.allclose(clip_then_bucket.x, manual([clip, bucket]))
    assert torch.allclose(bucket_then_clip.x, manual([bucket, clip]))
    assert not torch.allclose(clip_then_bucket.x, bucket_then_clip.x)  # the order matters and is kept
    assert clip_then_bucket.metrics["rows"] == 2.0 and clip_then_bucket.metrics["clipped"] == 2.0


def test_pre_aggregated_drops_weights_once_rows_are_buckets():
    x = torch.randn(6, 2, dtype=torch.float64)
    w = torch.arange(1.0, 7.0)
    kept = run(PreAggregated((NNM(f=1), StaticClip(max_norm=1.0)), RowsSeen()), x, weights=w)
    dropped = run(PreAggregated((Bucketing(bucket_size=2),), RowsSeen()), x, weights=w)
    assert kept.metrics["weighted"] == 1.0 and dropped.metrics["weighted"] == 0.0
    # with the uniform weights that bucketing leaves, a weighted Mean is the plain mean of the buckets
    out = run(PreAggregated((Bucketing(bucket_size=2),), Mean()), x, weights=w)
    assert torch.allclose(out.x, x.mean(0))


def test_pre_aggregators_do_not_modify_their_input():
    x = torch.randn(9, 4) * 10
    copy = x.clone()
    for pre in (NNM(f=2), Bucketing(bucket_size=2), StaticClip(max_norm=1.0), ARC(f=2)):
        pre(x)
    assert torch.equal(x, copy)


def test_errors_are_trustfl_value_errors():
    with pytest.raises(ConfigError, match="f=5 and n=4") as info:
        NNM(f=5)(torch.randn(4, 2))
    assert isinstance(info.value, ValueError)


def _registered(kind: str) -> list:
    from trustfl.core.registry import lookup, names

    out = []
    for name in names(kind):
        cls = lookup(kind, name)
        try:
            out.append((name, cls(f=3)))
        except TypeError:  # a rule without f
            try:
                out.append((name, cls(bucket_size=3) if name == "bucketing" else cls()))
            except TypeError:
                continue
    assert out
    return out


@pytest.mark.parametrize("kind", ["aggregator", "pre_aggregator"])
def test_declared_minimum_and_output_rows_are_what_each_stage_does(kind):
    """min_messages (what validation checks against the cohort) is each rule's runtime requirement: one message
    fewer is refused, exactly that many runs; rows_out is the row count a pre-aggregator returns."""
    gen = torch.Generator().manual_seed(0)
    declared = []
    for name, stage in _registered(kind):
        k = stage.min_messages()
        if k > 1:  # a rule with a requirement (the others may need per-row reports to run at all)
            declared.append(name)
            with pytest.raises(ConfigError, match="needs"):
                run(stage, torch.randn(k - 1, 4, generator=gen))
            run(stage, torch.randn(k, 4, generator=gen))
        if kind == "pre_aggregator" and stage.rows_out(9) is not None:
            assert run(PreAggregated((stage,), RowsSeen()), torch.randn(9, 4, generator=gen)).metrics["rows"] \
                == stage.rows_out(9), name
    assert set(declared) >= ({"caf", "cwtm", "krum", "mda", "meamed", "multi_krum"} if kind == "aggregator"
                             else {"arc", "nnm"})


def test_too_few_follows_the_rows_through_the_pre_aggregators():
    chain = PreAggregated((NNM(f=2), Bucketing(bucket_size=2)), CoordinateWiseTrimmedMean(f=2))
    assert chain.too_few(2) == "NNM needs at least 3 messages, found 2"
    assert chain.too_few(8) == ("CoordinateWiseTrimmedMean needs at least 5 rows, and the pre-aggregators turn 8 "
                                "messages into 4")
    assert chain.too_few(9) is None  # 9 messages -> 5 buckets
    assert PreAggregated((StaticClip(1.0),), Mean()).too_few(1) is None
