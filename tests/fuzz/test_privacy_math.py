"""Seeded fuzzing of every public function of :mod:`trustfl.privacy.analysis` with ill-typed and extreme arguments.

Property: a call returns, or raises a :class:`~trustfl.errors.TrustFLError`; a TypeError, ValueError, OverflowError
or ZeroDivisionError from inside (None, strings, bools, NaN, ±inf, 1e±300 reached the formulas) fails the test, and
so does a call that runs for more than 30 s (``epsilon_from_mu(inf, …)`` looped forever). Functions come from the
package's ``__all__``, so new ones are fuzzed automatically.
"""
from __future__ import annotations

import inspect
import math
import random
import signal

import pytest

import trustfl.privacy.analysis as analysis
from trustfl.errors import PrivacyError, TrustFLError

VALUES = [1.0, 0.5, 2.0, 10, 100, 1e-5, 0.01, None, "x", True, math.nan, math.inf, -1, 0, 1e300, 1e-300, [2.0, 8.0],
          (1.5,), "rdp", lambda z: 1.0 / (1.0 + z)]
CALLS = 300


def functions() -> list[str]:
    return [name for name in analysis.__all__ if inspect.isfunction(getattr(analysis, name))]


class _Timeout(Exception):
    pass


def _alarm(*_):
    raise _Timeout


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's / dp_accounting's at 1e±300: the values are refused
@pytest.mark.parametrize("name", functions())
def test_privacy_math_never_raises_anything_but_a_trustfl_error(name):
    fn = getattr(analysis, name)
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    rng = random.Random(f"{name}-20261127")
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for _ in range(CALLS):
            kwargs = {p.name: rng.choice(VALUES) for p in params if p.default is p.empty or rng.random() < 0.5}
            signal.alarm(30)
            try:
                fn(**kwargs)
            except TrustFLError:
                pass
            except _Timeout:
                pytest.fail(f"{name}(**{kwargs!r}) ran for more than 30 s")
            finally:
                signal.alarm(0)
    finally:
        signal.signal(signal.SIGALRM, previous)


def test_the_fuzz_covers_the_public_functions():
    assert len(functions()) >= 25


def test_no_noise_and_bad_counts_are_said_not_looped_or_crashed():
    assert analysis.epsilon_from_mu(math.inf, 1e-5) == math.inf
    assert analysis.epsilon_from_mu(1e300, 1e-5) == math.inf
    with pytest.raises(PrivacyError, match="mironov_epsilon.*outside what it computes"):
        analysis.mironov_epsilon(10.0, -1, 1e-5)
    with pytest.raises(PrivacyError, match="`noise_multiplier` must be a number"):
        analysis.mu_gaussian(None)
    with pytest.raises(PrivacyError, match="`orders` must be a sequence of numbers"):
        analysis.make_accountant("rdp", orders=1e-300)
