"""Your own data: the ``npz``, ``csv``, ``parquet`` and ``image_folder`` data sets, read from ``data.path``.

This module holds the shared machinery and ``npz``; ``csv`` and ``parquet`` live in
:mod:`trustfl.data.own_tables`, ``image_folder`` in :mod:`trustfl.data.own_images`.

Each loader is registered as ``@register("dataset", name)`` with the signature ``(data_dir, seed, *, path, ...)``
like the built-in sets, so ``data.dataset = "csv"`` with ``data.path = "table.csv"`` (``data.path`` is the loader
option ``path``) and the keys of ``data.options`` reach it through :func:`trustfl.data.datasets.load_dataset`.

* ``npz``: arrays ``x`` (N, ...) and ``y`` (N,) or (N, K), optional ``x_test`` / ``y_test`` and ``client_id`` (N,).
* ``csv`` (``parquet`` with the optional ``pyarrow``): one row per example; the feature columns, a target column
  (``target``, default the last column) and an optional ``client_id`` column (``client_column``).
* ``image_folder``: one sub-folder per class holding PNG/JPEG files, resized to ``size`` with ``channels`` 1 or 3,
  and an optional ``test`` sub-folder laid out the same way.

Targets: integer, boolean or string labels are a classification task (the distinct labels, sorted, become the
class indices 0..K−1; the mapping is ``Dataset.metadata["classes"]`` and is named in ``Dataset.source``);
floating-point targets are a regression task. ``task = "classification" | "regression"`` overrides the guess.

Without test data, a seeded test split of ``test_fraction`` (default 0.2) is drawn: stratified by class for
classification, uniformly for regression, and within each client when the data name their clients (so every
client keeps training rows). ``standardize`` (default true) scales the features with the training split's mean
and standard deviation (per feature for tables and npz, per channel for images); ``standardize_target`` (default
true) does the same for regression targets, as the built-in ``diabetes`` does.

A relative ``path`` is read from the current working directory (the rule of ``plugins``: a config records no
location of its own). Every problem with the files is a :class:`~trustfl.errors.DataError` naming the file and,
where there is one, the array, column, line or image; an invalid option is a :class:`~trustfl.errors.ConfigError`.

Example:
  >>> import tempfile, numpy as np, pathlib
  >>> f = pathlib.Path(tempfile.mkdtemp()) / "d.npz"
  >>> np.savez(f, x=np.arange(20.0).reshape(10, 2), y=np.array([0, 1] * 5))
  >>> ds = npz(path=str(f), seed=0)
  >>> ds.train_x.shape, ds.test_x.shape, ds.num_classes, ds.task
  (torch.Size([8, 2]), torch.Size([2, 2]), 2, 'classification')
"""
from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trustfl.core.checks import is_device
from trustfl.core.paths import looked_up
from trustfl.core.registry import register
from trustfl.core.rng import numpy_rng
from trustfl.data.datasets import TEST_FRACTION, Dataset, _stratified_choice
from trustfl.data.own_targets import _check_features, _encode_targets, _groups, _list
from trustfl.errors import ConfigError, DataError

DEFAULT_CLIENT_COLUMN = "client_id"


# ---------------------------------------------------------------------------------------------------- helpers

def resolve_path(name: str, path: Any) -> Path:
    """``path`` as an absolute path: ``~`` expanded, a relative path taken from the working directory."""
    if path is None or path == "":
        raise ConfigError(f"data set {name!r} reads your own file: set `data.path` to it (a relative path is read "
                          f"from the working directory).")
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"`path` of data set {name!r} must be a string, found {path!r}.")
    p = looked_up(Path(path).expanduser(), f"`data.path` (data set {name!r})")
    return p if p.is_absolute() else Path.cwd() / p


def _where(p: Path, given: Any) -> str:
    """The file as a message names it: the absolute path, and the configured one when that was relative."""
    shown = repr(str(p))
    return shown if Path(str(given)).expanduser().is_absolute() else f"{shown} (data.path {str(given)!r}, read " \
        f"from the working directory)"


