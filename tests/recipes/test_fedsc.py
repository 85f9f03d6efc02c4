"""FedSC (Algorithm 1 of the FedSC paper) in the synchronous engine: the server's correlation store, the personal
downlink R̃_{−j}, vectorized = sequential local training, DP-CalR's ledgers, clients with little data, bad input."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from trustfl.config.build import build_federation
from trustfl.config.load import config_from_dict
from trustfl.core.registry import register
from trustfl.data.partition import AbstractPartitioner
from trustfl.engine.executors import VectorizedExecutor
from trustfl.engine.sync import initial_state, run_round
from trustfl.errors import ConfigError
from trustfl.experiment import run_experiment


def _cfg(**over):
    data = {"name": "fedsc-test", "algorithm": "fedsc", "seed": 1, "rounds": 4,
            "data": {"dataset": "digits_canvas", "num_clients": 5,
                     "partition": {"name": "classes_per_client", "classes_per_client": 2}},
            "model": {"name": "sc_mlp", "hidden": [32], "projector": [32], "dim": 8},
            "client": {"epochs": 1, "batch_size": 32, "lr": 0.05, "momentum": 0.9},
            "engine": {"checkpoint_every": 0}, "recipe": {"share_views": 2}}
    for key, value in over.items():
        node = data
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return config_from_dict(data)


class Spy(VectorizedExecutor):
    """Records what each round's cohort received alone (``CohortContext.personal``)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def run(self, job, plans, cohort, start=None):
        self.seen.append((cohort.client_ids, {k: v.clone() for k, v in cohort.personal.items()}))
        return super().run(job, plans, cohort, start)


def test_store_is_incremental_and_reference_excludes_the_client(one_torch_thread):
    fed = build_federation(_cfg(cohort={"sampler": "uniform", "size": 2}, rounds=4), quiet=True)
    fed.executor = Spy()
    state = initial_state(fed)
    for r in range(4):
        before = state.statistics.get("fedsc_correlation")
        state, metrics = run_round(fed, state)
        st = state.statistics["fedsc_correlation"]
        q = st["weights"].to(st["matrices"].dtype)
        # the incremental total equals recomputing Σ_j q_j R̃_j
        torch.testing.assert_close(st["total"], torch.einsum("j,jhk->hk", q, st["matrices"]), rtol=1e-5, atol=1e-6)
        ids, personal = fed.executor.seen[-1]
        if r == 0:  # all clients upload at the first share, whatever the cohort (Algorithm 1, t = 1)
            assert metrics["fedsc_correlation/uploads"] == 5
        else:
            assert metrics["fedsc_correlation/uploads"] == len(ids)
            absent = [j for j in range(5) if j not in ids]
            torch.testing.assert_close(st["matrices"][absent], before["matrices"][absent], rtol=0, atol=0)
        for i, j in enumerate(ids):  # what client j received: the q-weighted mean of the OTHER clients' matrices
            others = [k for k in range(5) if k != j]
            want = torch.einsum("j,jhk->hk", q[others], st["matrices"][others]) / q[others].sum()
            torch.testing.assert_close(personal["reference"][i], want, rtol=1e-4, atol=1e-6)
        assert personal["alpha"].tolist() == pytest.approx([1.0 - 0.8 * r / 4] * len(ids))


def test_alpha_q_sends_each_client_its_weight_every_round(one_torch_thread):
    """``recipe.alpha = "q"``: α = q_j (Eq. 5), not the schedule; unequal client sizes give unequal α."""
    fed = build_federation(_cfg(rounds=3, recipe={"share_views": 2, "alpha": "q"}), quiet=True)
    fed.executor = Spy()
    state = initial_state(fed)
    sizes = torch.tensor(fed.client_rows.sizes(), dtype=torch.float64)
    assert len(set(sizes.tolist())) > 1
    for _ in range(3):
        state, _ = run_round(fed, state)
        ids, personal = fed.executor.seen[-1]
        want = (sizes / sizes.sum())[list(ids)]
        torch.testing.assert_close(personal["alpha"].double(), want, rtol=1e-6, atol=0)


