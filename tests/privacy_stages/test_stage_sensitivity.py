"""A noise stage charges each client for the sensitivity it is given; the run must make its rows that sensitive.

Each config below trained and reported the noise stage's ε (e.g. ε = 0.68 after 2 rounds of z = 8.2) while the
rows it noised were unclipped, clipped to 100, summed with a client's weight or picked by Krum, or while a
``secldp_accounting`` stage charged a step of privacy for noise nobody added (the run trained noiselessly). Each is
refused now before training, naming the stage's key; the shipped clip-then-noise configs still run.
"""
import pytest

from trustfl.config.build import build_federation
from trustfl.errors import ConfigError

CLIP = {"name": "clip_l2", "max_norm": 1.0}
NOISE = {"name": "gaussian_noise", "noise_multiplier": 8.2, "sensitivity": 1.0}
CENTRAL = {"name": "central_gaussian_noise", "noise_multiplier": 8.2, "clip_norm": 1.0}
BUDGET = {"epsilon": 3.0, "delta": 1e-5}


def _cfg(small_config, **overrides):
    return small_config(rounds=2, client__dp=BUDGET, client__momentum=0.0, **overrides)


LOCAL_UNBOUNDED = {
    "no_clip": [NOISE],
    "clip_above_sensitivity": [{**CLIP, "max_norm": 100.0}, NOISE],
    "noise_before_clip": [NOISE, CLIP],
    "momentum_between": [CLIP, {"name": "worker_momentum", "beta": 0.9}, NOISE],
}


@pytest.mark.parametrize("name", sorted(LOCAL_UNBOUNDED))
def test_local_noise_on_rows_not_clipped_to_its_sensitivity_is_refused(small_config, name):
    stages = LOCAL_UNBOUNDED[name]
    index = next(i for i, s in enumerate(stages) if s is NOISE)
    with pytest.raises(ConfigError, match=rf"^`client_stages\[{index}\]` \(gaussian_noise\) charges each client for "
                                          r"sensitivity = 1, but its rows are not clipped"):
        build_federation(_cfg(small_config, client_stages=stages), quiet=True)


@pytest.mark.parametrize("stages", [
    [CLIP, NOISE],
    [{**CLIP, "max_norm": 0.5}, NOISE],  # a tighter clip: the charge is an upper bound
    [CLIP, {"name": "gaussian_noise", "std": 0.1}, NOISE],  # noise between them only adds privacy
    [CLIP, NOISE, {"name": "worker_momentum", "beta": 0.9}],  # after the noise: post-processing
])
def test_local_noise_on_clipped_rows_runs(small_config, stages):
    fed = build_federation(_cfg(small_config, client_stages=stages), quiet=True)
    assert fed.ledger is not None


CENTRAL_BROKEN = {
    "no_clip": ({"client_stages": []},
                "the client chain does not end in clip_l2 with max_norm <= 1 \\(nothing before it\\)"),
    "clip_above": ({"client_stages": [{**CLIP, "max_norm": 50.0}]}, "clip_l2 with max_norm = 50"),
    "clip_then_momentum": ({"client_stages": [CLIP, {"name": "worker_momentum", "beta": 0.9}]},
                           "\\(WorkerMomentum before it\\)"),
    "weighted": ({"server__weighting": "num_samples"}, "`server.weighting` is 'num_samples'"),
    "robust_rule": ({"aggregator": {"name": "cwmed"}}, "`aggregator` is 'cwmed', not the plain mean"),
    "pre_aggregated": ({"pre_aggregators": [{"name": "nnm", "f": 1}]}, "with `pre_aggregators`"),
    "quantized_uplink": ({"compress": {"uplink": {"name": "qsgd", "levels": 4}}}, "`compress.uplink` 'qsgd'"),
    "scaffold_extras": ({"algorithm": "scaffold"}, "send values beside the message"),
}


@pytest.mark.parametrize("name", sorted(CENTRAL_BROKEN))
def test_central_noise_whose_sum_sensitivity_does_not_hold_is_refused(small_config, name):
    extra, why = CENTRAL_BROKEN[name]
    parts = {"client_stages": [CLIP], "server__weighting": "uniform", "server_stages": [CENTRAL], **extra}
    with pytest.raises(ConfigError, match=r"^`server_stages\[0\]` \(central_gaussian_noise\) charges each client "
                                          rf"for sum sensitivity clip_norm = 1, .*{why}"):
        build_federation(_cfg(small_config, **parts), quiet=True)


def test_central_noise_on_the_uniform_mean_of_clipped_messages_runs(small_config):
    fed = build_federation(_cfg(small_config, client_stages=[CLIP, NOISE], server__weighting="uniform",
                                server_stages=[CENTRAL]), quiet=True)
    assert fed.ledger is not None


def test_secldp_accounting_outside_cafcor_is_refused(small_config):
    """It adds no noise: alone it charged ε_step per round and the run trained without noise."""
    with pytest.raises(ConfigError, match=r"^`client_stages\[0\]` \(secldp_accounting\) .* with algorithm 'fedavg' "
                                          r"it would report privacy nobody provides"):
        build_federation(_cfg(small_config, client_stages=[{"name": "secldp_accounting", "step": 0.001}]),
                         quiet=True)
