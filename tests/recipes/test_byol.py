"""The BYOL-family baselines (FedAvg+BYOL, FedU, FedEMA): the loss against a direct computation, the target network
against a hand-written BYOL loop, FedU's and FedEMA's starting models, vectorized = sequential, bad input."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from trustfl.client.divergence_aware import FedEMAStart, FedUPredictorUpdate, encoder_mask, layer_divergence
from trustfl.config.build import build_federation
from trustfl.config.load import config_from_dict
from trustfl.core.rng import make_generator
from trustfl.engine.local import ClientPlan, batch_schedule
from trustfl.engine.sync import initial_state, run_round
from trustfl.errors import ConfigError
from trustfl.objectives.byol import BYOL, TARGET, byol_losses
from trustfl.selfsup.augment import make_views
from trustfl.types import CohortContext, ParamLayout


def _cfg(**over):
    data = {"name": "byol-test", "algorithm": "fedavg_byol", "seed": 2, "rounds": 2,
            "data": {"dataset": "digits_canvas", "num_clients": 5,
                     "partition": {"name": "classes_per_client", "classes_per_client": 2}},
            "model": {"name": "sc_mlp", "hidden": [24], "projector": [16], "dim": 8, "predictor": [12]},
            "client": {"epochs": 1, "batch_size": 32, "lr": 0.05},
            "engine": {"checkpoint_every": 0}, "recipe": {"ema": 0.9}}
    data.update(over)
    return config_from_dict(data)


def test_byol_losses_match_a_direct_computation():
    g = torch.Generator().manual_seed(0)
    p = torch.randn(7, 2, 5, generator=g, dtype=torch.float64)
    z = torch.randn(7, 2, 5, generator=g, dtype=torch.float64)
    ref = torch.stack([sum(2 - 2 * F.cosine_similarity(p[b, i], z[b, 1 - i], dim=0) for i in range(2))
                       for b in range(7)])
    torch.testing.assert_close(byol_losses(p, z), ref, rtol=1e-12, atol=1e-12)
    assert not byol_losses(p, z.requires_grad_(True)).requires_grad   # the target is never differentiated


def test_target_update_is_the_moving_average_for_rows_that_stepped():
    obj = BYOL(ema=0.9)
    start = {"w": torch.zeros(3, 2), "predictor.0.weight": torch.zeros(3, 1)}
    state = obj.local_state_init(start, None)
    assert set(state) == {TARGET + "w"}                         # the predictor has no target
    moved = {"w": torch.ones(3, 2), "predictor.0.weight": torch.ones(3, 1)}
    out = obj.local_state_update(state, moved, torch.tensor([True, False, True]))
    torch.testing.assert_close(out[TARGET + "w"], torch.tensor([[0.1, 0.1], [0.0, 0.0], [0.1, 0.1]]))
    with pytest.raises(ConfigError, match="predictor"):
        obj.local_state_init({"w": torch.zeros(3, 2)}, None)


def test_one_client_round_equals_a_hand_written_byol_loop(one_torch_thread):
    """FedAvg+BYOL with one client: the engine's model after a round equals plain PyTorch BYOL on the same batches
    and views (online SGD step, then ξ ← τξ + (1 − τ)θ), the target starting from the received model."""
    fed = build_federation(_cfg(data={"dataset": "digits_canvas", "num_clients": 1, "partition": {"name": "iid"},
                                      "options": {"max_train": 64}},
                                client={"epochs": 2, "batch_size": 32, "lr": 0.1}, rounds=1), quiet=True)
    state = initial_state(fed)
    new, _ = run_round(fed, state)

    online = copy.deepcopy(fed.model)
    torch.nn.utils.vector_to_parameters(state.params.clone(), online.parameters())
    target = copy.deepcopy(online)
    opt = torch.optim.SGD(online.parameters(), lr=0.1)
    x = fed.train_data.tensors["x"]
    rows = fed.client_rows[0]
    gen = make_generator(fed.seed, 0, 0, "views")
    kernel = fed.augment.kernel
    for batch in batch_schedule(fed.training, _plan(fed), fed.seed, 0):
        v = make_views(x[rows[batch]], 2, gen, kernel)
        flat = v.flatten(0, 1)
        p = online(flat, output="predictor").view(len(batch), 2, -1)
        with torch.no_grad():
            z = target(flat, output="projector").view(len(batch), 2, -1)
        loss = byol_losses(p, z).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for (name, t), o in zip(target.named_parameters(), online.parameters()):
                if not name.startswith("predictor."):
                    t.lerp_(o, 0.1)
    expected = torch.nn.utils.parameters_to_vector(online.parameters())
    torch.testing.assert_close(new.params, expected.detach(), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(new.params, state.params)


def _plan(fed):
    return ClientPlan(0, fed.client_rows[0], fed.batch_sizes[0])


def _cohort(local: torch.Tensor, seen: list[float], layout: ParamLayout, received: torch.Tensor,
            scale: list[float] | None = None) -> CohortContext:
    m = local.shape[0]
    state = {"local": local, "seen": torch.tensor(seen)}
    if scale is not None:
        state["scale"] = torch.tensor(scale)
    return CohortContext(tuple(range(m)), 0, 0, 0.1, torch.full((m,), 8.0), torch.zeros(m), {"model": received},
                         state, layout)


LAYOUT = ParamLayout(("backbone.w", "backbone.b", "predictor.w"), ((2, 2), (2,), (1, 2)))


def test_fedu_keeps_its_predictor_only_when_the_divergence_reaches_the_threshold():
    received = torch.zeros(8)
    near, far = torch.full((8,), 0.1), torch.full((8,), 1.0)      # ‖ΔW‖ of the 2×2 weight: 0.2 and 2.0
    local = torch.stack([near, far, far])
    cohort = _cohort(local, [1.0, 1.0, 0.0], LAYOUT, received)
    torch.testing.assert_close(layer_divergence(LAYOUT, received.expand(3, -1), local), torch.tensor([0.2, 2.0, 2.0]))
    start = FedUPredictorUpdate(threshold=0.4).personalize(received.unsqueeze(0).expand(3, -1), cohort)
    predictor = ~encoder_mask(LAYOUT, received.device)
    assert torch.equal(start[:, ~predictor], torch.zeros(3, 6))    # the encoder is always the global one
    assert torch.equal(start[0, predictor], torch.zeros(2))        # small divergence: the global predictor
    assert torch.equal(start[1, predictor], torch.ones(2))         # large divergence: its own predictor
    assert torch.equal(start[2, predictor], torch.zeros(2))        # never trained: the global model


def test_fedema_keeps_more_of_the_local_model_the_larger_the_divergence():
    received = torch.zeros(8)
    local = torch.stack([torch.full((8,), 0.1), torch.full((8,), 0.2), torch.full((8,), 0.2), torch.ones(8)])
    # λ already set (1.0) for the first three; the fourth is measured for the first time
    cohort = _cohort(local, [1.0, 1.0, 0.0, 1.0], LAYOUT, received, scale=[1.0, 1.0, 1.0, 0.0])
    ema = FedEMAStart(tau=0.7)
    start = ema.personalize(received.unsqueeze(0).expand(4, -1), cohort)
    d = torch.linalg.vector_norm(local[:, :6], dim=1)               # over the encoder only
    mu = start[:, 0] / local[:, 0]                                   # W = μ·W_l + (1 − μ)·0
    torch.testing.assert_close(mu[:2], d[:2])                        # μ = min(λd, 1) with λ = 1
    assert mu[1] > mu[0]                                             # larger divergence, more of the local model
    assert torch.equal(start[2], torch.zeros(8))                     # never trained: the global model
    torch.testing.assert_close(mu[3], torch.tensor(0.7))             # first divergence: λ = τ/d, so μ = τ
    assert ema.init(None, cohort)[3] == pytest.approx(0.7 / float(d[3]))


@pytest.mark.parametrize("algorithm", ["fedavg_byol", "fedu", "fedema"])
def test_vectorized_equals_sequential_and_only_the_online_network_is_sent(algorithm, one_torch_thread):
    runs = []
    for executor in ("vectorized", "sequential"):
        fed = build_federation(_cfg(algorithm=algorithm, rounds=3, cohort={"sampler": "uniform", "size": 2},
                                    engine={"executor": executor, "checkpoint_every": 0}), quiet=True)
        state = initial_state(fed)
        for _ in range(3):
            state, metrics = run_round(fed, state)
        runs.append(state)
    torch.testing.assert_close(runs[0].params, runs[1].params, rtol=1e-4, atol=1e-5)
    assert metrics["bytes_up"] == 2 * 4 * fed.layout.numel                 # backbone, projector and predictor
    assert any(n.startswith("predictor.") for n in fed.layout.names)
    if algorithm != "fedavg_byol":                                          # each trained client keeps its model
        assert len(runs[0].clients) >= 2 and all(e[f"{algorithm}/local"].shape == (fed.layout.numel,)
                                                 for e in runs[0].clients.values())


@pytest.mark.parametrize("over, key", [({"recipe": {"views": 2}}, "recipe.views"),
                                       ({"recipe": {"mu": 4.0}}, "recipe.mu"),
                                       ({"recipe": {"ema": 1.0}}, "recipe.ema"),
                                       ({"model": {"name": "mlp"}}, "model.name"),
                                       ({"objective": {"name": "cross_entropy"}}, "objective.name"),
                                       # the recipe builds its objective: a parameter of the user's was dropped
                                       ({"objective": {"name": "byol", "ema": 0.5}}, "objective.ema"),
                                       ({"objective": {"name": "auto", "zz": 1}}, "objective.zz"),
                                       ({"client": {"dp": {"mode": "per_example"}}}, "client.dp.mode")])
def test_bad_input_is_refused_with_its_key(over, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_federation(_cfg(**over), quiet=True)


@pytest.mark.parametrize("algorithm, key", [("fedu", "threshold"), ("fedema", "tau")])
def test_mixing_parameters_are_checked(algorithm, key):
    with pytest.raises(ConfigError, match=f"recipe.{key}"):
        build_federation(_cfg(algorithm=algorithm, recipe={key: -1.0}), quiet=True)


def test_a_personalizing_transform_with_clients_that_keep_their_models_is_refused_by_name(one_torch_thread):
    """QuAFL's clients continue from their own models: FedEMA's start cannot apply, and says so."""
    from trustfl.config.build import resolve_engine
    from trustfl.config.load import load_config

    cfg = load_config("configs/quafl/quafl.toml", ['client.transforms=[{name="fedema"}]', "rounds=2",
                                                   'data.dataset="digits"'])
    fed = build_federation(cfg, quiet=True)
    engine = resolve_engine(cfg)
    with pytest.raises(ConfigError, match=r"engine\.kind"):
        engine.run_round(fed, engine.initial_state(fed))