def test_reference_does_not_depend_on_the_clients_own_matrix(one_torch_thread):
    fed = build_federation(_cfg(rounds=2), quiet=True)
    state, _ = run_round(fed, initial_state(fed))
    stat = dict(fed.statistics)["fedsc_correlation"]
    st = state.statistics["fedsc_correlation"]
    sent = stat.personal(st, 1, [0, 1, 2, 3, 4])["reference"]
    changed = dict(st, matrices=st["matrices"].clone())
    changed["matrices"][2] += 5.0
    changed["total"] = torch.einsum("j,jhk->hk", st["weights"].to(st["total"].dtype), changed["matrices"])
    again = stat.personal(changed, 1, [2])["reference"][0]
    torch.testing.assert_close(again, sent[2], rtol=1e-5, atol=1e-5)


def test_vectorized_equals_sequential(one_torch_thread):
    runs = []
    for executor in ("vectorized", "sequential"):
        fed = build_federation(_cfg(rounds=2, engine={"executor": executor, "checkpoint_every": 0}), quiet=True)
        state = initial_state(fed)
        for _ in range(2):
            state, _ = run_round(fed, state)
        runs.append(state.params)
    torch.testing.assert_close(runs[0], runs[1], rtol=1e-4, atol=1e-5)


def test_dp_calr_budget_is_calibrated_charged_and_reported(tmp_path, one_torch_thread):
    cfg = _cfg(rounds=4, recipe={"share_views": 2, "epsilon": 8.0, "delta": 1e-3, "share_from": 2,
                                 "share_every": 2})
    result = run_experiment(cfg, tmp_path / "run", progress=False, plots=False)
    eps = result.summary["epsilon"]
    assert set(eps) == {str(j) for j in range(5)} and result.summary["delta"] == 1e-3
    # 2 releases (rounds 2 and 4): each client spends its budget, not more
    assert all(7.9 < e <= 8.0 * (1 + 1e-9) for e in eps.values())
    shared = [r for r in result.rows if r.get("fedsc_correlation/uploads")]
    assert [r["round"] for r in shared] == [2, 4]
    assert result.rows[0]["fedsc_correlation/uploads"] == 0 and result.rows[0]["epsilon_max"] == 0


def test_budget_the_schedule_cannot_meet_is_refused_before_training():
    with pytest.raises(ConfigError, match="recipe.epsilon"):
        build_federation(_cfg(recipe={"epsilon": 0.5, "sigma": 1e-4}), quiet=True)


@pytest.mark.parametrize("mu", [1e-75, 1e76])
def test_calibrated_sigma_float32_cannot_draw_is_refused_before_training(mu):
    """σ_j ∝ μ: at μ's extremes the σ that spends ε lies beyond float32 (its noise was inf or 0)."""
    with pytest.raises(ConfigError, match=r"recipe\.epsilon.*calibrated σ = .* outside \[1e-30, 1e\+30\]"):
        build_federation(_cfg(recipe={"share_views": 2, "epsilon": 1.0, "mu": mu}), quiet=True)


