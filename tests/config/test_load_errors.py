"""Unreadable and inconsistent configs: one ConfigError that names the file or the key path (issue #16)."""
from __future__ import annotations

import dataclasses
import math
import typing
from pathlib import Path

import pytest
import torch

from trustfl.config import schema
from trustfl.config.build import build_federation
from trustfl.config.load import config_from_dict, load_config, parse_override, read_toml
from trustfl.errors import ConfigError

SMALL = 'name = "small"\nrounds = 1\n[data]\nnum_clients = 4\n[model]\nname = "logreg"\n'


def _write(tmp_path: Path, content: bytes | str, name: str = "c.toml") -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


@pytest.mark.parametrize("content, fragments", [
    (b'name = "caf\xe9"\n', ["not UTF-8", "0xe9", "line 1"]),
    (b"rounds = 1\n\xff\xfe\n", ["not UTF-8", "0xff", "line 2"]),
    ('name = "x"\n'.encode("utf-16"), ["binary"]),
    (bytes(range(256)), ["binary"]),
    (b"rounds = = 1\n", ["not valid TOML", "line 1"]),
    (b"rounds = 1\nrounds = 2\n", ["not valid TOML", "defined twice"]),
    (b"[client]\nlr = 0.1\n[client]\nepochs = 2\n", ["not valid TOML", "defined twice"]),
    (b"[data]\nnum_clients = 3\n[data]\n", ["not valid TOML", "defined twice"]),
    (b"v = " + b"[" * 5000 + b"]" * 5000 + b"\n", ["TOML"]),
])
def test_unreadable_file_names_the_file(tmp_path, content, fragments):
    path = _write(tmp_path, content)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert repr(str(path)) in message and "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_directory_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="cannot be looked up: embedded null byte"):
        load_config(str(tmp_path / "a\x00b.toml"))


def test_unreadable_permissions_become_a_config_error(tmp_path, monkeypatch):
    path = _write(tmp_path, SMALL)

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", denied)  # root ignores chmod 000, so simulate it
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "Cannot read config file" in str(err.value) and "Permission denied" in str(err.value)
    assert repr(str(path)) in str(err.value)


def test_byte_order_mark_is_accepted(tmp_path):
    path = _write(tmp_path, b"\xef\xbb\xbf" + SMALL.encode())
    assert load_config(path).rounds == 1
    assert read_toml(path)["name"] == "small"


@pytest.mark.parametrize("text, fragments", [
    ("client.lr", ["KEY=VALUE"]),
    ("=1", ["empty part"]),
    ("client..lr=1", ["empty part"]),
    ("client.lr=", ["has no value"]),
    ("model.hidden=[64,", ["model.hidden", "not a valid TOML value"]),
    ("name=\"open", ["name", "not a valid TOML value"]),
    ("recipe={ mu = ", ["recipe", "not a valid TOML value"]),
    ("client.lr=1\nclient.momentum=0.5", ["client.lr", "more than one"]),
])
def test_bad_override_syntax(text, fragments):
    with pytest.raises(ConfigError) as err:
        parse_override(text)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_override_through_a_scalar_names_the_key(tmp_path):
    path = _write(tmp_path, SMALL)
    with pytest.raises(ConfigError, match="`rounds` is not a table"):
        load_config(path, ["rounds.x=1"])
    with pytest.raises(ConfigError, match="`client.lr` must be a number"):
        load_config(path, ["client.lr=fast"])  # a bare word is a string, refused by type


def _float_fields(cls: type, prefix: str = "") -> list[tuple[str, str]]:
    """(key path, "float" | "list") of every float field of the schema, recursively."""
    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        path = f"{prefix}{f.name}"
        if tp is float:
            out.append((path, "float"))
        elif typing.get_origin(tp) is list and typing.get_args(tp) == (float,):
            out.append((path, "list"))
        elif dataclasses.is_dataclass(tp) and tp is not schema.Component:
            out += _float_fields(tp, path + ".")
    return out


FLOAT_FIELDS = _float_fields(schema.ExperimentConfig)


def _nested(path: str, value) -> dict:
    data: dict = {}
    node = data
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return data


