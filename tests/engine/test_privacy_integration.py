"""Privacy in the engine: budgets enforced before and during training, per-client calibration, reporting."""
import math

import pytest

from trustfl.config.build import build_federation
from trustfl.config.load import load_config
from trustfl.engine.sync import initial_state, run_round
from trustfl.errors import BudgetExceededError
from trustfl.experiment import run_experiment
from trustfl.privacy.accountant import Budget, PrivacyLedger


def test_over_budget_schedule_is_refused_before_training(small_config):
    cfg = small_config(client__dp={"mode": "per_example", "noise_multiplier": 0.3, "epsilon": 1.0})
    with pytest.raises(BudgetExceededError) as err:
        build_federation(cfg, quiet=True)
    msg = str(err.value)
    assert "client" in msg and "over its budget" in msg and "1.0" in msg


def test_stage_placement_over_budget_is_refused(small_config):
    cfg = small_config(client__dp={"epsilon": 1.0},
                       client_stages=[{"name": "clip_l2", "max_norm": 1.0},
                                      {"name": "gaussian_noise", "noise_multiplier": 1.0, "sensitivity": 1.0}])
    with pytest.raises(BudgetExceededError):
        build_federation(cfg, quiet=True)


def test_sample_level_dp_plus_stage_noise_is_checked_as_a_whole(small_config):
    # Sample-level DP calibrated to ε = 2 spends the whole budget; a noise stage on top must be refused up front.
    dp = {"mode": "per_example", "epsilon": 2.0}
    build_federation(small_config(client__dp=dp), quiet=True)
    stages = [{"name": "clip_l2", "max_norm": 1.0},
              {"name": "gaussian_noise", "noise_multiplier": 5.0, "sensitivity": 1.0}]
    with pytest.raises(BudgetExceededError, match="over its budget ε = 2.0"):
        build_federation(small_config(client__dp=dp, client_stages=stages), quiet=True)


def test_running_experiment_never_spends_past_a_budget(small_config):
    cfg = small_config(cohort={"sampler": "all"}, client__dp={"mode": "per_example", "noise_multiplier": 1.0})
    fed = build_federation(cfg, quiet=True)
    state = initial_state(fed)
    state, _ = run_round(fed, state)
    one_round = fed.ledger[0].epsilon_spent()
    # Shrink client 0's budget to 1.15 rounds' worth (two rounds compose to more): it must sit out from round 2 on.
    fed.ledger[0].budget = Budget(one_round * 1.15, fed.ledger[0].budget.delta)
    outs = []
    for _ in range(3):
        state, metrics = run_round(fed, state)
        outs.append(metrics["clients_out_of_budget"])
    assert fed.ledger[0].epsilon_spent() <= one_round * 1.15
    assert outs == [1, 1, 1]
    assert fed.ledger[1].epsilon_spent() > fed.ledger[0].epsilon_spent()  # the others went on training
    assert len(fed.ledger[1].events) == 4 and len(fed.ledger[0].events) == 1


@pytest.mark.parametrize("mode", ["per_example", "batch_clip"])
def test_clipping_without_noise_is_charged_as_no_privacy(small_config, mode):
    # noise_multiplier 0 (the default without a budget) charged nothing: every client reported ε = 0
    cfg = small_config(cohort={"sampler": "all"}, rounds=1, client__dp={"mode": mode})
    fed = build_federation(cfg, quiet=True)
    run_round(fed, initial_state(fed))
    assert all(fed.ledger[c].epsilon_spent() == math.inf for c in range(8))


def test_smaller_epsilon_gets_larger_noise(small_config):
    cfg = small_config(client={"epochs": 1, "batch_size": 16, "lr": 0.5, "batch_sampler": "poisson"},
                       client__dp={"mode": "per_example", "epsilons": [0.5, 1.0, 2.0, 4.0, 0.5, 1.0, 2.0, 4.0]},
                       data__partition={"name": "iid"})
    fed = build_federation(cfg, quiet=True)
    z = fed.noise_multipliers
    assert z[0] > z[1] > z[2] > z[3]


