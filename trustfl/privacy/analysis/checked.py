"""Argument checks shared by the public privacy-math functions: a wrong argument is a PrivacyError naming it.

:func:`checked` reads a function's annotations (:data:`_KINDS`): a parameter annotated ``float`` must be a real
number that is not NaN (``bool``, ``None`` and strings are refused), one annotated ``int`` an integer (not a
``bool``), a ``Sequence[float]`` an iterable of such numbers, a ``Callable`` a function; ``Optional`` ones may
also be ``None``. Ranges stay with each function. An ``ArithmeticError`` inside (an overflow or a division by zero
at extreme but well-typed values, e.g. a noise multiplier of 1e-300) or a math domain error becomes a PrivacyError
that names the function and its arguments: such values are outside what the formula computes, not a result.

Example:
  >>> from trustfl.privacy.analysis.gdp import mu_gaussian
  >>> mu_gaussian(None)
  Traceback (most recent call last):
  ...
  trustfl.errors.PrivacyError: mu_gaussian: `noise_multiplier` must be a number (not NaN), found None.
"""
from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Iterable
from typing import Any, Callable, TypeVar

from trustfl.errors import PrivacyError

F = TypeVar("F", bound=Callable[..., Any])


_KINDS = {"float": ("float", False), "int": ("int", False), "Optional[float]": ("float", True),
          "Optional[int]": ("int", True), "float|None": ("float", True), "int|None": ("int", True),
          "Sequence[float]": ("floats", False), "Optional[Sequence[float]]": ("floats", True),
          "Callable[[float],float]": ("callable", False)}
"""Annotations (as written: the modules use postponed evaluation) that :func:`checked` checks."""


def _kind(annotation: Any) -> tuple[str | None, bool]:
    """(the check a parameter's annotation asks for, or None; whether None is allowed)."""
    if not isinstance(annotation, str):
        annotation = getattr(annotation, "__name__", "")
    return _KINDS.get(annotation.replace(" ", ""), (None, False))


def _check(fn_name: str, name: str, value: Any, kind: str, optional: bool) -> None:
    if value is None and optional:
        return
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise PrivacyError(f"{fn_name}: `{name}` must be an integer, found {value!r}.")
    elif kind == "callable":
        if not callable(value):
            raise PrivacyError(f"{fn_name}: `{name}` must be a function, found {value!r}.")
    elif kind == "floats":
        if isinstance(value, (str, bytes)) or not isinstance(value, Iterable) or not all(_real(v) for v in value):
            raise PrivacyError(f"{fn_name}: `{name}` must be a sequence of numbers (not NaN), found {value!r}.")
    elif not _real(value):
        raise PrivacyError(f"{fn_name}: `{name}` must be a number (not NaN), found {value!r}.")


def _real(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and not math.isnan(value)


def checked(fn: F) -> F:
    """``fn`` with its ``float`` / ``int`` parameters checked and its arithmetic failures made PrivacyErrors."""
    signature = inspect.signature(fn)
    kinds = {name: _kind(p.annotation) for name, p in signature.parameters.items()}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as err:
            raise PrivacyError(f"{fn.__name__}: {err}.") from None
        for name, value in bound.arguments.items():
            kind, optional = kinds.get(name, (None, False))
            if kind is not None:
                _check(fn.__name__, name, value, kind, optional)
        try:
            return fn(*args, **kwargs)
        except (ArithmeticError, ValueError) as err:
            if isinstance(err, ValueError) and (isinstance(err, PrivacyError) or str(err) != "math domain error"):
                raise
            given = ", ".join(f"{k}={v!r}" for k, v in bound.arguments.items())
            raise PrivacyError(f"{fn.__name__}({given}) is outside what it computes ({type(err).__name__}: "
                               f"{err}).") from None

    return wrapper  # type: ignore[return-value]
