"""Run an experiment in a child process and read its own peak memory (for tests of memory that follows the cohort)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = """import sys
from trustfl.config.load import config_from_dict
from trustfl.experiment import run_experiment
r = run_experiment(config_from_dict({config!r}), sys.argv[1], progress=False, plots=False)
status = open('/proc/self/status').read().split('VmHWM:')[1].split()[0]
print(r.summary['rounds'], r.summary['bytes_up_total'], int(status) / 1024)
"""


def child_env(drop: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    """This process's environment for a child Python that imports trustfl from this checkout: the repository first
    on ``PYTHONPATH``, the caller's own entries kept after it (an environment whose dependencies come through
    ``PYTHONPATH`` still finds them), ``drop`` removed and ``extra`` set."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**env, **extra}


def run_in_child(config: dict[str, Any], run_dir: Path) -> tuple[int, int, float]:
    """``(rounds, bytes_up_total, peak MB)`` of ``run_experiment(config)`` in a fresh Python process.

    The peak is the child's own VmHWM: ``ru_maxrss`` would count the pages of the forked pytest process."""
    out = subprocess.run([sys.executable, "-c", _SCRIPT.format(config=config), str(run_dir)], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    rounds, bytes_up, peak_mb = out.stdout.split()[-3:]
    return int(rounds), int(bytes_up), float(peak_mb)
