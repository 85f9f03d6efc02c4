"""The CafCor recipe: calibration, refusals, worker momentum, SecLDP accounting and small runs through the engine."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import trustfl
from trustfl.config.build import build_federation
from trustfl.config.load import config_from_dict
from trustfl.config.schema import Component
from trustfl.engine.sync import initial_state, run_round
from trustfl.errors import ConfigError, MessageError
from trustfl.experiment import run_experiment
from trustfl.privacy.analysis.gaussian import epsilon_subsampled_gaussian
from trustfl.privacy.analysis.secldp import OPACUS_ORDERS, calibrate_secldp, equivalent_noise_multiplier, secldp_epsilon
from trustfl.recipes.cafcor import CafCorRecipe, calibrate
from trustfl.types import RoundContext


def make_cfg(recipe: dict, *, n: int = 10, f: int = 2, attack: str = "alie", rounds: int = 20, lr: float = 0.5,
             **tables):
    data = {
        "name": "cafcor-test", "algorithm": "cafcor", "seed": 1, "rounds": rounds,
        "data": {"dataset": "digits", "num_clients": n},
        "model": {"name": "logreg"},
        "client": {"batch_size": 32, "lr": lr, "dp": {"clip": 1.0}},
        "attack": {"name": attack, "num_byzantine": f} if attack != "none" else {"name": "none"},
        "recipe": recipe,
        "engine": {"checkpoint_every": 0},
    }
    for key, value in tables.items():
        data[key] = value
    return config_from_dict(data)


def stage(cfg, name: str) -> Component:
    return next(c for c in cfg.client_stages if c.name == name)


# -- calibration ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("threat,extra", [("secldp", {}), ("byzldp", {}), ("ldp", {}), ("cdp", {}),
                                          ("secldp", {"num_colluding": 1, "ind_to_cor": 0.5}),
                                          ("byzldp", {"ind_to_cor": 2.0})])
def test_calibration_matches_calibrate_secldp(threat, extra):
    # cdp: DSGD's plain mean with f declared (no simulated attack: the model must be a function of the honest sum)
    cdp = {"aggregator": "mean", "num_byzantine": 5} if threat == "cdp" else {}
    cfg = make_cfg({"threat_model": threat, "epsilon": 27.8, "conversion": "opacus", **extra, **cdp}, n=100, f=5,
                   attack="none" if cdp else "alie", rounds=30,
                   client={"batch_size": 50, "lr": 0.075, "dp": {"clip": 2.25}})
    ref = calibrate_secldp(threat, 27.8, 1e-4, 30, 2.25, 100, 5, num_colluding=extra.get("num_colluding"),
                           ind_to_cor=extra.get("ind_to_cor"), conversion="opacus")
    cal = calibrate(cfg)
    assert (cal.sigma_cor, cal.sigma_ind, cal.epsilon_step) == (ref.sigma_cor, ref.sigma_ind, ref.step)
    out = CafCorRecipe().configure(cfg)
    noise = stage(out, "correlated_noise").params
    assert noise["sigma_cor"] == pytest.approx(0.075 * ref.sigma_cor, rel=1e-12)  # message units: × client.lr
    assert noise["sigma_ind"] == pytest.approx(0.075 * ref.sigma_ind, rel=1e-12)
    assert stage(out, "secldp_accounting").params["step"] == ref.step
    assert secldp_epsilon(ref.step, 30, 1e-4, "opacus") == pytest.approx(27.8, abs=1e-3)


def test_spec_table_values_for_mnist():
    """Calibration table (Opacus orders, n = 100, C = 2.25, T = 30, f = 5, ε = 27.8)."""
    base = dict(n=100, f=5, rounds=30, client={"batch_size": 50, "lr": 0.075, "dp": {"clip": 2.25}})
    sigma = {t: calibrate(make_cfg({"threat_model": t, "epsilon": 27.8, "conversion": "opacus"}, **base))
             for t in ("ldp", "secldp", "byzldp", "cdp")}
    assert sigma["ldp"].sigma_ind == pytest.approx(5.51, abs=0.01)
    assert sigma["secldp"].sigma_cor == pytest.approx(0.603, abs=0.001)
    assert sigma["byzldp"].sigma_cor == pytest.approx(0.795, abs=0.001)
    assert sigma["cdp"].sigma_ind * math.sqrt(95) == pytest.approx(5.51, abs=0.01)  # sum std / √(n − f)


def test_default_rdp_conversion_hits_the_target_of_the_ledgers_accountant():
    cfg = make_cfg({"threat_model": "byzldp", "epsilon": 20.0}, rounds=30)
    cal = calibrate(cfg)
    ref = calibrate_secldp("byzldp", 20.0, 1e-4, 30, 1.0, 10, 2, conversion="opacus")
    assert cal.sigma_ind / cal.sigma_cor == pytest.approx(1.0)
    assert cal.sigma_cor == pytest.approx(ref.sigma_cor, rel=0.03)
    eps = epsilon_subsampled_gaussian(equivalent_noise_multiplier(cal.epsilon_step), 1.0, 30, 1e-4, "rdp")
    assert 20.0 - 1e-3 <= eps <= 20.0


def test_configure_sets_algorithm_1():
    out = CafCorRecipe().configure(make_cfg({"epsilon": 10.0, "momentum": 0.7}))
    assert out.client.steps == 1 and out.client.dp.mode == "batch_clip" and out.client.dp.noise_multiplier == 0
    assert out.client.batch_sampler == "fixed" and out.client.dp.delta == 1e-4
    assert out.server.weighting == "uniform" and not out.attack.byzantine_hold_data
    assert [c.name for c in out.client_stages] == ["correlated_noise", "secldp_accounting", "worker_momentum"]
    assert stage(out, "worker_momentum").params == {"beta": 0.7}
    assert out.aggregator == Component("caf", {"f": 2})
    dsgd = CafCorRecipe().configure(make_cfg({"threat_model": "ldp", "epsilon": 10.0, "aggregator": "mean"},
                                             n=8, attack="none", f=0))
    assert dsgd.aggregator.name == "mean" and stage(dsgd, "correlated_noise").params["sigma_cor"] == 0.0
    named = CafCorRecipe().configure(make_cfg({"epsilon": 10.0}, aggregator={"name": "cwtm"}))
    assert named.aggregator == Component("cwtm", {"f": 2})
    flip = CafCorRecipe().configure(make_cfg({"epsilon": 10.0}, attack="label_flip"))
    assert flip.attack.byzantine_hold_data  # the flipping workers need data


# -- refusals -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("recipe,kwargs,key", [
    ({"threat_model": "secldp", "epsilon": 5.0}, {"attack": "none", "f": 0}, "recipe.ind_to_cor"),
    ({"threat_model": "secldp", "epsilon": 5.0, "num_colluding": 2}, {}, "recipe.ind_to_cor"),
    ({"threat_model": "byzldp", "epsilon": 5.0, "ind_to_cor": 0.0}, {}, "recipe.ind_to_cor"),
    ({"threat_model": "secldp", "epsilon": 5.0, "num_colluding": 3}, {}, "recipe.num_colluding"),
    ({"threat_model": "ldp", "epsilon": 5.0, "num_colluding": 1}, {}, "recipe.num_colluding"),
    ({"threat_model": "ldp", "epsilon": 5.0, "ind_to_cor": 1.0}, {}, "recipe.ind_to_cor"),
    ({"threat_model": "secldp"}, {}, "recipe.epsilon"),
    ({"epsilon": -1.0}, {}, "recipe.epsilon"),
    ({"epsilon": 5.0, "delta": 1.5}, {}, "recipe.delta"),
    ({"epsilon": 5.0, "threat_model": "trusted"}, {}, "recipe.threat_model"),
    ({"epsilon": 5.0, "noise_path": "slow"}, {}, "recipe.noise_path"),
    ({"epsilon": 5.0, "momentum": 1.0}, {}, "recipe.momentum"),
    ({"epsilon": 5.0, "sigma": 1.0}, {}, "recipe.sigma"),
    ({"threat_model": "example_cdp"}, {}, "recipe.noise_multiplier"),
    ({"threat_model": "example_cdp", "noise_multiplier": 0.5, "epsilon": 3.0}, {}, "recipe.epsilon"),
    ({"epsilon": 5.0}, {"cohort": {"sampler": "uniform", "size": 5}}, "cohort.sampler"),
    ({"epsilon": 5.0}, {"client": {"lr": 0.1, "steps": 3}}, "client.steps"),
    ({"epsilon": 5.0}, {"client": {"lr": 0.1, "momentum": 0.9}}, "client.momentum"),
    ({"epsilon": 5.0}, {"client": {"lr": 0.1, "dp": {"mode": "per_example"}}}, "client.dp.mode"),
    # The recipe sets these from `[recipe]`; a value given here was overwritten without a word.
    ({"epsilon": 5.0}, {"client": {"lr": 0.1, "dp": {"delta": 1e-6}}}, "client.dp.delta"),
    ({"epsilon": 5.0}, {"client": {"lr": 0.1, "dp": {"accountant": "pld"}}}, "client.dp.accountant"),
    ({"epsilon": 5.0}, {"client": {"lr": 0.1, "dp": {"epsilon": 2.0}}}, "client.dp.epsilon"),
    ({"epsilon": 5.0}, {"client": {"lr": 0.1, "dp": {"method": "vmap"}}}, "client.dp.method"),
    ({"epsilon": 5.0, "aggregator": "mean"}, {"aggregator": {"name": "cwtm"}}, "recipe.aggregator"),
    ({"epsilon": 5.0, "aggregator": "krum_of_krums"}, {}, "recipe.aggregator"),
])
def test_degenerate_or_invalid_settings_are_refused_naming_the_key(recipe, kwargs, key):
    cfg = make_cfg(recipe, **kwargs)
    with pytest.raises(ConfigError, match=f"`{key}"):
        build_federation(cfg, quiet=True)  # the recipe refuses before any data is loaded


def test_secldp_with_colluders_below_f_is_private_without_independent_noise():
    cal = calibrate(make_cfg({"threat_model": "secldp", "epsilon": 5.0, "num_colluding": 1}))
    assert cal.sigma_ind == 0 and cal.sigma_cor > 0 and cal.num_colluding == 1


# -- worker momentum ------------------------------------------------------------------------------------------

def test_worker_momentum_recursion_and_first_step():
    mom = trustfl.build("client_stage", "worker_momentum", beta=0.8)
    x1, x2 = torch.randn(2, 5, dtype=torch.float64), torch.randn(2, 5, dtype=torch.float64)
    state = mom.init(None)
    out1 = mom.apply(x1, state, RoundContext(0, 0, (3, 5)))
    assert torch.allclose(out1.x, 0.2 * x1)  # m_0 = 0, so the first message is (1 − β) x (docs/papers/cafcor.md)
    out2 = mom.apply(x2, out1.state, RoundContext(1, 0, (3, 5)))
    assert torch.allclose(out2.x, 0.8 * 0.2 * x1 + 0.2 * x2)
    assert state == {} and torch.allclose(out1.state[3], 0.2 * x1[0])  # input state not mutated


def test_worker_momentum_state_is_per_client():
    mom = trustfl.build("client_stage", "worker_momentum", beta=0.5)
    s = mom.apply(torch.ones(3, 4), mom.init(None), RoundContext(0, 0, (0, 1, 2))).state
    # Only client 1 takes part, in another row position: it must use its own momentum and leave 0 and 2 alone.
    out = mom.apply(torch.full((1, 4), 3.0), s, RoundContext(1, 0, (1,)))
    assert torch.allclose(out.x, torch.full((1, 4), 0.5 * 0.5 + 0.5 * 3.0))
    assert torch.equal(out.state[0], s[0]) and torch.equal(out.state[2], s[2])
    # Row order does not matter: rows are matched to clients by id.
    a = mom.apply(torch.tensor([[1.0], [2.0]]), s := {7: torch.tensor([4.0]), 9: torch.tensor([8.0])},
                  RoundContext(0, 0, (7, 9))).x
    b = mom.apply(torch.tensor([[2.0], [1.0]]), s, RoundContext(0, 0, (9, 7))).x
    assert torch.equal(a, b.flip(0))
    assert mom.apply(torch.ones(2, 2), {}, RoundContext(0, 0, (0, 1))).metrics == {}


def test_worker_momentum_beta_zero_is_identity_and_bad_beta_is_refused():
    x = torch.randn(3, 4)
    assert torch.equal(trustfl.build("client_stage", "worker_momentum", beta=0.0).apply(
        x, {}, RoundContext(0, 0, (0, 1, 2))).x, x)
    for beta in (-0.1, 1.0, float("nan"), True):
        with pytest.raises(ConfigError, match="`beta`"):
            trustfl.build("client_stage", "worker_momentum", beta=beta)
    with pytest.raises(MessageError, match="client_ids"):
        trustfl.build("client_stage", "worker_momentum", beta=0.5).apply(x, {}, RoundContext(0, 0, (0, 0, 1)))


# -- accounting stage -----------------------------------------------------------------------------------------

def test_secldp_accounting_charges_honest_rows_only_and_passes_x_through():
    acc = trustfl.build("client_stage", "secldp_accounting", step=0.02)
    x = torch.randn(4, 3)
    out = acc.apply(x, None, RoundContext(0, 0, (0, 2, 3, 4), num_byzantine=2, num_clients=5))
    assert out.x is x
    assert [c for c, _ in out.events] == [0, 2]  # ids 3, 4 are the Byzantine ones (the last f)
    assert out.events[0][1].noise_multiplier == pytest.approx(1 / math.sqrt(0.04))
    with pytest.raises(ConfigError, match="`step`"):
        trustfl.build("client_stage", "secldp_accounting", step=0.0)


# -- through the engine ---------------------------------------------------------------------------------------

def test_tiny_cafcor_run_learns_and_ledgers_report_the_target_epsilon(tmp_path):
    cfg = make_cfg({"threat_model": "secldp", "epsilon": 50.0, "momentum": 0.8, "noise_path": "exact"},
                   rounds=25)
    res = run_experiment(cfg, out=tmp_path / "run", progress=False)
    assert bool(torch.isfinite(res.params).all())
    assert res.summary["final_accuracy"] > 0.35  # chance is 0.1 (digits, 10 classes)
    eps = res.summary["epsilon"]
    assert sorted(eps) == [str(i) for i in range(8)]  # honest clients only
    assert all(abs(e - 50.0) < 1e-2 for e in eps.values())
    import json
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())["cafcor"]
    assert info["threat_model"] == "secldp" and info["noise_path"] == "exact"
    assert info["epsilon_planned"] == pytest.approx(50.0, abs=1e-2)


def _engine_only(cfg):
    """The configured experiment as a plain engine config (no recipe), to vary one stage parameter; without the
    secldp_accounting stage, which only algorithm "cafcor" calibrates (refused elsewhere)."""
    stages = [c for c in cfg.client_stages if c.name != "secldp_accounting"]
    return dataclasses.replace(cfg, algorithm="fedavg", recipe={}, client_stages=stages)


@pytest.mark.parametrize("path", ["exact", "fast"])
def test_correlated_noise_cancels_in_an_all_honest_round(path):
    cfg = CafCorRecipe().configure(make_cfg({"threat_model": "secldp", "epsilon": 1.0, "noise_path": path,
                                             "aggregator": "mean"}, n=6, f=1))
    stages = [c if c.name != "correlated_noise" else Component(c.name, {**c.params, "sigma_ind": 0.0})
              for c in _engine_only(cfg).client_stages]
    honest = dataclasses.replace(_engine_only(cfg), client_stages=stages,
                                 attack=dataclasses.replace(cfg.attack, name="none", num_byzantine=0))
    quiet = dataclasses.replace(honest, client_stages=[
        c if c.name != "correlated_noise" else Component(c.name, {**c.params, "sigma_cor": 0.0})
        for c in stages])
    assert stage(honest, "correlated_noise").params["sigma_cor"] > 1.0  # very noisy messages ...
    params, metrics = [], []
    for c in (honest, quiet):
        fed = build_federation(c, quiet=True)
        state, m = run_round(fed, initial_state(fed))
        params.append(state.params)
        metrics.append(m)
    assert metrics[0]["correlated_noise/message_noise_std"] > 1.0
    assert metrics[0]["correlated_noise/sum_noise_std"] == 0.0  # all n = 6 protocol participants present
    # ... whose noise cancels in the mean of the 6 honest rows (float32 rounding only).
    assert float((params[0] - params[1]).abs().max()) < 1e-5


def test_example_cdp_label_flip_runs_and_records_the_cdp_epsilon(tmp_path):
    cfg = make_cfg({"threat_model": "example_cdp", "noise_multiplier": 0.5, "momentum": 0.8}, n=6, f=1,
                   attack="label_flip", rounds=3, client={"batch_size": 16, "lr": 0.3, "dp": {"clip": 5.0}})
    out = CafCorRecipe().configure(cfg)
    assert out.client.dp.mode == "per_example" and out.client.batch_sampler == "poisson"
    assert out.client.dp.noise_multiplier == pytest.approx(0.5 / math.sqrt(5))
    assert [c.name for c in out.client_stages] == ["worker_momentum"]
    fed = build_federation(cfg, quiet=True)
    state = initial_state(fed)
    for _ in range(3):
        state, _ = run_round(fed, state)  # the Byzantine flipping worker trains but has no ledger
    info = fed.info["cafcor"]
    sizes = {i: int(r.numel()) for i, r in enumerate(fed.client_rows) if i not in fed.byzantine}
    ref = epsilon_subsampled_gaussian(0.5, 16 / sizes[0], 3, 1e-4, "rdp", "poisson", orders=OPACUS_ORDERS)
    assert info["cdp_epsilon"]["0"] == pytest.approx(ref, rel=1e-9) and "5" not in info["cdp_epsilon"]
    assert sorted(fed.ledger.epsilons()) == [0, 1, 2, 3, 4]


class _Recorder:
    """Wraps an attack and records the honest rows it is shown each round."""

    def __init__(self, attack):
        self.attack, self.seen = attack, []
        self.data_level = attack.data_level

    def craft(self, honest, num_byzantine, ctx, aggregator=None):
        self.seen.append(honest.clone())
        return self.attack.craft(honest, num_byzantine, ctx, aggregator)


def _views(cfg, rounds: int = 3):
    """Run ``rounds`` rounds, recording what the attack sees and the honest clients' local updates."""
    fed = build_federation(cfg, quiet=True)
    fed.attack = _Recorder(fed.attack)
    updates, run = [], fed.executor.run

    def recording_run(*args, **kwargs):
        out = run(*args, **kwargs)
        updates.append(out.updates.clone())
        return out

    fed.executor = dataclasses.replace(fed.executor) if dataclasses.is_dataclass(fed.executor) else fed.executor
    object.__setattr__(fed.executor, "run", recording_run)
    state = initial_state(fed)
    for _ in range(rounds):
        state, _ = run_round(fed, state)
    return fed, state, updates


