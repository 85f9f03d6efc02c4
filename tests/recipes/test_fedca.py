"""FedCA: the InfoNCE / dictionary losses against direct computations, the dictionary statistic's server store and
what each client receives, the recipe end to end (vectorized = sequential), bad input."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trustfl.config.build import build_federation
from trustfl.config.load import config_from_dict
from trustfl.engine.sync import initial_state, run_round
from trustfl.errors import ConfigError
from trustfl.objectives.contrastive import InfoNCE, info_nce_losses
from trustfl.selfsup.augment import Augmentation, make_views_cohort
from trustfl.selfsup.dictionary import FedCADictionary, dictionary_of

TAU = 0.1


def _data(b=6, k=5, h=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, 2, h, generator=g, dtype=torch.float64),
            torch.randn(k, h, generator=g, dtype=torch.float64))


def _unit(v):
    return v / v.norm()


def test_joint_loss_matches_a_direct_computation():
    z, d = _data()
    valid = torch.tensor([True, False, True, True, False])
    got = info_nce_losses(z, TAU, None, d, valid, "joint")
    for i in range(z.shape[0]):
        u = _unit(z[i, 0])
        pos = math.exp(float(u @ _unit(z[i, 1])) / TAU)
        negs = sum(math.exp(float(u @ _unit(z[k, 1])) / TAU) for k in range(z.shape[0]))
        negs += sum(math.exp(float(u @ _unit(d[k])) / TAU) for k in range(d.shape[0]) if valid[k])
        assert float(got[i]) == pytest.approx(-math.log(pos / negs), rel=1e-12, abs=1e-12)


def test_code_loss_matches_the_authors_mixture():
    """0.8·CE(u·Wᵀ/τ, i) + 0.2·CE(u·Dᵀ/τ, i) over the real dictionary entries, row i's target the i-th of them;
    rows beyond the dictionary's size keep the batch term only."""
    z, d = _data(b=4, k=5)
    valid = torch.tensor([True, False, True, False, True])          # real entries 0, 2, 4: three targets
    got = info_nce_losses(z, TAU, None, d, valid, "code")
    u, w = F.normalize(z[:, 0], dim=-1), F.normalize(z[:, 1], dim=-1)
    real = F.normalize(d[valid], dim=-1)
    batch = F.cross_entropy(u @ w.T / TAU, torch.arange(4), reduction="none")
    dict_term = F.cross_entropy(u[:3] @ real.T / TAU, torch.arange(3), reduction="none")
    expected = 0.8 * batch + 0.2 * torch.cat([dict_term, torch.zeros(1, dtype=torch.float64)])
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["joint", "code"])
def test_without_a_dictionary_both_are_one_directional_info_nce(mode):
    z, d = _data()
    u, w = F.normalize(z[:, 0], dim=-1), F.normalize(z[:, 1], dim=-1)
    expected = F.cross_entropy(u @ w.T / TAU, torch.arange(6), reduction="none")
    torch.testing.assert_close(info_nce_losses(z, TAU), expected, rtol=1e-12, atol=1e-12)
    none_valid = torch.zeros(d.shape[0], dtype=torch.bool)      # a dictionary whose every slot is padding
    torch.testing.assert_close(info_nce_losses(z, TAU, None, d, none_valid, mode), expected, rtol=1e-12,
                               atol=1e-12)


@pytest.mark.parametrize("mode", ["joint", "code"])
def test_padding_rows_are_neither_anchors_nor_negatives(mode):
    z, d = _data(b=6)
    mask = torch.tensor([True, True, True, True, False, False])
    obj = InfoNCE(TAU, mode)
    personal = {"dictionary": d, "dictionary_mask": torch.ones(d.shape[0], dtype=torch.bool)}
    z = z.clone().requires_grad_(True)
    padded = obj.client_loss(z, {}, mask, personal)
    alone = obj.client_loss(z[:4].detach(), {}, torch.ones(4, dtype=torch.bool), personal)
    torch.testing.assert_close(padded.detach(), alone, rtol=1e-12, atol=1e-12)
    padded.backward()
    assert torch.equal(z.grad[4:], torch.zeros_like(z.grad[4:]))       # padding rows get no gradient
    assert torch.isfinite(z.grad).all()


def test_the_loss_has_the_gradient_of_its_definition():
    z, d = _data(b=4, k=3)
    valid = torch.tensor([True, True, False])
    for mode in ("joint", "code"):
        torch.autograd.gradcheck(lambda t: info_nce_losses(t, TAU, None, d, valid, mode).sum(),
                                 (z.clone().requires_grad_(True),))


def test_dictionary_store_normalises_and_averages_each_sample_entry():
    stat = FedCADictionary(ema=0.5)
    state = stat.server_init([2, 3, 1])
    first = torch.tensor([[[3.0, 4.0], [0.0, 2.0], [9.0, 9.0]], [[1.0, 0.0], [0.0, 0.0], [5.0, 5.0]]])
    state = stat.server_update(state, [0, 2], first[:, :3])
    torch.testing.assert_close(dictionary_of(state, 0), torch.tensor([[0.6, 0.8], [0.0, 1.0]]))
    torch.testing.assert_close(dictionary_of(state, 2), torch.tensor([[1.0, 0.0]]))
    assert torch.equal(state["entries"][0, 2], torch.zeros(2))         # padding beyond |D_0| holds nothing
    assert state["filled"].tolist() == [True, False, True]
    state = stat.server_update(state, [0], torch.tensor([[[0.0, 5.0], [3.0, 0.0]]]))
    expected = F.normalize(0.5 * torch.tensor([[0.6, 0.8], [0.0, 1.0]]) + 0.5 * torch.tensor([[0.0, 5.0],
                                                                                              [3.0, 0.0]]), dim=-1)
    torch.testing.assert_close(dictionary_of(state, 0), expected)
    torch.testing.assert_close(dictionary_of(state, 2), torch.tensor([[1.0, 0.0]]))   # absent: unchanged


