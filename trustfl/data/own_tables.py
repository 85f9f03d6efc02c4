"""The ``csv`` and ``parquet`` data sets (your own tables, read from ``data.path``); see :mod:`trustfl.data.own`
for the shared rules on targets, the test split and standardisation."""
from __future__ import annotations

import csv
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trustfl.core.registry import register
from trustfl.data.datasets import Dataset
from trustfl.data.own import DEFAULT_CLIENT_COLUMN, _Arrays, _build, _check_options, _exists, _where, resolve_path
from trustfl.data.own_targets import _groups, _is_numeric, _list, _non_finite_rows, _parse
from trustfl.errors import ConfigError, DataError


@dataclass
class _Table:
    names: list[str]
    columns: list[np.ndarray]  # numeric arrays, or object arrays of str / None
    row: Callable[[int], str]


def _read_csv(p: Path, where: str, delimiter: str) -> _Table:
    lines: list[int] = []
    rows: list[list[str]] = []
    try:
        with open(p, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh, delimiter=delimiter)
            try:
                header = None
                for r in reader:
                    if not r or (len(r) == 1 and not r[0].strip()):
                        continue  # a blank line
                    if header is None:
                        header, header_line = r, reader.line_num
                        continue
                    rows.append(r)
                    lines.append(reader.line_num)
            except csv.Error as err:
                raise DataError(f"CSV file {where}, line {reader.line_num}: {err}.") from None
    except UnicodeDecodeError as err:
        raise DataError(f"CSV file {where} is not UTF-8 text (byte 0x{err.object[err.start]:02x}); save it as "
                        f"UTF-8.") from None
    except OSError as err:
        raise DataError(f"cannot read CSV file {where}: {err.strerror or err}.") from None
    if header is None:
        raise DataError(f"CSV file {where} is empty (or blank); expected a header row of column names, then one "
                        f"row per example.")
    names = [h.strip() for h in header]
    if any(not n for n in names):
        raise DataError(f"CSV file {where}: the header (line {header_line}) has an empty column name (column "
                        f"{names.index('') + 1}); every column needs a name.")
    for r, line in zip(rows, lines):
        if len(r) != len(names):
            raise DataError(f"CSV file {where}, line {line}: {len(r)} fields, but the header has {len(names)} "
                            f"columns.")
    if not rows:
        raise DataError(f"CSV file {where} has a header but no rows.")
    columns = [np.array(col, dtype=object) for col in zip(*rows)]
    return _Table(names, columns, lambda i: f"line {lines[i]}")


def _read_parquet(p: Path, where: str) -> _Table:
    try:
        pq = importlib.import_module("pyarrow.parquet")
    except ImportError:
        raise DataError(f"data set 'parquet' needs the optional package `pyarrow` to read {where}, and it is not "
                        f"installed; run `pip install pyarrow`, or save the table as CSV and use "
                        f"dataset = \"csv\".") from None
    try:
        table = pq.read_table(p)
    except Exception as err:  # pyarrow raises its own ArrowInvalid / OSError types
        raise DataError(f"{where} is not a readable Parquet file: {err}.") from None
    names = [str(n) for n in table.column_names]
    if table.num_rows == 0:
        raise DataError(f"Parquet file {where} has no rows.")
    columns = []
    for i, name in enumerate(names):
        col = table.column(i)
        try:
            arr = np.asarray(col.to_numpy(zero_copy_only=False))
        except TypeError:  # older pyarrow: ChunkedArray.to_numpy() takes no argument
            arr = np.asarray(col.to_numpy())
        if col.null_count and _is_numeric(arr):
            arr = np.array(col.to_pylist(), dtype=object)
        if arr.dtype.kind not in "biufO":
            arr = np.array(col.to_pylist(), dtype=object)
        columns.append(arr)
    return _Table(names, columns, lambda i: f"row {i}")


def _numeric_column(values: np.ndarray, describe: str, row: Callable[[int], str]) -> np.ndarray:
    if _is_numeric(values):
        return values.astype(np.float64)
    parsed = _parse(values, float)
    if isinstance(parsed, np.ndarray):
        return parsed
    v = values[parsed]
    found = "no value" if v is None or (isinstance(v, str) and not v.strip()) else repr(v)
    raise DataError(f"{describe} must be numeric: {row(parsed)} holds {found}; give a number in every row, or "
                    f"leave the column out with `features`.")


