"""Your own data (issue #18 item 1): npz, csv, parquet and image_folder data sets read from ``data.path``, the
natural partition of a ``client_id`` column, and the DataError of every malformed file."""
from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest
import torch

from trustfl.config.load import config_from_dict, load_config
from trustfl.core.registry import build
from trustfl.data import load_dataset
from trustfl.errors import ConfigError, DataError

Image = pytest.importorskip("PIL.Image")


def _blobs(n: int = 60, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two well separated classes in 3 features."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % 2
    x = rng.normal(size=(n, 3)) + 4.0 * y[:, None]
    return x, y


def _write_csv(path, header, rows, delimiter=","):
    path.write_text("\n".join([delimiter.join(header)] + [delimiter.join(map(str, r)) for r in rows]) + "\n")
    return path


# ------------------------------------------------------------------------------------------------------- npz

def test_npz_with_test_arrays_round_trips(tmp_path):
    x, y = _blobs(40)
    xt, yt = x[:6] + 0.5, y[:6]
    np.savez(tmp_path / "d.npz", x=x, y=y, x_test=xt, y_test=yt)
    ds = load_dataset("npz", path=str(tmp_path / "d.npz"), standardize=False)
    assert ds.task == "classification" and ds.num_classes == 2 and ds.input_shape == (3,)
    assert torch.allclose(ds.train_x, torch.from_numpy(x).float()) and ds.train_y.tolist() == y.tolist()
    assert torch.allclose(ds.test_x, torch.from_numpy(xt).float()) and ds.test_y.tolist() == yt.tolist()
    assert ds.metadata["classes"] == [0, 1] and ds.train_groups is None
    # standardised with the training split's statistics (the test split reuses them)
    std = load_dataset("npz", path=str(tmp_path / "d.npz"))
    assert torch.allclose(std.train_x.mean(0), torch.zeros(3), atol=1e-5)
    mean, sd = x.mean(0), x.std(0)
    assert torch.allclose(std.test_x, torch.from_numpy((xt - mean) / sd).float(), atol=1e-5)
    with pytest.raises(ConfigError, match="test_fraction"):
        load_dataset("npz", path=str(tmp_path / "d.npz"), test_fraction=0.3)


def test_npz_refuses_test_labels_the_training_labels_do_not_have(tmp_path):
    x, y = _blobs(20)
    cases = [(y, np.array(["a", "b"] * 3), r"class\(es\) 'a', 'b' .*classes: '0', '1'"),  # strings vs ints
             (y, y[:6] + 0.5, r"class\(es\) 0.5, 1.5 "),  # int y: float y_test is not a regression task
             (y, np.array([0, 1, 7, 0, 1, 0]), r"class\(es\) 7 .*classes: 0, 1\)")]
    for y_tr, y_te, message in cases:
        np.savez(tmp_path / "d.npz", x=x, y=y_tr, x_test=x[:6], y_test=y_te)
        with pytest.raises(DataError, match=r"d.npz.*test labels \(`y_test`\) hold " + message):
            load_dataset("npz", path=str(tmp_path / "d.npz"))
    np.savez(tmp_path / "d.npz", x=x, y=y, x_test=x[:6], y_test=y[:6].astype(np.float64))  # 0.0, 1.0: classes 0, 1
    ds = load_dataset("npz", path=str(tmp_path / "d.npz"))
    assert ds.task == "classification" and ds.test_y.tolist() == y[:6].tolist()


def test_npz_without_test_arrays_holds_out_a_seeded_stratified_fraction(tmp_path):
    x, y = _blobs(50)
    np.savez(tmp_path / "d.npz", x=x, y=np.where(y == 1, "dog", "cat"))
    ds = load_dataset("npz", path=str(tmp_path / "d.npz"), seed=0)
    assert ds.train_x.shape == (40, 3) and ds.test_x.shape == (10, 3)
    assert ds.metadata["classes"] == ["cat", "dog"] and "0='cat', 1='dog'" in ds.source
    assert torch.bincount(ds.test_y).tolist() == [5, 5]  # stratified
    again = load_dataset("npz", path=str(tmp_path / "d.npz"), seed=0)
    other = load_dataset("npz", path=str(tmp_path / "d.npz"), seed=1)
    assert torch.equal(ds.test_x, again.test_x) and not torch.equal(ds.test_x, other.test_x)
    quarter = load_dataset("npz", path=str(tmp_path / "d.npz"), test_fraction=0.5)
    assert quarter.test_x.shape == (25, 3)


def test_npz_float_targets_are_regression_and_task_overrides_the_guess(tmp_path):
    x, _ = _blobs(30)
    np.savez(tmp_path / "r.npz", x=x, y=x @ np.array([1.0, -2.0, 0.5]))
    ds = load_dataset("npz", path=str(tmp_path / "r.npz"))
    assert ds.task == "regression" and ds.num_classes == 0 and ds.train_y.dtype == torch.float32
    assert abs(float(ds.train_y.mean())) < 1e-5 and ds.metadata["target_std"] > 0
    raw = load_dataset("npz", path=str(tmp_path / "r.npz"), standardize_target=False, standardize=False)
    assert "target_mean" not in raw.metadata and "feature_mean" not in raw.metadata
    np.savez(tmp_path / "c.npz", x=x, y=np.arange(30) % 3 * 1.0)
    assert load_dataset("npz", path=str(tmp_path / "c.npz"), task="classification").num_classes == 3
    assert load_dataset("npz", path=str(tmp_path / "c.npz")).task == "regression"


def test_npz_images_keep_their_shape(tmp_path):
    x = np.random.default_rng(0).integers(0, 255, size=(20, 1, 4, 4)).astype(np.uint8)
    np.savez(tmp_path / "img.npz", x=x, y=np.arange(20) % 2)
    ds = load_dataset("npz", path=str(tmp_path / "img.npz"))
    assert ds.input_shape == (1, 4, 4) and ds.train_x.dtype == torch.float32


# ------------------------------------------------------------------------------------------------------- csv

def test_csv_with_a_client_id_column_gives_the_natural_partition(tmp_path):
    x, y = _blobs(60)
    ids = np.array(["bob", "alice", "carol"])[np.arange(60) % 3]
    rows = [[c, *np.round(r, 4), "yes" if t else "no"] for c, r, t in zip(ids, x, y)]
    _write_csv(tmp_path / "t.csv", ["client_id", "a", "b", "c", "label"], rows)
    ds = load_dataset("csv", path=str(tmp_path / "t.csv"))
    assert ds.input_shape == (3,) and ds.metadata["features"] == ["a", "b", "c"] and ds.metadata["target"] == "label"
    assert ds.metadata["classes"] == ["no", "yes"] and ds.metadata["client_ids"] == ["alice", "bob", "carol"]
    assert ds.train_x.shape[0] + ds.test_x.shape[0] == 60 and ds.test_x.shape[0] == 12
    groups = ds.train_groups.numpy()
    assert np.bincount(groups).tolist() == [16, 16, 16]  # the test share is drawn within each client
    part = build("partitioner", "natural")(ds.train_y.numpy(), 3, np.random.default_rng(0), groups=groups)
    for g, idx in enumerate(part.indices):
        assert np.array_equal(idx, np.flatnonzero(groups == g))
    assert part.summary["sizes"] == [16, 16, 16] and part.summary["partitioner"] == "natural"
    with pytest.raises(ConfigError, match=r"`data.num_clients` = 3"):
        build("partitioner", "natural")(ds.train_y.numpy(), 5, np.random.default_rng(0), groups=groups)


def test_csv_options_pick_the_columns(tmp_path):
    rows = [[i, i % 2, 2.5 * i, i % 3] for i in range(20)]
    _write_csv(tmp_path / "t.csv", ["f1", "label", "price", "shop"], rows, delimiter=";")
    ds = load_dataset("csv", path=str(tmp_path / "t.csv"), delimiter=";", target="label", features=["f1", "price"],
                      client_column="shop", standardize=False)
    assert ds.input_shape == (2,) and ds.num_classes == 2 and ds.metadata["client_ids"] == [0, 1, 2]
    assert sorted(ds.train_x[:, 1].tolist() + ds.test_x[:, 1].tolist()) == [2.5 * i for i in range(20)]
    reg = load_dataset("csv", path=str(tmp_path / "t.csv"), delimiter=";", client_column="")
    assert reg.metadata["target"] == "shop" and reg.train_groups is None and reg.num_classes == 3
    reg = load_dataset("csv", path=str(tmp_path / "t.csv"), delimiter=";", target="price")
    assert reg.task == "regression" and reg.input_shape == (3,)


@pytest.mark.parametrize("task", ["auto", "classification"])
def test_csv_integer_labels_beyond_int64_are_refused_naming_the_file_and_rows(tmp_path, task):
    """They were read as float64: a regression target under "auto", and under "classification" the labels 2**70
    and 2**70 + 1 became one class."""
    labels = [0, 1, 2 ** 70, 2 ** 70 + 1]
    f = _write_csv(tmp_path / "t.csv", ["a", "y"], [[i, labels[i % 4]] for i in range(12)])
    with pytest.raises(DataError, match=r"^CSV file '.*t\.csv': target column 'y' holds integers beyond the int64 "
                                        r"range in line 4, line 5, line 8, line 9, line 12, … \(6 in all\); .*"
                                        r"`task = \"regression\"`"):
        load_dataset("csv", path=str(f), task=task)
    reg = load_dataset("csv", path=str(f), task="regression", standardize_target=False)
    assert reg.task == "regression" and 2.0 ** 70 in reg.train_y.tolist() + reg.test_y.tolist()


# ----------------------------------------------------------------------------------------------- image_folder

def _png(path, value, mode="L", size=(6, 5)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, value).save(path)


def test_image_folder_reads_classes_resizes_and_splits(tmp_path):
    for i in range(3):
        _png(tmp_path / "imgs" / "cat" / f"{i}.png", 10 + i)
        _png(tmp_path / "imgs" / "dog" / f"{i}.PNG", (200, 100 + i, 50), mode="RGB")
    _png(tmp_path / "imgs" / "test" / "dog" / "t.png", 220)
    (tmp_path / "imgs" / "cat" / "notes.txt").write_text("ignored")
    ds = load_dataset("image_folder", path=str(tmp_path / "imgs"), size=[4, 3], standardize=False)
    assert ds.input_shape == (1, 4, 3) and ds.train_x.shape == (6, 1, 4, 3) and ds.test_x.shape == (1, 1, 4, 3)
    assert ds.metadata["classes"] == ["cat", "dog"] and ds.num_classes == 2 and "0='cat', 1='dog'" in ds.source
    assert ds.train_y.tolist() == [0, 0, 0, 1, 1, 1] and ds.test_y.tolist() == [1]
    assert abs(float(ds.train_x[0].max()) - 10 / 255) < 1e-6 and abs(float(ds.test_x.max()) - 220 / 255) < 1e-6
    # without a test folder: a seeded stratified test fraction; RGB; one int for a square size
    for i in range(5):
        _png(tmp_path / "flat" / "a" / f"{i}.jpg", (i, 0, 0), mode="RGB")
        _png(tmp_path / "flat" / "b" / f"{i}.png", (0, 0, 250 - i), mode="RGB")
    rgb = load_dataset("image_folder", path=str(tmp_path / "flat"), channels=3, size=8)
    assert rgb.train_x.shape == (8, 3, 8, 8) and rgb.test_x.shape == (2, 3, 8, 8)
    assert torch.bincount(rgb.test_y).tolist() == [1, 1]
    assert torch.allclose(rgb.train_x.mean((0, 2, 3)), torch.zeros(3), atol=1e-5)  # per-channel standardisation


# ------------------------------------------------------------------------------------------- malformed files

def _case(tmp_path, kind):
    """Write the malformed input ``kind``; return (dataset, options)."""
    f = tmp_path / "bad"
    x, y = _blobs(10)
    if kind == "missing":
        return "csv", {"path": str(tmp_path / "nope.csv")}
    if kind == "not_npz":
        f.write_text("x,y\n1,2\n")
        return "npz", {"path": str(f)}
    if kind == "npy":
        np.save(tmp_path / "a.npy", x)
        return "npz", {"path": str(tmp_path / "a.npy")}
    if kind == "no_y":
        np.savez(tmp_path / "a.npz", x=x, labels=y)
        return "npz", {"path": str(tmp_path / "a.npz")}
    if kind == "length":
        np.savez(tmp_path / "a.npz", x=x, y=y[:7])
        return "npz", {"path": str(tmp_path / "a.npz")}
    if kind == "half_test":
        np.savez(tmp_path / "a.npz", x=x, y=y, x_test=x)
        return "npz", {"path": str(tmp_path / "a.npz")}
    if kind == "npz_nan":
        x[[2, 7], 1] = np.nan
        np.savez(tmp_path / "a.npz", x=x, y=y)
        return "npz", {"path": str(tmp_path / "a.npz")}
    if kind == "text_feature":
        _write_csv(f, ["a", "colour", "y"], [[1, 2, 0], [2, "red", 1], [3, 4, 0]])
        return "csv", {"path": str(f)}
    if kind == "csv_nan":
        _write_csv(f, ["a", "b", "y"], [[1, 2, 0], [2, "nan", 1], [3, 4, 0], [4, "inf", 1]])
        return "csv", {"path": str(f)}
    if kind == "fields":
        _write_csv(f, ["a", "b", "y"], [[1, 2, 0], [2, 3]])
        return "csv", {"path": str(f)}
    if kind == "target":
        _write_csv(f, ["a", "b", "y"], [[1, 2, 0], [2, 3, 1]])
        return "csv", {"path": str(f), "target": "label"}
    if kind == "empty_csv":
        f.write_text("")
        return "csv", {"path": str(f)}
    if kind == "empty_class":
        _png(tmp_path / "imgs" / "cat" / "0.png", 1)
        (tmp_path / "imgs" / "dog").mkdir()
        return "image_folder", {"path": str(tmp_path / "imgs")}
    if kind == "bad_image":
        _png(tmp_path / "imgs" / "cat" / "0.png", 1)
        (tmp_path / "imgs" / "cat" / "1.png").write_bytes(b"not a png")
        return "image_folder", {"path": str(tmp_path / "imgs")}
    if kind == "csv_too_large_to_standardise":  # x² overflows float64: the column would be silently 0 or NaN
        _write_csv(f, ["a", "b", "y"], [[1, 2e200, 0], [2, -1e200, 1], [3, 5, 0], [4, 1, 1]])
        return "csv", {"path": str(f)}
    if kind == "csv_beyond_float32":
        _write_csv(f, ["a", "b", "y"], [[1, 2e39, 0], [2, 1, 1], [3, 5, 0], [4, 1, 1]])
        return "csv", {"path": str(f), "standardize": False}
    if kind == "npz_target_beyond_float32":
        np.savez(tmp_path / "a.npz", x=x, y=np.linspace(0, 1e39, 10))
        return "npz", {"path": str(tmp_path / "a.npz"), "standardize_target": False}
    raise AssertionError(kind)


@pytest.mark.parametrize("kind, message", [
    ("missing", r"CSV file '.*nope\.csv' does not exist"),
    ("not_npz", r"'.*bad' is not an \.npz archive"),
    ("npy", r"a\.npy' holds a single array"),
    ("no_y", r"a\.npz' has no array `y` \(found: labels, x\)"),
    ("length", r"`x` has 10 examples but `y` has 7"),
    ("half_test", r"has `x_test` but no `y_test`"),
    ("npz_nan", r"`x` holds NaN or Inf in row 2, row 7"),
    ("text_feature", r"bad': column 'colour' must be numeric: line 3 holds 'red'"),
    ("csv_nan", r"NaN or Inf in feature column\(s\) 'b' in line 3, line 5"),
    ("fields", r"bad', line 3: 2 fields, but the header has 3 columns"),
    ("target", r"bad' has no target column 'label' \(`target`\); its columns: 'a', 'b', 'y'"),
    ("empty_csv", r"bad' is empty"),
    ("empty_class", r"class folder '.*dog' holds no images"),
    ("bad_image", r"cannot read image '.*1\.png'"),
    ("csv_too_large_to_standardise", r"bad': features in column\(s\) 'b' are too large to standardise"),
    ("csv_beyond_float32", r"bad': features in column\(s\) 'b' are beyond float32's range"),
    ("npz_target_beyond_float32", r"a\.npz': targets in column\(s\) 0 are beyond float32's range"),
])
def test_malformed_files_are_data_errors_naming_the_problem(tmp_path, kind, message):
    name, options = _case(tmp_path, kind)
    with pytest.raises(DataError, match=message):
        load_dataset(name, **options)


def test_bad_options_are_config_errors(tmp_path):
    x, y = _blobs(10)
    np.savez(tmp_path / "a.npz", x=x, y=y)
    with pytest.raises(ConfigError, match="set `data.path`"):
        load_dataset("npz")
    with pytest.raises(ConfigError, match="test_fraction"):
        load_dataset("npz", path=str(tmp_path / "a.npz"), test_fraction=1.5)
    with pytest.raises(ConfigError, match="channels"):
        load_dataset("image_folder", path=str(tmp_path), channels=2)
    with pytest.raises(ConfigError, match="`data.path` is not used"):
        load_dataset("digits", path=str(tmp_path / "a.npz"))


# ----------------------------------------------------------------------------------------------------- parquet

def test_parquet_without_pyarrow_names_the_missing_package(tmp_path, monkeypatch):
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # an import of pyarrow now fails, installed or not
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match=r"needs the optional package `pyarrow`.*pip install pyarrow"):
        load_dataset("parquet", path=str(tmp_path / "t.parquet"))