def test_each_participant_receives_the_other_uploaded_clients_entries():
    stat = FedCADictionary()
    state = stat.server_init([2, 3, 1])
    assert stat.personal(state, 0, [0, 1]) == {}                       # nothing uploaded yet: plain InfoNCE
    state = stat.server_update(state, [0, 1], torch.rand(2, 3, 4) + 0.1)
    sent = stat.personal(state, 1, [0, 1, 2])
    assert sent["dictionary"].shape == (3, 9, 4)                        # J · N_max slots
    mask = sent["dictionary_mask"].view(3, 3, 3)                        # (receiver, owner, slot)
    assert mask[0].sum(1).tolist() == [0, 3, 0]                         # client 0: client 1's three entries
    assert mask[1].sum(1).tolist() == [2, 0, 0]                         # client 1: client 0's two
    assert mask[2].sum(1).tolist() == [2, 3, 0]                         # client 2 (never uploaded): both
    assert torch.equal(sent["dictionary"][0], state["entries"].reshape(9, 4))


def test_a_client_entry_is_the_mean_projection_of_its_own_views():
    stat = FedCADictionary(views=2)
    g = torch.Generator().manual_seed(1)
    x = torch.rand(2, 3, 1, 6, 6, generator=g)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    weight = torch.randn(36, 4, generator=g)

    def represent(v):
        return v.flatten(1) @ weight

    def streams(c, stream):
        return torch.Generator().manual_seed(100 * c + len(stream))

    kernel = Augmentation()
    values = stat.compute(represent, x, mask, [5, 7], streams)
    views = make_views_cohort(x, 2, [streams(5, "views"), streams(7, "views")], kernel)
    expected = represent(views.reshape(12, 1, 6, 6)).view(2, 3, 2, 4).mean(2)
    torch.testing.assert_close(values[0], expected[0])
    torch.testing.assert_close(values[1, :2], expected[1, :2])
    assert torch.equal(values[1, 2], torch.zeros(4))                   # padding
    changed = x.clone()
    changed[1] += 1.0
    assert torch.equal(stat.compute(represent, changed, mask, [5, 7], streams)[0], values[0])  # own data only


def _cfg(**over):
    data = {"name": "fedca-test", "algorithm": "fedca", "seed": 3, "rounds": 2,
            "data": {"dataset": "digits_canvas", "num_clients": 5,
                     "partition": {"name": "classes_per_client", "classes_per_client": 2}},
            "model": {"name": "sc_mlp", "hidden": [24], "projector": [16], "dim": 8},
            "client": {"epochs": 1, "batch_size": 32, "lr": 0.02},
            "engine": {"checkpoint_every": 0, "eval_initial": False}}
    data.update(over)
    return config_from_dict(data)


@pytest.mark.parametrize("mode", ["joint", "code"])
def test_vectorized_equals_sequential_and_every_participant_uploads(mode, one_torch_thread):
    runs = []
    for executor in ("vectorized", "sequential"):
        fed = build_federation(_cfg(rounds=3, cohort={"sampler": "uniform", "size": 3},
                                    recipe={"dictionary_loss": mode},
                                    engine={"executor": executor, "checkpoint_every": 0}), quiet=True)
        state = initial_state(fed)
        for _ in range(3):
            state, metrics = run_round(fed, state)
            assert metrics["fedca_dictionary/uploads"] == 3 and metrics["fedca_dictionary/rejected"] == 0
        runs.append(state)
    torch.testing.assert_close(runs[0].params, runs[1].params, rtol=1e-4, atol=1e-5)
    assert torch.isfinite(runs[0].params).all()
    store = runs[0].statistics["fedca_dictionary"]
    filled = store["filled"].nonzero().flatten().tolist()
    assert 3 <= len(filled) <= 5
    for c in filled:                                                   # stored entries are unit vectors
        norms = dictionary_of(store, c).norm(dim=-1)
        torch.testing.assert_close(norms, torch.ones_like(norms))


@pytest.mark.parametrize("over, key", [({"recipe": {"temperature": 0.0}}, "recipe.temperature"),
                                       ({"recipe": {"dictionary_loss": "mixed"}}, "recipe.dictionary_loss"),
                                       ({"recipe": {"dictionary_ema": 1.0}}, "recipe.dictionary_ema"),
                                       ({"recipe": {"dictionary_views": 0}}, "recipe.dictionary_views"),
                                       ({"recipe": {"views": 2}}, "recipe.views"),
                                       ({"recipe": {"mu": 4.0}}, "recipe.mu"),
                                       ({"model": {"name": "mlp"}}, "model.name"),
                                       ({"client": {"dp": {"mode": "per_example"}}}, "client.dp.mode")])
def test_bad_input_is_refused_with_its_key(over, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_federation(_cfg(**over), quiet=True)


def test_one_client_is_refused():
    with pytest.raises(ConfigError, match=r"data\.num_clients"):
        build_federation(_cfg(data={"dataset": "digits_canvas", "num_clients": 1}), quiet=True)
