"""``data.dataset = "synthetic"``: FedProx's Synthetic(α, β) generated per client on demand
(trustfl/data/population.py).

Statistical checks use fixed seeds; their bounds are several standard errors wide.
"""
import json
import math

import numpy as np
import pytest
import torch

from trustfl.config.build import build_federation
from trustfl.config.load import config_from_dict
from trustfl.data.datasets import load_dataset
from trustfl.data.population import power_law_sizes
from trustfl.engine.executors import SequentialExecutor, VectorizedExecutor
from trustfl.engine.local import ClientPlan, TrainData
from trustfl.errors import ConfigError
from trustfl.experiment import run_experiment
from trustfl.types import CohortContext

from tests.child_run import run_in_child


def _population(**options):
    options.setdefault("test_clients", 1)
    return load_dataset("synthetic", seed=options.pop("seed", 0), **options).population


def _config(**data_options):
    num_clients = data_options.pop("num_clients", 200)
    return {"name": "synthetic", "seed": 0, "rounds": 30,
            "data": {"dataset": "synthetic", "num_clients": num_clients, "partition": {"name": "natural"},
                     "options": {"alpha": 0.0, "beta": 0.0, "max_samples": 200, "test_clients": 200,
                                 **data_options}},
            "model": {"name": "logreg"}, "cohort": {"sampler": "uniform", "size": 20},
            "client": {"epochs": 5, "batch_size": 10, "lr": 0.05},
            "engine": {"checkpoint_every": 0, "eval_every": 10}}


def test_a_client_is_the_same_whoever_else_is_sampled_and_whatever_the_population_size():
    small, large = _population(num_clients=10), _population(num_clients=5_000)
    assert np.array_equal(small.sizes, large.sizes[:10])  # the sizes are one vectorised stream, drawn in order
    for k in (0, 3, 9):
        a, b = small.client_train(k), large.client_train(k)
        assert torch.equal(a["x"], b["x"]) and torch.equal(a["y"], b["y"])
    data = TrainData.lazy(large, 10)
    rows = [torch.arange(int(large.offsets[k]), int(large.offsets[k + 1])) for k in (4_321, 7, 999)]
    together, local = data.for_cohort(rows)
    alone, local_alone = data.for_cohort(rows[2:])
    reordered, local_re = data.for_cohort(rows[::-1])
    for batch in (together.gather(local[2]), alone.gather(local_alone[0]), reordered.gather(local_re[0])):
        assert torch.equal(batch["x"], large.client_train(999)["x"])
        assert torch.equal(batch["y"], large.client_train(999)["y"])
    assert together.tensors["x"].shape[0] == sum(int(r.numel()) for r in rows)  # only the group's clients
    part = data.for_cohort([rows[0][5:9]])[0]  # a part of a client's rows: the whole client is materialised
    assert torch.equal(part.gather(data.for_cohort([rows[0][5:9]])[1][0])["x"], large.client_train(4_321)["x"][5:9])


def test_dense_data_pass_through_unchanged():
    data = TrainData({"x": torch.randn(10, 2), "y": torch.arange(10)}, 10)
    rows = [torch.tensor([1, 4]), torch.tensor([9])]
    same, local = data.for_cohort(rows)
    assert same is data and all(a is b for a, b in zip(local, rows))


def test_alpha_spreads_the_local_models_and_beta_the_local_inputs():
    def spreads(a, b):
        pop = _population(num_clients=300, alpha=a, beta=b, samples=60)
        model_means = [pop.client_model(k)[0].mean() for k in range(300)]
        input_means = [pop.client_train(k)["x"].double().mean().item() for k in range(300)]
        return np.var(model_means), np.var(input_means)

    model0, input0 = spreads(0.0, 0.0)
    model1, input1 = spreads(1.0, 1.0)
    # Var over clients of mean(W_k) = α + 1/(C·d); of the mean input ≈ β + 1/d (+ the sampling noise)
    assert model0 < 0.005 and 0.7 < model1 < 1.3
    assert input0 < 0.05 and 0.7 < input1 < 1.3


def test_labels_are_the_argmax_of_the_clients_own_linear_model():
    pop = _population(num_clients=20, alpha=1.0, beta=1.0)
    agree_own, agree_other = [], []
    for k in range(20):
        x, y, _ = pop.client(k)
        w, b, _ = pop.client_model(k)
        # labelled in float64 before x is stored as float32: a near-tie may rarely flip
        assert np.mean(y == np.argmax(x.astype(np.float64) @ w.T + b, axis=1)) > 0.995
        w2, b2, _ = pop.client_model((k + 1) % 20)
        agree_other.append(np.mean(y == np.argmax(x.astype(np.float64) @ w2.T + b2, axis=1)))
    assert np.mean(agree_other) < 0.5  # another client's model labels the same inputs differently


def test_sizes_follow_the_capped_power_law():
    sizes = power_law_sizes(0, 200_000, 50, 1000)
    assert sizes.min() >= 50 and sizes.max() == 1000
    # P(n = cap) = P(LogNormal(4, 2) >= 950) = 1 − Φ((ln 950 − 4)/2); median ⌊e⁴⌋ + 50 = 104
    capped = 0.5 * math.erfc((math.log(950) - 4) / 2 / math.sqrt(2))
    assert abs(np.mean(sizes == 1000) - capped) < 0.003
    assert abs(np.median(sizes) - 104) <= 2
    pop = _population(num_clients=50, samples=40)
    assert set(pop.sizes.tolist()) == {40} and set(pop.offsets.diff().tolist()) == {32}  # 80 % is training data


