"""The DPZV configs use the party learning rates the benchmark's tuning chose (ε = 1), every method was tuned on
the same grid per ε, and the choice is the grid's best (benchmarks/dpzv_lr.json, written by benchmarks/dpzv.py).

An optimum may sit at an edge only where the grid reached its limits (1e-10, 10) and could not grow further: the
record states it (at ε = 0.1 the DP baselines do not learn at any learning rate, so their scores are flat)."""
import json
from pathlib import Path

import pytest

from trustfl.config.load import load_config

REPO = Path(__file__).resolve().parents[2]
RECORD = json.loads((REPO / "benchmarks" / "dpzv_lr.json").read_text())
LIMITS = (1e-10, 10.0)
CONFIGS = {"dpzv": "mnist_dpzv.toml", "vafl": "mnist_vafl.toml", "zoo_vfl": "mnist_zoo_vfl.toml",
           "czofo": "mnist_czofo.toml"}


@pytest.mark.parametrize("method", sorted(CONFIGS))
def test_configs_hold_the_tuned_learning_rate_of_epsilon_1(method):
    cfg = load_config(REPO / "configs" / "dpzv" / CONFIGS[method])
    assert cfg.algorithm == method and cfg.recipe["epsilon"] == 1.0
    assert cfg.client.lr == RECORD["epsilons"]["1.0"]["chosen"][method]


@pytest.mark.parametrize("eps", ["0.1", "1.0", "10.0", "inf"])
def test_every_method_was_tuned_on_one_grid_and_the_best_value_was_chosen(eps):
    tuned = RECORD["epsilons"][eps]
    grid = tuned["grid"]
    assert grid == sorted(grid) and len(grid) >= 7
    for method, scores in tuned["scores"].items():
        assert sorted(map(float, scores)) == grid, method  # the same grid for every method
        best = max(grid, key=lambda lr: scores[repr(lr)])
        assert best == tuned["chosen"][method]
        at_edge = best in (grid[0], grid[-1])
        assert tuned["at_edge"][method] == at_edge
        if at_edge:  # only where the grid could not grow any further
            assert (best == grid[0] and grid[0] / 10 < LIMITS[0]) or (best == grid[-1] and grid[-1] * 10 > LIMITS[1])
