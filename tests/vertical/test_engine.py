"""The vertical engine end to end: activation orders, resume, privacy accounting, bad input, the DPZV claim."""
import json
import math
import re

import pytest
import torch

from trustfl.config.build import build_federation
from trustfl.config.load import load_config
from trustfl.errors import BudgetExceededError, ConfigError
from trustfl.experiment import run_experiment
from trustfl.privacy.analysis.gdp import dpzv_noise_std, mu_from_epsilon
from trustfl.simtime.speed import Deterministic, ExponentialGroups
from trustfl.vertical.activation import activation_order


def test_equal_delays_on_the_clock_give_round_robin():
    speed = Deterministic(duration=2.0).bind(5, seed=0)
    parties, times = activation_order("clock", 5, rounds=3, per_round=10, seed=0, speed=speed)
    assert parties.tolist() == [t % 5 for t in range(30)]
    assert times.tolist() == [2.0 * (t // 5 + 1) for t in range(30)]


def test_faster_parties_are_activated_more_often_on_the_clock():
    speed = ExponentialGroups(slow_share=0.5, fast_mean=1.0, slow_mean=4.0).bind(4, seed=0)
    parties, times = activation_order("clock", 4, rounds=1, per_round=4000, seed=0, speed=speed)
    counts = torch.bincount(parties, minlength=4).tolist()
    assert min(counts[2:]) > 3 * max(counts[:2])  # parties 0, 1 are the slow half
    assert bool((times.diff() >= 0).all())


def test_shuffled_rounds_activate_every_party_equally_often():
    parties, times = activation_order("shuffled", 7, rounds=3, per_round=21, seed=4)
    assert times is None
    for r in range(3):
        assert torch.bincount(parties[21 * r:21 * (r + 1)], minlength=7).tolist() == [3] * 7
    again, _ = activation_order("shuffled", 7, rounds=3, per_round=21, seed=4)
    assert torch.equal(parties, again)


def test_resume_reproduces_the_uninterrupted_run(vertical_config, tmp_path):
    cfg = vertical_config("dpzv", rounds=3, recipe={"epsilon": 2.0}, engine__checkpoint_every=1)
    whole = run_experiment(cfg, tmp_path / "whole", progress=False, plots=False)
    run_experiment(cfg, tmp_path / "cut", progress=False, plots=False, stop_after=1)
    resumed = run_experiment(cfg, progress=False, plots=False, resume=tmp_path / "cut")
    assert torch.equal(whole.params, resumed.params)
    assert [r["train_loss"] for r in whole.rows] == [r["train_loss"] for r in resumed.rows]
    assert whole.summary["epsilon"] == resumed.summary["epsilon"]


def test_rows_carry_the_running_byte_totals_warm_up_pass_included(vertical_config, tmp_path):
    """Vertical rows had bytes_up / bytes_down but no totals, which `trustfl report` and the bytes axis read."""
    cfg = vertical_config("dpzv", rounds=3)
    rows = run_experiment(cfg, tmp_path, progress=False, plots=False).rows
    samples = build_federation(cfg).vertical.num_samples
    warm_up = 4 * 4 * samples * 4  # 4 parties' float32 embeddings (dim 4) of every training sample, sent once
    for key in ("bytes_up", "bytes_down"):
        totals = [r[f"{key}_total"] for r in rows]
        steps = [r[key] for r in rows]
        assert all(s > 0 for s in steps)
        assert [b - a for a, b in zip(totals, totals[1:])] == steps[1:]
    assert rows[0]["bytes_down_total"] == rows[0]["bytes_down"]
    assert rows[0]["bytes_up_total"] - rows[0]["bytes_up"] == warm_up


@pytest.mark.parametrize("algorithm", ["dpzv", "vafl", "zoo_vfl", "czofo"])
def test_the_budget_is_spent_exactly_and_never_exceeded(vertical_config, tmp_path, algorithm):
    cfg = vertical_config(algorithm, recipe={"epsilon": 1.5, "delta": 1e-3})
    result = run_experiment(cfg, tmp_path, progress=False, plots=False)
    spent = list(result.summary["epsilon"].values())
    assert len(spent) == 4 and max(spent) <= 1.5 * (1 + 1e-9)
    assert max(spent) == pytest.approx(1.5, rel=1e-5)  # calibrated for the most active party (all, for DPZV)
    info = json.loads((result.run_dir / "run_info.json").read_text())["vertical"]
    assert info["noise_multiplier"] > 0 and info["accountant"] == "gdp"
    assert bool(torch.isfinite(result.params).all())


def test_dpzv_noise_is_the_papers_formula(vertical_config):
    """With the first-order GDP accountant the calibrated σ_dp is Thm 6.1's 2C√T/(Dμ)."""
    fed = build_federation(vertical_config("dpzv", recipe={"epsilon": 1.0, "delta": 1e-3, "clip": 10.0}),
                           quiet=True)
    t, d = fed.vertical.order.numel(), fed.vertical.num_samples
    expected = dpzv_noise_std(10.0, t, d, mu_from_epsilon(1.0, 1e-3))
    assert fed.vertical.method.noise_std == pytest.approx(expected, rel=1e-5)


def test_a_run_that_would_overspend_is_refused(vertical_config):
    fed = build_federation(vertical_config("dpzv", recipe={"epsilon": 1.0}), quiet=True)
    from trustfl.vertical.engine import VerticalEngine

    engine = VerticalEngine()
    state = engine.initial_state(fed)
    state, _ = engine.run_round(fed, state)
    state, _ = engine.run_round(fed, state)  # the planned rounds spend exactly the budget
    state.clock["iteration"] = 0  # replaying the first round would release it again
    with pytest.raises(BudgetExceededError):
        engine.run_round(fed, state)


@pytest.mark.parametrize("overrides, key", [
    ({"data__features": {"name": "columns", "columns": [[0, 1], [], [2], [3]]}}, "columns[1]"),
    ({"data__features": {"name": "columns", "columns": [[0, 1], [1], [2], [3]]}}, "columns[1]"),
    ({"data__features": {"name": "columns", "columns": [[0, 64], [1], [2], [3]]}}, "columns[0]"),
    ({"data__features": {"name": "columns", "columns": [[0], [1], [2]]}}, "columns"),
    ({"data__features": {"name": "contiguous", "unit": 3}}, "data.features"),
    ({"data__features": {"name": "diagonal"}}, "data.features.name"),
    ({"recipe": {"smoothing": 0.0}}, "recipe.smoothing"),
    ({"recipe": {"smoothing": -1e-3}}, "recipe.smoothing"),
    ({"recipe": {"clip": 0}}, "recipe.clip"),
    ({"recipe": {"clip": -1.0}}, "recipe.clip"),
    ({"recipe": {"epsilon": 0.0}}, "recipe.epsilon"),
    ({"recipe": {"epsilon": -1.0}}, "recipe.epsilon"),
    ({"recipe": {"epsilon": 1.0, "delta": 1.0}}, "recipe.delta"),
    ({"recipe": {"epsilon": 1.0, "clipping": False}}, "recipe.clipping"),
    ({"recipe": {"lambda": 1e-3}}, "recipe.lambda"),
    ({"recipe": {"difference": "three_lambda"}}, "recipe.difference"),
    ({"aggregator": {"name": "krum"}}, "aggregator"),
    ({"client__momentum": 0.9}, "client.momentum"),
    ({"engine__speed": {"name": "deterministic", "duration": 1.0}}, "engine.speed"),
    # settings of the horizontal engines the vertical one ignored without a word
    ({"engine__dtype": "bfloat16"}, "engine.dtype"),
    ({"engine__executor": "sequential"}, "engine.executor"),
    ({"engine__max_clients_per_batch": 2}, "engine.max_clients_per_batch"),
    ({"server__weighting": "uniform"}, "server.weighting"),
    ({"client__dp": {"epsilon": 1.0}}, "client.dp"),
    ({"client__batch_size": 100000}, "client.batch_size"),
    # the activation schedule is drawn whole at build time: 10^7 rounds used to ask for terabytes
    ({"rounds": 10_000_000}, "rounds"),
    ({"engine__iterations_per_round": 10_000_001}, "rounds"),
])
def test_bad_input_is_refused_before_training_with_the_key(vertical_config, overrides, key):
    with pytest.raises(ConfigError, match=re.escape(f"`{key}")):
        build_federation(vertical_config("dpzv", **overrides), quiet=True)


@pytest.mark.parametrize("overrides, key, instead", [
    ({"client__batch_sampler": "poisson"}, "client.batch_sampler", "draws B = `client.batch_size` of the D sample IDs "
                                                                   "uniformly without replacement"),
    ({"client__batch_sampler": "fixed"}, "client.batch_sampler", "uniformly without replacement"),
    ({"client__step_budget": {"name": "stragglers", "fraction": 0.5}}, "client.step_budget.fraction",
     "one step of the party `engine.activation` activates"),
    ({"client__augment": {"name": "views"}, "data__dataset": "digits_canvas"}, "client.augment",
     "each party embeds its columns of the stored examples"),
])
def test_a_horizontal_client_setting_is_refused_saying_what_the_engine_does_instead(vertical_config, overrides, key,
                                                                                     instead):
    """Each of these trained bitwise the same model as its default."""
    with pytest.raises(ConfigError, match=rf"^`{re.escape(key)}` is set, but the vertical engine does not use it "
                                          rf"\(.*{re.escape(instead)}.*\): remove it\.$"):
        build_federation(vertical_config("vafl", **overrides), quiet=True)


def test_an_activation_schedule_the_machine_cannot_hold_is_a_resource_error(vertical_config, monkeypatch):
    """Below the iteration cap a clock schedule of many parties can still exceed memory: one line naming the keys
    that size it (the allocator's failure stood in for)."""
    import trustfl.config.vertical as vertical
    from trustfl.errors import ResourceError

    def fails(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 96000000000 bytes.")
    monkeypatch.setattr(vertical, "activation_order", fails)
    with pytest.raises(ResourceError, match=r"vertical activation schedule needs more memory .*96\.0 GB.*`rounds`"):
        build_federation(vertical_config("dpzv"), quiet=True)


def test_vertical_settings_are_refused_by_horizontal_engines(small_config):
    with pytest.raises(ConfigError, match="engine.activation"):
        build_federation(small_config(engine__activation="clock"), quiet=True)
    with pytest.raises(ConfigError, match="data.features"):
        build_federation(small_config(data__features={"name": "columns", "columns": [[0]]}), quiet=True)


def test_non_finite_party_data_are_rejected_and_counted(vertical_config, tmp_path):
    fed = build_federation(vertical_config("dpzv", recipe={"epsilon": 2.0}), quiet=True)
    fed.vertical.features[1][:200, 3] = math.nan  # party 1 holds NaN features for 200 of its samples
    from trustfl.vertical.engine import VerticalEngine

    engine = VerticalEngine()
    state = engine.initial_state(fed)
    state.shared["cache"][1] = 0.0  # the warm-up pass cached NaN embeddings; start from a clean cache
    for _ in range(2):
        state, metrics = engine.run_round(fed, state)
    assert state.rejected_total > 0 and metrics["rejected"] > 0
    assert bool(torch.isfinite(state.params).all()) and bool(torch.isfinite(state.shared["cache"]).all())


def test_train_loss_is_the_mean_over_accepted_iterations(vertical_config, monkeypatch):
    """A rejected message's loss (NaN once a huge embedding sat in the cache) was averaged in: train_loss null."""
    from trustfl.vertical.engine import VerticalEngine
    from trustfl.vertical.methods import DPZV
    seen: list[tuple[bool, float]] = []
    iterate = DPZV.iterate

    def every_third_rejected(self, it, party, server, ids):
        ok, loss = iterate(self, it, party, server, ids)
        if len(seen) % 3 == 0:
            ok, loss = torch.zeros((), dtype=torch.bool), torch.tensor(math.nan)
        seen.append((bool(ok), float(loss)))
        return ok, loss

    monkeypatch.setattr(DPZV, "iterate", every_third_rejected)
    fed = build_federation(vertical_config("dpzv"), quiet=True)
    engine = VerticalEngine()
    _, metrics = engine.run_round(fed, engine.initial_state(fed))
    accepted = [loss for ok, loss in seen if ok]
    assert metrics["rejected"] == len(seen) - len(accepted) == 14
    assert metrics["train_loss"] == pytest.approx(sum(accepted) / len(accepted), rel=1e-6)
    monkeypatch.setattr(DPZV, "iterate", lambda self, it, party, server, ids: (
        torch.zeros((), dtype=torch.bool), torch.tensor(math.nan)))
    _, metrics = engine.run_round(fed, engine.initial_state(fed))
    assert metrics["rejected"] == 40 and "train_loss" not in metrics  # nothing accepted: no loss to report


def test_a_clip_beyond_the_dtype_clips_nothing(vertical_config, tmp_path):
    """C = 1e308 passed validate and raised torch's overflow error in clamp in round 1; no float32 value exceeds
    it, so it clips as a C of 3e38 does: nothing."""
    runs = [run_experiment(vertical_config("dpzv", rounds=1, recipe={"clip": c}), tmp_path / str(c), progress=False,
                           plots=False) for c in (1e308, 3e38)]
    assert torch.equal(runs[0].params, runs[1].params) and bool(torch.isfinite(runs[0].params).all())


def test_dpzv_stays_accurate_where_dp_vafl_collapses(vertical_config, tmp_path):
    """The DPZV paper's claim in small (digits, 4 parties, ε = 1): DPZV far above VAFL with embedding DP."""
    acc = {}
    for algorithm, lr in (("dpzv", 1e-3), ("vafl", 0.05)):
        cfg = vertical_config(algorithm, rounds=4, client__lr=lr, engine__iterations_per_round=0,
                              recipe={"epsilon": 1.0})
        acc[algorithm] = run_experiment(cfg, tmp_path / algorithm, progress=False, plots=False).summary[
            "final_accuracy"]
    assert acc["dpzv"] > 0.65 and acc["vafl"] < acc["dpzv"] - 0.3, acc


def test_a_fallback_that_does_not_divide_among_the_parties_says_so(vertical_config, tmp_path, capsys):
    """MNIST configs fall back to digits without `make data`: 7 parties cannot split digits' 64 columns evenly,
    so the run uses 4 (the largest divisor not above 7) and the notice says it."""
    cfg = vertical_config("dpzv", data__dataset="mnist", data__fallback="digits", data__num_clients=7,
                          data__data_dir=str(tmp_path), data__options={"max_train": 10000})
    fed = build_federation(cfg)
    notice = capsys.readouterr().err
    assert "fallback 'digits'" in notice and "4 parties instead" in notice and "max_train" in notice
    assert [b.numel() for b in fed.vertical.blocks] == [16, 16, 16, 16]
    assert fed.info["notice"] in notice


def test_an_unreachable_budget_is_refused_before_training(vertical_config):
    with pytest.raises(ConfigError, match="recipe.epsilon"):
        build_federation(vertical_config("vafl", recipe={"epsilon": 1e-9, "delta": 1e-9}), quiet=True)


def test_a_round_from_params_on_the_meta_device_is_refused_in_one_line(vertical_config):
    """It failed with torch's "META device type not an accelerator." (a RuntimeError)."""
    import dataclasses

    from trustfl.config.build import resolve_engine
    from trustfl.errors import MessageError

    cfg = vertical_config(engine__iterations_per_round=2)
    fed = build_federation(cfg, quiet=True)
    engine = resolve_engine(cfg, fed.info["engine"])
    state = engine.initial_state(fed)
    with pytest.raises(MessageError, match=r"^round 1: the engine state's `params` are on the meta device"):
        engine.run_round(fed, dataclasses.replace(state, params=state.params.to("meta")))


def test_run_info_reports_epsilon_and_delta_only_with_dp(vertical_config):
    """Without `recipe.epsilon` it said epsilon inf and delta 0.001 (the default of a key refused without DP), as
    if the run had a δ; a horizontal run without DP reports no privacy either."""
    plain = build_federation(vertical_config("dpzv"), quiet=True).info
    assert "privacy" not in plain and plain["vertical"]["method"] == "dpzv"
    assert not {"epsilon", "delta", "noise_multiplier", "accountant"} & set(plain["vertical"])
    private = build_federation(vertical_config("vafl", recipe={"epsilon": 2.0, "delta": 1e-4}), quiet=True).info
    assert private["vertical"]["epsilon"] == 2.0 and private["vertical"]["delta"] == 1e-4


@pytest.mark.parametrize("algorithm", ["dpzv", "vafl"])
def test_rdp_epsilon_is_the_accountants_for_batches_drawn_without_replacement(vertical_config, tmp_path, algorithm):
    """Every server iteration draws B of the D samples without replacement (randperm[:B]), and the noise is z times
    the replace-one sensitivity (2C): dp_accounting's RDP accountant analyses exactly that as
    ``SampledWithoutReplacementDpEvent(D, B, GaussianDpEvent(z))`` under replace-one. The reported ε is that one,
    not the smaller ε of a Poisson sample under add/remove."""
    from dp_accounting import dp_event
    from dp_accounting.privacy_accountant import NeighboringRelation
    from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

    from trustfl.privacy.analysis.gaussian import DEFAULT_RDP_ORDERS

    cfg = vertical_config(algorithm, recipe={"epsilon": 2.0, "delta": 1e-3, "accountant": "rdp"})
    result = run_experiment(cfg, tmp_path, progress=False, plots=False)
    info = json.loads((result.run_dir / "run_info.json").read_text())["vertical"]
    fed = build_federation(cfg, quiet=True)
    d, b = fed.vertical.num_samples, fed.vertical.batch_size
    step = dp_event.SampledWithoutReplacementDpEvent(d, b, dp_event.GaussianDpEvent(info["noise_multiplier"]))
    counts = torch.bincount(fed.vertical.order, minlength=4).tolist()
    for party, spent in result.summary["epsilon"].items():
        releases = (fed.vertical.order.numel() if fed.vertical.charge_all else counts[int(party)]) \
            * fed.vertical.method.releases
        acc = RdpAccountant(list(DEFAULT_RDP_ORDERS), NeighboringRelation.REPLACE_ONE).compose(step, releases)
        assert spent == pytest.approx(acc.get_epsilon(1e-3), rel=1e-9)
        assert spent <= 2.0 * (1 + 1e-9)


def test_pld_is_refused_for_batches_drawn_without_replacement(vertical_config):
    with pytest.raises(ConfigError, match="recipe.accountant"):
        build_federation(vertical_config("dpzv", recipe={"epsilon": 1.0, "accountant": "pld"}), quiet=True)
