"""Data sets: shapes, dtypes, normalisation, split determinism, IDX round trips, missing and corrupt data."""
from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from trustfl.data import Dataset, array_sha256, dataset_available, load_dataset, read_idx, resolve_data_dir, write_idx
from trustfl.data.datasets import EXPECTED_SHA256, IDX_FILES
from trustfl.errors import ConfigError, DataError, RegistryError

REPO = Path(__file__).resolve().parents[2]


def _check_dataset(ds: Dataset, n_train: int, n_test: int, input_shape: tuple[int, ...], num_classes: int) -> None:
    assert ds.train_x.shape == (n_train, *input_shape) and ds.test_x.shape == (n_test, *input_shape)
    assert ds.train_y.shape == (n_train,) and ds.test_y.shape == (n_test,)
    assert ds.train_x.dtype == ds.test_x.dtype == torch.float32
    assert ds.train_y.dtype == ds.test_y.dtype == torch.int64
    assert ds.input_shape == input_shape and ds.num_classes == num_classes
    assert set(ds.train_y.tolist()) == set(range(num_classes)) == set(ds.test_y.tolist())
    assert ds.source


@pytest.mark.parametrize("name,n_train,n_test,dim,classes", [("digits", 1438, 359, 64, 10),
                                                            ("breast_cancer", 455, 114, 30, 2)])
def test_bundled_shapes_and_standardisation(name: str, n_train: int, n_test: int, dim: int, classes: int) -> None:
    ds = load_dataset(name, seed=0)
    _check_dataset(ds, n_train, n_test, (dim,), classes)
    mean, std = ds.train_x.double().mean(0), ds.train_x.double().std(0, unbiased=False)
    assert torch.allclose(mean, torch.zeros(dim, dtype=torch.float64), atol=1e-5)
    varying = std > 0  # digits has constant border pixels, which stay at 0
    assert torch.allclose(std[varying], torch.ones(int(varying.sum()), dtype=torch.float64), atol=1e-4)
    assert torch.all(ds.train_x[:, ~varying] == 0)
    # Stratified: every class's test count is floor or ceil of 20% of its total.
    total = np.bincount(np.concatenate([ds.train_y.numpy(), ds.test_y.numpy()]))
    test = np.bincount(ds.test_y.numpy(), minlength=classes)
    assert np.all(np.abs(test - 0.2 * total) < 1)


def test_test_split_uses_train_statistics() -> None:
    from sklearn.datasets import load_digits

    ds = load_dataset("digits", seed=1)
    raw = load_digits().data / 16.0
    for pixel in (10, 36, 50):
        # Train and test together must be ONE affine image (x − m)/s of the raw column, with (m, s) the
        # training split's statistics (train mean 0 / std 1 is checked above).
        z = np.sort(np.concatenate([ds.train_x[:, pixel].numpy(), ds.test_x[:, pixel].numpy()]).astype(float))
        x = np.sort(raw[:, pixel])
        slope, intercept = np.polyfit(x, z, 1)
        assert np.abs(slope * x + intercept - z).max() < 1e-5
        train_raw_std = 1 / slope  # s, in [0, 1] units since raw pixels were scaled by 1/16
        assert 0 < train_raw_std < 1


def test_split_depends_only_on_seed() -> None:
    a, b, c = load_dataset("digits", seed=7), load_dataset("digits", seed=7), load_dataset("digits", seed=8)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert not torch.equal(a.test_x, c.test_x)
    small = load_dataset("digits", seed=7, max_train=200)
    assert torch.equal(small.test_x, a.test_x) and torch.equal(small.test_y, a.test_y)
    # The subset's rows are rows of the full training split (same normalisation), stratified.
    full_rows = {tuple(r) for r in a.train_x.numpy().round(5).tolist()}
    assert all(tuple(r) in full_rows for r in small.train_x.numpy().round(5).tolist())
    counts = np.bincount(small.train_y.numpy())
    assert counts.sum() == 200 and np.all(np.abs(counts - 200 * np.bincount(a.train_y.numpy()) / 1438) < 1)
    assert torch.equal(small.train_x, load_dataset("digits", seed=7, max_train=200).train_x)


def test_bad_options_and_names() -> None:
    with pytest.raises(ConfigError, match="max_train"):
        load_dataset("digits", max_train=0)
    with pytest.raises(ConfigError, match="max_test"):
        load_dataset("breast_cancer", max_test=10_000)
    with pytest.raises(ConfigError, match="valid options"):
        load_dataset("digits", augment=True)
    with pytest.raises(RegistryError, match="digits"):
        load_dataset("cifar10")


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
def test_idx_round_trip(tmp_path: Path, suffix: str, dtype: type) -> None:
    arr = (np.arange(2 * 3 * 4) - 5).astype(dtype).reshape(2, 3, 4) if dtype != np.uint8 else \
        np.arange(24, dtype=np.uint8).reshape(2, 3, 4) * 10
    path = tmp_path / f"x-idx3{suffix}"
    write_idx(path, arr)
    if suffix:
        assert path.read_bytes()[:2] == b"\x1f\x8b"
    back = read_idx(path)
    assert back.dtype == np.dtype(dtype) and back.shape == arr.shape and np.array_equal(back, arr)
    assert back.flags.writeable and back.dtype.isnative
    assert array_sha256(back) == array_sha256(arr)