@pytest.mark.parametrize("key, value, path", [
    ("recipe__mu", -1.0, "recipe.mu"), ("recipe__share_views", 0, "recipe.share_views"),
    ("recipe__sigma", -0.1, "recipe.sigma"), ("recipe__share_every", 0, "recipe.share_every"),
    ("recipe__alpha_end", 1.5, "recipe.alpha_end"), ("recipe__views", 0, "recipe.views"),
    ("recipe__alpha", "linear", "recipe.alpha"),
    ("recipe__delta", 1.0, "recipe.delta"), ("recipe__epsilon", 0.0, "recipe.epsilon"),
    # beyond what float32 / the accounting represent (σ² underflowed into a ZeroDivisionError, √μ overflowed float32)
    ("recipe__sigma", 1e-300, "recipe.sigma"), ("recipe__sigma", 1e300, "recipe.sigma"),
    ("recipe__mu", 1e300, "recipe.mu"), ("recipe__mu", 1e-200, "recipe.mu"),
    ("recipe__scale", 1e300, "recipe.scale"), ("recipe__scale", 1e-300, "recipe.scale"),
    ("recipe__augment", {"noise_std": 1e300}, "recipe.augment"),   # was inf in the views: every message rejected
    ("model__dim", 0, "model"), ("data__num_clients", 1, "data.num_clients"),
    ("client__dp__mode", "per_example", "client.dp.mode"),
    ("client__dp__epsilon", 2.0, "client.dp.epsilon"),  # a budget here protected nothing: DP-CalR's is recipe.epsilon
    ("objective", {"name": "spectral_contrastive", "scale": 2.0}, "objective.scale"),  # recipe.scale sets it
])
def test_bad_input_is_refused_with_its_key(key, value, path):
    over = {key: value}
    if key.startswith("recipe__"):
        over = {"recipe": {"share_views": 2, key.split("__")[1]: value}}
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        build_federation(_cfg(**over), quiet=True)


@pytest.mark.parametrize("recipe, key", [
    ({"alpha": "q", "alpha_start": 0.5}, "alpha_start"), ({"alpha": "q", "alpha_end": 0.5}, "alpha_end"),
    ({"alpha": "q", "alpha_endpoint": True}, "alpha_endpoint"),
    ({"delta": 1e-2}, "delta"), ({"neighboring": "zero_out"}, "neighboring"),
    ({"sigma": 0.0, "delta": 1e-2}, "delta"),
])
def test_keys_other_keys_turn_off_are_refused(recipe, key):
    """They left the models bitwise the same: the α schedule under α = q_j, δ and the neighbouring relation without
    DP-CalR noise. At their defaults they change nothing and pass (a sweep may set them so)."""
    with pytest.raises(ConfigError, match=rf"`recipe\.{key}` is set but does nothing"):
        build_federation(_cfg(recipe={"share_views": 2, **recipe}), quiet=True)
    default = {**recipe, key: {"alpha_start": 1.0, "alpha_end": 0.2, "alpha_endpoint": False, "delta": 1e-4,
                               "neighboring": "replace_one"}[key]}
    build_federation(_cfg(recipe={"share_views": 2, **default}), quiet=True)


@pytest.mark.parametrize("algorithm, recipe", [("fedsc", {"augment": {"shift": 1}}), ("fedsc", {"views": 3}),
                                               ("fedavg_byol", {"augment": {"shift": 1}}),
                                               ("fedca", {"augment": {"dropout": 0.5}})])
def test_recipe_views_are_refused_beside_the_users_own_augmentation(algorithm, recipe):
    """`client.augment` makes the views: `recipe.augment` / `recipe.views` were dropped (the models bitwise the
    same); `recipe.views` at its default passes."""
    with pytest.raises(ConfigError, match=rf"`recipe\.{next(iter(recipe))}` is set but does nothing: `client\.augment` "
                                          r"is set \('views'\) and makes the views itself"):
        build_federation(_cfg(algorithm=algorithm, recipe=recipe, client__augment={"name": "views", "num_views": 1}),
                         quiet=True)
    build_federation(_cfg(recipe={"views": 1}, client__augment={"name": "views", "num_views": 1}), quiet=True)


def test_probe_penalty_float32_cannot_fit_is_refused_before_training():
    """λ = 1e300 was a RuntimeError inside L-BFGS at the first evaluation."""
    with pytest.raises(ConfigError, match=r"`evaluators\[0\]` \(evaluator 'linear_probe'\): `l2` must be"):
        build_federation(_cfg(evaluators=[{"name": "linear_probe", "l2": 1e300}]), quiet=True)


