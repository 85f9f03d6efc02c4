"""Finite but huge messages (up to the float32 maximum) never overflow a rule (issue #16).

16 honest rows ~ N(0, 1) in d = 50 and 4 Byzantine rows ~ N(0, σ²), σ ∈ {1e10, 1e30, 3e38} (draws clipped to the
float32 maximum), through every registered aggregator and pre-aggregator: no exception, a finite output and, for the
robust rules, an output within 10 honest radii of the honest mean. Rules with breakdown point 0 (means weighted by
weights, reports or estimated noise) only have to stay finite; pre-aggregators are checked for boundedness through
``cwtm(f)``, the rule they are meant to precede.
"""
import pytest
import torch

import trustfl
from trustfl.aggregate.base import PreAggregated
from trustfl.aggregate.coordinate import CoordinateWiseTrimmedMean
from trustfl.errors import ConfigError, MessageError, TrustFLError
from trustfl.types import ParamLayout, RoundContext

pytestmark = pytest.mark.usefixtures("one_torch_thread")

H, F, D = 16, 4, 50
N = H + F
BYZANTINE_ROWS = [2, 7, 11, 19]
F32_MAX = torch.finfo(torch.float32).max
SIGMAS = [1e10, 1e30, 3e38]

PARAMS = {
    "aggregator": {"cwtm": {"f": F}, "meamed": {"f": F}, "krum": {"f": F}, "multi_krum": {"f": F}, "mda": {"f": F},
                   "caf": {"f": F}, "centered_clipping": {"tau": 3.0}, "robust_hdp": {"max_iter": 50}},
    "pre_aggregator": {"nnm": {"f": F}, "bucketing": {"bucket_size": 2}, "static_clip": {"max_norm": 10.0},
                       "arc": {"f": F}},
}
# Breakdown point 0: a single message moves them arbitrarily far (robust_hdp weights by estimated noise variance and
# floors the estimates at 1e-12 × the largest one, so a huge message keeps a relative weight of ~1e-12).
NOT_ROBUST = {"mean", "dpfedavg", "weiavg", "oracle", "pfa", "robust_hdp"}


def reports(n: int) -> dict[str, torch.Tensor]:
    i = torch.arange(n, dtype=torch.float64)
    return {"num_samples": 10.0 + i, "reported_epsilon": torch.where(i % 3 == 0, 8.0, 1.0) + 0.1 * i,
            "oracle_noise_variance": 1.0 + (i % 4)}


def context(n: int) -> RoundContext:
    return RoundContext(round=1, seed=3, client_ids=tuple(range(n)), num_clients=n, reports=reports(n))


def run(stage, x: torch.Tensor) -> torch.Tensor:
    return stage.apply(x, stage.init(ParamLayout(("x",), ((x.shape[1],),))), context(x.shape[0])).x


def build(kind: str, name: str):
    params = PARAMS[kind].get(name, {})
    try:
        stage = trustfl.build(kind, name, **params)
        run(stage, attacked(1.0, torch.float64)[0])
    except (TypeError, TrustFLError) as exc:
        if name in PARAMS[kind] or name in NOT_ROBUST:
            raise
        pytest.skip(f"{kind} {name!r} cannot run with parameters {params}: {exc}")
    return stage


def attacked(sigma: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, honest)``: the honest rows with 4 Byzantine N(0, σ²) rows (clipped to ±float32 max) among them."""
    gen = torch.Generator().manual_seed(int(sigma) % 1000 + 5)
    honest = torch.randn(H, D, generator=gen, dtype=torch.float64)
    byz = (torch.randn(F, D, generator=gen, dtype=torch.float64) * sigma).clamp(-F32_MAX, F32_MAX)
    keep = [i for i in range(N) if i not in BYZANTINE_ROWS]
    x = torch.empty(N, D, dtype=torch.float64)
    x[keep], x[BYZANTINE_ROWS] = honest, byz
    return x.to(dtype), honest.to(dtype).double()


def radius(honest: torch.Tensor) -> float:
    return float((honest - honest.mean(0)).norm(dim=1).max())


def cases(kind: str) -> list:
    return [pytest.param(name, id=name) for name in trustfl.names(kind)]


@pytest.mark.parametrize("sigma", SIGMAS, ids=lambda s: f"sigma={s:g}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", cases("aggregator"))
def test_aggregators_survive_huge_messages(name, dtype, sigma):
    agg = build("aggregator", name)
    x, honest = attacked(sigma, dtype)
    out = run(agg, x)
    assert out.shape == (D,) and out.dtype == dtype
    assert torch.isfinite(out).all(), f"{name}: non-finite output for σ={sigma:g}"
    if name not in NOT_ROBUST:
        err = float((out.double() - honest.mean(0)).norm())
        assert err < 10 * radius(honest), (name, err, radius(honest))


@pytest.mark.parametrize("sigma", SIGMAS, ids=lambda s: f"sigma={s:g}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", cases("pre_aggregator"))
def test_pre_aggregators_survive_huge_messages(name, dtype, sigma):
    pre = build("pre_aggregator", name)
    x, honest = attacked(sigma, dtype)
    out = run(pre, x)
    assert out.ndim == 2 and out.shape[1] == D and 1 <= out.shape[0] <= N and out.dtype == dtype
    assert torch.isfinite(out).all(), f"{name}: non-finite output for σ={sigma:g}"
    composed = run(PreAggregated((pre,), CoordinateWiseTrimmedMean(f=F)), x)
    err = float((composed.double() - honest.mean(0)).norm())
    assert torch.isfinite(composed).all() and err < 10 * radius(honest), (name, err, radius(honest))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_means_of_huge_rows_are_exact_not_inf(dtype):
    # The float32 sum of two rows near the maximum overflows; the mean itself is representable.
    x = torch.tensor([[3e38, -3e38, 1.0], [3e38, -3e38, 2.0], [-1e38, 3e38, 3.0]]).to(dtype)
    exact = x.double().mean(0)
    for name, params in (("mean", {}), ("cwtm", {"f": 0}), ("meamed", {"f": 0}), ("mda", {"f": 0}),
                         ("caf", {"f": 0}), ("multi_krum", {"f": 0})):
        out = trustfl.build("aggregator", name, **params)(x)
        assert torch.allclose(out.double(), exact, rtol=1e-6), (name, out)
    buckets = trustfl.build("pre_aggregator", "bucketing", bucket_size=3)(x)
    assert torch.allclose(buckets.double(), exact[None], rtol=1e-6)


def test_float64_messages_beyond_float32_range():
    # Means and coordinate rules rescale by a power of two; Gram-based rules refuse norms whose squares overflow.
    x = torch.tensor([[1e308, 1.0], [1e308, 2.0], [-1e308, 3.0]], dtype=torch.float64)
    expected = torch.tensor([1e308 / 3, 2.0], dtype=torch.float64)
    assert torch.allclose(trustfl.build("aggregator", "mean")(x), expected, rtol=1e-12)
    assert torch.isfinite(trustfl.build("aggregator", "meamed", f=1)(x)).all()
    with pytest.raises(MessageError, match="norms above"):
        trustfl.build("aggregator", "krum", f=0)(x)


def test_rule_size_errors_count_usable_messages():
    with pytest.raises(ConfigError) as info:
        trustfl.build("aggregator", "krum", f=4)(attacked(1e30, torch.float32)[0][:10])
    msg = str(info.value)
    assert "at least 11 messages" in msg and "n=10 usable" in msg and "rejected" in msg
