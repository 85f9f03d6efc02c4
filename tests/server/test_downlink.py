"""The downlink encode/decode chain (trustfl.server.downlink): identity, casts and byte counts."""
from __future__ import annotations

import pytest
import torch

import trustfl
from trustfl.errors import ConfigError, MessageError
from trustfl.server.downlink import Cast, Downlink


def _payload(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    # values with more mantissa bits than bfloat16/float16 keep, and a wide range
    return {"model": torch.randn(1000, generator=g) * 10.0 ** torch.randint(-3, 3, (1000,), generator=g),
            "scaffold/c": torch.randn(37, generator=g)}


def _dtypes(payload):
    return {k: v.dtype for k, v in payload.items()}


def test_empty_downlink_is_the_identity():
    p = _payload()
    down = Downlink(())
    enc = down.encode(p)
    assert enc.keys() == p.keys()
    for k in p:
        assert enc[k].dtype == torch.float32 and torch.equal(enc[k], p[k])
    dec = down.decode(enc, _dtypes(p))
    for k in p:
        assert dec[k].dtype == torch.float32 and torch.equal(dec[k], p[k])
    assert Downlink.nbytes(enc) == (1000 + 37) * 4


@pytest.mark.parametrize("name,dtype", [("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_cast_halves_the_bytes_and_decodes_to_the_rounded_values(name, dtype):
    p = _payload(1)
    down = Downlink((("cast", Cast(name)),))
    enc = down.encode(p)
    for k in p:
        assert enc[k].dtype == dtype
    assert Downlink.nbytes(enc) == Downlink.nbytes(p) // 2 == (1000 + 37) * 2
    dec = down.decode(enc, _dtypes(p))
    for k, x in p.items():
        assert dec[k].dtype == torch.float32
        assert torch.equal(dec[k], x.to(dtype).to(torch.float32))
    # lossy, within the type's relative precision (normal range)
    eps = torch.finfo(dtype).eps
    x, y = p["scaffold/c"], dec["scaffold/c"]
    assert not torch.equal(x, y)
    assert bool(((x - y).abs() <= eps * x.abs()).all())


def test_cast_decodes_to_each_tensors_own_dtype():
    p = {"model": torch.linspace(-1, 1, 11, dtype=torch.float64), "extra": torch.randn(5)}
    down = Downlink((("cast", Cast("bfloat16")),))
    dec = down.decode(down.encode(p), _dtypes(p))
    assert dec["model"].dtype == torch.float64 and dec["extra"].dtype == torch.float32
    assert torch.equal(dec["model"], p["model"].to(torch.bfloat16).to(torch.float64))


def test_cast_to_float32_of_float32_is_lossless():
    p = _payload(2)
    down = Downlink((("cast", Cast("float32")),))
    enc = down.encode(p)
    assert Downlink.nbytes(enc) == Downlink.nbytes(p)
    for k, v in down.decode(enc, _dtypes(p)).items():
        assert torch.equal(v, p[k])


def test_cast_unknown_dtype_raises():
    with pytest.raises(ConfigError):
        Cast("int8")
    with pytest.raises(ConfigError):
        Cast("fp16")


def test_cast_is_registered():
    stage = trustfl.build("downlink_stage", "cast", dtype="float16")
    assert isinstance(stage, Cast) and stage.dtype == "float16"
    assert trustfl.build("downlink_stage", "cast").dtype == "bfloat16"


@pytest.mark.parametrize("name,big", [("float16", 7e4), ("float16", -1e5), ("bfloat16", 3.4e38)])
def test_cast_refuses_a_finite_value_beyond_the_target_range(name, big):
    """A float16 cast turned a model value of 7e4 into inf, which every client then received."""
    p = _payload(3)
    p["scaffold/c"][5] = big
    with pytest.raises(MessageError, match=rf"tensor 'scaffold/c' holds a finite value .* beyond {name}'s range.*"
                                           r"dtype = \"(bfloat16|float32)\""):
        Downlink((("cast", Cast(name)),)).encode(p)


def test_cast_passes_non_finite_values_through():
    p = {"model": torch.tensor([float("nan"), float("inf"), -float("inf"), 65504.0])}
    enc = Cast("float16").encode(p)
    assert torch.equal(enc["model"].isnan(), torch.tensor([True, False, False, False]))
    assert enc["model"][1:].tolist() == [float("inf"), -float("inf"), 65504.0]
