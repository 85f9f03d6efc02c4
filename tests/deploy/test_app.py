"""``trustfl deploy app``: the Flower app directory it writes, and its refusals (one line, exit 2, key named)."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from trustfl.cli import main
from trustfl.config.load import config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_app_directory_holds_the_components_and_the_experiment(tmp_path):
    out = tmp_path / "app"
    assert main(["deploy", "app", str(ROOT / "configs/quickstart.toml"), "--out", str(out),
                 "--set", "data.num_clients=3", "--set", "cohort.size=3", "--set", "rounds=2"]) == 0
    project = tomllib.loads((out / "pyproject.toml").read_text())
    app = project["tool"]["flwr"]["app"]
    assert set(app["components"]) == {"serverapp", "clientapp"}
    for ref in app["components"].values():  # Flower wants `<module>:<attribute>` with the attribute assigned
        module, attr = ref.split(":")
        assert f"\n{attr} = " in (out / (module.replace(".", "/") + ".py")).read_text()
    cfg = config_from_dict(tomllib.loads(app["config"]["trustfl-config"]))
    want = load_config(ROOT / "configs/quickstart.toml", ["data.num_clients=3", "cohort.size=3", "rounds=2"])
    assert cfg == want
    assert Path(app["config"]["run-dir"]).is_absolute() and app["config"]["data-dir"] == ""


@pytest.mark.parametrize("override,key", [
    ('attack={name="sign_flip", num_byzantine=1}', "attack.name"),
    ('engine.kind="async"', "engine.kind"),
    ("client.lr=-1", "client.lr"),
])
def test_an_undeployable_config_is_refused_in_one_line(override, key, tmp_path, capsys):
    code = main(["deploy", "app", str(ROOT / "configs/quickstart.toml"), "--out", str(tmp_path / "app"),
                 "--set", override])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("trustfl: error:") and key in lines[0]
    assert not (tmp_path / "app").exists()


def test_the_command_process_exits_2_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "trustfl", "deploy", "app", str(ROOT / "configs/quickstart.toml"),
                           "--out", str(tmp_path / "app"), "--set", 'engine.kind="async"'],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "engine.kind" in lines[0], proc.stderr


def test_out_that_cannot_hold_the_app_is_refused_in_one_line(tmp_path, capsys):
    config = str(ROOT / "configs/quickstart.toml")
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    foreign = tmp_path / "project"
    foreign.mkdir()
    (foreign / "pyproject.toml").write_text('[project]\nname = "mine"\n')
    for out, fragment in ((a_file, "is a file"), (a_file / "sub", "cannot write the app"),
                          (foreign, "holds a pyproject.toml that is not a trustfl app")):
        assert main(["deploy", "app", config, "--out", str(out)]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("trustfl: error: --out") and fragment in lines[0], lines
    assert a_file.read_text() == "mine" and (foreign / "pyproject.toml").read_text() == '[project]\nname = "mine"\n'


def test_the_app_is_rewritten_in_place_and_named_as_a_python_project(tmp_path):
    out = tmp_path / "app"
    config = str(ROOT / "configs/quickstart.toml")
    assert main(["deploy", "app", config, "--out", str(out), "--set", "rounds=2"]) == 0
    assert main(["deploy", "app", config, "--out", str(out), "--set", "rounds=3",
                 "--set", 'name="My run (v2) ✓"']) == 0  # the app this command wrote may be written again
    project = tomllib.loads((out / "pyproject.toml").read_text())
    assert project["project"]["name"] == "trustfl-my-run-v2"  # PEP 508 names: letters, digits, '-', '.'
    assert tomllib.loads(project["tool"]["flwr"]["app"]["config"]["trustfl-config"])["rounds"] == 3


def test_the_server_app_run_again_writes_beside_its_earlier_runs(tmp_path, monkeypatch):
    """The app's `run-dir` is fixed when the app is written: a second `flwr run` wrote over the first run's
    metrics, model and summary without a word. Each run now takes the first of run, run-2, ... holding no run."""
    pytest.importorskip("flwr")
    from types import SimpleNamespace

    from trustfl.config.load import config_to_dict, dump_toml
    from trustfl.deploy import flower

    written = []

    def fake_run(cfg, transport, out, resume=None, data_dir=None):
        if resume is not None:  # the run config's `resume` continues that run directory
            assert out is None
            written.append(("resume", Path(resume)))
            return SimpleNamespace(run_dir=Path(resume))
        (Path(out) / "config.toml").parent.mkdir(parents=True, exist_ok=True)
        (Path(out) / "config.toml").write_text("")
        written.append(Path(out))
        return SimpleNamespace(run_dir=Path(out))

    monkeypatch.setattr(flower, "run_deployment", fake_run)
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs/quickstart.toml")
    context = SimpleNamespace(run_config={"trustfl-config": dump_toml(config_to_dict(cfg)),
                                          "run-dir": str(tmp_path / "run")})
    (tmp_path / "run-2").mkdir()
    (tmp_path / "run-2" / "summary.json").write_text("{}")  # a run there too: skipped
    for _ in range(3):
        flower._server_main(None, context)
    assert written == [tmp_path / "run", tmp_path / "run-3", tmp_path / "run-4"]
    context.run_config["resume"] = str(tmp_path / "run-3")
    flower._server_main(None, context)
    assert written[-1] == ("resume", tmp_path / "run-3")


def test_a_user_error_in_the_server_app_reaches_flower_as_an_exception(tmp_path, capsys):
    """SystemExit(2) bypassed Flower's handler, which uploads the log and marks the run failed with its reason:
    `flwr run` printed nothing, and the run failed a minute later, "no heartbeat"."""
    pytest.importorskip("flwr")
    from types import SimpleNamespace

    from trustfl.deploy import flower

    context = SimpleNamespace(run_config={"trustfl-config": "rounds = 0\n", "run-dir": str(tmp_path / "run")})
    with pytest.raises(Exception) as info:  # what Flower's `except Exception` catches
        flower._server_main(None, context)
    assert isinstance(info.value, flower.DeploymentRefused) and str(info.value).startswith("trustfl: error: ")
    assert "rounds" in str(info.value) and capsys.readouterr().err.strip() == str(info.value)
