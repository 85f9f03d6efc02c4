"""Bad input through the direct API (issue #16): every registered aggregator and pre-aggregator, called on a matrix
with a NaN or ±inf row, a wrong shape or an integer dtype, raises a MessageError naming itself and the bad rows.
"""
import pytest
import torch

import trustfl
from trustfl.errors import ConfigError, MessageError, TrustFLError

N, D = 10, 4
# Tried in order until the component builds; the input check runs before any parameter is used.
CANDIDATE_PARAMS = [{}, {"f": 1}, {"tau": 1.0}, {"max_norm": 1.0}, {"bucket_size": 2}]


def construct(kind: str, name: str):
    for params in CANDIDATE_PARAMS:
        try:
            return trustfl.build(kind, name, **params)
        except (TypeError, ConfigError):
            continue
    pytest.skip(f"{kind} {name!r} builds with none of {CANDIDATE_PARAMS}")


def good() -> torch.Tensor:
    return torch.randn(N, D, generator=torch.Generator().manual_seed(0))


def nan_rows() -> torch.Tensor:
    x = good()
    x[3, 1] = x[7, 0] = float("nan")
    return x


def inf_rows() -> torch.Tensor:
    x = good().double()
    x[3, 2], x[7, 3] = float("inf"), -float("inf")
    return x


BAD = {  # name: (matrix, text the error must contain besides the component)
    "nan_rows": (nan_rows, r"rows \[3, 7\] are not finite"),
    "inf_rows": (inf_rows, r"rows \[3, 7\] are not finite"),
    "one_dimensional": (lambda: torch.ones(D), r"2-D \(n, d\).*found shape \(4,\)"),
    "three_dimensional": (lambda: torch.ones(2, N, D), r"2-D \(n, d\)"),
    "zero_columns": (lambda: torch.ones(N, 0), r"d >= 1 columns.*\(10, 0\)"),
    "zero_rows": (lambda: torch.ones(0, D), r"n >= 1 rows"),
    "int_dtype": (lambda: torch.ones(N, D, dtype=torch.int64), r"floating dtype.*torch\.int64"),
    "bool_dtype": (lambda: torch.ones(N, D, dtype=torch.bool), r"floating dtype.*torch\.bool"),
}


def cases() -> list:
    return [pytest.param(kind, name, id=f"{kind}-{name}") for kind in ("aggregator", "pre_aggregator")
            for name in trustfl.names(kind)]


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("kind,name", cases())
def test_bad_messages_raise_a_message_error_naming_component_and_rows(kind, name, bad):
    stage = construct(kind, name)
    make, text = BAD[bad]
    with pytest.raises(MessageError, match=text) as info:
        stage(make())
    assert f"{kind} {name!r}" in str(info.value)
    assert isinstance(info.value, TrustFLError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("weights", [torch.tensor([1.0, float("nan"), 1.0]), torch.tensor([1.0, -1.0, 1.0]),
                                     torch.zeros(3), torch.ones(2), "abc", [[1.0, 2.0], [3.0]]],
                         ids=["nan", "negative", "zero_sum", "shape", "string", "ragged"])  # the last two: TypeError
def test_bad_weights_raise_a_message_error(weights):
    with pytest.raises(MessageError, match="aggregator 'mean': `weights`"):
        trustfl.build("aggregator", "mean")(torch.ones(3, 2), weights)


def test_reports_reach_report_weighted_rules_through_the_direct_api():
    x = torch.tensor([[0.0], [4.0]])
    out = trustfl.build("aggregator", "weiavg")(x, reports={"reported_epsilon": torch.tensor([1.0, 3.0])})
    assert out.tolist() == [3.0]


def test_caf_raises_trustfl_errors_not_linalg_errors():
    # Huge finite rows used to overflow the float32 Gram matrix and make eigh fail (NumPy's _LinAlgError).
    x = torch.randn(20, 50, generator=torch.Generator().manual_seed(1))
    x[:4] = torch.finfo(torch.float32).max
    out = trustfl.build("aggregator", "caf", f=4)(x)
    assert torch.isfinite(out).all() and float(out.abs().max()) < 10
    with pytest.raises(MessageError, match="aggregator 'caf': rows"):
        trustfl.build("aggregator", "caf", f=4)(nan_rows())


def test_rules_on_pairwise_distances_refuse_a_cohort_whose_gram_matrices_do_not_fit(monkeypatch):
    """Krum, NNM, CAF and the other rules that form the n×n Gram matrix check its three float64 copies against the
    free memory before the product: cohort.size = 300,000 asked for 360 GB in one allocation, which a machine that
    overcommits memory grants and then kills the run for. Stood in for: 2,399 bytes free against 10 rows' 2,400."""
    import trustfl.core.memory as memory

    x = good()
    rules = [("aggregator", "krum"), ("aggregator", "caf"), ("pre_aggregator", "nnm")]
    monkeypatch.setattr(memory, "free_memory", lambda device: 3 * 8 * N * N - 1)
    for kind, name in rules:
        with pytest.raises(MemoryError, match="allocate 2400 bytes"):
            construct(kind, name)(x)
    monkeypatch.setattr(memory, "free_memory", lambda device: 3 * 8 * N * N)
    for kind, name in rules:
        assert torch.isfinite(construct(kind, name)(x)).all()


@pytest.mark.parametrize("name", trustfl.names("aggregator"))
def test_weights_of_any_scale_or_a_list_give_the_weights_own_result(name):
    """Weights were cast to the messages' dtype before normalising: 5e37·w overflowed float32 to zeros or NaN,
    1e±300·w (float64) to NaN, geometric_median indexed out of range, and a list raised AttributeError."""
    rule = construct("aggregator", name)
    x, w = good(), torch.tensor([1.0, 2, 3, 1, 2, 3, 1, 2, 3, 1])
    reports = {k: torch.linspace(1.0, 2.0, N) for k in ("num_samples", "reported_epsilon", "oracle_noise_variance")}
    base = rule(x, w, reports=reports)
    for scaled in (w * 5e37, w.double() * 1e100, w.double() * 1e-300, w.tolist()):
        out = rule(x, scaled, reports=reports)
        assert torch.isfinite(out).all() and torch.allclose(out, base, rtol=1e-5, atol=1e-6), (name, scaled)