def test_noiseless_attack_view_sees_the_messages_without_privacy_noise():
    beta = 0.5
    transmitted = make_cfg({"threat_model": "secldp", "epsilon": 2.0, "momentum": beta, "noise_path": "exact"},
                           n=6, f=1)
    noiseless = dataclasses.replace(transmitted, attack=dataclasses.replace(transmitted.attack, view="noiseless"))
    fed_v, state_v, updates = _views(noiseless)
    fed_t, _, _ = _views(transmitted)
    assert fed_v.attack_view is not None and fed_t.attack_view is None
    assert [n for n, _ in fed_v.attack_view.stages] == ["secldp_accounting", "worker_momentum"]
    momentum = torch.zeros_like(updates[0])
    for seen_v, seen_t, u in zip(fed_v.attack.seen, fed_t.attack.seen, updates):
        # The worker momentum of the noiseless updates, over the rounds: the shadow chain keeps its own state.
        momentum = beta * momentum + (1 - beta) * u
        assert seen_v.shape == momentum.shape == (5, u.shape[1])
        assert torch.allclose(seen_v, momentum, atol=1e-6)
        assert float(seen_t.norm()) > 10 * float(seen_v.norm())   # the transmitted view is mostly noise
    # The shadow chain's state: one entry per stage; the worker momentum holds one noiseless momentum per honest
    # client, the last momentum checked above.
    assert set(state_v.attack_view) == {"secldp_accounting", "worker_momentum"}
    shadow = state_v.attack_view["worker_momentum"]
    assert len(shadow) == 5
    assert torch.allclose(torch.stack([shadow[c] for c in sorted(shadow)]), momentum, atol=1e-6)
    # The shadow chain's accounting events are not charged: the ledgers match the transmitted-view run's.
    assert fed_v.ledger.epsilons() == pytest.approx(fed_t.ledger.epsilons())


