"""``dump_toml`` (tomli-w): what it writes loads back to the same config; what TOML cannot hold is refused by key."""
from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest

from trustfl.config.load import config_from_dict, config_to_dict, dump_toml, load_config
from trustfl.config.schema import Component, ExperimentConfig
from trustfl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "configs").rglob("*.toml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.relative_to(ROOT / "configs").as_posix())
def test_every_shipped_config_round_trips(path, tmp_path):
    cfg = load_config(path)
    text = dump_toml(config_to_dict(cfg))
    (tmp_path / "c.toml").write_text(text)
    again = load_config(tmp_path / "c.toml")
    assert again == cfg
    assert dump_toml(config_to_dict(again)) == text  # the config hash of a resumed run is the same


def test_nested_tables_arrays_of_tables_odd_keys_and_scalars_round_trip():
    data = {
        "name": "quoted \"name\" with ünïcode", "seed": 2 ** 63 - 1, "rounds": 3,
        "model": {"name": "mlp", "hidden": [64, 32]},
        "evaluators": [{"name": "accuracy"}, {"name": "class_accuracy", "classes": [0, 1, 2]}],
        "client_stages": [{"name": "clip", "params with space": {"nested": {"deep": 1.5e-300}}}],
        "data": {"dataset": "digits", "options": {}, "partition": {"name": "dirichlet", "alpha": 0.5}},
        "recipe": {"": 1, "émoji ✓": True, "text": "quoted \"text\"\nwith a newline", "list": [[1, 2], ["x"]],
                   "tuple": (1.0, 2.0)},
    }
    parsed = tomllib.loads(dump_toml(data))
    assert parsed == {**data, "recipe": {**data["recipe"], "tuple": [1.0, 2.0]}}
    cfg = config_from_dict(parsed)
    assert config_from_dict(tomllib.loads(dump_toml(config_to_dict(cfg)))) == cfg


def test_non_finite_floats_are_written_and_refused_on_load():
    text = dump_toml({"client": {"lr": math.inf}, "recipe": {"x": [1.0, -math.inf, math.nan]}})
    parsed = tomllib.loads(text)
    assert parsed["client"]["lr"] == math.inf and math.isnan(parsed["recipe"]["x"][2])
    with pytest.raises(ConfigError, match=r"`client\.lr`"):
        config_from_dict(parsed)


@pytest.mark.parametrize("data, key", [
    ({"a": None}, "`a`"),
    ({"model": {"name": "mlp", "hidden": [64, None]}}, r"`model\.hidden\[1\]`"),
    ({"recipe": {"thing": object()}}, r"`recipe\.thing`"),
])
def test_values_toml_cannot_hold_are_config_errors_naming_the_key(data, key):
    with pytest.raises(ConfigError, match=key):
        dump_toml(data)


def test_a_component_param_of_none_is_refused_by_name():
    cfg = ExperimentConfig(model=Component("mlp", {"hidden": None}))
    with pytest.raises(ConfigError, match=r"`model\.hidden`"):
        dump_toml(config_to_dict(cfg))


def test_a_run_directory_config_loads_back_to_the_run_config(tmp_path):
    from trustfl.experiment import run_experiment

    cfg = config_from_dict({"name": "rt", "rounds": 1, "data": {"dataset": "digits", "num_clients": 3,
                                                                  "options": {"max_train": 120, "max_test": 60}},
                            "model": {"name": "mlp", "hidden": [8]}, "engine": {"checkpoint_every": 0},
                            "evaluators": [{"name": "accuracy"}, {"name": "loss"}]})
    run_experiment(cfg, tmp_path / "run", progress=False)
    assert load_config(tmp_path / "run" / "config.toml") == cfg
