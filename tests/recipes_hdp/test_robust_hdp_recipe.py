"""The Robust-HDP recipe: DP settings per method, the ε / oracle-noise reports, and a tiny end-to-end run."""
import dataclasses
import math

import pytest
import torch

from trustfl.aggregate.noise_aware import oracle_weights, update_noise_variance
from trustfl.config.build import build_federation
from trustfl.config.load import config_from_dict
from trustfl.errors import ConfigError
from trustfl.experiment import run_experiment
from trustfl.privacy.budgets import RHDP_FIXED_LISTS
from trustfl.recipes.robust_hdp import RobustHDPRecipe

# 4 clients × 300 digits examples, one batch size: the calibration only sees two (ε, q) pairs, shared (through
# the calibration cache) by every test of this module.
EPS = [0.5, 2.0, 2.0, 2.0]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_cfg(rounds: int = 3, **recipe):
    data = {
        "name": "rhdp-test", "algorithm": "robust_hdp", "seed": 1, "rounds": rounds,
        "data": {"dataset": "digits", "num_clients": 4, "options": {"max_train": 1200}},
        "model": {"name": "mlp", "hidden": [16]},
        "client": {"lr": 0.05, "batch_size": 16, "dp": {"epsilons": EPS}},
        "engine": {"checkpoint_every": 0},
        "recipe": {"rpca": {"per_client_metrics": True}, **recipe},
    }
    return config_from_dict(data)


@pytest.fixture(scope="module")
def honest_fed():
    return build_federation(make_cfg(method="weiavg"), quiet=True)


@pytest.fixture(scope="module")
def lying_fed():
    return build_federation(make_cfg(method="weiavg", falsify={"client": 0, "factor": 10}), quiet=True)


def test_falsified_epsilon_only_in_reports(honest_fed, lying_fed):
    true = torch.tensor(EPS, dtype=torch.float64)
    assert torch.equal(honest_fed.reports["reported_epsilon"], true)
    expected = true.clone()
    expected[0] = 5.0
    assert torch.equal(lying_fed.reports["reported_epsilon"], expected)
    # The liar still trains at its true ε: same budget, same noise, same ledger budget.
    assert lying_fed.info["privacy"]["epsilon_budget"] == EPS
    assert lying_fed.noise_multipliers == honest_fed.noise_multipliers
    assert lying_fed.ledger[0].budget.epsilon == 0.5
    z = lying_fed.noise_multipliers
    assert z[0] > z[1] == z[2] == z[3] > 0
    info = lying_fed.info["robust_hdp"]
    assert info["falsified_client"] == 0 and info["reported_epsilon"][0] == 5.0 and info["true_epsilon"] == EPS
    # WeiAvg's predicted aggregate noise gets worse when the noisiest client over-reports; the oracle's does not.
    pred_h, pred_l = honest_fed.info["robust_hdp"]["predicted_noise_metric"], info["predicted_noise_metric"]
    assert pred_l["weiavg"] > 2 * pred_h["weiavg"]
    assert pred_l["oracle"] == pytest.approx(pred_h["oracle"])
    assert pred_h["oracle"] <= min(pred_h["weiavg"], pred_h["dpfedavg"])


def test_oracle_variances_match_update_noise_variance(honest_fed):
    fed = honest_fed
    sizes = [int(r.numel()) for r in fed.client_rows]
    assert sizes == [300] * 4
    expected = update_noise_variance(fed.noise_multipliers, fed.batch_sizes, sizes, 1, 0.05, 3.0,
                                     fed.layout.numel)
    assert torch.allclose(fed.reports["oracle_noise_variance"], expected, rtol=1e-12)
    # Eq. 3 + Eq. 7 by hand for client 0: K·⌈N/b⌉·η²·p·c²·z²/b².
    z0, p = fed.noise_multipliers[0], fed.layout.numel
    by_hand = 1 * math.ceil(300 / 16) * 0.05 ** 2 * p * 3.0 ** 2 * z0 ** 2 / 16 ** 2
    assert float(fed.reports["oracle_noise_variance"][0]) == pytest.approx(by_hand, rel=1e-12)
    assert fed.info["robust_hdp"]["oracle_noise_variance"] == pytest.approx(expected.tolist())
    # The paper's DP settings: c = 3, δ = 1e-4, Poisson batches, per-example DP-SGD, Robust-HDP's z.
    assert fed.training.clip == 3.0 and fed.training.dp_mode == "per_example"
    assert fed.training.sampler.accounting == "poisson"
    assert fed.info["privacy"]["delta"] == 1e-4


