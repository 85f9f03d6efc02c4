"""Settings that another setting turns off are refused, naming the key, instead of being silently ignored.

``client.dp = { noise_multiplier = 1.0, clip = 1.0 }`` without ``mode`` trained without any noise, with the
same bits as no ``client.dp`` at all; ``engine.time_limit`` in the synchronous engine, ``cohort.size`` without
``sampler = "uniform"`` (every client, every round), ``server.beta1`` with SGD, ``client.epochs`` beside
``client.steps`` and one budget beside another (``epsilon`` beside ``epsilons``) were accepted and did nothing.
REFUSED holds (the override, the key the error names, why); ACCEPTED the same keys where their part runs, at
their defaults, or where the part runs another way that needs no such key.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import apply_overrides
from trustfl.config.build import build_federation
from trustfl.config.inert import check_inert_settings, inert_settings
from trustfl.config.load import config_from_dict, load_config
from trustfl.config.schema import ExperimentConfig
from trustfl.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _cfg(**tables) -> ExperimentConfig:
    data = {"name": "inert", "rounds": 1, "data": {"dataset": "digits", "num_clients": 4},
            "model": {"name": "logreg"}, "engine": {"checkpoint_every": 0}}
    return config_from_dict(apply_overrides(data, tables))


REFUSED = [
    ({"client__dp": {"noise_multiplier": 1.0, "clip": 2.0}}, "client.dp.clip", 'mode` is "off"'),
    ({"client__dp": {"noise_multiplier": 1.0}}, "client.dp.noise_multiplier", 'mode` is "off"'),
    ({"client__dp": {"method": "vmap"}}, "client.dp.method", 'mode` is "off"'),
    ({"client__dp": {"calibration": "rhdp"}}, "client.dp.calibration", 'mode` is "off"'),
    ({"client__dp": {"round_noise_to": 2}}, "client.dp.round_noise_to", 'mode` is "off"'),
    ({"client__dp": {"mode": "per_example", "epsilons": [1.0, 2.0, 3.0, 4.0], "epsilon": 3.0}}, "client.dp.epsilon",
     "`client.dp.epsilons` gives"),
    ({"client__dp": {"mode": "per_example", "epsilons": [1.0, 2.0, 3.0, 4.0], "epsilon_distribution": "dist1"}},
     "client.dp.epsilon_distribution", "`client.dp.epsilons` gives"),
    ({"client__dp": {"mode": "per_example", "epsilon_distribution": "dist1", "epsilon": 3.0}}, "client.dp.epsilon",
     "`client.dp.epsilon_distribution` draws"),
    ({"client": {"batch_sizes": [8, 16], "batch_size": 64}}, "client.batch_size", "`client.batch_sizes` gives"),
    ({"engine__interaction_time": 2.0}, "engine.interaction_time", "no simulated clock"),
    ({"engine__wait_time": 1.0}, "engine.wait_time", "no simulated clock"),
    ({"engine__time_limit": 50.0}, "engine.time_limit", "no simulated clock"),
    ({"cohort": {"sampler": "all", "size": 2}}, "cohort.size", "'all'"),
    ({"cohort": {"sampler": "uniform", "size": 2, "rate": 0.5}}, "cohort.rate", "'uniform'"),
    ({"server": {"beta1": 0.5}}, "server.beta1", '"sgd"'),
    ({"server": {"tau": 0.1}}, "server.tau", '"sgd"'),
    ({"server": {"optimizer": "fedadam", "momentum": 0.9}}, "server.momentum", "'fedadam'"),
    ({"client": {"steps": 3, "epochs": 2}}, "client.epochs", "`client.steps` > 0"),
    ({"engine__schedule": "nonsense"}, "engine.schedule", "no simulated clock"),  # a misspelt name, never looked up
    ({"engine__speed": "deterministic"}, "engine.speed", "no simulated clock"),
    # the polling (QuAFL) and buffered (FedBuff) schedules send the model through `compress.downlink` alone
    ({"engine": {"kind": "async", "schedule": "polling"}, "downlink": [{"name": "cast", "dtype": "float16"}]},
     "downlink", "'polling' schedule"),
    ({"engine": {"kind": "async", "schedule": "buffered"}, "downlink": [{"name": "cast", "dtype": "float16"}]},
     "downlink", "'buffered' schedule"),
    # stragglers' budgets were ignored there: the clock gives each client its steps (models bitwise the same)
    ({"engine": {"kind": "async", "schedule": "polling"}, "client": {"step_budget": {"name": "stragglers"}}},
     "client.step_budget", "'polling' schedule gives each client the steps its clock allows"),
    # and under FedNova's deadline, which gives each client the steps it completes before it
    ({"engine": {"kind": "async", "schedule": {"name": "synchronous", "deadline": 3.0}},
      "client": {"step_budget": {"name": "stragglers"}}}, "client.step_budget", "`deadline` (FedNova)"),
    ({"algorithm": "fednova", "recipe": {"deadline": 3.0}, "client": {"step_budget": {"name": "stragglers"}}},
     "client.step_budget", "`deadline` (FedNova)"),
    ({"compress": {"downlink": {"name": "qsgd_minmax", "levels": 16}}, "downlink": [{"name": "cast"}]}, "downlink",
     "`compress.downlink` encodes the model"),
    # the fallback replaces only a fetched data set: beside your own file it was never used
    ({"data": {"dataset": "npz", "path": "mine.npz", "fallback": "digits"}}, "data.fallback",
     "data set 'npz' reads your own file at `data.path`"),
]

ACCEPTED = [
    {"client__dp": {"mode": "per_example", "noise_multiplier": 1.0, "clip": 2.0, "method": "vmap"}},
    {"client__dp": {"mode": "per_example", "epsilon": 3.0, "calibration": "rhdp", "round_noise_to": 2}},
    {"client__dp": {"mode": "batch_clip", "noise_multiplier": 1.0}},
    {"engine": {"kind": "async", "interaction_time": 2.0, "wait_time": 1.0, "time_limit": 50.0}},
    {"engine__max_clients_per_batch": 2},
    {"cohort": {"sampler": "uniform", "size": 2}},
    {"cohort": {"sampler": "poisson", "rate": 0.5}},
    {"server": {"optimizer": "fedadam", "beta1": 0.5, "tau": 0.1}},
    {"server": {"momentum": 0.9}},
    {"client": {"epochs": 2}},
    {"client": {"batch_sizes": [8, 16]}},
    {"client__dp": {"mode": "per_example", "epsilons": [1.0, 2.0, 3.0, 4.0]}},
    {"client__dp": {"mode": "per_example", "epsilon_distribution": "dist1"}},
    {"client": {"steps": 3}},
    {"data": {"dataset": "mnist", "fallback": "digits"}},
    {"data": {"fallback": "breast_cancer"}},  # a bundled set: a sweep over data sets keeps a config's fallback
    {"attack": {"name": "sign_flip", "num_byzantine": 1, "view": "noiseless", "byzantine_hold_data": False}},
    {"engine__time_limit": 0.0, "cohort": {"sampler": "all", "size": 0}, "client": {"steps": 3, "epochs": 1}},
    # A part that runs another way needing no such key loses nothing: accepted, so that sweeps keep working.
    {"client__dp": {"mode": "batch_clip", "method": "vmap", "noise_multiplier": 1.0}},
    {"client__dp": {"mode": "per_example", "noise_multiplier": 1.0, "round_noise_to": 2}},
    {"engine": {"executor": "sequential", "max_clients_per_batch": 2}},
    {"attack": {"view": "noiseless", "byzantine_hold_data": False}},
    {"engine": {"kind": "async", "schedule": "buffered", "speed": "deterministic"}},
    {"downlink": [{"name": "cast", "dtype": "float16"}]},
    {"engine": {"kind": "async"}, "downlink": [{"name": "cast", "dtype": "float16"}]},  # the synchronous schedule
    {"engine": {"kind": "async", "schedule": {"name": "synchronous", "deadline": 0.0}},
     "client": {"step_budget": {"name": "stragglers"}}},  # no deadline: the budget gives the steps
]


@pytest.mark.parametrize("tables, key, why", REFUSED, ids=[r[1] for r in REFUSED])
def test_a_setting_that_does_nothing_is_refused_by_name(tables, key, why):
    cfg = _cfg(**tables)
    with pytest.raises(ConfigError) as err:
        build_federation(cfg, quiet=True)
    message = str(err.value)
    assert message.startswith(f"`{key}` is set but does nothing: ") and why in message and "\n" not in message
    assert "remove it or set it to its default " in message


@pytest.mark.parametrize("tables", ACCEPTED)
def test_the_same_setting_where_it_acts_or_at_its_default_is_accepted(tables):
    cfg = _cfg(**tables)
    assert inert_settings(cfg) == [] and inert_settings(cfg, as_written=True) == []


def test_a_recipe_that_derives_one_key_from_another_is_not_refused():
    """Robust-HDP turns `client.batch_size` into `client.batch_sizes`: the written config has one, not both."""
    cfg = _cfg(algorithm="robust_hdp", client={"batch_size": 16, "dp": {"epsilons": [1.0, 2.0, 3.0, 4.0]}},
               model={"name": "mlp", "hidden": [8]})
    assert build_federation(cfg, quiet=True).batch_sizes == [16] * 4


def test_every_inert_key_is_named_the_first_leads():
    cfg = _cfg(client__dp={"noise_multiplier": 1.0, "clip": 2.0}, engine__time_limit=5.0, server={"beta1": 0.5})
    assert [(k, d) for k, _, d in inert_settings(cfg)] == [("client.dp.clip", 1.0), ("client.dp.noise_multiplier", 0.0),
                                                          ("engine.time_limit", 0.0), ("server.beta1", 0.9)]
    with pytest.raises(ConfigError, match=r"^`client.dp.clip` .* its default 1.0; also `client.dp.noise_multiplier`, "
                                          r"`engine.time_limit`, `server.beta1`\.$"):
        check_inert_settings(cfg)


def test_noise_without_a_mode_no_longer_trains_without_noise():
    """The reported case, end to end: building refuses it before any data is loaded or anything trains."""
    with pytest.raises(ConfigError, match=r"^`client.dp.noise_multiplier` is set but does nothing"):
        build_federation(_cfg(client__dp={"noise_multiplier": 1.0, "clip": 1.0}), quiet=True)


@pytest.mark.parametrize("dp", [{"epsilon": 3.0}, {"epsilons": [1.0, 2.0, 3.0, 4.0]},
                                {"epsilon_distribution": "dist1"}, {"delta": 1e-6}, {"accountant": "pld"}])
def test_a_budget_where_nothing_is_private_is_refused(dp):
    key = next(iter(dp))
    with pytest.raises(ConfigError, match=rf"^`client.dp.{key}` is set but nothing in this run is private"):
        build_federation(_cfg(client__dp=dp), quiet=True)


def test_a_budget_for_noise_stages_is_kept():
    """Local DP: ``client.dp.epsilon`` with ``mode = "off"`` is the budget of the clip-and-noise client stages."""
    stages = [{"name": "clip_l2", "max_norm": 1.0}, {"name": "gaussian_noise", "noise_multiplier": 8.2,
                                                      "sensitivity": 1.0}]
    fed = build_federation(_cfg(client__dp={"epsilon": 3.0, "delta": 1e-5}, client_stages=stages), quiet=True)
    assert fed.info["privacy"]["mode"] == "stages" and fed.info["privacy"]["epsilon_budget"] == [3.0] * 4


def test_a_vertical_run_refuses_any_client_dp_setting():
    """The vertical engine's privacy is the recipe's; a `client.dp` budget there was ignored."""
    cfg = load_config(ROOT / "configs/dpzv/breast_cancer_dpzv.toml", ["client.dp.epsilon=1.0"])
    with pytest.raises(ConfigError, match=r"^`client.dp` is set, but the vertical engine does not use it"):
        build_federation(cfg, quiet=True)


def test_an_unused_component_is_named_and_its_default_shown_by_name():
    with pytest.raises(ConfigError,
                       match=r'^`engine.schedule` is set but does nothing: .* its default "synchronous"\.$'):
        check_inert_settings(_cfg(engine__schedule="buffered"))


def test_a_vertical_run_refuses_a_speed_model_it_does_not_use():
    """Parties activated in a shuffled order use no speed model; a misspelt one was accepted there."""
    cfg = load_config(ROOT / "configs/dpzv/breast_cancer_dpzv.toml", ["engine.speed='nonsense'"])
    with pytest.raises(ConfigError, match=r"^`engine.speed` is set but does nothing: `engine.activation` is "):
        build_federation(cfg, quiet=True)


def test_a_batch_larger_than_a_client_s_rows_is_said(capsys):
    """Such a client steps on all its rows: said at build time and kept in the summary, not silently capped."""
    fed = build_federation(_cfg(client={"batch_size": 400}), quiet=False)
    note = "NOTICE: 4 of the 4 clients hold fewer rows than their batch size (client 0: "
    assert fed.info["notice"].startswith(note) and note in capsys.readouterr().err
    assert "notice" not in build_federation(_cfg(client={"batch_size": 16}), quiet=False).info


@pytest.mark.parametrize("sampler", ["poisson", "fixed"])
@pytest.mark.parametrize("batch", [{"batch_size": 400}, {"batch_sizes": [16, 400]}])
def test_a_batch_larger_than_a_client_s_rows_is_refused_where_the_sampler_cannot_draw_it(sampler, batch):
    """Poisson and fixed-size sampling draw b of n: validate passed (with the notice above) and the run failed in its
    first round."""
    key = next(iter(batch))
    with pytest.raises(ConfigError, match=rf"^`client\.{key}`: [0-9]+ of the 4 clients hold fewer rows than their "
                                          rf"batch size \(client [0-9]: [0-9]+ rows, batch 400\), which "
                                          rf"batch_sampler '{sampler}' cannot draw; "):
        build_federation(_cfg(client={**batch, "batch_sampler": sampler}), quiet=True)


@pytest.mark.parametrize("schedule, expected", [
    ({"name": "synchronous", "zz_typo": 1}, r"^`engine.schedule.zz_typo` is set but does nothing: .*; remove it\.$"),
    ({"name": "synchronous", "a": 1, "b": 2},
     r"^`engine.schedule.a` is set .*; remove it; also `engine.schedule.b`\.$"),
    ({"name": "buffered", "zz_typo": 1}, r'^`engine.schedule` is set .* its default "synchronous"\.$'),
])
def test_parameters_of_an_unused_default_component_are_named_one_by_one(schedule, expected):
    """A default-named component with a parameter (a typo among them) names that parameter's key path; the
    parameter table alone was named before, hiding which key the user wrote."""
    with pytest.raises(ConfigError, match=expected):
        check_inert_settings(_cfg(engine__schedule=schedule))


@pytest.mark.parametrize("rule, report", [("pfa", "reported_epsilon"), ("weiavg", "reported_epsilon"),
                                          ("oracle", "oracle_noise_variance")])
def test_a_rule_reading_reports_nobody_gives_is_refused_before_training(rule, report):
    """validate passed and the run failed in round 1: only algorithm robust_hdp reports the clients' ε."""
    with pytest.raises(ConfigError, match=rf"^`aggregator`: aggregator '{rule}' reads the clients' report "
                                          rf"'{report}', which this run does not give \(it gives \['num_samples'\]"):
        build_federation(_cfg(aggregator={"name": rule}), quiet=True)
    build_federation(_cfg(aggregator={"name": "dpfedavg"}), quiet=True)  # its report, num_samples, every run gives