@pytest.mark.parametrize("path, kind", FLOAT_FIELDS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_every_float_field_refuses_non_finite(path, kind, bad):
    value = [1.0, bad] if kind == "list" else bad
    with pytest.raises(ConfigError) as err:
        config_from_dict(_nested(path, value))
    assert f"`{path}{'[1]' if kind == 'list' else ''}`" in str(err.value) and "finite" in str(err.value)


def test_float_fields_are_found():
    paths = {p for p, _ in FLOAT_FIELDS}
    assert {"client.lr", "client.dp.clip", "client.dp.epsilons", "server.tau", "engine.time_limit"} <= paths


@pytest.mark.parametrize("data, path", [
    ({"model": {"name": "mlp", "scale": math.nan}}, "`model.scale`"),
    ({"data": {"partition": {"name": "dirichlet", "alpha": math.inf}}}, "`data.partition.alpha`"),
    ({"recipe": {"mu": -math.inf}}, "`recipe.mu`"),
    ({"client_stages": [{"name": "clip_l2", "max_norm": math.inf}]}, "`client_stages[0].max_norm`"),
    ({"data": {"options": {"max_train": [1, math.nan]}}}, "`data.options.max_train[1]`"),
    ({"rounds": 2 ** 64}, "`rounds`"),
    ({"rounds": 10_000_001}, "`rounds`"),  # per-round plans are laid out at build time (2^31 hung or exhausted memory)
    ({"client": {"dp": {"epsilons": [2 ** 70]}}}, "`client.dp.epsilons[0]`"),
])
def test_non_finite_and_huge_numbers_anywhere(data, path):
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    assert path in str(err.value)


def test_toml_literals_nan_inf_and_overflowing_floats(tmp_path):
    path = _write(tmp_path, SMALL)
    for override, key in (("client.lr=nan", "`client.lr`"), ("client.weight_decay=inf", "`client.weight_decay`"),
                          ("client.dp.noise_multiplier=1e999", "`client.dp.noise_multiplier`"),
                          ("server.tau=-inf", "`server.tau`")):
        with pytest.raises(ConfigError, match="nan and inf are not accepted") as err:
            load_config(path, [override])
        assert key in str(err.value)


def test_unusual_keys_are_quoted_in_messages():
    with pytest.raises(ConfigError, match='Unknown key `""`'):
        config_from_dict({"": 1})
    with pytest.raises(ConfigError, match='Unknown key `data."a b"`'):
        config_from_dict({"data": {"a b": 1}})


def test_non_table_config():
    with pytest.raises(ConfigError, match="table"):
        config_from_dict([1, 2])  # type: ignore[arg-type]


# --- [recipe] keys belong to the algorithm named in `algorithm` --------------------------------------------------

@pytest.mark.parametrize("algorithm, recipe, extra", [
    ("fedavg", {"mu": 0.1}, {}),
    ("fedavg", {"threat_model": "ldp"}, {}),
    ("scaffold", {"mu": 0.1}, {}),
    ("fedprox", {"threat_model": "ldp"}, {}),
    ("cafcor", {"threat_model": "ldp", "epsilon": 5.0, "mu": 0.1}, {"data": {"num_clients": 4}}),
    ("robust_hdp", {"eps_list": "dist1", "mu": 0.1}, {}),
    ("quafl", {"mu": 0.1}, {}),
])
def test_recipe_key_of_another_algorithm_is_refused(algorithm, recipe, extra):
    data = {"algorithm": algorithm, "rounds": 1, "recipe": recipe, "data": {"num_clients": 4},
            "model": {"name": "logreg"}, **extra}
    cfg = config_from_dict(data)
    with pytest.raises(ConfigError) as err:
        build_federation(cfg, quiet=True)
    message = str(err.value)
    foreign = "mu" if "mu" in recipe else "threat_model"  # mu is FedProx's only; threat_model CafCor's only
    assert f"`recipe.{foreign}`" in message
    assert repr(algorithm) in message and "allowed" in message


def test_fedavg_without_recipe_keys_builds():
    cfg = config_from_dict({"rounds": 1, "data": {"num_clients": 4}, "model": {"name": "logreg"}, "recipe": {}})
    assert build_federation(cfg, quiet=True).num_clients == 4


@pytest.mark.parametrize("name", ["", "a/b", "../../outside", "x\x00y", "tab\there", "n" * 101, " lead", "trail ",
                                  ".hidden", "back\\slash", "del\x7f"])
def test_run_name_that_cannot_name_a_directory_is_refused(name):
    # the default run directory is runs/<name>-...: a separator would leave runs/, a NUL or 300 characters crashed
    with pytest.raises(ConfigError, match=r"^`name` must be 1 to 100 characters"):
        config_from_dict({"name": name})


@pytest.mark.parametrize("name", ["n" * 100, "my run (v2)", "é-ü ✓", "a.b"])
def test_run_names_that_fit_a_directory_load(tmp_path, name):
    from trustfl.experiment import default_run_dir

    cfg = config_from_dict({"name": name})
    path = default_run_dir(cfg, tmp_path)
    path.mkdir()
    assert path.parent == tmp_path and path.name.startswith(name + "-")


def test_cohort_larger_than_the_population_is_said(capsys):
    cfg = config_from_dict({"rounds": 1, "data": {"num_clients": 4}, "model": {"name": "logreg"},
                            "cohort": {"sampler": "uniform", "size": 5}})
    fed = build_federation(cfg)
    notice = "NOTICE: `cohort.size` = 5 is more than the 4 clients of `data.num_clients`; every round samples all 4."
    assert fed.info["notice"] == notice and capsys.readouterr().err.strip() == notice
    assert fed.cohort.sample(list(range(4)), torch.Generator().manual_seed(0)) == [0, 1, 2, 3]
    assert "notice" not in build_federation(dataclasses.replace(cfg, cohort=schema.CohortConfig("uniform", 4)),
                                            quiet=True).info


def test_clients_left_empty_by_min_size_0_and_columns_left_to_no_party_are_said(capsys):
    """The partition's and the feature split's notices reach the run's notice and stderr (they were silent)."""
    cfg = config_from_dict({"rounds": 1, "data": {"num_clients": 12, "partition": {
        "name": "dirichlet", "alpha": 0.001, "min_size": 0}}, "model": {"name": "logreg"}})
    fed = build_federation(cfg)
    empty = [i for i, s in enumerate(fed.info["partition"]["sizes"]) if s == 0]
    said = fed.info["partition"]["notice"]
    assert empty and f"clients {', '.join(map(str, empty))} hold no training examples" in said
    assert said in fed.info["notice"] and said in capsys.readouterr().err
    vertical = config_from_dict({"algorithm": "vafl", "rounds": 1, "data": {
        "num_clients": 2, "features": {"name": "columns", "columns": [[0, 1], [5]]}},
        "model": {"name": "vertical", "party_hidden": [4], "embedding_dim": 2, "head_hidden": [4]},
        "client": {"lr": 1e-2, "batch_size": 16}, "engine": {"kind": "vertical"}})
    notice = build_federation(vertical, quiet=True).info["notice"]
    assert "leaves columns 2, 3, 4, 6, 7, … (61 in all) of the 64 features to no party" in notice


@pytest.mark.parametrize("key, value, expected", [
    ("plugins", "x", "`plugins` must be a list of strings, found 'x'."),
    ("evaluators", "acc", "`evaluators` must be a list of components (names or tables), found 'acc'."),
])
def test_list_types_are_named_in_plain_words(key, value, expected):
    with pytest.raises(ConfigError) as err:
        config_from_dict({key: value})
    assert str(err.value) == expected


def test_a_named_pipe_is_refused_instead_of_waiting_for_a_writer(tmp_path):
    """Opening a FIFO with no writer blocked `trustfl validate` for ever."""
    import os
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"is a named pipe, not a file"):
        load_config(fifo)


