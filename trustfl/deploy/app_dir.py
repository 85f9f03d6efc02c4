"""``trustfl deploy app CONFIG --out DIR``: a ready Flower app directory for an experiment.

The directory holds ``pyproject.toml`` (the app's components and its run config: the experiment TOML as text,
the run directory, the data directory) and a two-line package whose ``server_app`` and ``client_app`` are
trustfl's (:mod:`trustfl.deploy.flower`). ``flwr run DIR <connection>`` then runs the experiment on the
connected SuperNodes (docs/deployment.md).
"""
from __future__ import annotations

from pathlib import Path

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
    import tomli_w

    from trustfl.config.build import build_federation
    from trustfl.config.load import config_to_dict, dump_toml, load_config
    from trustfl.deploy.checks import check_deployable

    cfg = load_config(config, list(overrides))
    check_deployable(cfg, build_federation(cfg, data_dir=data_dir or None, quiet=True))
    out = Path(out)
    (out / PACKAGE).mkdir(parents=True, exist_ok=True)
    for name, text in _MODULES.items():
        (out / PACKAGE / name).write_text(text)
    project = {
        "project": {"name": f"trustfl-{cfg.name}".replace("_", "-").lower(), "version": "1.0.0",
                    "description": f"trustfl experiment {cfg.name!r} deployed with Flower",
                    "license": "Apache-2.0", "dependencies": []},
        "tool": {"flwr": {"app": {
            "publisher": "trustfl",
            "components": {"serverapp": f"{PACKAGE}.server_app:app", "clientapp": f"{PACKAGE}.client_app:app"},
            "config": {"trustfl-config": dump_toml(config_to_dict(cfg)),
                       "run-dir": run_dir or str((out / "run").resolve()), "data-dir": data_dir},
        }}},
    }
    (out / "pyproject.toml").write_text(tomli_w.dumps(project, multiline_strings=True))
    (out / ".gitignore").write_text("run/\n")
    return out
