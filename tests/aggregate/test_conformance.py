"""Conformance table: every registered aggregator and pre-aggregator through the same checks.

Every context carries the per-row reports the report-weighted rules read (``num_samples``, ``reported_epsilon``,
``oracle_noise_variance``; see :func:`reports`). Names registered by other modules are built with no parameters; a
name that cannot be built that way, or cannot run on these messages, is skipped with the reason.
"""
import pytest
import torch

import trustfl
from trustfl.aggregate.base import PreAggregated
from trustfl.errors import TrustFLError
from trustfl.types import ParamLayout, RoundContext

N, D, F = 11, 6, 2

PARAMS = {
    "aggregator": {
        "mean": {}, "cwtm": {"f": F}, "cwmed": {}, "meamed": {"f": F}, "geometric_median": {}, "krum": {"f": F},
        "multi_krum": {"f": F}, "mda": {"f": F}, "centered_clipping": {"tau": 3.0}, "caf": {"f": F},
        "dpfedavg": {}, "weiavg": {}, "oracle": {}, "pfa": {}, "robust_hdp": {},
    },
    "pre_aggregator": {"nnm": {"f": F}, "bucketing": {"bucket_size": 2}, "static_clip": {"max_norm": 2.0},
                       "arc": {"f": F}},
}
VARIANTS = {  # extra parameter sets of the rules above
    "aggregator": [("caf", {"f": F, "method": "power"}), ("multi_krum", {"f": F, "m": 3}),
                   ("centered_clipping", {"tau": 0.5, "iterations": 4}), ("cwtm", {"f": 0})],
    "pre_aggregator": [("bucketing", {"bucket_size": 3})],
}


def test_every_builtin_rule_is_checked_with_explicit_parameters():
    """The skips in :func:`build` are for rules that other modules register: one of trustfl's own rules left out of
    PARAMS would be built with no parameters and could be skipped without anyone noticing."""
    for kind, table in PARAMS.items():
        own = {name for name in trustfl.names(kind) if trustfl.lookup(kind, name).__module__.startswith("trustfl.")}
        assert own == set(table), f"{kind}: missing from PARAMS {sorted(own - set(table))}, " \
                                  f"not registered {sorted(set(table) - own)}"


def cases(kind: str) -> list:
    out = [pytest.param(kind, name, PARAMS[kind].get(name), id=name) for name in trustfl.names(kind)]
    out += [pytest.param(kind, name, params, id=f"{name}-{'-'.join(map(str, params.values()))}")
            for name, params in VARIANTS[kind]]
    return out


def messages(dtype: torch.dtype, seed: int = 0, n: int = N) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D, generator=gen, dtype=torch.float64)
    x[:F] = x[:F] * 4 + 3  # a few outlying rows, so that the robust rules have something to do
    return x.to(dtype)


def reports(n: int) -> dict[str, torch.Tensor]:
    """Per-row reports for ``n`` rows: positive, varied (two ε groups, so PFA projects) and deterministic."""
    i = torch.arange(n, dtype=torch.float64)
    return {"num_samples": 10.0 + i, "reported_epsilon": torch.where(i % 3 == 0, 8.0, 1.0) + 0.1 * i,
            "oracle_noise_variance": 1.0 + (i % 4)}


def context(n: int, seed: int = 4, perm: torch.Tensor | None = None) -> RoundContext:
    """The round context of ``n`` rows; with ``perm``, the rows (ids and reports) permuted like the messages."""
    ctx = RoundContext(round=2, seed=seed, client_ids=tuple(range(n)), num_clients=n, reports=reports(n))
    return ctx if perm is None else ctx.select(perm)


def build(kind: str, name: str, params):
    if params is not None:
        return trustfl.build(kind, name, **params)
    try:
        stage = trustfl.build(kind, name)
    except (TypeError, TrustFLError) as exc:
        pytest.skip(f"{kind} {name!r} needs parameters: {exc}")
    try:
        run(stage, messages(torch.float64))
    except (TypeError, KeyError, TrustFLError) as exc:
        pytest.skip(f"{kind} {name!r} cannot run on plain messages: {exc}")
    return stage