@pytest.mark.parametrize("dataset, evaluators, name, task", [
    ("diabetes", ["mse", "accuracy"], "accuracy", "regression"),  # it reported accuracy 0.0
    ("diabetes", ["loss", {"name": "class_accuracy", "classes": [0]}], "class_accuracy", "regression"),
    ("digits", ["accuracy", "r2"], "r2", "classification"),  # the message said only "evaluator:" at run time
    ("digits", ["loss", "mae"], "mae", "classification"),
])
def test_an_evaluator_of_the_other_task_is_refused_naming_its_entry(dataset, evaluators, name, task):
    cfg = config_from_dict({"rounds": 1, "data": {"dataset": dataset, "num_clients": 2}, "model": {"name": "logreg"},
                            "evaluators": evaluators})
    with pytest.raises(ConfigError, match=rf"^`evaluators\[1\]` \('{name}'\) measures a .* task, but the data set "
                                          rf"and objective are {task}; use "):
        build_federation(cfg, quiet=True)


@pytest.mark.parametrize("partition", [{"name": "dirichlet", "alpha": 0.1}, {"name": "shards", "labels_per_client": 2},
                                       {"name": "classes_per_client", "classes_per_client": 1},
                                       {"name": "class_groups", "classes": [0]}])
def test_a_partitioner_that_skews_classes_is_refused_on_real_valued_targets(partition):
    """On diabetes' real-valued targets they saw one class and cut a random split, without a word."""
    data = {"rounds": 1, "data": {"dataset": "diabetes", "num_clients": 4, "partition": partition},
            "model": {"name": "logreg"}}
    with pytest.raises(ConfigError, match=rf"^`data.partition` '{partition['name']}' skews the clients' classes, but "
                                          r"the regression targets of 'diabetes' have none"):
        build_federation(config_from_dict(data), quiet=True)
    data["data"]["partition"] = {"name": "quantity_skew", "alpha": 0.5}  # by size: no class needed
    assert build_federation(config_from_dict(data), quiet=True).num_clients == 4


@pytest.mark.parametrize("override, key", [
    ("client.lr=1e308", "`client.lr` must be a number > 0 and <= 3.403e+38"),
    ("client.weight_decay=1e308", "`client.weight_decay` must be a number >= 0 and <= 3.403e+38"),
    ('client.transforms=[{name="proximal", mu=1e308}]', "`mu` must be a number in [0, 3.40282e+38]"),
    ('client.transforms=[{name="weight_decay", weight_decay=1e39}]',
     "`weight_decay` must be a number in [0, 3.40282e+38]"),
])
def test_a_scale_beyond_float32_is_refused_when_the_run_is_built(tmp_path, override, key):
    """Finite but beyond float32's largest value: validate passed, and round 1 raised torch's "value cannot be
    converted to type float without overflow" from the op the value scales."""
    with pytest.raises(ConfigError) as err:
        build_federation(load_config(_write(tmp_path, SMALL), [override]), quiet=True)
    assert key in str(err.value) and "\n" not in str(err.value)
