"""One check for scalar parameters: a number (or an integer) in a range, refused with a message naming the key.

Example:
  >>> check_number("max_iter", 5, integer=True, low=1)
  5
  >>> check_number("tau", 0.0, low=0, low_open=True, finite=True)
  Traceback (most recent call last):
  ...
  trustfl.errors.ConfigError: `tau` must be a finite number > 0, found 0.0.
"""
from __future__ import annotations

import math
import reprlib
from pathlib import Path
from typing import Any, Optional

import numpy as np

from trustfl.errors import ConfigError, TrustFLError

__all__ = ["check_number", "describe_value"]

_INTEGERS = (int, np.integer)
INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1
_NUMBERS = (int, float, np.integer, np.floating)


def _bound(x: float) -> str:
    return str(x) if isinstance(x, _INTEGERS) else f"{x:g}"


def _allowed(integer: bool, low: Optional[float], high: Optional[float], low_open: bool, high_open: bool,
             finite: bool) -> str:
    kind = "an integer" if integer else "a finite number" if finite else "a number"
    if low is not None and high is not None:
        if integer and not (low_open or high_open):
            return f"{kind} in {_bound(low)}..{_bound(high)}"
        return f"{kind} in {'(' if low_open else '['}{_bound(low)}, {_bound(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"{kind} {'>' if low_open else '>='} {_bound(low)}"
    if high is not None:
        return f"{kind} {'<' if high_open else '<='} {_bound(high)}"
    return kind


FLOAT32_MAX = float(np.finfo(np.float32).max)
"""The largest scale a hyperparameter that multiplies float32 tensors may have (about 3.4e38): torch refuses a larger
Python float as an op's ``alpha`` or bound ("cannot be converted to type float without overflow")."""


def check_number(name: str, value: Any, *, integer: bool = False, low: Optional[float] = None,
                 high: Optional[float] = None, low_open: bool = False, high_open: bool = False,
                 finite: bool = False, allow_none: bool = False, note: str = "", where: str = "",
                 error: type[TrustFLError] = ConfigError) -> Any:
    """``value`` unchanged if it is a number within the bounds; else ``error`` naming ``name``.

    Args:
      name: the key, written between backticks in the message (```max_iter` must be an integer >= 1, found 0.``).
      value: a Python or NumPy number; a bool is never one. NaN fails every bound, and so does a Python integer
        beyond 64 bits (torch cannot take it).
      integer: only integers (Python or NumPy) pass.
      low, high: bounds, inclusive unless ``low_open`` / ``high_open``.
      finite: refuse ±inf (an interval with both bounds refuses it anyway).
      allow_none: ``None`` passes (the message says "or None").
      note: appended to the allowed values in parentheses (what the value means, what None means).
      where: a prefix naming the component (``"krum: `m` must be ..."``).
      error: the error class (``ConfigError``; ``PrivacyError`` in the privacy math).
    """
    if value is None and allow_none:
        return value
    ok = isinstance(value, _INTEGERS if integer else _NUMBERS) and not isinstance(value, (bool, np.bool_))
    if ok:
        ok = ((low is None or (value > low if low_open else value >= low))
              and (high is None or (value < high if high_open else value <= high))
              and (not finite or isinstance(value, _INTEGERS) or math.isfinite(value)))
    if not ok:
        allowed = _allowed(integer, low, high, low_open, high_open, finite)
        allowed += " or None" if allow_none else ""
        allowed += f" ({note})" if note else ""
        raise error(f"{where + ': ' if where else ''}`{name}` must be {allowed}, found {value!r}.")
    if isinstance(value, int) and not INT64_MIN <= value <= INT64_MAX:  # torch takes no wider integer
        raise error(f"{where + ': ' if where else ''}`{name}` must fit in a 64-bit integer "
                    f"({INT64_MIN}..{INT64_MAX}{'' if integer else '; write a larger number as a float'}), "
                    f"found {value!r}.")
    return value


def is_device(path: Any) -> bool:
    """Whether ``path`` names a character or block device (``/dev/zero``: a file read to its end never ends); a
    path the file system cannot look up is none (opening it then fails with its own error)."""
    p = Path(path)
    try:
        return p.is_char_device() or p.is_block_device()
    except (OSError, ValueError):
        return False


def describe_value(v: Any) -> str:
    """How an error message names what it was given: a tensor by dtype, shape and device, anything else by its
    type and a short repr (``a float32 tensor of shape (3, 4) on cpu``, ``a list [1, 2]``)."""
    import torch

    if isinstance(v, torch.Tensor):
        dtype = str(v.dtype).removeprefix("torch.")
        return f"{'an' if dtype.startswith('int') else 'a'} {dtype} tensor of shape {tuple(v.shape)} on {v.device}"
    return "None" if v is None else f"a {type(v).__name__} {reprlib.repr(v)}"