def test_idx_header_bytes(tmp_path: Path) -> None:
    path = tmp_path / "labels-idx1-ubyte"
    write_idx(path, np.array([7, 2, 1], dtype=np.uint8))
    assert path.read_bytes() == bytes([0, 0, 0x08, 1, 0, 0, 0, 3, 7, 2, 1])


def test_idx_corrupt_files_raise(tmp_path: Path) -> None:
    good = tmp_path / "good"
    write_idx(good, np.zeros((4, 5), dtype=np.uint8))
    raw = good.read_bytes()
    cases = {
        "truncated": raw[:-1],
        "padded": raw + b"\x00",
        "magic": b"\x01" + raw[1:],
        "typecode": raw[:2] + b"\x07" + raw[3:],
        "short": raw[:3],
        "badgzip": gzip.compress(raw)[:-6],
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(DataError):
            read_idx(path)
    with pytest.raises(DataError, match="does not exist"):
        read_idx(tmp_path / "nothing")


def test_array_sha256_covers_dtype_and_shape() -> None:
    a = np.arange(6, dtype=np.uint8)
    assert array_sha256(a) == array_sha256(a.copy())
    assert array_sha256(a) != array_sha256(a.reshape(2, 3))
    assert array_sha256(a) != array_sha256(a.astype(np.int8))
    assert array_sha256(a.astype(">i4")) == array_sha256(a.astype("<i4"))
    assert len(array_sha256(a)) == 64


def test_missing_mnist_names_make_data(tmp_path: Path) -> None:
    assert not dataset_available("mnist", data_dir=str(tmp_path))
    with pytest.raises(DataError) as info:
        load_dataset("mnist", data_dir=str(tmp_path))
    message = str(info.value)
    assert "make data" in message and str(tmp_path / "mnist") in message
    assert dataset_available("digits", data_dir=str(tmp_path))


def test_data_dir_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRUSTFL_DATA", str(tmp_path / "env"))
    assert resolve_data_dir("/explicit") == Path("/explicit")
    assert resolve_data_dir() == tmp_path / "env"
    with pytest.raises(DataError, match="env"):
        load_dataset("fashion_mnist")
    monkeypatch.delenv("TRUSTFL_DATA")
    assert resolve_data_dir() == Path("~/.cache/trustfl").expanduser()


def _write_fake(root: Path, name: str, n_train: int, n_test: int, gz: bool) -> None:
    rng = np.random.default_rng(0)
    folder = root / name
    folder.mkdir(parents=True)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_labels": np.arange(n_train, dtype=np.uint8) % 10,
        "test_images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_labels": np.arange(n_test, dtype=np.uint8) % 10,
    }
    arrays["train_images"][0, 0, :2] = [0, 255]
    for role, arr in arrays.items():
        write_idx(folder / (IDX_FILES[role] + (".gz" if gz else "")), arr)


@pytest.mark.parametrize("name,mean,std,gz", [("mnist", 0.1307, 0.3081, False),
                                              ("fashion_mnist", 0.2860, 0.3530, True)])
def test_idx_loader_on_fake_files(tmp_path: Path, name: str, mean: float, std: float, gz: bool) -> None:
    _write_fake(tmp_path, name, 50, 20, gz)
    assert dataset_available(name, data_dir=str(tmp_path))
    ds = load_dataset(name, data_dir=str(tmp_path), verify=False)
    _check_dataset(ds, 50, 20, (1, 28, 28), 10)
    assert ds.train_x[0, 0, 0, 0].item() == pytest.approx((0 - mean) / std, abs=1e-6)
    assert ds.train_x[0, 0, 0, 1].item() == pytest.approx((1 - mean) / std, abs=1e-6)
    sub = load_dataset(name, data_dir=str(tmp_path), seed=3, max_train=20, max_test=10, verify=False)
    assert sub.train_x.shape == (20, 1, 28, 28) and np.all(np.bincount(sub.train_y.numpy()) == 2)
    # Loads share the cached arrays but return fresh tensors.
    ds.train_x.zero_()
    assert load_dataset(name, data_dir=str(tmp_path), verify=False).train_x.abs().sum() > 0
    with pytest.raises(DataError, match="SHA-256"):
        load_dataset(name, data_dir=str(tmp_path))


def _fetch_script():
    spec = importlib.util.spec_from_file_location("fetch_data", REPO / "scripts" / "fetch_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fetch_script_hashes_match_loader(tmp_path: Path) -> None:
    script = _fetch_script()
    assert script.EXPECTED_SHA256 == EXPECTED_SHA256
    assert script.existing_files(tmp_path / "mnist") is None


@pytest.mark.parametrize("name,counts0", [("mnist", 5923), ("fashion_mnist", 6000)])
def test_real_idx_datasets(name: str, counts0: int) -> None:
    if not dataset_available(name):
        pytest.skip(f"{name} not in {resolve_data_dir()}; run `make data`")
    ds = load_dataset(name)
    _check_dataset(ds, 60_000, 10_000, (1, 28, 28), 10)
    assert np.bincount(ds.train_y.numpy())[0] == counts0
    assert abs(ds.train_x.mean().item()) < 1e-3 and abs(ds.train_x.std().item() - 1) < 1e-3
    small = load_dataset(name, seed=1, max_train=1000, max_test=500)
    assert small.train_x.shape[0] == 1000 and small.test_x.shape[0] == 500
    json.dumps(small.source)
