"""The generalised engine: objectives, client state, gradient transforms, downlink, engines by config.

FedProx, SCAFFOLD and regression are the proof that the parts compose; the acceptance greps (no loss outside the
objectives, no DP-mode branch in an executor, no engine imported by experiment.py) are AST checks.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trustfl.config.build import build_federation
from trustfl.config.load import load_config
from trustfl.engine.executors import SequentialExecutor, VectorizedExecutor
from trustfl.engine.local import ClientPlan
from trustfl.engine.sync import initial_state, run_round
from trustfl.errors import ConfigError
from trustfl.experiment import run_experiment
from tests.child_run import run_in_child
from tests.engine.rounds import train
from trustfl.types import CohortContext

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "trustfl"




# ---------------------------------------------------------------- FedProx

def test_fedprox_with_mu_zero_is_fedavg_bitwise(small_config):
    common = dict(client={"epochs": 2, "batch_size": 16, "lr": 0.1, "momentum": 0.5, "weight_decay": 1e-4,
                          "step_budget": {"name": "stragglers", "fraction": 0.5}})
    _, fedavg, _ = train(small_config(**common), 3)
    _, prox0, _ = train(small_config(algorithm="fedprox", recipe={"mu": 0.0}, **common), 3)
    _, prox, _ = train(small_config(algorithm="fedprox", recipe={"mu": 1.0}, **common), 3)
    assert torch.equal(fedavg.params, prox0.params)
    assert not torch.equal(fedavg.params, prox.params)


def test_proximal_term_keeps_local_models_near_the_global_one(small_config):
    def update_norm(mu):
        cfg = small_config(algorithm="fedprox", recipe={"mu": mu}, rounds=1,
                           client={"epochs": 5, "batch_size": 16, "lr": 0.1})
        fed = build_federation(cfg, quiet=True)
        state = initial_state(fed)
        new, _ = run_round(fed, state)
        return float((new.params - state.params).norm())

    norms = [update_norm(mu) for mu in (0.0, 1.0, 10.0)]
    assert norms[0] > norms[1] > norms[2]


def test_stragglers_take_fewer_steps(small_config):
    full = build_federation(small_config(cohort={"sampler": "all"}), quiet=True)
    strag = build_federation(small_config(cohort={"sampler": "all"},
                                          client={"epochs": 3, "batch_size": 16, "lr": 0.1,
                                                  "step_budget": {"name": "stragglers", "fraction": 1.0}}),
                             quiet=True)
    from trustfl.engine.round_parts import make_plan as _plan
    planned = [p for p in (_plan(full, c, 0) for c in range(8))]
    budgets = [_plan(strag, c, 0).max_steps for c in range(8)]
    assert all(p.max_steps is None for p in planned)
    assert all(b is not None and 1 <= b for b in budgets)


# ---------------------------------------------------------------- SCAFFOLD

def test_scaffold_server_variate_is_the_mean_of_client_variates(small_config):
    cfg = small_config(algorithm="scaffold", cohort={"sampler": "all"}, server={"weighting": "uniform"})
    fed, state, history = train(cfg, 4)
    d = fed.layout.numel
    client_c = torch.stack([state.clients[c]["scaffold/c"] for c in range(fed.num_clients)])
    server_c = state.shared["scaffold"]["c"]
    assert client_c.shape == (fed.num_clients, d)
    assert float(server_c.norm()) > 0
    assert torch.allclose(server_c, client_c.mean(0), atol=1e-6, rtol=1e-5)
    # the variates travel: uplink carries Δc_i beside the delta, downlink carries c beside the model
    assert history[-1]["bytes_up"] == 2 * d * 4 * fed.num_clients
    assert history[-1]["bytes_down"] == 2 * d * 4 * fed.num_clients


def test_scaffold_with_partial_participation_allocates_only_sampled_clients(small_config):
    cfg = small_config(algorithm="scaffold", cohort={"sampler": "uniform", "size": 2}, data__num_clients=8)
    fed, state, _ = train(cfg, 1)
    assert len(state.clients) == 2


def test_scaffold_resumes_bitwise(small_config, tmp_path):
    cfg = small_config(algorithm="scaffold", rounds=6, engine={"checkpoint_every": 2})
    full = run_experiment(cfg, tmp_path / "full", progress=False)
    run_experiment(cfg, tmp_path / "part", progress=False, stop_after=3)
    saved = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=False)["state"]
    assert saved["round"] == 3 and "scaffold" in saved["shared"]
    # The store holds exactly the clients drawn in rounds 0–2 (cohorts of 5 of 8), each with its variate.
    from trustfl.engine.round_parts import sample_cohort
    fed = build_federation(cfg, quiet=True)
    drawn = set().union(*(sample_cohort(fed, r) for r in range(3)))
    assert set(saved["clients"]) == drawn and all(set(e) == {"scaffold/c"} for e in saved["clients"].values())
    resumed = run_experiment(None, resume=tmp_path / "part", progress=False)
    assert torch.equal(full.params, resumed.params)
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=False)["state"]
    b = torch.load(tmp_path / "part" / "checkpoint.pt", weights_only=False)["state"]
    assert a["clients"].keys() == b["clients"].keys()
    for cid in a["clients"]:
        assert torch.equal(a["clients"][cid]["scaffold/c"], b["clients"][cid]["scaffold/c"])
    assert torch.equal(a["shared"]["scaffold"]["c"], b["shared"]["scaffold"]["c"])


def test_extras_are_not_sent_under_message_level_privacy_noise(small_config):
    with pytest.raises(ConfigError, match="client.transforms"):
        build_federation(small_config(algorithm="scaffold", client_stages=[
            {"name": "clip_l2", "max_norm": 1.0}, {"name": "gaussian_noise", "std": 0.1}]), quiet=True)


# ---------------------------------------------------------------- regression

def test_fedavg_linear_regression_reaches_least_squares(tmp_path):
    from sklearn.linear_model import LinearRegression
    from sklearn.metrics import r2_score
    from trustfl.data import load_dataset

    result = run_experiment(load_config(ROOT / "configs/regression/diabetes_linear.toml",
                                        ["rounds=60", "engine.checkpoint_every=0"]), tmp_path / "r", progress=False)
    ds = load_dataset("diabetes", seed=0)
    ols = LinearRegression().fit(ds.train_x.numpy(), ds.train_y.numpy())
    r2_ols = r2_score(ds.test_y.numpy(), ols.predict(ds.test_x.numpy()))
    s = result.summary
    assert s["primary_metric"] == "r2" and s["metrics"] == ["mse", "mae", "r2", "loss"]
    assert abs(s["final_r2"] - r2_ols) < 0.03
    assert abs(s["final_mse"] - s["final_loss"]) < 1e-6  # the mse test loss (float32) is the MSE (float64)
    row = result.rows[-1]
    assert "accuracy" not in row and {"mse", "mae", "r2"} <= set(row)
    for name in ("mse.png", "mae.png", "r2.png", "loss.png"):
        assert (tmp_path / "r" / name).is_file()
    assert not (tmp_path / "r" / "accuracy.png").exists()


@pytest.mark.slow
@pytest.mark.parametrize("config, least_r2", [("diabetes_mlp", 0.2), ("diabetes_dpsgd", 0.2),
                                              ("diabetes_robust", 0.2)])
def test_regression_variants_learn(config, least_r2, tmp_path):
    cfg = load_config(ROOT / f"configs/regression/{config}.toml", ["engine.checkpoint_every=0"])
    result = run_experiment(cfg, tmp_path / config, progress=False)
    assert result.summary["final_r2"] >= least_r2
    assert result.summary["final_mse"] < 0.85  # a constant predictor scores about 1 on standardised targets
    if config == "diabetes_dpsgd":
        assert max(result.summary["epsilon"].values()) <= 3.0 + 1e-9


def test_objective_must_match_the_data(small_config):
    with pytest.raises(ConfigError, match="`objective`.*cross_entropy"):
        build_federation(small_config(data={"dataset": "diabetes", "num_clients": 4},
                                      objective={"name": "cross_entropy"}), quiet=True)
    with pytest.raises(ConfigError, match="`objective`.*mse"):
        build_federation(small_config(objective={"name": "mse"}), quiet=True)
    with pytest.raises(ConfigError, match="`attack.name`"):
        build_federation(small_config(data={"dataset": "diabetes", "num_clients": 6},
                                      attack={"name": "label_flip", "num_byzantine": 1}), quiet=True)


def test_unknown_engine_and_primary_metric_are_named(small_config):
    with pytest.raises(ConfigError, match="`engine.kind`.*valid names: async, sync"):
        build_federation(small_config(engine={"kind": "warp"}), quiet=True)
    with pytest.raises(ConfigError, match="`report.primary_metric`"):
        build_federation(small_config(report={"primary_metric": "r2"}), quiet=True)


def test_cli_validate_and_list(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text((ROOT / "configs/regression/diabetes_linear.toml").read_text().replace('name = "mse"',
                                                                                           'name = "cross_entropy"'))
    out = subprocess.run([sys.executable, "-m", "trustfl", "validate", str(bad)], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "`objective`" in out.stderr
    listed = subprocess.run([sys.executable, "-m", "trustfl", "list"], capture_output=True, text=True, cwd=ROOT)
    kinds = dict(line.split(": ", 1) for line in listed.stdout.strip().splitlines())
    for kind, name in [("objective", "mse"), ("evaluator", "r2"), ("gradient_transform", "scaffold"),
                       ("gradient_transform", "proximal"), ("engine", "sync"), ("gradient_method", "per_example"),
                       ("step_budget", "stragglers"), ("downlink_stage", "cast"), ("dataset", "diabetes")]:
        assert name in kinds[kind].split(", "), (kind, name)


# ---------------------------------------------------------------- plugins, downlink, scale

def test_user_objective_from_a_plugin_module(small_config, tmp_path):
    plugin = tmp_path / "my_loss.py"
    plugin.write_text(
        "import torch.nn.functional as F\n"
        "from trustfl.objectives import register_objective\n"
        "@register_objective('test_label_smoothing')\n"
        "def smooth(outputs, batch):\n"
        "    return F.cross_entropy(outputs, batch['y'], reduction='none', label_smoothing=0.1)\n")
    cfg = small_config(rounds=3, plugins=[str(plugin)], objective={"name": "test_label_smoothing"},
                       evaluators=[{"name": "accuracy"}, {"name": "loss"}])
    result = run_experiment(cfg, tmp_path / "run", progress=False)
    assert result.summary["final_accuracy"] > 0.5
    with pytest.raises(ConfigError, match=r"`plugins\[0\]`"):
        build_federation(small_config(plugins=[str(tmp_path / "missing.py")]), quiet=True)


def test_bfloat16_downlink_halves_bytes_down_and_still_trains(small_config):
    _, exact, h1 = train(small_config(), 3)
    fed, cast, h2 = train(small_config(downlink=[{"name": "cast", "dtype": "bfloat16"}]), 3)
    assert h2[0]["bytes_down"] * 2 == h1[0]["bytes_down"] == fed.layout.numel * 4 * 5
    assert h2[0]["bytes_up"] == h1[0]["bytes_up"]
    assert not torch.equal(exact.params, cast.params)
    assert float((exact.params - cast.params).abs().max()) < 0.05
    assert h2[-1]["train_loss"] < h2[0]["train_loss"]


def test_a_million_stateless_clients_run_one_round_under_2_gb(tmp_path):
    config = {"name": "million", "rounds": 1, "plugins": ["tests/engine/million_plugin.py"],
              "data": {"dataset": "million_points", "num_clients": 1_000_000}, "model": {"name": "logreg"},
              "cohort": {"sampler": "uniform", "size": 100}, "client": {"batch_size": 1, "lr": 0.1},
              "engine": {"checkpoint_every": 0}}
    rounds, bytes_up, peak_mb = run_in_child(config, tmp_path / "run")
    assert rounds == 1 and bytes_up == 100 * 6 * 4  # 100 clients sent a (2·2 + 2)-parameter delta
    assert peak_mb < 2048


# ---------------------------------------------------------------- executors

def _cohort(fed, plans, global_flat):
    return CohortContext(tuple(p.client_id for p in plans), 0, fed.seed, fed.training.lr,
                         torch.tensor([float(p.batch_size) for p in plans], dtype=torch.float64),
                         torch.zeros(len(plans), dtype=torch.float64), {"model": global_flat}, {}, fed.layout)


@pytest.mark.parametrize("chain", ["momentum", "plain SGD (fused)"])
def test_executors_start_each_client_from_its_own_parameters(small_config, chain):
    local = {} if chain == "momentum" else {"client__momentum": 0.0, "client__weight_decay": 0.0}
    fed = build_federation(small_config(**local), quiet=True)
    plans = [ClientPlan(c, fed.client_rows[c], fed.batch_sizes[c]) for c in (0, 2, 5)]
    g = fed.initial_params
    cohort = _cohort(fed, plans, g)
    starts = torch.stack([g + 0.01 * k for k in range(3)])
    kept = starts.clone()
    vec = VectorizedExecutor().run(fed.local_job(), plans, cohort, start=starts)
    seq = SequentialExecutor().run(fed.local_job(), plans, cohort, start=starts)
    assert torch.equal(starts, kept)  # the starts are read, never written
    assert torch.allclose(vec.updates, seq.updates, atol=1e-5)
    for k, plan in enumerate(plans):  # each client alone, sent its own start as the model: same progress
        alone = VectorizedExecutor().run(fed.local_job(), [plan], _cohort(fed, [plan], starts[k]))
        assert torch.allclose(vec.updates[k], alone.updates[0], atol=1e-5)
    assert not torch.allclose(vec.updates[1], VectorizedExecutor().run(fed.local_job(), plans, cohort).updates[1],
                              atol=1e-4)
    same = VectorizedExecutor().run(fed.local_job(), plans, cohort, start=g.repeat(3, 1))
    broadcast = VectorizedExecutor().run(fed.local_job(), plans, cohort)
    assert torch.equal(same.updates, broadcast.updates)
    for wrong in (fed.layout.unflatten(starts), starts[:2], starts[:, 1:]):  # stacked dict, too few rows, too short
        with pytest.raises(ConfigError, match=r"`start` must be the 3 clients' flat starting parameters"):
            VectorizedExecutor().run(fed.local_job(), plans, cohort, start=wrong)


def test_vectorized_round_equals_a_plain_pytorch_loop(small_config):
    """Oracle: nn.Module + torch.optim.SGD per client on the same batches (momentum and weight decay)."""
    from trustfl.engine.local import batch_schedule
    import torch.nn.functional as F

    fed = build_federation(small_config(), quiet=True)
    plans = [ClientPlan(c, fed.client_rows[c], fed.batch_sizes[c]) for c in range(4)]
    g = fed.initial_params
    results = VectorizedExecutor().run(fed.local_job(), plans, _cohort(fed, plans, g))
    x, y = fed.train_data.tensors["x"], fed.train_data.tensors["y"]
    for k, plan in enumerate(plans):
        model = fed.model
        torch.nn.utils.vector_to_parameters(g.clone(), model.parameters())
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5, weight_decay=1e-4)
        for batch in batch_schedule(fed.training, plan, fed.seed, 0):
            idx = plan.rows[batch]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
        local = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
        assert torch.allclose(results.updates[k], local - g, atol=1e-5)


# ---------------------------------------------------------------- acceptance greps

_LOSSES = {"cross_entropy", "nll_loss", "mse_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits",
           "l1_loss", "huber_loss", "smooth_l1_loss", "CrossEntropyLoss", "MSELoss", "NLLLoss", "BCEWithLogitsLoss"}


def _calls(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return names


def test_no_loss_function_outside_the_objectives():
    offenders = {str(p.relative_to(ROOT)): sorted(_calls(p) & _LOSSES) for p in PKG.rglob("*.py")
                 if "objectives" not in p.parts and _calls(p) & _LOSSES}
    assert not offenders


def test_executors_do_not_branch_on_a_dp_mode():
    tree = ast.parse((PKG / "engine" / "executors.py").read_text())
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not names & {"dp_mode", "private", "dp_method", "clip"}


def test_experiment_imports_no_engine():
    tree = ast.parse((PKG / "experiment.py").read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    engines = {m for m in modules if m.startswith("trustfl.engine.")
               and '@register("engine"' in (ROOT / (m.replace(".", "/") + ".py")).read_text()}
    assert not engines


def test_empty_poisson_batches_are_skipped_alike_by_both_executors(small_config):
    """Plain SGD takes no step on an empty batch; tiny Poisson batches make some (schedule-derived masks)."""
    common = dict(client={"epochs": 1, "batch_size": 2, "lr": 0.1, "batch_sampler": "poisson", "momentum": 0.5},
                  cohort={"sampler": "all"})
    fed, vec, _ = train(small_config(**common), 2)
    _, seq, _ = train(small_config(engine={"executor": "sequential", "checkpoint_every": 0}, **common), 2)
    from trustfl.engine.local import batch_schedule
    sizes = [int(b.numel()) for c in range(fed.num_clients)
             for b in batch_schedule(fed.training, ClientPlan(c, fed.client_rows[c], 2), fed.seed, 0)]
    assert 0 in sizes  # the case under test occurs
    assert float((vec.params - seq.params).abs().max()) <= 1e-5