def test_parquet_columns_follow_the_csv_rules(tmp_path, monkeypatch):
    """A stand-in for pyarrow (not a dependency): the reader's handling of typed columns and nulls."""

    class Column:
        def __init__(self, values):
            self.values, self.null_count = values, sum(v is None for v in values)

        def to_numpy(self, zero_copy_only=True):
            return np.array(self.values)

        def to_pylist(self):
            return list(self.values)

    class Table:
        def __init__(self, cols):
            self.column_names, self.cols = list(cols), [Column(v) for v in cols.values()]
            self.num_rows = len(self.cols[0].values)

        def column(self, i):
            return self.cols[i]

    tables = {
        "ok": {"client_id": [1, 2, 1, 2] * 5, "a": [float(i) for i in range(20)], "y": ["u", "v"] * 10},
        "null": {"a": [1.0, None, 3.0, 4.0], "y": [0, 1, 0, 1]},
    }
    pq = types.ModuleType("pyarrow.parquet")
    pq.read_table = lambda p: Table(tables[p.stem])
    monkeypatch.setitem(sys.modules, "pyarrow", types.ModuleType("pyarrow"))
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", pq)
    for stem in tables:
        (tmp_path / f"{stem}.parquet").write_bytes(b"PAR1")
    ds = load_dataset("parquet", path=str(tmp_path / "ok.parquet"))
    assert ds.metadata["classes"] == ["u", "v"] and ds.metadata["client_ids"] == [1, 2] and ds.input_shape == (1,)
    with pytest.raises(DataError, match=r"column 'a' must be numeric: row 1 holds no value"):
        load_dataset("parquet", path=str(tmp_path / "null.parquet"))