def test_attack_view_is_validated():
    with pytest.raises(ConfigError, match="attack.view"):
        config_from_dict({"algorithm": "cafcor", "attack": {"name": "alie", "num_byzantine": 1, "view": "clean"}})


def test_noiseless_attack_view_resumes_exactly(tmp_path):
    base = make_cfg({"threat_model": "secldp", "epsilon": 5.0, "momentum": 0.8}, rounds=6,
                    engine={"checkpoint_every": 2})
    cfg = dataclasses.replace(base, attack=dataclasses.replace(base.attack, view="noiseless"))
    full = run_experiment(cfg, tmp_path / "full", progress=False)
    run_experiment(cfg, tmp_path / "part", progress=False, stop_after=3)
    resumed = run_experiment(None, resume=tmp_path / "part", progress=False)
    # The shadow momentums ALIE reads are part of the checkpoint: resuming changes nothing.
    assert torch.equal(full.params, resumed.params)


@pytest.mark.parametrize("recipe, kwargs, problem", [
    ({}, {"attack": "none"}, "caf"),  # the recipe's default rule
    ({"aggregator": "mean"}, {}, "attack"),  # crafted rows computed from the honest messages one by one
    ({"aggregator": "mean"}, {"attack": "none", "pre_aggregators": [{"name": "nnm"}]}, "pre_aggregators"),
    ({"aggregator": "mean"}, {"attack": "none", "compress": {"uplink": {"name": "qsgd"}}}, "compress.uplink"),
])
def test_cdp_is_refused_where_the_model_is_not_a_function_of_the_honest_sum(recipe, kwargs, problem):
    """threat_model = "cdp" charges each worker ε_step = 2C²/s² for the noise s its n − f honest workers' noises
    make on their *sum*: the model must be a function of that sum (the DSGD-CDP baseline: the plain mean, every
    message as sent, no attack). A robust rule or an attack computed from the messages one by one sees a message
    with only its own noise s/√(n − f); such a run reported the CDP ε in summary.json and its ledgers."""
    cfg = make_cfg({"threat_model": "cdp", "epsilon": 5.0, **recipe}, **kwargs)
    with pytest.raises(ConfigError, match=f"`recipe.threat_model`.*{problem}"):
        build_federation(cfg, quiet=True)


def test_cdp_with_the_plain_mean_and_no_attack_runs():
    cfg = make_cfg({"threat_model": "cdp", "epsilon": 5.0, "aggregator": "mean", "num_byzantine": 2}, attack="none")
    build_federation(cfg, quiet=True)
