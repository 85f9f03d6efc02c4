"""The Robust-HDP configs use the learning rates the benchmark's tuning chose, every method was tuned on the same
grid, and no chosen value sits at an edge of it (benchmarks/robust_hdp_lr.json, written by benchmarks/robust_hdp.py)."""
import json
import statistics
from pathlib import Path

import pytest

from trustfl.config.load import load_config

REPO = Path(__file__).resolve().parents[2]
RECORD = json.loads((REPO / "benchmarks" / "robust_hdp_lr.json").read_text())


@pytest.mark.parametrize("config", ["mnist.toml", "mnist_falsified.toml"])
def test_configs_hold_the_tuned_learning_rates(config):
    lrs = load_config(REPO / "configs" / "robust_hdp" / config).recipe["lrs"]
    assert {m: lrs[m] for m in RECORD["chosen"]} == RECORD["chosen"]


def test_every_method_was_tuned_on_the_same_grid_and_no_optimum_is_at_an_edge():
    grid = RECORD["grid"]
    assert grid == sorted(grid) and len(grid) >= 5
    for method, scores in RECORD["scores"].items():
        assert sorted(scores, key=float) == [f"{lr:g}" for lr in grid], method       # the same grid for everyone
        assert all(len(v) == len(RECORD["seeds"]) for v in scores.values()), method  # every seed at every lr
        best = max(grid, key=lambda lr: statistics.mean(scores[f"{lr:g}"]))
        assert best == RECORD["chosen"][method] and min(grid) < best < max(grid), method
