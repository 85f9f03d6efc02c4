"""The targets and client ids of your own files (:mod:`trustfl.data.own`): strings, integers and numbers parsed
alike for CSV and npz, class labels encoded as indices 0..K-1, client ids as 0..M-1; and the feature check shared
by every file reader (own files and IDX); every refusal a DataError naming the file's rows."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from trustfl.errors import DataError

_SHOWN = 5  # rows, values or files named in one message


def _list(items: Sequence[Any], limit: int = _SHOWN) -> str:
    """``a, b, c`` or ``a, b, c, … (12 in all)``."""
    shown = ", ".join(str(i) for i in items[:limit])
    return shown if len(items) <= limit else f"{shown}, … ({len(items)} in all)"


def _parse(values: np.ndarray, kind: type) -> np.ndarray | int:
    """``values`` (strings, or None for a missing value) parsed as ``kind`` (int or float); on failure the index
    of the first value that does not parse."""
    out = np.empty(len(values), dtype=np.int64 if kind is int else np.float64)
    for i, v in enumerate(values):
        if kind is int and not isinstance(v, (str, int, np.integer)):
            return i  # never truncate a float to an int
        try:
            out[i] = kind(v.strip() if isinstance(v, str) else v)
        except (TypeError, ValueError, OverflowError):
            return i
    return out


def _beyond_int64(values: np.ndarray) -> list[int]:
    """The indices of the values beyond int64 when every value is an integer (text or int), else none."""
    big = []
    for i, v in enumerate(values):
        try:
            n = int(v.strip()) if isinstance(v, str) else int(v) if isinstance(v, (int, np.integer)) else None
        except ValueError:
            return []
        if n is None or isinstance(v, bool):
            return []
        if not -2 ** 63 <= n < 2 ** 63:
            big.append(i)
    return big


def _is_numeric(arr: np.ndarray) -> bool:
    return arr.dtype.kind in "biuf"


def _non_finite_rows(x: np.ndarray) -> np.ndarray:
    return np.flatnonzero(~np.isfinite(x.reshape(x.shape[0], -1)).all(axis=1))


def _check_features(x: np.ndarray, describe: str, row: Callable[[int], str]) -> np.ndarray:
    """``x`` as float64 (float32 unless it was float64), refusing non-numeric dtypes and NaN/Inf (naming the rows)."""
    if not _is_numeric(x):
        raise DataError(f"{describe} must be numeric, found dtype {x.dtype}.")
    x = x.astype(np.float64 if x.dtype == np.float64 else np.float32)
    bad = _non_finite_rows(x)
    if bad.size:
        raise DataError(f"{describe} holds NaN or Inf in {_list([row(int(i)) for i in bad])}.")
    return x


def _encode_targets(raw: np.ndarray, task: str, describe: str,
                    row: Callable[[int], str]) -> tuple[np.ndarray, str, list[Any] | None]:
    """Targets → (int64 class indices, "classification", classes) or (float64 values, "regression", None).

    ``raw`` is a numeric array, or an object array of strings (None: missing). Strings that all parse as integers
    count as integers and strings that all parse as numbers as floating point, so CSV and npz files agree.
    Integers beyond int64 are refused unless ``task`` is "regression" (read as float64, classes would merge).
    """
    if raw.dtype.kind == "S":
        raw = raw.astype(str)
    if raw.dtype.kind in "OU":
        missing = [i for i, v in enumerate(raw.ravel()) if v is None or (isinstance(v, str) and not v.strip())]
        if missing:
            raise DataError(f"{describe} has no value in {_list([row(i) for i in missing])}.")
        as_int = _parse(raw.ravel(), int)
        big = [] if isinstance(as_int, np.ndarray) or task == "regression" else _beyond_int64(raw.ravel())
        if big:  # read as float64 they were a regression target, or classes 2**70 and 2**70 + 1 merged
            raise DataError(f"{describe} holds integers beyond the int64 range in {_list([row(i) for i in big])}; "
                            f"class labels must fit in int64 or be text (e.g. a letter before the digits), or set "
                            f"`task = \"regression\"` if they are values.")
        if isinstance(as_int, np.ndarray):
            raw = as_int.reshape(raw.shape)
        else:
            as_float = _parse(raw.ravel(), float)
            if isinstance(as_float, np.ndarray):
                raw = as_float.reshape(raw.shape)
            else:
                raw = np.array([str(v).strip() for v in raw.ravel()], dtype=object).reshape(raw.shape)
                if task == "regression":
                    raise DataError(f"{describe} must hold numbers for a regression task: {row(as_float)} holds "
                                    f"{raw.ravel()[as_float]!r}.")
    elif not _is_numeric(raw):
        raise DataError(f"{describe} must hold numbers or strings, found dtype {raw.dtype}.")
    if raw.dtype == object:
        guess = "classification"
    else:
        guess = "regression" if raw.dtype.kind == "f" else "classification"
    chosen = guess if task == "auto" else task
    if raw.dtype != object and raw.dtype.kind == "f":
        bad = _non_finite_rows(raw.reshape(raw.shape[0], -1))
        if bad.size:
            raise DataError(f"{describe} holds NaN or Inf in {_list([row(i) for i in bad])}.")
    if chosen == "regression":
        return raw.astype(np.float64), chosen, None
    if raw.ndim == 2 and raw.shape[1] == 1:
        raw = raw[:, 0]
    if raw.ndim != 1:
        raise DataError(f"{describe} has shape {raw.shape}; class labels must be one per example, shape (N,).")
    if raw.dtype == object:  # strings: sorted as text
        classes = sorted(set(raw.tolist()))
        index = {c: i for i, c in enumerate(classes)}
        return np.array([index[v] for v in raw], dtype=np.int64), chosen, classes
    classes_arr, inverse = np.unique(raw, return_inverse=True)
    classes = [c.item() if hasattr(c, "item") else c for c in classes_arr]
    if raw.dtype.kind == "b":
        classes = [bool(c) for c in classes]
    elif raw.dtype.kind == "f" and all(float(c).is_integer() for c in classes):
        classes = [int(c) for c in classes]
    return inverse.reshape(-1).astype(np.int64), chosen, classes


def _groups(raw: np.ndarray, describe: str, row: Callable[[int], str]) -> tuple[np.ndarray, list[Any]]:
    """Client ids → (int64 client index per row, the distinct ids sorted); integer ids sort as numbers, other
    ids (strings, zero-padded numbers) as text."""
    if raw.ndim != 1:
        raise DataError(f"{describe} has shape {raw.shape}; expected one client id per example, shape (N,).")
    if raw.dtype.kind == "S":
        raw = raw.astype(str)
    if raw.dtype.kind in "OU":
        missing = [i for i, v in enumerate(raw) if v is None or (isinstance(v, str) and not v.strip())]
        if missing:
            raise DataError(f"{describe} has no value in {_list([row(i) for i in missing])}.")
        texts = [str(v).strip() for v in raw]
        as_int = _parse(raw, int)
        # ids are names: numbers sort as numbers only when written plainly ("7", not "007", which stays text)
        canonical = isinstance(as_int, np.ndarray) and all(str(n) == t for n, t in zip(as_int.tolist(), texts))
        raw = as_int if canonical else np.array(texts, dtype=object)
    elif raw.dtype.kind == "f":
        bad = np.flatnonzero(~np.isfinite(raw) | (raw != np.round(raw)))
        if bad.size:
            raise DataError(f"{describe} must hold integers or strings: {row(int(bad[0]))} holds {raw[bad[0]]!r}.")
        raw = raw.astype(np.int64)
    elif raw.dtype.kind not in "biu":
        raise DataError(f"{describe} must hold integers or strings, found dtype {raw.dtype}.")
    if raw.dtype == object:
        ids = sorted(set(raw.tolist()))
        index = {c: i for i, c in enumerate(ids)}
        return np.array([index[v] for v in raw], dtype=np.int64), ids
    ids_arr, inverse = np.unique(raw, return_inverse=True)
    return inverse.astype(np.int64), [c.item() for c in ids_arr]