def test_label_flipping_is_refused_where_it_poisons_nothing():
    """label_flip beside a self-supervised objective (no label read) ran bitwise as the run without it; with
    attack.byzantine_hold_data = false its clients held no data to flip."""
    cfg = load_config(ROOT / "configs/fedsc/digits_canvas_2class.toml",
                      ['attack={name="label_flip", num_byzantine=1}'])
    with pytest.raises(ConfigError, match=r"^`attack.name`: 'label_flip' poisons class labels, but objective "
                                          r"SpectralContrastive reads no label"):
        build_federation(cfg, quiet=True)
    with pytest.raises(ConfigError, match=r"^`attack.byzantine_hold_data` = false: 'label_flip' poisons the "
                                          r"Byzantine clients' own data, and they would hold none"):
        build_federation(_cfg(attack={"name": "label_flip", "num_byzantine": 1, "byzantine_hold_data": False}),
                         quiet=True)
    build_federation(_cfg(attack={"name": "label_flip", "num_byzantine": 1}), quiet=True)


def test_correlated_noise_needs_every_client_in_every_round():
    """Outside cafcor a partial cohort kept the absent clients' pair terms in the aggregate (accuracy 0.15 against
    0.91 with every client); refused before training."""
    stages = [{"name": "clip_l2", "max_norm": 1.0}, {"name": "correlated_noise", "sigma_cor": 0.5}]
    with pytest.raises(ConfigError, match=r"^`client_stages\[1\]`: correlated_noise's pair terms cancel only when "
                                          r"every client sends .* found 'uniform' and 'sync'"):
        build_federation(_cfg(client_stages=stages, cohort={"sampler": "uniform", "size": 2}), quiet=True)
    build_federation(_cfg(client_stages=stages, cohort={"sampler": "all"}), quiet=True)