def run(stage, x: torch.Tensor, seed: int = 4, perm: torch.Tensor | None = None):
    """``stage`` on ``x`` (or on ``x[perm]`` with the context's rows permuted alike)."""
    state = stage.init(ParamLayout(("x",), ((x.shape[1],),)))
    return stage.apply(x if perm is None else x[perm], state, context(x.shape[0], seed, perm))


def same_rows(a: torch.Tensor, b: torch.Tensor, **tol) -> bool:
    """Equal as multisets of rows (rows matched by sorting on a fixed projection)."""
    key = torch.linspace(1.0, 2.0, a.shape[1], dtype=torch.float64)
    a, b = a.double(), b.double()
    return a.shape == b.shape and torch.allclose(a[(a @ key).argsort()], b[(b @ key).argsort()], **tol)


TOL = {torch.float32: {"rtol": 1e-4, "atol": 1e-5}, torch.float64: {"rtol": 1e-9, "atol": 1e-10}}


@pytest.mark.parametrize("kind,name,params", cases("aggregator"))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_aggregator_conformance(kind, name, params, dtype, device):
    agg = build(kind, name, params)
    x = messages(dtype).to(device)
    copy = x.clone()
    out = run(agg, x)
    assert out.x.shape == (D,) and out.x.dtype == dtype  # output dtype = input dtype
    assert out.x.device == x.device  # and device: no silent move to the CPU
    assert torch.isfinite(out.x).all()
    assert torch.equal(x, copy)  # the messages are not modified
    assert all(isinstance(v, float) for v in out.metrics.values())
    assert torch.equal(run(agg, x).x, out.x)  # deterministic for a seed
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(run(agg, x, perm=perm).x, out.x, **TOL[dtype])  # permutation-invariant


@pytest.mark.parametrize("kind,name,params", cases("aggregator"))
def test_aggregator_degenerate_inputs(kind, name, params):
    agg = build(kind, name, params)
    row = torch.tensor([0.5, -1.0, 0.25, 0.0, 1.0, -0.5], dtype=torch.float64)
    out = run(agg, row.repeat(N, 1)).x
    assert torch.isfinite(out).all()
    if params is not None:  # our rules: all messages equal → that message, to float64 rounding (a float32 weight
        assert torch.allclose(out, row, rtol=1e-12, atol=1e-15)  # of tied rows was off by 1e-8)
    try:  # one message: either its value or a TrustFLError naming n (f too large)
        single = run(agg, row[None]).x
    except TrustFLError as exc:
        assert "n=1" in str(exc)
    else:
        assert torch.isfinite(single).all()


@pytest.mark.parametrize("kind,name,params", cases("pre_aggregator"))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_pre_aggregator_conformance(kind, name, params, dtype):
    pre = build(kind, name, params)
    x = messages(dtype)
    copy = x.clone()
    out = run(pre, x)
    assert out.x.ndim == 2 and out.x.shape[1] == D and 1 <= out.x.shape[0] <= N
    assert out.x.dtype == dtype and torch.isfinite(out.x).all()
    assert torch.equal(x, copy)
    assert torch.equal(run(pre, x).x, out.x)
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(1))
    assert same_rows(run(pre, x, perm=perm).x, out.x, **TOL[dtype])  # equivariant: same rows, permuted
    # wrapped around a rule, the composition is permutation-invariant
    wrapped = PreAggregated((pre,), trustfl.build("aggregator", "cwtm", f=1))
    assert torch.allclose(run(wrapped, x, perm=perm).x, run(wrapped, x).x, **TOL[dtype])


@pytest.mark.parametrize("kind,name,params", cases("pre_aggregator"))
def test_pre_aggregator_degenerate_inputs(kind, name, params):
    pre = build(kind, name, params)
    row = torch.tensor([0.5, -1.0, 0.25, 0.0, 1.0, -0.5], dtype=torch.float64)
    out = run(pre, row.repeat(N, 1)).x
    assert torch.isfinite(out).all()
    if params is not None and name != "static_clip":
        assert torch.allclose(out, row.expand_as(out), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("kind,name,params", [c for k in ("aggregator", "pre_aggregator") for c in cases(k)
                                              if c.values[2] is not None])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_keeps_its_dtype(kind, name, params, dtype):
    out = run(build(kind, name, params), messages(dtype)).x
    assert out.dtype == dtype and torch.isfinite(out).all()
