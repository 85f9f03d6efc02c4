"""``check_number``: one scalar range check, refusing with a message that names the key."""
from __future__ import annotations

import math

import numpy as np
import pytest

from trustfl.core.checks import check_number
from trustfl.errors import ConfigError, PrivacyError, TrustFLError


@pytest.mark.parametrize("value, kwargs", [
    (1, {"integer": True, "low": 1}), (np.int64(3), {"integer": True, "low": 1}), (0.5, {"low": 0, "high": 1}),
    (0, {"low": 0}), (np.float32(2.5), {"low": 0, "low_open": True, "finite": True}), (2 ** 63 - 1, {"finite": True}),
    (-2 ** 63, {"integer": True}),
    (None, {"allow_none": True, "integer": True}), (math.inf, {"low": 0}),
    (32, {"integer": True, "low": 1, "high": 32}),
    (-3, {"integer": True}),
])
def test_accepted_values_are_returned_unchanged(value, kwargs):
    assert check_number("k", value, **kwargs) is value


@pytest.mark.parametrize("value, kwargs, allowed", [
    (0, {"integer": True, "low": 1}, "an integer >= 1"),
    (1.0, {"integer": True, "low": 1}, "an integer >= 1"),
    (True, {"integer": True}, "an integer"),
    (np.bool_(True), {}, "a number"),
    ("1", {"low": 0}, "a number >= 0"),
    (None, {"low": 0}, "a number >= 0"),
    (0.0, {"low": 0, "low_open": True, "finite": True}, "a finite number > 0"),
    (math.inf, {"low": 0, "finite": True}, "a finite number >= 0"),
    (math.nan, {"low": 0}, "a number >= 0"),
    (1.0, {"low": 0, "high": 1, "high_open": True}, "a number in [0, 1)"),
    (0.0, {"low": 0, "high": 1, "low_open": True}, "a number in (0, 1]"),
    (40, {"integer": True, "low": 1, "high": 32}, "an integer in 1..32"),
    (2.5, {"high": 2}, "a number <= 2"),
    (0, {"integer": True, "low": 1, "allow_none": True, "note": "n − f"}, "an integer >= 1 or None (n − f)"),
])
def test_refusals_name_the_key_the_rule_and_the_value(value, kwargs, allowed):
    with pytest.raises(ConfigError) as err:
        check_number("some.key", value, **kwargs)
    assert str(err.value) == f"`some.key` must be {allowed}, found {value!r}."


@pytest.mark.parametrize("value, integer", [(2 ** 63, True), (-2 ** 63 - 1, True), (10 ** 400, False),
                                            (2 ** 70, False)])
def test_python_integers_beyond_64_bits_are_refused(value, integer):
    # torch takes no wider integer: sigma = 2**70 passed, then `sigma * noise` raised an OverflowError in the round
    with pytest.raises(ConfigError, match=r"^`k` must fit in a 64-bit integer \(-9223372036854775808\.\."
                                          r"9223372036854775807" + ("" if integer else "; write a larger number as "
                                                                   r"a float") + r"\), found -?\d+\.$"):
        check_number("k", value, integer=integer, finite=True)


def test_component_prefix_and_error_class():
    with pytest.raises(PrivacyError, match=r"^`count` must be an integer >= 0, found -1\.$"):
        check_number("count", -1, integer=True, low=0, error=PrivacyError)
    with pytest.raises(TrustFLError, match=r"^alie: `num_byzantine` must be an integer >= 0"):
        check_number("num_byzantine", -2, integer=True, low=0, where="alie", error=TrustFLError)