def test_fedavg_on_a_few_hundred_clients_trains(tmp_path, one_torch_thread):
    result = run_experiment(config_from_dict(_config()), tmp_path / "run", progress=False, plots=False)
    test_y = load_dataset("synthetic", seed=0, num_clients=200, alpha=0.0, beta=0.0, max_samples=200,
                          test_clients=200).test_y
    majority = torch.bincount(test_y).max().item() / len(test_y)
    assert majority < 0.2 and result.summary["final_accuracy"] > 2 * majority
    info = json.loads((result.run_dir / "run_info.json").read_text())
    assert "sizes" not in info["partition"] and info["partition"]["size_quantiles"]["1"] <= 160


def test_vectorized_and_sequential_executors_agree_on_a_population(one_torch_thread):
    fed = build_federation(config_from_dict(_config()), quiet=True)
    plans = [ClientPlan(c, fed.client_rows[c], 10) for c in (3, 150, 7)]
    g = fed.initial_params
    cohort = CohortContext((3, 150, 7), 0, fed.seed, fed.training.lr, torch.full((3,), 10.0, dtype=torch.float64),
                           torch.zeros(3, dtype=torch.float64), {"model": g}, {}, fed.layout)
    vec = VectorizedExecutor().run(fed.local_job(), plans, cohort)
    seq = SequentialExecutor().run(fed.local_job(), plans, cohort)
    assert torch.allclose(vec.updates, seq.updates, atol=1e-5) and vec.updates.abs().sum() > 0


@pytest.mark.slow
def test_a_million_synthetic_clients_run_one_round_under_2_gb(tmp_path):
    config = {"name": "million", "rounds": 1, "data": {"dataset": "synthetic", "num_clients": 1_000_000,
                                                       "partition": {"name": "natural"}},
              "model": {"name": "logreg"}, "cohort": {"sampler": "uniform", "size": 100},
              "client": {"batch_size": 10, "lr": 0.01}, "engine": {"checkpoint_every": 0}}
    rounds, bytes_up, peak_mb = run_in_child(config, tmp_path / "run")
    assert rounds == 1 and bytes_up == 100 * 610 * 4  # 100 clients sent a (60·10 + 10)-parameter delta
    assert peak_mb < 2048
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert info["partition"]["num_clients"] == 1_000_000 and "sizes" not in info["partition"]


@pytest.mark.parametrize("option, value", [("alpha", -1.0), ("alpha", math.nan), ("beta", math.inf),
                                           ("beta", "1"), ("num_clients", 0), ("min_samples", 0),
                                           ("max_samples", 10), ("samples", -1), ("dim", 0), ("classes", 1),
                                           ("test_clients", 0), ("test_clients", 100_001)])
def test_bad_options_are_refused_naming_the_option(option, value):
    with pytest.raises(ConfigError, match=f"`{option}`"):
        load_dataset("synthetic", **{"num_clients": 10, option: value})


@pytest.mark.parametrize("edit, key", [
    (lambda c: c["data"].update(partition={"name": "iid"}), "data.partition"),
    (lambda c: c["data"].update(partition={"name": "natural", "shards": 3}), "data.partition.shards"),  # was dropped
    (lambda c: c["data"]["options"].update(num_clients=5), "data.options.num_clients"),
    (lambda c: c["data"]["options"].update(alpha=-0.5), "alpha"),
    (lambda c: c.update(evaluators=[{"name": "accuracy"}, {"name": "knn"}]), "evaluators"),
    (lambda c: c.update(attack={"name": "sign_flip", "num_byzantine": 2, "byzantine_hold_data": False}),
     "attack.byzantine_hold_data"),
])
def test_what_a_population_cannot_run_is_refused_naming_the_key(edit, key):
    cfg = _config()
    edit(cfg)
    with pytest.raises(ConfigError, match=f"`{key}"):
        build_federation(config_from_dict(cfg), quiet=True)


def test_the_unbuilt_training_set_refuses_reads():
    fed = build_federation(config_from_dict(_config(num_clients=20)), quiet=True)
    with pytest.raises(ConfigError, match="`data.dataset`"):
        fed.train_data.tensors["x"]


def test_a_cohort_larger_than_the_free_memory_is_refused_before_it_is_generated(monkeypatch):
    """A round materialises its clients' examples (each client's part, then their concatenation): with more rows
    than the free memory holds, the refusal comes first (a MemoryError, which the run loop reports naming the
    round's sizes), not from an allocation that an overcommitting machine grants and then kills the process for."""
    import trustfl.core.memory as memory

    pop = _population(num_clients=50, samples=100, dim=60)  # 80 training rows a client, 248 bytes a row
    generated = []
    monkeypatch.setattr(type(pop), "client_train", lambda self, k: generated.append(k) or {})
    monkeypatch.setattr(memory, "free_memory", lambda device: 2 * 248 * 80 * 3)  # three clients' worth
    with pytest.raises(MemoryError, match="allocate 158720 bytes"):
        pop.materialise([0, 1, 2, 3])
    assert generated == []
    monkeypatch.undo()
    monkeypatch.setattr(memory, "free_memory", lambda device: 2 * 248 * 80 * 3)
    assert pop.materialise([5, 6, 7])["x"].shape == (240, 60)  # exactly three clients fit
