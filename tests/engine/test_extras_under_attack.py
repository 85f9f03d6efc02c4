"""What update-level Byzantine clients send beside the message (SCAFFOLD's control-variate deltas), and the server's
defence. Crafted clients used to send zero extras only, so a simulated attack never touched SCAFFOLD's control
variate, while a real Byzantine node can (tests/deploy/test_protocol.py). ``attack.extras = "crafted"`` applies the
attack to the honest clients' extras too; ``server.extras = "median"`` takes their coordinate-wise median before
SCAFFOLD's server half averages them."""
import pytest

from trustfl.config.load import config_from_dict
from trustfl.errors import ConfigError
from trustfl.experiment import run_experiment

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cfg(**over):
    data = {"name": "extras", "seed": 0, "rounds": 6, "data": {"dataset": "digits", "num_clients": 10},
            "model": {"name": "mlp", "hidden": [64]}, "client": {"lr": 0.1, "batch_size": 32,
                                                               "transforms": [{"name": "scaffold"}]},
            "cohort": {"sampler": "all"}, "aggregator": {"name": "cwtm", "f": 2},
            "attack": {"name": "foe", "num_byzantine": 2}, "engine": {"checkpoint_every": 0}, "server": {}}
    for key, value in over.items():
        table, name = key.split("__")
        data[table] = {**data[table], name: value}
    return config_from_dict(data)


def _final(cfg, path):
    return run_experiment(cfg, path, progress=False, plots=False).rows[-1]["accuracy"]


def test_crafted_extras_hurt_scaffold_and_the_median_of_extras_defends(tmp_path):
    """FOE on 2 of 10 clients against a trimmed mean: with zero extras it barely hurts; crafted extras drag the
    control variate and the accuracy down by over 5 points; the median of the extras gives them back."""
    zero = _final(_cfg(), tmp_path / "zero")
    crafted = _final(_cfg(attack__extras="crafted"), tmp_path / "crafted")
    defended = _final(_cfg(attack__extras="crafted", server__extras="median"), tmp_path / "defended")
    assert crafted < zero - 0.05
    assert defended > crafted + 0.05


@pytest.mark.parametrize("key, value", [("attack__extras", "crafted"), ("server__extras", "median")])
def test_an_extras_setting_without_a_transform_sending_extras_is_refused(tmp_path, key, value):
    cfg = _cfg(**{key: value, "client__transforms": []})
    name = key.replace("__", ".")
    with pytest.raises(ConfigError, match=f"^`{name}` = '{value}' does nothing: no gradient transform"):
        run_experiment(cfg, tmp_path / "run", progress=False, plots=False)