# --------------------------------------------------------------------------------------------- config, e2e

def test_data_path_reaches_the_loader_and_a_relative_path_is_read_from_the_working_directory(tmp_path,
                                                                                            monkeypatch):
    from trustfl.config.build import build_federation
    cfg = config_from_dict({"data": {"dataset": "csv", "path": "t.csv", "num_clients": 2,
                                     "options": {"target": "y"}}, "model": {"name": "logreg"}})
    assert cfg.data.path == "t.csv" and cfg.data.options == {"target": "y"}
    with pytest.raises(ConfigError, match=r"`data.options.path`"):
        config_from_dict({"data": {"dataset": "csv", "path": "t.csv", "options": {"path": "u.csv"}}})
    x, y = _blobs(20)
    _write_csv(tmp_path / "t.csv", ["a", "b", "c", "y"], [[*r, t] for r, t in zip(x, y)])
    monkeypatch.chdir(tmp_path)
    fed = build_federation(cfg, quiet=True)
    assert str(tmp_path / "t.csv") in str(fed.info["data_source"])
    monkeypatch.chdir(tmp_path.parent)
    with pytest.raises(DataError, match=r"data.path 't.csv', read from the working directory"):
        load_dataset("csv", path="t.csv", target="y")


def test_a_toml_config_trains_on_a_csv_with_its_natural_partition(tmp_path, one_torch_thread):
    from trustfl.experiment import run_experiment

    x, y = _blobs(240, seed=1)
    ids = np.repeat(np.arange(4), 60)
    rows = [[f"site{c}", *np.round(r, 5), "pos" if t else "neg"] for c, r, t in zip(ids, x, y)]
    _write_csv(tmp_path / "sites.csv", ["client_id", "a", "b", "c", "outcome"], rows)
    (tmp_path / "exp.toml").write_text(f"""
name = "own-csv"
rounds = 2

[data]
dataset = "csv"
path = {json.dumps(str(tmp_path / "sites.csv"))}
num_clients = 4
partition = "natural"

[model]
name = "logreg"

[client]
batch_size = 16
lr = 0.1

[engine]
checkpoint_every = 0
executor = "sequential"  # no torch.func start-up cost for 2 tiny rounds
""")
    result = run_experiment(load_config(tmp_path / "exp.toml"), out=tmp_path / "run", progress=False)
    assert result.summary["final_accuracy"] > 0.9  # chance is 0.5
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert info["partition"]["partitioner"] == "natural" and info["partition"]["sizes"] == [48, 48, 48, 48]
    assert "0='neg', 1='pos'" in info["data_source"]
    assert load_config(tmp_path / "run" / "config.toml") == load_config(tmp_path / "exp.toml")
    with pytest.raises(ConfigError, match=r"`data.num_clients` = 4"):
        run_experiment(load_config(tmp_path / "exp.toml", ["data.num_clients=6"]), out=tmp_path / "r2",
                       progress=False)


