import pytest

from tests.conftest import apply_overrides
from trustfl.config.load import config_from_dict


@pytest.fixture
def vertical_config():
    """A small vertical run on digits: 4 parties of 2 image rows each, 2 rounds of 40 iterations."""

    def make(algorithm: str = "dpzv", **overrides):
        data = {
            "name": "vertical", "algorithm": algorithm, "seed": 1, "rounds": 2,
            "data": {"dataset": "digits", "num_clients": 4},
            "model": {"name": "vertical", "party_hidden": [16], "embedding_dim": 4, "head_hidden": [16]},
            "client": {"lr": 5e-4, "batch_size": 16},
            "server": {"lr": 0.05, "momentum": 0.9},
            "engine": {"kind": "vertical", "iterations_per_round": 40, "checkpoint_every": 0},
            "recipe": {},
        }
        return config_from_dict(apply_overrides(data, overrides))

    return make
