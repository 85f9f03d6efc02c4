"""Cached experiment runs for the reproduction scripts: a finished run whose saved config equals the requested one
is read back instead of run again, so re-running a script computes only what is new."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trustfl.config.load import config_to_dict, dump_toml, load_config  # noqa: E402
from trustfl.experiment import run_experiment  # noqa: E402
from trustfl.core.runfiles import read_metrics  # noqa: E402


def run_cached(config: Path, overrides: list[str], run_dir: Path) -> list[dict]:
    """The metrics rows of ``config`` with ``overrides`` (checkpoints off), run in ``run_dir`` or read from it."""
    cfg = load_config(config, overrides + ["engine.checkpoint_every=0"])
    saved = run_dir / "config.toml"
    if (run_dir / "summary.json").is_file() and saved.is_file() and saved.read_text() == dump_toml(config_to_dict(cfg)):
        return read_metrics(run_dir)
    return run_experiment(cfg, run_dir, progress=False).rows