@register("partitioner", "test_one_empty_client")
@dataclasses.dataclass(frozen=True)
class OneEmpty(AbstractPartitioner):
    name = "test_one_empty_client"

    def _split(self, labels, num_clients, rng):
        parts = np.array_split(rng.permutation(labels.size), num_clients - 1)
        return parts[:2] + [np.zeros(0, dtype=np.int64)] + parts[2:]


@pytest.mark.parametrize("privacy", [{}, {"epsilon": 2.0}, {"sigma": 0.5}])
def test_sharing_that_starts_after_the_last_round_is_refused(privacy):
    """Without DP it ran bitwise as fedavg_sc (nothing was ever shared) and nobody was told."""
    with pytest.raises(ConfigError, match=r"^`recipe.share_from` = 5 is after the last of 4 rounds: no matrix would "
                                          r"ever be shared .* algorithm \"fedavg_sc\""):
        build_federation(_cfg(recipe={"share_views": 2, "share_from": 5, **privacy}), quiet=True)
    build_federation(_cfg(recipe={"share_views": 2, "share_from": 4, **privacy}), quiet=True)  # the last round


def test_empty_client_is_refused_with_a_clear_message():
    with pytest.raises(ConfigError, match="client 2 holds no training examples"):
        build_federation(_cfg(data={"dataset": "digits_canvas", "num_clients": 5,
                                    "partition": {"name": "test_one_empty_client"}}), quiet=True)


def test_client_smaller_than_a_batch_trains_on_all_its_examples(tmp_path, one_torch_thread):
    cfg = _cfg(rounds=2, data={"dataset": "digits_canvas", "num_clients": 5, "options": {"max_train": 200},
                               "partition": {"name": "classes_per_client", "classes_per_client": 2}},
               client={"epochs": 1, "batch_size": 64, "lr": 0.05})
    result = run_experiment(cfg, tmp_path / "run", progress=False, plots=False)
    assert "fewer examples than a batch" in (tmp_path / "run" / "run_info.json").read_text()
    assert bool(torch.isfinite(result.params).all())


def test_baselines_share_nothing(one_torch_thread):
    fed = build_federation(_cfg(algorithm="fedavg_sc", recipe={}), quiet=True)
    assert fed.statistics == () and fed.weighting == "uniform"
    central = build_federation(_cfg(algorithm="centralized_sc", recipe={}), quiet=True)
    assert central.num_clients == 1 and len(central.client_rows[0]) == len(central.train_data.tensors["x"])


@pytest.mark.parametrize("cohort", [{"sampler": "uniform", "size": 2}, {"sampler": "poisson", "rate": 0.5}])
def test_centralized_refuses_a_cohort_sampler_instead_of_replacing_it(cohort):
    """The recipe replaced the user's sampler by "all"; the error then blamed `cohort.size` on a sampler 'all' that
    the config never named."""
    with pytest.raises(ConfigError, match=r'^`cohort\.sampler` must be "all" with algorithm \'centralized_sc\' .* '
                                          rf"found '{cohort['sampler']}'\.$"):
        build_federation(_cfg(algorithm="centralized_sc", recipe={}, cohort=cohort), quiet=True)


def test_centralized_says_which_data_settings_it_replaced():
    """One client with all the data, as documented, and the run's notice names what the config had instead."""
    fed = build_federation(_cfg(algorithm="centralized_sc", recipe={}), quiet=True)
    assert fed.num_clients == 1
    assert fed.info["notice"].endswith("`data.num_clients` = 5 and `data.partition` 'classes_per_client' are not used.")
    fed = build_federation(_cfg(algorithm="centralized_sc", recipe={},
                                data={"dataset": "digits_canvas", "num_clients": 1}), quiet=True)
    assert fed.num_clients == 1 and "notice" not in fed.info