def test_dp_fedavg_on_digits_reaches_accuracy_and_reports_epsilon(tmp_path):
    cfg = load_config("configs/dp/dpsgd_digits.toml")
    result = run_experiment(cfg, tmp_path / "dp", progress=False)
    assert result.summary["final_accuracy"] >= 0.80
    eps = result.summary["epsilon"]
    assert len(eps) == 10 and all(e <= 3.0 * (1 + 1e-6) for e in eps.values())
    assert max(eps.values()) > 2.9  # the calibrated schedule spends (almost) all of it
    assert result.summary["delta"] == 1e-5
    last = result.rows[-1]
    assert last["epsilon_min"] <= last["epsilon_median"] <= last["epsilon_max"] <= 3.0 + 1e-6
    assert math.isfinite(last["loss"])


def test_a_dp_run_is_bitwise_the_same_with_the_clients_noise_drawn_on_threads(small_config, monkeypatch):
    """The vectorized executor's DP-SGD noise and a local Gaussian noise stage, drawn one client after another and
    forced onto two threads (``run_draws``): the same models, round by round."""
    import torch

    import trustfl.core.rng as rng

    stages = [{"name": "clip_l2", "max_norm": 1.0}, {"name": "gaussian_noise", "std": 0.01}]
    cfg = small_config(rounds=2, client__dp={"mode": "per_example", "noise_multiplier": 1.0},
                       client_stages=stages, engine__executor="vectorized")
    before = torch.get_num_threads()
    models = {}
    try:
        for mode, least in (("one_after_another", 1 << 62), ("on_threads", 0)):
            monkeypatch.setattr(rng, "PARALLEL_DRAW_MIN", least)
            torch.set_num_threads(2)
            fed = build_federation(cfg, quiet=True)
            state = initial_state(fed)
            models[mode] = []
            for _ in range(2):
                state, _ = run_round(fed, state)
                models[mode].append(state.params.clone())
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(models["one_after_another"], models["on_threads"]))
    assert not torch.equal(models["on_threads"][0], models["on_threads"][1])


@pytest.mark.parametrize("stage", ["client", "server"])
def test_a_client_whose_stage_noise_would_overspend_sits_the_round_out(small_config, stage):
    """Admission checks everything a round charges a client (its local steps and the noise stages' events), not
    the local steps alone: a client with budget for its steps but not for the stage's event sits the round out
    (it was admitted, and the round's charge raised BudgetExceededError, ending the run)."""
    dp = {"mode": "per_example", "noise_multiplier": 1.0}
    if stage == "client":
        extra = {"client_stages": [{"name": "clip_l2", "max_norm": 1.0},
                                   {"name": "gaussian_noise", "noise_multiplier": 1.0, "sensitivity": 1.0}]}
    else:
        extra = {"client_stages": [{"name": "clip_l2", "max_norm": 1.0}], "client__momentum": 0.0,
                 "server__weighting": "uniform",
                 "server_stages": [{"name": "central_gaussian_noise", "noise_multiplier": 1.0, "clip_norm": 1.0}]}
    fed = build_federation(small_config(cohort={"sampler": "all"}, client__dp=dp, **extra), quiet=True)
    state = initial_state(fed)
    state, _ = run_round(fed, state)
    ledger = fed.ledger[0]
    spent, history = ledger.epsilon_spent(), ledger.events
    (local, _), (noise, _) = history  # the round's local steps, then the stage's event

    def after(*events):
        probe = PrivacyLedger(0, Budget(math.inf, ledger.budget.delta), fed.ledger.accountant, fed.ledger.neighboring)
        for event, count in history + [(e, 1) for e in events]:
            probe.compose(event, count)
        return probe.epsilon_spent()

    ledger.budget = Budget((after(local) + after(local, noise)) / 2, ledger.budget.delta)  # steps fit, noise not
    state, metrics = run_round(fed, state)
    assert metrics["clients_out_of_budget"] == 1
    assert ledger.epsilon_spent() == spent
