"""Bad honest input (issue #16): every registered attack, given honest rows with a NaN or ±inf row, a wrong shape or
an integer dtype, raises a MessageError naming itself and the bad rows; finite honest rows near the float32 maximum
give finite (saturated) Byzantine rows.
"""
import pytest
import torch

import trustfl
from trustfl.aggregate.base import Mean
from trustfl.errors import MessageError, TrustFLError
from trustfl.types import RoundContext

H, D, F = 6, 4, 2
NON_FINITE_BY_DESIGN = {"inf", "nan"}  # they exist to send non-finite rows


def ctx() -> RoundContext:
    return RoundContext(round=0, seed=0, client_ids=tuple(range(H)), num_clients=H + F)


def honest() -> torch.Tensor:
    return torch.randn(H, D, generator=torch.Generator().manual_seed(0))


def with_bad_rows(value: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    x = honest().to(dtype)
    x[1, 0] = x[4, 3] = value
    return x


BAD = {
    "nan_rows": (lambda: with_bad_rows(float("nan")), r"honest rows \[1, 4\] are not finite"),
    "inf_rows": (lambda: with_bad_rows(float("inf"), torch.float64), r"honest rows \[1, 4\] are not finite"),
    "neg_inf_rows": (lambda: with_bad_rows(-float("inf")), r"honest rows \[1, 4\] are not finite"),
    "one_dimensional": (lambda: torch.ones(D), r"2-D \(h, d\)"),
    "zero_columns": (lambda: torch.ones(H, 0), r"2-D \(h, d\) tensor with d >= 1"),
    "int_dtype": (lambda: torch.ones(H, D, dtype=torch.int32), r"floating dtype.*torch\.int32"),
}


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("name", trustfl.names("attack"))
def test_bad_honest_rows_raise_a_message_error_naming_attack_and_rows(name, bad):
    attack = trustfl.build("attack", name)
    make, text = BAD[bad]
    with pytest.raises(MessageError, match=text) as info:
        attack.craft(make(), F, ctx(), Mean())
    assert f"attack {name!r}" in str(info.value)
    assert isinstance(info.value, TrustFLError)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", [n for n in trustfl.names("attack") if not trustfl.build("attack", n).data_level])
def test_attacks_on_rows_near_the_float32_maximum_stay_finite(name, dtype):
    x = honest().double()
    top = min(torch.finfo(torch.float32).max, torch.finfo(dtype).max)  # float32 sums and squares of it overflow
    x[:3] = top * torch.sign(x[:3])
    out = trustfl.build("attack", name).craft(x.to(dtype), F, ctx(), Mean())
    assert out.shape == (F, D) and out.dtype == dtype
    if name not in NON_FINITE_BY_DESIGN:
        assert torch.isfinite(out).all(), out


@pytest.mark.parametrize("name", [n for n in trustfl.names("attack") if not trustfl.build("attack", n).data_level])
def test_poisoning_data_with_an_update_level_attack_is_refused_naming_it(name):
    from trustfl.errors import ConfigError
    with pytest.raises(ConfigError, match=f"^attack {name!r} is an update-level attack"):
        trustfl.build("attack", name).poison(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), 10)


@pytest.mark.parametrize("name", [n for n in trustfl.names("attack") if not trustfl.build("attack", n).data_level])
def test_no_round_context_crafts_or_says_what_needs_it(name):
    # craft(h, f, None) suits an attack that draws nothing (alie's example); gaussian, mimic and the line searches
    # raised AttributeError ('NoneType' object has no attribute 'generator' / 'seed')
    attack = trustfl.build("attack", name)
    try:
        out = attack.craft(honest(), F, None, Mean())
    except MessageError as err:
        assert name in ("gaussian", "mimic", "alie_ls", "foe_ls")
        assert str(err).startswith(f"attack {name!r}: `ctx` must be the round's RoundContext (")
        assert str(err).endswith("found NoneType.")
    else:
        assert name not in ("gaussian", "mimic", "alie_ls", "foe_ls")
        assert out.shape == (F, D)
        assert torch.allclose(out, attack.craft(honest(), F, ctx(), Mean()), rtol=0, atol=0, equal_nan=True)
