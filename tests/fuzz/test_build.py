"""Seeded fuzzing of ``trustfl.build`` for every registered component with ill-typed and extreme parameters.

Property: building returns a component or raises a :class:`~trustfl.errors.TrustFLError`; a TypeError, KeyError,
AttributeError, OverflowError or torch RuntimeError from inside a constructor fails the test (``seed = inf``
overflowed, ``blocks = 2`` raised TypeError, ``path = 1`` opened the process's stdout). Components come from the
registry, so new ones are fuzzed automatically.
"""
from __future__ import annotations

import inspect
import math
import random

import pytest

import trustfl
from trustfl.core import registry
from trustfl.errors import TrustFLError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VALUES = [1.0, 0.5, 2, 10, 1e-5, None, "x", True, False, math.nan, math.inf, -1, 0, 1e300, [2, 8], [], {}, (1,),
          "mean"]


def components() -> list[tuple[str, str]]:
    return [(kind, name) for kind in registry.kinds() for name in registry.names(kind)]


@pytest.mark.parametrize("kind, name", components())
def test_build_raises_only_trustfl_errors(kind, name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a string parameter read as a path finds nothing here
    params = [p for p in inspect.signature(registry.lookup(kind, name)).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"]
    rng = random.Random(f"{kind}-{name}-20261127")
    for _ in range(20 if kind == "dataset" else 60):
        kwargs = {p.name: rng.choice(VALUES) for p in params if p.default is p.empty or rng.random() < 0.4}
        try:
            trustfl.build(kind, name, **kwargs)
        except TrustFLError:
            pass


def test_the_fuzz_covers_every_kind():
    assert len(components()) >= 130 and {"dataset", "model", "aggregator", "speed_model"} <= set(registry.kinds())
