"""``trustfl deploy app CONFIG --out DIR``: a ready Flower app directory for an experiment.

The directory holds ``pyproject.toml`` (the app's components and its run config: the experiment TOML as text,
the run directory, the data directory, a run directory to resume) and a two-line package whose ``server_app``
and ``client_app`` are trustfl's (:mod:`trustfl.deploy.flower`). ``flwr run DIR <connection>`` then runs the
experiment on the connected SuperNodes (docs/deployment.md).
"""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

from trustfl.core.runfiles import check_out_dir
from trustfl.errors import UsageError

PACKAGE = "trustfl_app"
_MODULES = {
    "__init__.py": '"""A trustfl experiment as a Flower app (written by `trustfl deploy app`)."""\n',
    "server_app.py": "from trustfl.deploy import flower\n\napp = flower.server_app\n",
    "client_app.py": "from trustfl.deploy import flower\n\napp = flower.client_app\n",
}


def write_app(config: Path | str, out: Path | str, overrides: list[str] = (), run_dir: str = "",
              data_dir: str = "") -> Path:
    """Check ``config`` (with ``overrides``) can be deployed and write the Flower app into ``out``.

    The configuration is built once here (data set, model, privacy calibration) so that a setting a deployment
    cannot honour is refused now, with its key, and not on the SuperLink.

    Returns:
      ``out``.

    Raises:
      ConfigError: a bad or undeployable configuration (the key is named).
    """
    from trustfl.config.build import build_federation
    from trustfl.config.load import config_to_dict, dump_toml, load_config
    from trustfl.deploy.checks import check_deployable

    cfg = load_config(config, list(overrides))
    check_deployable(cfg, build_federation(cfg, data_dir=data_dir or None, quiet=True))
    out = Path(out)
    _check_out(out)
    try:
        _write(out, cfg.name, dump_toml(config_to_dict(cfg)), run_dir, data_dir)
    except OSError as err:
        raise UsageError(f"--out: cannot write the app into {str(out)!r}: {err.strerror or err}.") from None
    return out


def _check_out(out: Path) -> None:
    """Refuse an ``out`` that is a file, or that holds a ``pyproject.toml`` this command did not write."""
    check_out_dir(out)
    project = out / "pyproject.toml"
    if project.is_file():
        try:
            publisher = tomllib.loads(project.read_text())["tool"]["flwr"]["app"]["publisher"]
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, TypeError):
            publisher = None
        if publisher != "trustfl":
            raise UsageError(f"--out {str(out)!r} holds a pyproject.toml that is not a trustfl app; write the app "
                             f"into another directory.")


def _write(out: Path, name: str, experiment_toml: str, run_dir: str, data_dir: str) -> None:
    import tomli_w

    (out / PACKAGE).mkdir(parents=True, exist_ok=True)
    for module, text in _MODULES.items():
        (out / PACKAGE / module).write_text(text)
    # a Python project name: letters, digits, '-' and '.' (a run name may hold spaces or parentheses)
    project_name = re.sub(r"[^a-z0-9.]+", "-", f"trustfl-{name}".lower()).strip("-.")
    project = {
        "project": {"name": project_name, "version": "1.0.0",
                    "description": f"trustfl experiment {name!r} deployed with Flower",
                    "license": "Apache-2.0", "dependencies": []},
        "tool": {"flwr": {"app": {
            "publisher": "trustfl",
            "components": {"serverapp": f"{PACKAGE}.server_app:app", "clientapp": f"{PACKAGE}.client_app:app"},
            "config": {"trustfl-config": experiment_toml,
                       "run-dir": run_dir or str((out / "run").resolve()), "data-dir": data_dir, "resume": ""},
        }}},
    }
    (out / "pyproject.toml").write_text(tomli_w.dumps(project, multiline_strings=True))
    (out / ".gitignore").write_text("run/\n")
