"""The OpenMP spin limit: set before torch loads libgomp, never over the user's own setting."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from trustfl.core import openmp


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv(openmp.OPT_OUT, raising=False)
    return monkeypatch


def test_sets_the_spin_count_before_torch_is_loaded(clean_env):
    clean_env.delitem(sys.modules, "torch")  # as in a fresh `trustfl` process; restored after the test
    assert openmp.limit_openmp_spin() == f"GOMP_SPINCOUNT={openmp.SPIN_COUNT}"
    assert os.environ["GOMP_SPINCOUNT"] == str(openmp.SPIN_COUNT)


@pytest.mark.parametrize("env,unload_torch,said,left", [
    ({"GOMP_SPINCOUNT": "7"}, True, "GOMP_SPINCOUNT=7", "7"),  # the user's own value
    ({openmp.OPT_OUT: "1"}, True, f"GOMP_SPINCOUNT unset ({openmp.OPT_OUT}=1)", None),
    ({}, False, "GOMP_SPINCOUNT unset (torch was imported first)", None),
], ids=["user value", "opt-out", "torch first"])
def test_leaves_the_user_setting_and_a_loaded_torch_alone(clean_env, env, unload_torch, said, left):
    for key, value in env.items():
        clean_env.setenv(key, value)
    if unload_torch:
        clean_env.delitem(sys.modules, "torch")
    else:
        assert "torch" in sys.modules
    assert openmp.limit_openmp_spin() == said
    assert os.environ.get("GOMP_SPINCOUNT") == left


def test_the_command_sets_it_before_any_command_imports_torch():
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", openmp.OPT_OUT)}
    code = ("import os, sys\n"
            "from trustfl.cli import main\n"
            "assert 'torch' not in sys.modules\n"
            "code = main(['list'])\n"
            "assert 'torch' in sys.modules, 'the command no longer imports torch: pick one that does'\n"
            "print(code, os.environ.get('GOMP_SPINCOUNT'))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-2:] == ["0", str(openmp.SPIN_COUNT)]
