"""Config loading: every error names the key path, the value found and what is allowed."""
import re

import pytest
import torch

from trustfl.config.build import build_federation
from trustfl.config.load import config_from_dict, config_to_dict, dump_toml, load_config, parse_override
from trustfl.core import registry
from trustfl.errors import ConfigError


@pytest.mark.parametrize("data, fragments", [
    ({"client": {"lrr": 0.1}}, ["`client.lrr`", "allowed keys", "lr"]),
    ({"bogus": 1}, ["`bogus`"]),
    ({"client": {"lr": "fast"}}, ["`client.lr`", "a number", "'fast'"]),
    ({"rounds": 2.5}, ["`rounds`", "an integer", "2.5"]),
    ({"client": {"lr": -1.0}}, ["`client.lr`", "> 0", "-1.0"]),
    ({"client": {"momentum": 1.5}}, ["`client.momentum`", "[0, 1)", "1.5"]),
    ({"engine": {"executor": "gpu"}}, ["`engine.executor`", "'vectorized'", "'gpu'"]),
    ({"client": {"dp": {"delta": 2.0}}}, ["`client.dp.delta`", "(0, 1)", "2.0"]),
    ({"cohort": {"sampler": "uniform", "size": 0}}, ["`cohort.size`", "0"]),
])
def test_schema_errors_name_the_key_path(data, fragments):
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    for fragment in fragments:
        assert fragment in str(err.value)


@pytest.mark.parametrize("data, fragments", [
    ({"aggregator": {"name": "krumm"}}, ["`aggregator.name`", "krumm", "mean"]),
    ({"data": {"partition": {"name": "dirichlet", "alpha": -1.0}}}, ["`data.partition`", "alpha", "-1.0"]),
    ({"data": {"partition": {"name": "dirichlet", "beta": 1.0}}}, ["`data.partition.beta`", "alpha"]),
    ({"model": {"name": "mlp", "hidden": [0]}}, ["`model`", "hidden"]),
    ({"model": {"name": "mlp", "width": 3}}, ["`model`", "width"]),
    ({"model": {"name": "mlp", "hidden": 10}}, ["`model.hidden`", "found 10", "[10]"]),
    ({"model": {"name": "mlp", "hidden": [True]}}, ["`model.hidden`", "[True]"]),
])
def test_component_errors_name_the_key_path_before_training(data, fragments):
    cfg = config_from_dict({"data": {"dataset": "digits", "num_clients": 4}, **data} if "data" not in data
                           else {**data, "data": {"dataset": "digits", "num_clients": 4, **data["data"]}})
    with pytest.raises(ConfigError) as err:
        build_federation(cfg, quiet=True)
    for fragment in fragments:
        assert fragment in str(err.value)


class _MetaLayers(torch.nn.Module):
    """A model whose layers its author put on the meta device (shapes only)."""

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.fc = torch.nn.Linear(64, num_classes, device="meta")
        self.norm = torch.nn.LayerNorm(num_classes, device="meta")  # a layer build_model does not re-draw

    def forward(self, x):
        return self.norm(self.fc(x.flatten(1)))


def test_a_model_or_a_default_device_on_meta_is_refused_naming_it(monkeypatch):
    """A model left on the meta device failed with torch's NotImplementedError "Cannot copy out of meta tensor", and
    a build inside ``with torch.device("meta")`` with a TypeError (a meta tensor cannot become a numpy array)."""
    monkeypatch.setitem(registry._REGISTRY.setdefault("model", {}), "_test_meta", _MetaLayers)
    base = {"data": {"dataset": "digits", "num_clients": 4}, "model": {"name": "logreg"}}
    with pytest.raises(ConfigError, match=r"^`model` \('_test_meta'\): its tensor 'fc.weight' is on the meta device "
                                          r"\(a shape without values\)"):
        build_federation(config_from_dict({**base, "model": {"name": "_test_meta"}}), quiet=True)
    with torch.device("meta"), pytest.raises(ConfigError, match=r"^build_federation: torch's default device is 'meta'"):
        build_federation(config_from_dict(base), quiet=True)


def test_overrides_and_round_trip(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('rounds = 3\n[client]\nlr = 0.1\n')
    cfg = load_config(path, ["client.lr=0.5", "aggregator.name=cwmed", "data.dataset=breast_cancer"])
    assert cfg.client.lr == 0.5 and cfg.aggregator.name == "cwmed" and cfg.data.dataset == "breast_cancer"
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    (tmp_path / "d.toml").write_text(dump_toml(config_to_dict(cfg)))
    assert load_config(tmp_path / "d.toml") == cfg


@pytest.mark.parametrize("word", ["nan", "inf", "-inf", "+nan"])
def test_a_bare_nan_or_inf_override_is_a_word(tmp_path, word):
    """Bare words are strings, TOML's non-finite floats too: ``--set attack.name=nan`` picks the attack that
    sends NaN (it was read as a float and refused as "must be a finite number"); a number key says it wants one."""
    assert parse_override(f"attack.name={word}") == (["attack", "name"], word)
    path = tmp_path / "c.toml"
    path.write_text('rounds = 3\n[attack]\nname = "sign_flip"\nnum_byzantine = 1\n')
    assert load_config(path, ["attack.name=nan"]).attack.name == "nan"
    with pytest.raises(ConfigError, match=f"^`client.lr` must be a number, found '{re.escape(word)}' \\(TOML's nan "
                                          "and inf are not accepted\\)\\.$"):
        load_config(path, [f"client.lr={word}"])
    with pytest.raises(ConfigError, match=r"^`client.lr` must be a finite number, found inf"):
        load_config(path, ["client.lr=1e999"])  # a number that overflows is still a number


def test_bad_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("client.lr")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_shipped_configs_are_valid():
    from pathlib import Path
    root = Path(__file__).resolve().parents[2] / "configs"
    files = sorted(root.rglob("*.toml"))
    assert files, "no configs shipped"
    for f in files:
        load_config(f)  # schema-level validation of every shipped config