def _check_options(name: str, *, test_fraction: Any, standardize: Any, standardize_target: Any = True,
                   task: Any = "auto") -> float | None:
    if test_fraction is not None and (isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float))
                                      or not 0 < test_fraction < 1):
        raise ConfigError(f"`test_fraction` of data set {name!r} must be a number in (0, 1), found "
                          f"{test_fraction!r}.")
    for key, value in (("standardize", standardize), ("standardize_target", standardize_target)):
        if not isinstance(value, bool):
            raise ConfigError(f"`{key}` of data set {name!r} must be true or false, found {value!r}.")
    if task not in ("auto", "classification", "regression"):
        raise ConfigError(f"`task` of data set {name!r} must be \"auto\", \"classification\" or \"regression\", "
                          f"found {task!r}.")
    return None if test_fraction is None else float(test_fraction)


def _split(name: str, where: str, y: np.ndarray, task: str, groups: np.ndarray | None, fraction: float,
           seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) row indices: a seeded ``fraction`` held out, stratified by class for classification,
    drawn within each client when ``groups`` is given (every client keeps at least one training row)."""
    n = y.shape[0]
    rng = numpy_rng(seed, "dataset", name, "split")
    if groups is None:
        pools = [np.arange(n)]
    else:
        order = np.argsort(groups, kind="stable")
        pools = np.split(order, np.cumsum(np.bincount(groups))[:-1])
    chosen: list[np.ndarray] = []
    for pool in pools:
        k = round(fraction * pool.size)
        if groups is not None:
            k = min(k, pool.size - 1)
        if k <= 0:
            continue
        if task == "classification":
            chosen.append(pool[_stratified_choice(y[pool], k, rng)])
        else:
            chosen.append(pool[rng.permutation(pool.size)[:k]])
    test = np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)
    if test.size == 0 or test.size == n:
        per = "" if groups is None else (f" (drawn within each of its {len(pools)} clients, each keeping at "
                                         f"least one training example)")
        raise DataError(f"{where} holds {n} examples: `test_fraction` = {fraction} leaves "
                        f"{'no test' if test.size == 0 else 'no training'} examples{per}; give more examples, "
                        f"another `test_fraction`, or test data of your own.")
    mask = np.ones(n, dtype=bool)
    mask[test] = False
    return np.flatnonzero(mask), test


def _standardize(train: np.ndarray, test: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray,
                                                                                      np.ndarray, np.ndarray]:
    """Both splits scaled with the training split's mean and std over ``axes`` (a constant feature stays 0)."""
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused by the caller (_check_moments)
        mean = train.mean(axis=axes, keepdims=True, dtype=np.float64)
        std = train.std(axis=axes, keepdims=True, dtype=np.float64)
    std = np.where(std > 0, std, 1.0)
    m, sd = mean.astype(train.dtype), std.astype(train.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        return (train - m) / sd, (test - m) / sd, mean, std


def _class_text(classes: list[Any]) -> str:
    if classes == list(range(len(classes))):
        return f"{len(classes)} classes, labels 0..{len(classes) - 1}"
    pairs = [f"{i}={c!r}" for i, c in enumerate(classes)]
    return f"{len(classes)} classes ({_list(pairs, 20)})"


@dataclass
class _Arrays:
    """What a reader found, before the shared steps (targets, split, standardisation)."""

    x: np.ndarray
    y_raw: np.ndarray
    row: Callable[[int], str]
    x_test: np.ndarray | None = None
    y_test_raw: np.ndarray | None = None
    test_row: Callable[[int], str] | None = None
    groups: np.ndarray | None = None
    client_ids: list[Any] | None = None
    y_name: str = "`y`"
    test_name: str = "`y_test`"
    standardize_axes: tuple[int, ...] = (0,)
    class_names: list[Any] | None = None  # labels already 0..K-1: the names of the classes


def _build(name: str, fmt: str, p: Path, where: str, arrays: _Arrays, seed: int, *, task: str,
           test_fraction: float | None, standardize: bool, standardize_target: bool,
           metadata: dict[str, Any]) -> Dataset:
    """The shared last steps of every reader: encode the targets, split, standardise, wrap as a Dataset."""
    a = arrays
    has_test = a.x_test is not None
    if has_test and test_fraction is not None:
        raise ConfigError(f"`test_fraction` of data set {name!r} is set, but {fmt} {where} has its own test data; drop "
                          f"`test_fraction`.")
    raw = a.y_raw if not has_test else _concat_targets(a.y_raw, a.y_test_raw)
    n_train = a.y_raw.shape[0]

    def row(i: int) -> str:
        return a.row(i) if i < n_train else a.test_row(i - n_train)

    if has_test and task == "auto":  # the training labels decide: int `y` with float `y_test` stays classification
        task = _encode_targets(a.y_raw, task, f"{fmt} {where}: {a.y_name}", a.row)[1]
    y_all, task, classes = _encode_targets(raw, task, f"{fmt} {where}: {a.y_name}", row)
    if a.class_names is not None:
        classes = a.class_names
    if has_test and task == "classification":
        unseen = sorted(set(np.unique(y_all[n_train:]).tolist()) - set(np.unique(y_all[:n_train]).tolist()))
        if unseen:
            known = [classes[i] for i in np.unique(y_all[:n_train]).tolist()]
            raise DataError(f"{fmt} {where}: the test labels ({a.test_name}) hold class(es) "
                            f"{_list([repr(classes[i]) for i in unseen])} that the training labels ({a.y_name}) do "
                            f"not have (classes: {_list([repr(c) for c in known], 20)}).")
    if has_test:
        x_tr, x_te, y_tr, y_te = a.x, a.x_test, y_all[:n_train], y_all[n_train:]
        groups = a.groups
    else:
        tr, te = _split(name, f"{fmt} {where}", y_all, task, a.groups, TEST_FRACTION if test_fraction is None
                        else test_fraction, seed)
        x_tr, x_te, y_tr, y_te = a.x[tr], a.x[te], y_all[tr], y_all[te]
        groups = None if a.groups is None else a.groups[tr]
    meta: dict[str, Any] = {"format": fmt, "path": str(p), "task": task, **metadata}
    if standardize:
        x_tr, x_te, mean, std = _standardize(x_tr, x_te, a.standardize_axes)
        _check_moments(mean, std, f"{fmt} {where}", "features", metadata.get("features"))
        meta["feature_mean"], meta["feature_std"] = mean[0], std[0]
    notes = []
    if task == "regression":
        if standardize_target:
            y_tr, y_te, t_mean, t_std = _standardize(y_tr, y_te, (0,))
            _check_moments(t_mean, t_std, f"{fmt} {where}", "targets", _target_name(metadata))
            meta["target_mean"], meta["target_std"] = t_mean[0], t_std[0]
            notes.append("target standardised")
        num_classes, y_dtype = 0, torch.float32
        notes.insert(0, "regression")
    else:
        meta["classes"] = classes
        num_classes, y_dtype = len(classes), torch.int64
        notes.insert(0, _class_text(classes))
    if a.client_ids is not None:
        meta["client_ids"] = a.client_ids
        notes.append(f"{len(a.client_ids)} clients from {metadata.get('client_column', 'client_id')!r} "
                     f"(ids {_list([repr(c) for c in a.client_ids])})")
    notes.append("own test data" if has_test else
                 f"seeded test fraction {TEST_FRACTION if test_fraction is None else test_fraction}")
    notes.append("features standardised on the training split" if standardize else "features not standardised")
    x_tr, x_te = (_as_float32(x, f"{fmt} {where}", "features", metadata.get("features")) for x in (x_tr, x_te))
    if task == "regression":
        y_tr, y_te = (_as_float32(y, f"{fmt} {where}", "targets", _target_name(metadata)) for y in (y_tr, y_te))
    return Dataset(
        name=name,
        train_x=torch.from_numpy(x_tr),
        train_y=torch.from_numpy(np.ascontiguousarray(y_tr)).to(y_dtype),
        test_x=torch.from_numpy(x_te),
        test_y=torch.from_numpy(np.ascontiguousarray(y_te)).to(y_dtype),
        input_shape=tuple(int(s) for s in a.x.shape[1:]), num_classes=num_classes, task=task,
        source=f"{fmt} {p} ({'; '.join(notes)})",
        train_groups=None if groups is None else torch.from_numpy(groups.astype(np.int64)),
        metadata=meta,
    )


def _column_names(bad: np.ndarray, names: Sequence[Any] | None) -> str:
    """The columns flagged in ``bad`` (one flag per column), by name when ``names`` has one per column."""
    columns = np.flatnonzero(bad)
    if names is not None and len(names) == bad.shape[0]:
        return _list([repr(names[c]) for c in columns])
    return _list([str(int(c)) for c in columns])


def _target_name(metadata: dict[str, Any]) -> list[Any] | None:
    return [metadata["target"]] if "target" in metadata else None


def _check_moments(mean: np.ndarray, std: np.ndarray, where: str, what: str, names: Sequence[Any] | None) -> None:
    """Refuse a mean or standard deviation that overflowed float64 (values beyond about 1e154): the standardised
    column would be silently zero or NaN."""
    bad = ~(np.isfinite(mean) & np.isfinite(std)).reshape(-1)
    if bad.any():
        raise DataError(f"{where}: {what} in column(s) {_column_names(bad, names)} are too large to standardise "
                        f"(their mean or standard deviation overflows); rescale them.")


def _as_float32(x: np.ndarray, where: str, what: str, names: Sequence[Any] | None) -> np.ndarray:
    """``x`` as a contiguous float32 array, refusing finite values beyond float32's range (±3.4e38)."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ascontiguousarray(x, dtype=np.float32)
    finite = np.isfinite(out.reshape(out.shape[0], -1)) if out.ndim > 1 else np.isfinite(out)[:, None]
    if not finite.all():
        raise DataError(f"{where}: {what} in column(s) {_column_names(~finite.all(0), names)} are beyond float32's "
                        f"range (±3.4e38); rescale them.")
    return out


def _concat_targets(train: np.ndarray, test: np.ndarray) -> np.ndarray:
    train, test = (a.astype(str) if a.dtype.kind == "S" else a for a in (train, test))
    if train.dtype.kind in "OU" or test.dtype.kind in "OU":
        return np.concatenate([train.astype(object), test.astype(object)])
    return np.concatenate([train, test])


def _exists(p: Path, where: str, what: str) -> None:
    if not p.exists():
        raise DataError(f"{what} {where} does not exist.")
    if is_device(p):  # /dev/zero would be read until memory runs out
        raise DataError(f"{what} {where} is a device, not a file.")


# ------------------------------------------------------------------------------------------------------- npz

NPZ_ARRAYS = ("x", "y", "x_test", "y_test", "client_id")


@register("dataset", "npz")
def npz(data_dir: str | None = None, seed: int = 0, *, path: str | None = None, test_fraction: float | None = None,
        standardize: bool = True, standardize_target: bool = True, task: str = "auto") -> Dataset:
    """A NumPy ``.npz`` archive (``np.savez``): ``x`` (N, ...) and ``y`` (N,) — or (N, K) regression targets —,
    optional ``x_test`` / ``y_test`` (without them a seeded ``test_fraction``, default 0.2, is held out) and an
    optional ``client_id`` (N,) naming the client of every training example (``partition = "natural"``).

    Other arrays are ignored. Features are standardised per element (e.g. per pixel) with ``standardize``.
    ``data_dir`` is unused.
    """
    p = resolve_path("npz", path)
    fraction = _check_options("npz", test_fraction=test_fraction, standardize=standardize,
                              standardize_target=standardize_target, task=task)
    where = _where(p, path)
    _exists(p, where, "npz file")
    if p.is_dir():
        raise DataError(f"npz file {where} is a directory; give the path of an .npz archive.")
    try:
        archive = np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise DataError(f"{where} is not an .npz archive (numpy could not read it: {err}); write it with "
                        f"numpy.savez(path, x=..., y=...).") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataError(f"{where} holds a single array (an .npy file); expected an .npz archive with arrays `x` "
                        f"and `y` (numpy.savez(path, x=..., y=...)).")
    with archive:
        found = sorted(archive.files)
        for key in ("x", "y"):
            if key not in archive.files:
                raise DataError(f"npz file {where} has no array `{key}` (found: {_list(found, 20) or 'none'}); "
                                f"expected `x`, `y` and optionally `x_test`, `y_test`, `client_id`.")
        if ("x_test" in archive.files) != ("y_test" in archive.files):
            given, absent = ("x_test", "y_test") if "x_test" in archive.files else ("y_test", "x_test")
            raise DataError(f"npz file {where} has `{given}` but no `{absent}`; give both or neither.")
        arrays: dict[str, np.ndarray] = {}
        for key in NPZ_ARRAYS:
            if key in archive.files:
                try:
                    arrays[key] = archive[key]
                except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
                    raise DataError(f"npz file {where}: array `{key}` cannot be read ({err}); arrays of Python "
                                    f"objects are not read (save strings as a NumPy string array).") from None
    x, y = arrays["x"], arrays["y"]
    if x.ndim == 0 or y.ndim == 0:
        raise DataError(f"npz file {where}: `x` and `y` must hold one entry per example, found shapes {x.shape} "
                        f"and {y.shape}.")
    if x.ndim == 1:
        x = x[:, None]
    if x.shape[0] != y.shape[0]:
        raise DataError(f"npz file {where}: `x` has {x.shape[0]} examples but `y` has {y.shape[0]}; they must "
                        f"have the same length.")
    if x.shape[0] == 0:
        raise DataError(f"npz file {where}: `x` and `y` are empty.")

    def row(i: int) -> str:
        return f"row {i}"

    x = _check_features(x, f"npz file {where}: `x`", row)
    a = _Arrays(x=x, y_raw=y, row=row)
    if "x_test" in arrays:
        xt, yt = arrays["x_test"], arrays["y_test"]
        if xt.ndim == 1 and x.shape[1:] == (1,):
            xt = xt[:, None]
        if xt.ndim == 0 or tuple(xt.shape[1:]) != tuple(x.shape[1:]):
            raise DataError(f"npz file {where}: `x_test` has shape {xt.shape}; expected (N_test, "
                            f"{', '.join(map(str, x.shape[1:]))}) like `x` {x.shape}.")
        if yt.ndim == 0 or yt.shape[0] != xt.shape[0] or yt.shape[1:] != y.shape[1:]:
            raise DataError(f"npz file {where}: `y_test` has shape {yt.shape}; expected "
                            f"{(xt.shape[0], *y.shape[1:])} to match `x_test` and `y`.")
        if xt.shape[0] == 0:
            raise DataError(f"npz file {where}: `x_test` and `y_test` are empty.")
        a.x_test = _check_features(xt, f"npz file {where}: `x_test`", row)
        a.y_test_raw, a.test_row = yt, lambda i: f"`y_test` row {i}"
    metadata: dict[str, Any] = {}
    if "client_id" in arrays:
        cid = arrays["client_id"]
        if cid.shape != (x.shape[0],):
            raise DataError(f"npz file {where}: `client_id` has shape {cid.shape}; expected ({x.shape[0]},), one "
                            f"client id per row of `x`.")
        a.groups, a.client_ids = _groups(cid, f"npz file {where}: `client_id`", row)
        metadata["client_column"] = "client_id"
    return _build("npz", "npz file", p, where, a, seed, task=task, test_fraction=fraction, standardize=standardize,
                  standardize_target=standardize_target, metadata=metadata)