def test_component_tables_name_the_missing_or_unknown_key():
    """An unknown attack parameter was reported as `attack.std` (it sits in `attack.params`), and a missing required
    parameter as the factory's "__init__() missing 1 required positional argument"."""
    with pytest.raises(ConfigError, match=r"^Unknown key `attack.params.std` for attack 'gaussian'; allowed: mu, "):
        build_federation(_cfg(attack={"name": "gaussian", "num_byzantine": 1, "params": {"std": 1.0}}), quiet=True)
    with pytest.raises(ConfigError, match=r"^`aggregator.f` is required by aggregator 'krum' \(it takes f\)\.$"):
        build_federation(_cfg(aggregator={"name": "krum"}), quiet=True)


@pytest.mark.parametrize("tables, said", [
    ({"attack": {"view": "noiseless", "byzantine_hold_data": False}},
     ['`attack.view` = "noiseless" does nothing without an attack',
      "`attack.byzantine_hold_data` = false does nothing without an attack"]),
    ({"engine": {"executor": "sequential", "max_clients_per_batch": 2}},
     ["`engine.max_clients_per_batch` does nothing with the sequential executor"]),
    ({"data": {"fallback": "breast_cancer", "data_dir": "/nowhere"}},
     ["`data.fallback` does nothing: 'digits' is bundled, never absent",
      "`data.data_dir` does nothing: 'digits' reads no file"]),
])
def test_a_key_accepted_for_sweeps_but_idle_in_this_run_is_said(tables, said, capsys):
    """Accepted (a sweep that turns their part off keeps working) but no longer silent: a notice names each."""
    fed = build_federation(_cfg(**tables), quiet=False)
    err = capsys.readouterr().err
    for note in said:
        assert f"NOTICE: {note}" in fed.info["notice"] and f"NOTICE: {note}" in err
    where_they_act = {"attack": {"name": "sign_flip", "num_byzantine": 1, "view": "noiseless"},
                      "engine": {"max_clients_per_batch": 2}, "data": {"dataset": "mnist", "fallback": "digits"}}
    acting = build_federation(_cfg(**{k: where_they_act[k] for k in tables}), quiet=True).info
    assert "does nothing" not in acting.get("notice", "")  # (MNIST absent: the fallback's own notice)
