"""examples/custom runs from its TOML (own data written by the example, a model by import path, a registered
aggregator), and import paths work for models and objectives."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trustfl.config.load import load_config
from trustfl.errors import ConfigError
from trustfl.experiment import run_experiment

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "custom"


def _write_data(path: Path) -> None:
    spec = importlib.util.spec_from_file_location("make_data", EXAMPLE / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write(path)


@pytest.mark.slow
def test_the_custom_example_trains_against_a_byzantine_site(tmp_path, monkeypatch, one_torch_thread):
    _write_data(tmp_path / "sensors.csv")
    monkeypatch.chdir(REPO)  # the config's plugin and model paths are relative to the repository root
    cfg = load_config(EXAMPLE / "experiment.toml", [f"data.path={tmp_path / 'sensors.csv'}", "rounds=8"])
    result = run_experiment(cfg, tmp_path / "run", progress=False, plots=False)
    assert result.summary["final_accuracy"] > 0.8                      # 60 % of the rows are "ok": chance is 0.6
    capped = [r["aggregator/capped"] for r in result.rows]
    assert all(c >= 1 for c in capped)                                 # the huge message is scaled down every round
    mean = load_config(EXAMPLE / "experiment.toml", [f"data.path={tmp_path / 'sensors.csv'}", "rounds=8",
                                                     "aggregator={name=\"mean\"}"])
    plain = run_experiment(mean, tmp_path / "mean", progress=False, plots=False)
    assert plain.summary["final_accuracy"] < result.summary["final_accuracy"] - 0.1   # the mean is not robust


MODULE = '''
import torch
from torch import nn

class Net(nn.Module):                      # takes neither input_shape nor num_classes
    def __init__(self, width=8):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))
    def forward(self, x):
        return self.body(x.flatten(1))

def smoothed_ce(outputs, batch, smoothing=0.0):
    return torch.nn.functional.cross_entropy(outputs, batch["y"], reduction="none", label_smoothing=smoothing)
'''


def test_a_model_and_an_objective_by_import_path(tmp_path, monkeypatch, one_torch_thread):
    (tmp_path / "mine.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    overrides = ['model={name="mine.py:Net", width=12}', 'objective={name="mine.py:smoothed_ce", smoothing=0.1}',
                 'evaluators=[{name="accuracy"}]', "rounds=3", "data.num_clients=4", "engine.checkpoint_every=0"]
    cfg = load_config(REPO / "configs" / "quickstart.toml", overrides)
    result = run_experiment(cfg, tmp_path / "run", progress=False, plots=False)
    assert result.summary["final_accuracy"] > 0.5 and result.summary["num_parameters"] == 64 * 12 + 12 + 12 * 10 + 10
    state = torch.load(result.model_path)
    assert state["body.0.weight"].shape == (12, 64)


@pytest.mark.parametrize("name,match", [("nowhere.py:Net", "cannot import"), ("mine.py:Missing", "no attribute"),
                                        ("mine.py:", "import path")])
def test_bad_import_paths_are_one_line_config_errors(tmp_path, monkeypatch, name, match):
    (tmp_path / "mine.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    from trustfl.config.build import build_federation
    cfg = load_config(REPO / "configs" / "quickstart.toml", [f'model={{name="{name}"}}'])
    with pytest.raises(ConfigError, match=match) as err:
        build_federation(cfg, quiet=True)
    assert "model" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("where", ["plugins", "model"])
def test_a_plugin_whose_own_code_raises_is_one_line_naming_it(tmp_path, monkeypatch, where):
    (tmp_path / "broken.py").write_text("import math\n\nvalue = math.sqrt(-1)  # the user's bug\n")
    monkeypatch.chdir(tmp_path)
    from trustfl.config.build import build_federation
    override = 'plugins=["broken.py"]' if where == "plugins" else 'model={name="broken.py:Net"}'
    cfg = load_config(REPO / "configs" / "quickstart.toml", [override])
    with pytest.raises(ConfigError) as err:
        build_federation(cfg, quiet=True)
    message = str(err.value)
    assert "'broken.py'" in message and "raised ValueError: math domain error" in message and "\n" not in message
    assert message.endswith(f"(at {tmp_path / 'broken.py'}, line 3)")
    assert not any(m.startswith("trustfl_plugin_broken") for m in sys.modules)  # a failed import leaves nothing
    with pytest.raises(ConfigError, match=r"`plugins\[0\]` is empty"):
        build_federation(load_config(REPO / "configs" / "quickstart.toml", ['plugins=[""]']), quiet=True)


def test_a_plugin_that_exits_while_imported_is_one_line_naming_it(tmp_path, monkeypatch):
    """``sys.exit(3)`` at a plugin's top level ended `trustfl validate` with exit code 3 and no word."""
    (tmp_path / "leaving.py").write_text("import sys\n\nsys.exit(3)\n")
    monkeypatch.chdir(tmp_path)
    from trustfl.config.build import build_federation
    cfg = load_config(REPO / "configs" / "quickstart.toml", ['plugins=["leaving.py"]'])
    with pytest.raises(ConfigError, match=r"^`plugins\[0\]`: cannot import 'leaving.py': its code raised SystemExit: "
                                          r"3 \(at .*leaving.py, line 3\)$"):
        build_federation(cfg, quiet=True)


def test_the_example_data_script_runs(tmp_path):
    out = subprocess.run([sys.executable, str(EXAMPLE / "make_data.py"), str(tmp_path / "s.csv")],
                         capture_output=True, text=True, check=True)
    lines = (tmp_path / "s.csv").read_text().splitlines()
    assert lines[0] == "site,temp,vibration,current,pressure,status" and len(lines) == 601 and "wrote" in out.stdout


def test_two_plugin_files_of_one_name_are_two_modules(tmp_path):
    """Files were imported once per name (`trustfl_plugin_<stem>`): a second `my_loss.py` in another folder
    silently resolved to the first one imported, and its objects were "not found" or, worse, the first file's."""
    from trustfl.core.registry import import_object
    for folder, value in (("a", 1), ("b", 2)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "my_loss.py").write_text(f"VALUE = {value}\n")
    assert import_object(f"{tmp_path / 'a' / 'my_loss.py'}:VALUE") == 1
    assert import_object(f"{tmp_path / 'b' / 'my_loss.py'}:VALUE") == 2
    assert import_object(f"{tmp_path / 'a' / 'my_loss.py'}:VALUE") == 1  # each imported once
