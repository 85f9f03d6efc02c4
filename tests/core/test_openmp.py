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


@pytest.mark.parametrize("case", ["user value", "opt-out", "torch first"])
def test_leaves_the_user_setting_and_a_loaded_torch_alone(clean_env, case):
    if case == "user value":
        clean_env.setenv("GOMP_SPINCOUNT", "7")
        clean_env.delitem(sys.modules, "torch")
        assert openmp.limit_openmp_spin() == "GOMP_SPINCOUNT=7"
        assert os.environ["GOMP_SPINCOUNT"] == "7"
        return
    if case == "opt-out":
        clean_env.setenv(openmp.OPT_OUT, "1")
        clean_env.delitem(sys.modules, "torch")
        assert openmp.limit_openmp_spin() == f"GOMP_SPINCOUNT unset ({openmp.OPT_OUT}=1)"
    else:
        assert "torch" in sys.modules
        assert openmp.limit_openmp_spin() == "GOMP_SPINCOUNT unset (torch was imported first)"
    assert "GOMP_SPINCOUNT" not in os.environ


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