def test_min_eps_trains_everyone_at_the_minimum(honest_fed):
    fed = build_federation(make_cfg(method="min_eps"), quiet=True)
    assert fed.info["privacy"]["epsilon_budget"] == [0.5] * 4
    assert fed.noise_multipliers == [honest_fed.noise_multipliers[0]] * 4
    assert type(fed.aggregator).__name__ == "DPFedAvg"
    assert torch.equal(fed.reports["reported_epsilon"], torch.full((4,), 0.5, dtype=torch.float64))


def test_fedavg_has_no_dp():
    fed = build_federation(make_cfg(method="fedavg"), quiet=True)
    assert fed.training.dp_mode == "off" and fed.noise_multipliers == [0.0] * 4
    assert set(fed.reports) == {"num_samples"}
    assert type(fed.aggregator).__name__ == "DPFedAvg"


def test_configure_fixed_lists_lrs_and_aggregators():
    cfg = config_from_dict({"data": {"num_clients": 20}, "algorithm": "robust_hdp",
                            "recipe": {"method": "pfa", "eps_list": "dist6", "lrs": {"pfa": 0.2, "weiavg": 0.3}}})
    out = RobustHDPRecipe().configure(cfg)
    assert out.client.dp.epsilons == list(RHDP_FIXED_LISTS["dist6"])
    assert out.client.batch_sizes == list(RHDP_FIXED_LISTS["batch_sizes"])
    assert out.client.lr == 0.2 and out.aggregator.name == "pfa"
    assert out.client.batch_sampler == "poisson" and out.client.dp.calibration == "rhdp"
    assert (out.client.dp.clip, out.client.dp.delta) == (3.0, 1e-4)
    rhdp = RobustHDPRecipe().configure(dataclasses.replace(cfg, recipe={"eps_list": "dist1", "batch_list": False,
                                                                        "rpca": {"mode": "once"}}))
    assert rhdp.aggregator.name == "robust_hdp" and rhdp.aggregator.params == {"mode": "once"}
    assert rhdp.client.batch_sizes == [32] * 20  # client.batch_size for everyone
    for method, agg in (("oracle", "oracle"), ("dpfedavg", "dpfedavg"), ("weiavg", "weiavg")):
        assert RobustHDPRecipe().configure(dataclasses.replace(cfg, recipe={"method": method, "eps_list": "dist2"})
                                           ).aggregator.name == agg


def test_sort_by_batch_permutes_pairs_and_keeps_the_liar():
    cfg = config_from_dict({"data": {"num_clients": 20}, "algorithm": "robust_hdp",
                            "recipe": {"eps_list": "dist6", "sort_by_batch": True, "method": "weiavg",
                                       "falsify": {"client": 12, "factor": 10}}})
    recipe = RobustHDPRecipe()
    out = recipe.configure(cfg)
    b, e = RHDP_FIXED_LISTS["batch_sizes"], RHDP_FIXED_LISTS["dist6"]
    assert out.client.batch_sizes == sorted(b)
    # Every (ε, b) pair of the list is kept, only renumbered.
    assert sorted(zip(out.client.dp.epsilons, out.client.batch_sizes)) == sorted(zip(e, b))
    order = recipe._order
    assert [b[i] for i in order] == out.client.batch_sizes and out.client.dp.epsilons == [e[i] for i in order]
    assert order.index(12) == 4  # client 12 (b = 16) is the fifth of the eight b = 16 clients


