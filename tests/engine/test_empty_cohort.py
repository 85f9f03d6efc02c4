"""A round nobody takes part in (a Poisson cohort that draws no client) is a round like any other: the model stays,
the row says ``cohort_size = 0``, and the run goes on, whatever client stages, gradient transforms and executor the
run has. The Gaussian-noise stage crashed there (an IndexError sizing the draws of no row) and SCAFFOLD's round
(a KeyError: an empty cohort's results carried no extras)."""
import pytest
import torch

from trustfl.config.build import build_federation, resolve_engine
from trustfl.config.load import config_from_dict
from trustfl.experiment import run_experiment

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PARTS = {
    "gaussian_noise": {"client_stages": [{"name": "gaussian_noise", "std": 1.0}]},
    "clip_and_noise": {"client_stages": [{"name": "clip_l2", "max_norm": 1.0},
                                         {"name": "gaussian_noise", "noise_multiplier": 1.0, "sensitivity": 1.0}]},
    "worker_momentum": {"client_stages": [{"name": "worker_momentum", "beta": 0.9}]},
    "scaffold": {"algorithm": "scaffold"},
    "scaffold_median_extras": {"algorithm": "scaffold", "server": {"extras": "median"}},
    "scaffold_crafted_extras": {"algorithm": "scaffold",
                                "attack": {"name": "sign_flip", "num_byzantine": 1, "extras": "crafted"}},
    "transforms": {"client": {"steps": 2, "batch_size": 16,
                              "transforms": [{"name": "proximal", "mu": 0.1}, {"name": "momentum"}]}},
    "dp_sgd": {"client": {"steps": 2, "batch_size": 16, "dp": {"mode": "per_example", "noise_multiplier": 1.0}}},
    "central_noise": {"client_stages": [{"name": "clip_l2", "max_norm": 1.0}], "server": {"weighting": "uniform"},
                      "server_stages": [{"name": "central_gaussian_noise", "noise_multiplier": 1.0, "clip_norm": 1.0}]},
}


def _cfg(part: dict, executor: str, rate: float):
    data = {"name": "empty", "seed": 0, "rounds": 2, "data": {"dataset": "digits", "num_clients": 4},
            "model": {"name": "mlp", "hidden": [8]}, "client": {"steps": 2, "batch_size": 16},
            "cohort": {"sampler": "poisson", "rate": rate}, "engine": {"checkpoint_every": 0, "executor": executor}}
    return config_from_dict({**data, **part})


@pytest.mark.parametrize("executor", ["vectorized", "sequential"])
@pytest.mark.parametrize("name", sorted(PARTS))
def test_a_round_without_clients_leaves_the_model_and_goes_on(tmp_path, name, executor):
    cfg = _cfg(PARTS[name], executor, 1e-9)
    empty = run_experiment(cfg, tmp_path / "empty", progress=False, plots=False)
    assert [r["cohort_size"] for r in empty.rows] == [0, 0] and [r["bytes_up"] for r in empty.rows] == [0, 0]
    full = run_experiment(_cfg(PARTS[name], executor, 1.0), tmp_path / "full", progress=False, plots=False)
    assert [r["cohort_size"] for r in full.rows] == [4, 4]  # the same parts move the model when clients come
    assert torch.equal(empty.params, _initial(cfg)) and not torch.equal(empty.params, full.params)


def test_correlated_noise_is_refused_on_a_cohort_that_can_be_empty():
    """Its pair terms cancel only when every client sends: a Poisson cohort, empty or not, is refused when the run
    is built (it ran, and a partial cohort kept the absent clients' pair noise)."""
    from trustfl.errors import ConfigError
    part = {"client_stages": [{"name": "correlated_noise", "sigma_cor": 1.0, "sigma_ind": 0.1}]}
    with pytest.raises(ConfigError, match=r"^`client_stages\[0\]`: correlated_noise's pair terms cancel only when"):
        build_federation(_cfg(part, "vectorized", 1e-9), quiet=True)


def _initial(cfg):
    """The run's starting model: the engine's initial state for ``cfg``."""
    return resolve_engine(cfg).initial_state(build_federation(cfg, quiet=True)).params