def _from_table(name: str, fmt: str, p: Path, where: str, table: _Table, seed: int, *, target: Any,
                features: Any, client_column: Any, test_fraction: Any, standardize: Any, standardize_target: Any,
                task: Any) -> Dataset:
    fraction = _check_options(name, test_fraction=test_fraction, standardize=standardize,
                              standardize_target=standardize_target, task=task)
    names = table.names
    listed = _list([repr(n) for n in names], 30)
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise DataError(f"{fmt} {where} names column(s) {_list([repr(d) for d in dupes])} more than once.")
    if client_column is not None and not isinstance(client_column, str):
        raise ConfigError(f"`client_column` of data set {name!r} must be a column name (\"\": none), found "
                          f"{client_column!r}.")
    if client_column:
        if client_column not in names:
            raise DataError(f"{fmt} {where} has no client column {client_column!r} (`client_column`); its "
                            f"columns: {listed}.")
        cid_col: str | None = client_column
    elif client_column is None and DEFAULT_CLIENT_COLUMN in names:
        cid_col = DEFAULT_CLIENT_COLUMN
    else:
        cid_col = None
    if target is None:
        candidates = [n for n in names if n != cid_col]
        if not candidates:
            raise DataError(f"{fmt} {where} has no column besides the client column {cid_col!r}.")
        target = candidates[-1]
    elif not isinstance(target, str):
        raise ConfigError(f"`target` of data set {name!r} must be a column name, found {target!r}.")
    elif target not in names:
        raise DataError(f"{fmt} {where} has no target column {target!r} (`target`); its columns: {listed}.")
    if target == cid_col:
        raise ConfigError(f"`target` of data set {name!r} is the client column {target!r}; name another column.")
    if features is None:
        features = [n for n in names if n not in (target, cid_col)]
        if not features:
            raise DataError(f"{fmt} {where} has no feature column: only the target {target!r}"
                            f"{'' if cid_col is None else f' and the client column {cid_col!r}'}.")
    else:
        if not isinstance(features, (list, tuple)) or not features or not all(isinstance(f, str) for f in features):
            raise ConfigError(f"`features` of data set {name!r} must be a non-empty list of column names, found "
                              f"{features!r}.")
        missing = [f for f in features if f not in names]
        if missing:
            raise DataError(f"{fmt} {where} has no column(s) {_list([repr(m) for m in missing])} named in "
                            f"`features`; its columns: {listed}.")
        clash = [f for f in features if f in (target, cid_col)]
        if clash:
            raise ConfigError(f"`features` of data set {name!r} names {clash[0]!r}, which is the "
                              f"{'target' if clash[0] == target else 'client'} column.")
        if len(set(features)) != len(features):
            raise ConfigError(f"`features` of data set {name!r} names a column twice: {list(features)}.")
        features = list(features)
    col = {n: c for n, c in zip(names, table.columns)}
    x = np.stack([_numeric_column(col[f], f"{fmt} {where}: column {f!r}", table.row) for f in features], axis=1)
    bad = _non_finite_rows(x)
    if bad.size:
        cols = sorted({features[j] for j in np.flatnonzero(~np.isfinite(x[bad]).all(axis=0))})
        raise DataError(f"{fmt} {where}: NaN or Inf in feature column(s) {_list([repr(c) for c in cols])} in "
                        f"{_list([table.row(int(i)) for i in bad])}.")
    a = _Arrays(x=x, y_raw=col[target], row=table.row, y_name=f"target column {target!r}")
    metadata: dict[str, Any] = {"target": target, "features": features}
    if cid_col is not None:
        a.groups, a.client_ids = _groups(col[cid_col], f"{fmt} {where}: client column {cid_col!r}", table.row)
        metadata["client_column"] = cid_col
    return _build(name, fmt, p, where, a, seed, task=task, test_fraction=fraction, standardize=standardize,
                  standardize_target=standardize_target, metadata=metadata)


@register("dataset", "csv")
def csv_table(data_dir: str | None = None, seed: int = 0, *, path: str | None = None, target: str | None = None,
              features: list[str] | None = None, client_column: str | None = None, delimiter: str = ",",
              test_fraction: float | None = None, standardize: bool = True, standardize_target: bool = True,
              task: str = "auto") -> Dataset:
    """A CSV file (UTF-8, a header row of column names, one row per example).

    Args:
      target: the target column (default: the last column that is not the client column).
      features: the feature columns (default: every column but the target and the client column); each must
        hold a number in every row.
      client_column: the column naming each row's client (default ``"client_id"`` when the file has one; ``""``:
        none). Its distinct values, sorted, are the clients of ``partition = "natural"``.
      delimiter: the field separator (one character).
      test_fraction: the seeded test share (default 0.2), drawn within each client when there is a client column.
      standardize, standardize_target, task: see the module docstring.
    """
    p = resolve_path("csv", path)
    if not isinstance(delimiter, str) or len(delimiter) != 1:
        raise ConfigError(f"`delimiter` of data set 'csv' must be one character, found {delimiter!r}.")
    where = _where(p, path)
    _exists(p, where, "CSV file")
    if p.is_dir():
        raise DataError(f"CSV file {where} is a directory; give the path of a .csv file.")
    table = _read_csv(p, where, delimiter)
    return _from_table("csv", "CSV file", p, where, table, seed, target=target, features=features,
                       client_column=client_column, test_fraction=test_fraction, standardize=standardize,
                       standardize_target=standardize_target, task=task)


@register("dataset", "parquet")
def parquet_table(data_dir: str | None = None, seed: int = 0, *, path: str | None = None, target: str | None = None,
                  features: list[str] | None = None, client_column: str | None = None,
                  test_fraction: float | None = None, standardize: bool = True, standardize_target: bool = True,
                  task: str = "auto") -> Dataset:
    """A Parquet file, read with the optional package ``pyarrow``; the options are those of ``csv`` (no
    ``delimiter``), and rows are named by their 0-based index in messages."""
    p = resolve_path("parquet", path)
    where = _where(p, path)
    _exists(p, where, "Parquet file")
    table = _read_parquet(p, where)
    return _from_table("parquet", "Parquet file", p, where, table, seed, target=target, features=features,
                       client_column=client_column, test_fraction=test_fraction, standardize=standardize,
                       standardize_target=standardize_target, task=task)
