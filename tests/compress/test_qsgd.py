"""qsgd_minmax and qsgd: unbiased, exact on constant input, per-segment statistics, honest bit counts."""
from __future__ import annotations

import math

import pytest
import torch

from trustfl.compress import QSGD, QSGDMinMax
from trustfl.errors import ConfigError


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mean_error(comp, x: torch.Tensor, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean over n independent encodings of x (1, d) − x, the decoded rows)."""
    enc = comp.encode(x.expand(n, x.shape[1]), _gen(seed), 0)
    dec, failures = comp.decode(enc, None, 0)
    assert failures.tolist() == [0] * n
    return dec.mean(dim=0) - x[0], dec


@pytest.mark.parametrize("l2", [False, True])
def test_minmax_is_unbiased(l2):
    n, k = 4000, 4
    x = torch.randn(1, 64, generator=_gen(1))
    comp = QSGDMinMax(levels=k, l2=l2)
    err, dec = _mean_error(comp, x, n, 2)
    fmin, fmax = (0.0, float(x.norm())) if l2 else (float(x.min()), float(x.max()))
    unit = (fmax - fmin) / (k - 1)
    # v rounds to one of two neighbouring levels: variance <= unit²/4 per coordinate
    se = unit / (2 * math.sqrt(n))
    assert err.abs().max() < 5 * se
    assert (dec - x).abs().max() <= unit * (1 + 1e-5)  # never further than one level
    assert (dec - x).std() > 0.1 * unit  # and really random
    grid = (dec - fmin) / unit
    assert (grid - grid.round()).abs().max() < 1e-4  # every decoded value is on the grid


@pytest.mark.parametrize("bucket", [None, 16])
def test_qsgd_is_unbiased(bucket):
    n, s = 4000, 3
    x = torch.randn(1, 64, generator=_gen(3))
    comp = QSGD(levels=s, bucket=bucket)
    err, dec = _mean_error(comp, x, n, 4)
    norms = x.view(-1, bucket or 64).norm(dim=1).repeat_interleave(bucket or 64)
    # |x_j|·s/‖x_B‖ rounds to a neighbouring integer: variance <= (‖x_B‖/s)²/4 per coordinate
    se = norms / s / (2 * math.sqrt(n))
    assert (err.abs() < 5 * se).all()
    assert ((dec - x).abs() <= norms / s * (1 + 1e-5)).all()
    levels = dec * s / norms
    assert (levels - levels.round()).abs().max() < 1e-4 and levels.abs().max() <= s + 1e-4


def test_constant_input_is_exact():
    x = torch.full((3, 50), 0.37)
    x[1] = -2.0
    x[2] = 0.0
    for comp in (QSGDMinMax(levels=2), QSGDMinMax(levels=16)):
        dec, _ = comp.decode(comp.encode(x, _gen(5), 0), None, 0)
        assert torch.equal(dec, x)
    zero = torch.zeros(2, 40)
    for comp in (QSGDMinMax(l2=True), QSGD(), QSGD(levels=1, bucket=8)):
        dec, _ = comp.decode(comp.encode(zero, _gen(5), 0), None, 0)
        assert torch.equal(dec, zero)


def test_segments_give_each_tensor_its_own_range():
    small = torch.randn(1, 100, generator=_gen(6)) * 1e-3
    large = torch.randn(1, 100, generator=_gen(7))
    x = torch.cat([small, large], dim=1)
    whole = QSGDMinMax(levels=16)
    split = whole.with_segments((100, 100))
    assert split.segments == (100, 100) and whole.segments is None
    assert QSGDMinMax(levels=16, segments=(100, 100)) == split
    err_whole = (whole.decode(whole.encode(x, _gen(8), 0), None, 0)[0] - x)[:, :100].abs().max()
    err_split = (split.decode(split.encode(x, _gen(8), 0), None, 0)[0] - x)[:, :100].abs().max()
    unit_small = float(small.max() - small.min()) / 15
    assert err_split <= unit_small * (1 + 1e-4) < 1e-3
    assert err_whole > 10 * err_split  # one range for both tensors wastes the levels on the small one
    # a constant segment next to a varying one is still exact
    y = torch.cat([torch.full((1, 30), 4.0), large], dim=1)
    comp = QSGDMinMax(levels=4, segments=(30, 100))
    assert torch.equal(comp.decode(comp.encode(y, _gen(9), 0), None, 0)[0][:, :30], y[:, :30])
    with pytest.raises(ConfigError, match="segments"):
        comp.encode(x, _gen(9), 0)  # sizes sum to 130, not 200


@pytest.mark.parametrize("k,l2", [(2, False), (16, False), (17, False), (256, False), (16, True), (3, True)])
def test_minmax_bits_are_the_bytes_produced(k, l2):
    d, m = 1001, 3
    sizes = (500, 1, 500)
    comp = QSGDMinMax(levels=k, l2=l2, segments=sizes)
    enc = comp.encode(torch.randn(m, d, generator=_gen(k)), _gen(0), 0)
    code_bits = math.ceil(math.log2(2 * k - 1 if l2 else k))
    assert comp.bits_per_coordinate == code_bits
    header = 4 * len(sizes) * (1 if l2 else 2)  # float32 norm, or fmin and fmax, per segment
    assert enc.bits_per_row() == 8 * (math.ceil(code_bits * d / 8) + header) == 8 * enc.nbytes() // m
    assert sum(t.numel() * t.element_size() for t in enc.payload.values()) == enc.nbytes()


@pytest.mark.parametrize("s,bucket", [(1, None), (7, None), (7, 512), (15, 100), (255, 64)])
def test_qsgd_bits_are_the_bytes_produced(s, bucket):
    d, m = 1001, 2
    comp = QSGD(levels=s, bucket=bucket)
    enc = comp.encode(torch.randn(m, d, generator=_gen(s)), _gen(0), 0)
    code_bits = 1 + math.ceil(math.log2(s + 1))  # a sign bit and the level
    buckets = 1 if bucket is None else math.ceil(d / bucket)
    assert comp.bits_per_coordinate == code_bits
    assert enc.payload["norm"].shape == (m, buckets)
    assert enc.bits_per_row() == 8 * (math.ceil(code_bits * d / 8) + 4 * buckets) == 8 * enc.nbytes() // m


def test_same_generator_same_codes():
    x = torch.randn(2, 300, generator=_gen(10))
    for comp in (QSGDMinMax(), QSGD(bucket=64)):
        a = comp.encode(x, _gen(1), 0)
        assert all(torch.equal(a.payload[k], v) for k, v in comp.encode(x, _gen(1), 0).payload.items())
        assert not torch.equal(a.payload["codes"], comp.encode(x, _gen(2), 0).payload["codes"])


@pytest.mark.parametrize("factory,kwargs,name", [
    (QSGDMinMax, {"levels": 1}, "levels"), (QSGDMinMax, {"levels": 0}, "levels"),
    (QSGDMinMax, {"levels": 4.5}, "levels"), (QSGDMinMax, {"l2": "yes"}, "l2"),
    (QSGDMinMax, {"segments": (3, 0)}, "segments"), (QSGDMinMax, {"segments": ()}, "segments"),
    (QSGD, {"levels": 0}, "levels"), (QSGD, {"bucket": 0}, "bucket"), (QSGD, {"bucket": 2.5}, "bucket"),
])
def test_bad_parameters_raise_config_error_naming_them(factory, kwargs, name):
    with pytest.raises(ConfigError, match=f"`{name}`"):
        factory(**kwargs)


F32_MAX = torch.finfo(torch.float32).max


@pytest.mark.parametrize("comp,x", [
    (QSGD(), [[2e19, -2e19, 1.0]]),  # the float32 sum of squares overflowed: NaN
    (QSGD(levels=1, bucket=2), [[F32_MAX, -F32_MAX, 3e38, 0.0]]),  # a norm beyond float32: capped, still unbiased
    (QSGDMinMax(), [[-2e38, 2e38, 0.0]]),  # fmax − fmin overflowed
    (QSGDMinMax(levels=4), [[-F32_MAX, F32_MAX, 1e38]]),
    (QSGDMinMax(l2=True), [[1e20, -1e20, 3.0]]),
    (QSGDMinMax(l2=True, levels=3), [[F32_MAX, F32_MAX, -F32_MAX]]),
    (QSGDMinMax(levels=16), [[0.0, 1e-44, 5e-45]]),  # a unit below float32 (1/unit overflowed)
    (QSGD(levels=4), [[1e-40, -1e-40, 1e-40, 1e-40]]),  # squares below float32: norm 0, decoded as zeros
    (QSGD(levels=4, bucket=2), [[1e-30, -1e-30, 1e-20, 0.0]]),
    (QSGDMinMax(l2=True, levels=4), [[1e-40, -1e-40, 1e-40]]),
])
def test_huge_and_tiny_ranges_stay_finite_and_unbiased(comp, x):
    """Scales computed in float32 overflowed, and finite messages decoded to NaN."""
    x = torch.tensor(x)
    n = 4000
    enc = comp.encode(x.expand(n, x.shape[1]), _gen(11), 0)
    assert all(bool(t.isfinite().all()) for k, t in enc.payload.items() if k != "codes")
    dec, _ = comp.decode(enc, None, 0)
    assert bool(dec.isfinite().all())
    span = float(x.double().abs().max())
    # within a few standard errors of x (one level is at most 2·span wide)
    assert ((dec.double().mean(dim=0) - x[0].double()).abs() <= 5 * 2 * span / math.sqrt(n)).all()
    assert (dec.double() - x.double()).abs().max() <= 2 * span * (1 + 1e-5)


def test_overflow_paths_leave_ordinary_rows_alone():
    """A row needing the float64 path next to ordinary rows: the ordinary rows encode and decode as they do alone."""
    ordinary = torch.randn(3, 40, generator=_gen(12))
    huge = torch.tensor([[1e38, -1e38]]).repeat(1, 20)
    for comp in (QSGD(), QSGD(bucket=8), QSGDMinMax(l2=True), QSGDMinMax(segments=(20, 20))):
        mixed = torch.cat([ordinary, huge])
        gens = [_gen(i) for i in range(4)]
        both, alone = comp.encode(mixed, gens, 0), comp.encode(ordinary, [_gen(i) for i in range(3)], 0)
        for k, t in alone.payload.items():
            assert torch.equal(both.payload[k][:3], t)
        assert torch.equal(comp.decode(both, None, 0)[0][:3], comp.decode(alone, None, 0)[0])


@pytest.mark.parametrize("factory,kwargs,largest", [
    (QSGD, {}, 2 ** 23), (QSGDMinMax, {}, 2 ** 24 + 1), (QSGDMinMax, {"l2": True}, 2 ** 23 + 1),
])
def test_levels_beyond_float32_integers_are_refused_when_built(factory, kwargs, largest):
    """qsgd took levels = 2**40 and failed in the first round with "`bits` must be an integer in 1..32, found 42";
    levels between 2**24 and 2**31 flipped signs (the codes are float32 integers)."""
    comp = factory(levels=largest, **kwargs)
    x = torch.tensor([[1.0, -1.0, 0.0, 0.5]])
    dec, _ = comp.decode(comp.encode(x, _gen(0), 0), None, 0)
    assert (dec - x).abs().max() <= 2.0 / (largest - 1)
    for levels in (largest + 1, 2 ** 31 - 1, 1099511627776):
        with pytest.raises(ConfigError, match=f"`levels` must be an integer in \\d+\\.\\.{largest} .*found {levels}"):
            factory(levels=levels, **kwargs)