@pytest.mark.slow
def test_small_setting_end_to_end_records_the_floor_and_learns(tmp_path, one_torch_thread):
    """The small setting (10 clients × 1 digit): every method records the random network's probe (the floor);
    centralized SC beats it clearly within 30 rounds; FedSC runs to the end with finite weights and both metrics.
    (Whether FedSC beats the floor on this setting: benchmarks/fedsc.md.)"""
    from trustfl.config.load import load_config

    path = "configs/fedsc/digits_canvas_1class.toml"
    central = run_experiment(load_config(path, ['algorithm="centralized_sc"', "rounds=30"]), tmp_path / "c",
                             progress=False, plots=False).summary
    assert central["final_linear_probe_accuracy"] > central["initial_linear_probe_accuracy"] + 0.05
    fed = run_experiment(load_config(path, ["rounds=10"]), tmp_path / "f", progress=False, plots=False)
    assert 0.5 < fed.summary["initial_linear_probe_accuracy"] < 0.8
    assert bool(torch.isfinite(fed.params).all()) and 0 < fed.summary["final_knn_accuracy"] <= 1


def test_run_info_reports_delta_and_neighboring_only_with_dp_calr_noise():
    """Without noise it said delta 1e-4 and neighboring "replace_one" (defaults of keys refused there), as if the
    shared matrices had a (ε, δ) guarantee."""
    plain = build_federation(_cfg(), quiet=True).info["fedsc"]
    assert plain["releases_per_client"] > 0 and not {"delta", "neighboring", "sigma"} & set(plain)
    noisy = build_federation(_cfg(recipe={"share_views": 2, "sigma": 0.5, "delta": 1e-3}), quiet=True).info["fedsc"]
    assert noisy["delta"] == 1e-3 and noisy["neighboring"] == "replace_one" and noisy["sigma"] == [0.5] * 5


def test_a_resumed_dp_calr_run_reports_every_release_charged_before_its_checkpoint(tmp_path, one_torch_thread):
    """DP-CalR's releases are charged in the statistics exchange, outside the round's events: the checkpoint's
    ledgers must hold them too, or a run resumed after a sharing round starts from ledgers without it."""
    from dp_accounting import dp_event
    from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

    from trustfl.privacy.analysis.fedsc import release_event
    from trustfl.privacy.analysis.gaussian import DEFAULT_RDP_ORDERS

    cfg = _cfg(rounds=3, recipe={"share_views": 2, "epsilon": 8.0, "delta": 1e-3},
               engine={"checkpoint_every": 1})
    run_experiment(cfg, tmp_path / "cut", progress=False, plots=False, stop_after=2)
    resumed = run_experiment(None, progress=False, plots=False, resume=tmp_path / "cut")
    fed = build_federation(cfg, quiet=True)
    (_, stat), = fed.statistics
    for cid, spent in resumed.summary["epsilon"].items():
        one = release_event(stat.sigma_of(int(cid)), stat.mu, fed.client_rows.sizes()[int(cid)], stat.neighboring)
        acc = RdpAccountant(list(DEFAULT_RDP_ORDERS)).compose(dp_event.SelfComposedDpEvent(one, 3))
        assert spent == pytest.approx(acc.get_epsilon(1e-3), rel=1e-9)


@pytest.mark.parametrize("privacy", [{"sigma": 0.5}, {"epsilon": 4.0}])
def test_dp_calr_ledgers_resume_with_the_spend_before_the_interruption(tmp_path, one_torch_thread, privacy):
    # the matrices' releases were charged to the ledgers but not to the checkpointed state: a resumed run
    # started from empty ledgers and reported a smaller ε (and could spend past its budget)
    cfg = _cfg(rounds=4, engine={"checkpoint_every": 1, "eval_every": 2}, recipe={"share_views": 2, **privacy})
    whole = run_experiment(cfg, tmp_path / "whole", progress=False, plots=False)
    run_experiment(cfg, tmp_path / "part", progress=False, plots=False, stop_after=2)
    resumed = run_experiment(None, resume=tmp_path / "part", progress=False, plots=False)
    eps = ("epsilon_min", "epsilon_median", "epsilon_max")
    assert [[r[k] for k in eps] for r in resumed.rows] == [[r[k] for k in eps] for r in whole.rows]
    assert resumed.summary["epsilon"] == whole.summary["epsilon"]
    assert torch.equal(resumed.params, whole.params)


