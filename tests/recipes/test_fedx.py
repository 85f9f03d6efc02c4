"""FedX: the contrastive and relational losses against direct computations of their definitions, masks, the frozen
received model and the anchors kept as local state, the recipe end to end (vectorized = sequential), bad input."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trustfl.config.build import build_federation
from trustfl.config.load import config_from_dict
from trustfl.engine.sync import initial_state, run_round
from trustfl.errors import ConfigError
from trustfl.models.ssl import SCMLP
from trustfl.objectives.fedx import ANCHOR, GLOBAL, FedX, nt_xent_losses, relational_losses

TAU, TAU2 = 0.1, 0.01


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_nt_xent_matches_its_definition():
    """Mean over the 2B vectors of −log(e^{s_pos/τ} / Σ_{k≠self} e^{s_k/τ}) (SimCLR's NT-Xent)."""
    x, y = _randn(5, 3), _randn(5, 3, seed=1)
    v = F.normalize(torch.cat([x, y]), dim=-1)
    total = 0.0
    for i in range(10):
        pos = math.exp(float(v[i] @ v[(i + 5) % 10]) / TAU)
        den = sum(math.exp(float(v[i] @ v[k]) / TAU) for k in range(10) if k != i)
        total += -math.log(pos / den)
    got = nt_xent_losses(x, y, TAU, torch.ones(5, dtype=torch.bool))
    assert float(got.mean()) == pytest.approx(total / 10, rel=1e-12)


def test_relational_loss_matches_kl_divergences_to_the_mixed_target():
    x, y, a = _randn(4, 3), _randn(4, 3, seed=1), _randn(6, 3, seed=2)
    sx = F.normalize(x, dim=-1) @ F.normalize(a, dim=-1).T
    sy = F.normalize(y, dim=-1) @ F.normalize(a, dim=-1).T
    target = (F.softmax(sx / TAU2, dim=1) + F.softmax(sy / TAU2, dim=1)) / 2
    expected = (F.kl_div(F.log_softmax(sx / TAU, dim=1), target, reduction="batchmean")
                + F.kl_div(F.log_softmax(sy / TAU, dim=1), target, reduction="batchmean")) / 2
    ones = torch.ones(4, dtype=torch.bool)
    got = relational_losses(x, y, a, torch.ones(6, dtype=torch.bool), TAU, TAU2, ones)
    assert float(got.mean()) == pytest.approx(float(expected), rel=1e-10)


def test_padding_rows_and_padded_anchors_count_for_nothing():
    x, y, a = _randn(6, 3), _randn(6, 3, seed=1), _randn(5, 3, seed=2)
    mask = torch.tensor([True, True, True, True, False, False])
    amask = torch.tensor([True, True, False, True, False])
    xr = x.clone().requires_grad_(True)
    loss = (nt_xent_losses(xr, y, TAU, mask) + relational_losses(xr, y, a, amask, TAU, TAU2, mask)).sum()
    alone = (nt_xent_losses(x[:4], y[:4], TAU, mask[:4])
             + relational_losses(x[:4], y[:4], a[amask], torch.ones(3, dtype=torch.bool), TAU, TAU2, mask[:4])).sum()
    assert float(loss.detach()) == pytest.approx(float(alone), rel=1e-12)
    loss.backward()
    assert torch.equal(xr.grad[4:], torch.zeros(2, 3)) and torch.isfinite(xr.grad).all()


def test_losses_have_the_gradients_of_their_definitions():
    x, y, a = _randn(4, 3), _randn(4, 3, seed=1), _randn(5, 3, seed=2)
    ones, amask = torch.ones(4, dtype=torch.bool), torch.tensor([True, False, True, True, True])
    torch.autograd.gradcheck(lambda t, u: nt_xent_losses(t, u, TAU, ones).sum(),
                             (x.clone().requires_grad_(True), y.clone().requires_grad_(True)))
    torch.autograd.gradcheck(lambda t, u: relational_losses(t, u, a, amask, TAU, TAU2, ones).sum(),
                             (x.clone().requires_grad_(True), y.clone().requires_grad_(True)))


def test_a_sharp_target_that_underflows_keeps_gradients_finite():
    """τ₂ = 0.01 puts probabilities e^{−200} into the target: float32 underflows them to 0, never 0·log 0 = NaN."""
    x, y, a = (t.float() for t in (_randn(8, 4), _randn(8, 4, seed=1), _randn(8, 4, seed=2)))
    xr = x.clone().requires_grad_(True)
    relational_losses(xr, y, a, torch.ones(8, dtype=torch.bool), TAU, TAU2, torch.ones(8, dtype=torch.bool)).sum() \
        .backward()
    assert torch.isfinite(xr.grad).all()


def _model():
    torch.manual_seed(0)
    return SCMLP((1, 4, 4), hidden=(6,), projector=(5,), dim=3, predictor=(4,))


def test_the_received_model_is_frozen_and_anchors_follow_the_previous_batch():
    model, obj = _model(), FedX()
    params = {n: p.detach().unsqueeze(0).repeat(2, *[1] * p.dim()) for n, p in model.named_parameters()}
    state = obj.local_state_init(params, None)
    assert set(state) == {GLOBAL + n for n in params}
    views = torch.rand(2, 3, 2, 1, 4, 4)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    state = obj.local_state_update(state, params, None, {"views": views}, mask)
    assert torch.equal(state[ANCHOR + "x"], views[:, :, 0]) and torch.equal(state[ANCHOR + "mask"], mask)
    later = torch.rand(2, 3, 2, 1, 4, 4)
    state = obj.local_state_update(state, params, torch.tensor([False, True]), {"views": later}, mask)
    assert torch.equal(state[ANCHOR + "x"][0], views[0, :, 0])             # no step: the old anchors stay
    assert torch.equal(state[ANCHOR + "x"][1], later[1, :, 0])
    with pytest.raises(ConfigError, match="predictor"):
        obj.local_state_init({"backbone.1.weight": torch.zeros(2, 6, 16)}, None)


def test_client_outputs_read_the_received_model_without_differentiating_it():
    model, obj = _model(), FedX()
    local = {n: p.detach().clone().requires_grad_(True) for n, p in model.named_parameters()}
    received = {n: p.detach() + 0.5 for n, p in model.named_parameters()}
    views, anchors = torch.rand(3, 2, 1, 4, 4), torch.rand(4, 1, 4, 4)
    personal = {**{GLOBAL + n: v for n, v in received.items()}, ANCHOR + "x": anchors}
    out = obj.client_outputs(model, local, {"views": views}, personal)
    inputs = torch.cat([views.reshape(6, 1, 4, 4), anchors])
    from torch.func import functional_call
    torch.testing.assert_close(out[:, 6:], functional_call(model, received, (inputs,)))       # z^G
    torch.testing.assert_close(out[:, :3], functional_call(model, local, (inputs,)).detach())   # z
    grads = torch.autograd.grad(out[:, 6:].sum(), list(local.values()), allow_unused=True, retain_graph=True)
    assert all(g is None or not g.any() for g in grads)                                         # z^G: no gradient
    grads = torch.autograd.grad(out[:, :6].sum(), list(local.values()), allow_unused=True)
    assert any(g is not None and g.any() for g in grads)                                        # z, p: trained


def _cfg(**over):
    data = {"name": "fedx-test", "algorithm": "fedx", "seed": 4, "rounds": 2,
            "data": {"dataset": "digits_canvas", "num_clients": 5,
                     "partition": {"name": "classes_per_client", "classes_per_client": 2}},
            "model": {"name": "sc_mlp", "hidden": [24], "projector": [16], "dim": 8, "predictor": [12]},
            "client": {"epochs": 1, "batch_size": 32, "lr": 0.01},
            "engine": {"checkpoint_every": 0, "eval_initial": False}}
    data.update(over)
    return config_from_dict(data)


def test_vectorized_equals_sequential_and_only_the_model_is_sent(one_torch_thread):
    runs = []
    for executor in ("vectorized", "sequential"):
        fed = build_federation(_cfg(rounds=2, cohort={"sampler": "uniform", "size": 2},
                                    engine={"executor": executor, "checkpoint_every": 0}), quiet=True)
        state = initial_state(fed)
        for _ in range(2):
            state, metrics = run_round(fed, state)
        runs.append(state)
    torch.testing.assert_close(runs[0].params, runs[1].params, rtol=1e-4, atol=1e-5)
    assert metrics["rejected"] == 0 and torch.isfinite(runs[0].params).all()
    assert metrics["bytes_up"] == 2 * 4 * fed.layout.numel and not runs[0].statistics


@pytest.mark.parametrize("over, key", [({"recipe": {"temperature": 0.0}}, "recipe.temperature"),
                                       ({"recipe": {"target_temperature": -1.0}}, "recipe.target_temperature"),
                                       ({"recipe": {"views": 2}}, "recipe.views"),
                                       ({"recipe": {"ema": 0.9}}, "recipe.ema"),
                                       ({"model": {"name": "mlp"}}, "model.name")])
def test_bad_input_is_refused_with_its_key(over, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_federation(_cfg(**over), quiet=True)