def test_image_folder_without_pillow_names_the_missing_package(tmp_path, monkeypatch):
    _png(tmp_path / "imgs" / "cat" / "0.png", 1)
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(DataError, match=r"needs the package `Pillow`.*pip install pillow"):
        load_dataset("image_folder", path=str(tmp_path / "imgs"))


def test_image_folder_refuses_a_test_folder_holding_the_training_images(tmp_path):
    for name in ("cat", "dog"):
        for i in range(3):
            _png(tmp_path / "imgs" / name / f"{i}.png", 10 * i)
    root = tmp_path / "imgs"
    for folder in (".", str(root), "..", "cat/.."):
        with pytest.raises(ConfigError, match=r"`data.options.test_folder` = .*training image folder"):
            load_dataset("image_folder", path=str(root), test_folder=folder)
    _png(root / "train" / "cat" / "0.png", 1)
    _png(root / "test" / "cat" / "0.png", 2)
    with pytest.raises(ConfigError, match=r"`data.options.test_folder` = 'train'"):
        load_dataset("image_folder", path=str(root), test_folder="train")


def test_image_folder_refuses_a_test_folder_that_is_not_there(tmp_path):
    for name in ("cat", "dog"):
        for i in range(5):
            _png(tmp_path / "imgs" / name / f"{i}.png", 10 * i)
    with pytest.raises(ConfigError, match=r"`data.options.test_folder` = 'no_such'.*not a folder"):
        load_dataset("image_folder", path=str(tmp_path / "imgs"), test_folder="no_such")
    # the default "test" stays optional, and "" asks for no test folder
    for options in ({}, {"test_folder": ""}):
        ds = load_dataset("image_folder", path=str(tmp_path / "imgs"), **options)
        assert "seeded test fraction" in ds.source