@pytest.mark.parametrize("sigma", [0.0, 0.3])
def test_honest_uploads_meet_the_admission_bound_and_forged_ones_do_not(sigma):
    """‖R̃_j‖_F <= μ + σ(H + 10): honest uploads (norm-clipped representations, Gaussian noise) are admitted; a huge,
    negated or one-sided matrix, which passed the finite check and then reached every other client's objective
    (training stalled, probe accuracy 0.68 → 0.33), is not."""
    from trustfl.objectives.spectral import norm_clip
    from trustfl.selfsup.correlation import add_matrix_noise
    from trustfl.selfsup.share import FedSCCorrelation
    stat = FedSCCorrelation(mu=4.0, sigma=sigma, sizes=(50,) * 4)
    h, gen = 16, torch.Generator().manual_seed(0)
    z = norm_clip(torch.randn(4, 50, h, generator=gen) * 10 + 3, 2.0)  # every ‖z‖ = √μ: the largest honest norm
    honest = torch.einsum("jnh,jnk->jhk", z, z) / 50
    honest = torch.stack([add_matrix_noise(m, sigma, torch.Generator().manual_seed(j)) for j, m in enumerate(honest)])
    assert stat.admissible([0, 1, 2, 3], honest).tolist() == [True] * 4
    eye = torch.eye(h)
    forged = torch.stack([torch.full((h, h), 1e30), -1e6 * eye, torch.triu(torch.full((h, h), 1e3)),
                          (4.0 + sigma * (h + 10)) * 1.01 * eye / h ** 0.5])
    assert stat.admissible([0, 1, 2, 3], forged).tolist() == [False] * 4
    assert stat.admissible([0], (4.0 + sigma * (h + 10)) * 0.99 * eye[None] / h ** 0.5).tolist() == [True]


def test_a_refused_first_upload_does_not_hold_sharing_back(one_torch_thread, monkeypatch):
    """The store waited for a first sharing round in which every upload was accepted: one client sending a bad
    matrix every round kept FedSC on the plain SC loss for the whole run, silently. Sharing now starts with the
    refused clients' matrices set to the others' q-weighted mean, until their own accepted upload replaces them."""
    from trustfl.selfsup.share import FedSCCorrelation
    compute = FedSCCorrelation.compute

    def client_0_forges(self, represent, x, mask, client_ids, generator, augment=None):
        r = compute(self, represent, x, mask, client_ids, generator, augment)
        return torch.where(torch.tensor([c == 0 for c in client_ids]).view(-1, 1, 1), 1e30, r)

    monkeypatch.setattr(FedSCCorrelation, "compute", client_0_forges)
    fed = build_federation(_cfg(rounds=2), quiet=True)
    state, metrics = run_round(fed, initial_state(fed))
    assert (metrics["fedsc_correlation/uploads"], metrics["fedsc_correlation/rejected"]) == (4, 1)
    st = state.statistics["fedsc_correlation"]
    q = st["weights"].to(st["matrices"].dtype)
    others = torch.einsum("j,jhk->hk", q[1:], st["matrices"][1:]) / q[1:].sum()
    torch.testing.assert_close(st["matrices"][0], others, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(st["total"], others, rtol=1e-5, atol=1e-6)  # R̃ is the accepted uploads' mean
    assert bool(torch.isfinite(st["matrices"]).all()) and float(st["total"].norm()) <= 4.0