@pytest.mark.parametrize("recipe, match", [
    ({"method": "krum"}, "recipe.method"),
    ({"eps_list": "dist10"}, "recipe.eps_list"),
    ({"epsilon_list": "dist1"}, "recipe.epsilon_list"),
    ({"falsify": {"factor": 10}}, "recipe.falsify"),
    ({"falsify": {"client": 7, "factor": 10}}, "recipe.falsify.client"),
    ({"falsify": {"client": 0, "factor": -1}}, "recipe.falsify.factor"),
    ({"lrs": {"robust_hdp": 0}}, "recipe.lrs.robust_hdp"),
    ({"delta": 2.0}, "recipe.delta"),
    ({"sort_by_batch": 1}, "recipe.sort_by_batch"),
])
def test_invalid_recipe_tables(recipe, match):
    cfg = make_cfg(**recipe)
    with pytest.raises(ConfigError, match=match.replace(".", r"\.")):
        RobustHDPRecipe().configure(cfg)


@pytest.mark.parametrize("client, key", [
    ({"dp": {"epsilons": EPS, "clip": 2.0}}, "client.dp.clip"),
    ({"dp": {"epsilons": EPS, "delta": 1e-6}}, "client.dp.delta"),
    ({"dp": {"epsilons": EPS, "mode": "batch_clip"}}, "client.dp.mode"),
    ({"batch_sampler": "fixed"}, "client.batch_sampler"),
])
def test_client_keys_the_recipe_sets_are_refused_not_overwritten(client, key):
    """c, δ, the clipping mode and the batch sampler are the paper's (or `[recipe]`'s); a value given in
    `[client]` used to be replaced without a word. The paper's own values (and its calibration) are accepted."""
    cfg = make_cfg(method="weiavg")
    cfg = dataclasses.replace(cfg, client=dataclasses.replace(
        cfg.client, **{k: v for k, v in client.items() if k != "dp"},
        dp=dataclasses.replace(cfg.client.dp, **client.get("dp", {}))))
    with pytest.raises(ConfigError, match=rf"^`{key}` is set, but algorithm 'robust_hdp' sets it"):
        RobustHDPRecipe().configure(cfg)
    same = dataclasses.replace(cfg, client=dataclasses.replace(
        cfg.client, batch_sampler="poisson", dp=dataclasses.replace(cfg.client.dp, mode="per_example",
                                                                    calibration="rhdp")))
    if key in ("client.dp.mode", "client.batch_sampler"):  # the paper's own values are accepted
        assert RobustHDPRecipe().configure(same).client.dp.mode == "per_example"


def test_needs_budgets():
    cfg = make_cfg(method="weiavg")
    cfg = dataclasses.replace(cfg, client=dataclasses.replace(
        cfg.client, dp=dataclasses.replace(cfg.client.dp, epsilons=[])))
    with pytest.raises(ConfigError, match="per-client budgets"):
        RobustHDPRecipe().configure(cfg)


def _weights(rows, n=4):
    return torch.tensor([[r[f"aggregator/weight/{i}"] for i in range(n)] for r in rows], dtype=torch.float64)


def test_end_to_end_robust_hdp_ignores_the_falsified_report(tmp_path, honest_fed):
    honest = run_experiment(make_cfg(method="robust_hdp"), out=tmp_path / "h", progress=False)
    lying = run_experiment(make_cfg(method="robust_hdp", falsify={"client": 0, "factor": 10}), out=tmp_path / "l",
                           progress=False)
    for res in (honest, lying):
        assert bool(torch.isfinite(res.params).all()) and len(res.rows) == 3
        assert math.isfinite(res.summary["final_loss"])
        assert res.summary["delta"] == 1e-4           # the recipe's δ, not client.dp's default
    w_h, w_l = _weights(honest.rows), _weights(lying.rows)
    assert torch.allclose(w_h.sum(1), torch.ones(3, dtype=torch.float64))
    assert torch.equal(w_h, w_l)                      # the lie changes nothing
    assert torch.equal(honest.params, lying.params)
    # The noisiest client (smallest ε) gets the smallest weight, as with the oracle weights.
    oracle = oracle_weights(honest_fed.reports["oracle_noise_variance"])
    assert int(oracle.argmin()) == 0
    assert bool((w_h.argmin(1) == 0).all())
    # WeiAvg, in contrast, hands the liar most of the weight.
    weiavg = run_experiment(make_cfg(method="weiavg", falsify={"client": 0, "factor": 10}), out=tmp_path / "w",
                            progress=False, stop_after=1)
    assert weiavg.rows[0]["aggregator/weight/max"] == pytest.approx(5 / 11)
