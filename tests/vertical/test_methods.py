"""One server iteration of DPZV and the baselines: clipping, the single scalar noise draw, rejection of
non-finite messages, and what each party receives (the message log)."""
import math

import pytest
import torch

from trustfl.config.build import build_federation
from trustfl.vertical.directions import direction
from trustfl.vertical.engine import VerticalEngine
from trustfl.vertical.methods import DPZV, Iteration


def _parts(vertical_config, algorithm="dpzv", **overrides):
    fed = build_federation(vertical_config(algorithm, **overrides), quiet=True)
    engine = VerticalEngine()
    state = engine.initial_state(fed)
    master = state.params.clone()
    parties, server = engine._parts(fed, master, state, fed.model.slices())
    return fed, parties, server, master


def _reply(method, it, party, server, ids):
    """Run one iteration and return the scalar Δ the party received (read back from its parameter change)."""
    before = party.params.clone()
    method.iterate(it, party, server, ids)
    seed = it.seed_for(party.index, "direction")
    u = direction(party.num_params, seed, method.direction_kind)
    step = party.params - before  # = −η·Δ·u
    return -(step @ u).item() / (method.party_lr * u.square().sum().item())


def _deltas(method, it, party, server, ids):
    """The per-sample loss differences δ_i of eq. 7, recomputed from the same perturbation."""
    seed = it.seed_for(party.index, "direction")
    scale = party.scale(seed, method.direction_kind)
    party.perturb(seed, method.smoothing * scale)
    h_plus = party.embed(party.rows(ids))
    party.perturb(seed, -2 * method.smoothing * scale)
    h_minus = party.embed(party.rows(ids))
    party.perturb(seed, method.smoothing * scale)
    with torch.no_grad():
        losses = server.losses(server.params, server.inputs(ids, party.index, torch.stack([h_plus, h_minus])), ids)
    f_plus, f_minus = losses.view(2, -1)
    return (f_plus - f_minus) / method.smoothing


def test_reply_is_the_clipped_mean_of_the_loss_differences(vertical_config):
    fed, parties, server, _ = _parts(vertical_config)
    ids = torch.arange(16)
    it = Iteration(seed=1, t=0)
    deltas = _deltas(DPZV(party_lr=1e-3), it, parties[0], server, ids)
    clip = deltas.abs().median().item()  # clips about half of them
    assert (deltas.abs() > clip).any()
    method = DPZV(party_lr=1e-3, clip=clip)
    reply = _reply(method, it, parties[0], server, ids)
    assert reply == pytest.approx(deltas.clamp(-clip, clip).mean().item(), rel=1e-3)
    assert abs(reply) <= clip


def test_noise_is_one_scalar_draw_of_the_calibrated_std(vertical_config):
    """Δ − Δ_noiseless over many iterations: one N(0, σ²) draw each (mean 0, std σ), whatever the batch size."""
    sigma, draws = 0.5, []
    fed, parties, server, master = _parts(vertical_config)
    saved = (master.clone(), server.params.clone(), server.cache.clone(), server.velocity.clone())
    for t in range(200):
        it, ids = Iteration(seed=2, t=t), torch.arange(16)
        got = []
        for noise in (0.0, sigma):
            got.append(_reply(DPZV(party_lr=1e-3, noise_std=noise), it, parties[0], server, ids))
            for live, kept in zip((master, server.params, server.cache, server.velocity), saved):
                live.copy_(kept)
        draws.append(got[1] - got[0])
    draws = torch.tensor(draws)
    assert draws.mean().abs() < 4 * sigma / math.sqrt(len(draws))
    assert draws.std().item() == pytest.approx(sigma, rel=0.15)
    gen = Iteration(seed=2, t=0).generator(torch.device("cpu"), "dp_noise")
    assert draws[0].item() == pytest.approx(sigma * torch.randn((), generator=gen).item(), rel=1e-3, abs=1e-4)


def test_non_finite_messages_are_rejected_counted_and_never_applied(vertical_config):
    fed, parties, server, master = _parts(vertical_config)
    bad = parties[2]
    bad.features[5, 0] = math.nan  # the party's own data hold a NaN: its embeddings of sample 5 are NaN
    before, head, cache = master.clone(), server.params.clone(), server.cache.clone()
    ok, loss = DPZV(party_lr=1e-3).iterate(Iteration(1, 0), bad, server, torch.tensor([3, 5, 7]))
    assert not bool(ok)
    own = fed.model.slices()[2]
    others = torch.ones_like(master, dtype=torch.bool)
    others[own] = False
    assert torch.equal(master[others], before[others])  # the other parties are untouched
    assert torch.equal(server.params, head) and torch.equal(server.cache, cache)  # so are the head and the cache
    # the party's own ±λu perturbation is undone up to float rounding (§2.4), and no step is taken
    assert torch.allclose(master[own], before[own], atol=1e-6)
    ok, _ = DPZV(party_lr=1e-3).iterate(Iteration(1, 1), bad, server, torch.tensor([3, 4, 7]))
    assert bool(ok) and not torch.equal(master, before) and not torch.equal(server.params, head)


@pytest.mark.parametrize("algorithm", ["dpzv", "vafl", "zoo_vfl", "czofo"])
def test_a_party_receives_only_replies_about_its_own_embeddings(vertical_config, algorithm):
    fed, parties, server, _ = _parts(vertical_config, algorithm)
    method = fed.vertical.method
    method.log = []
    for t in range(12):
        party = parties[t % len(parties)]
        method.iterate(Iteration(1, t), party, server, torch.arange(8))
    received = [(t, to, what, shape) for t, sender, to, what, shape in method.log if sender == "server"]
    sent = [(t, sender, what, shape) for t, sender, to, what, shape in method.log if to == "server"]
    assert len(received) == 12 and len(sent) == 24
    allowed = {"dpzv": ("scalar", ()), "zoo_vfl": ("scalar", ()), "czofo": ("scalar", ()),
               "vafl": ("embedding_gradient", (8, 4))}[algorithm]
    for t, to, what, shape in received:
        assert to == t % len(parties) and (what, shape) == allowed
    # parties talk to the server only, and the party activated is the only one sending
    assert all(sender == t % len(parties) for t, sender, _, _ in sent)
    assert all(to == "server" or sender == "server" for _, sender, to, _, _ in method.log)


def test_each_party_holds_only_its_own_columns(vertical_config):
    fed, parties, server, _ = _parts(vertical_config)
    train_x = fed.dataset.train_x.flatten(1)
    for party, block in zip(parties, fed.vertical.blocks):
        assert torch.equal(party.features, train_x[:, block])
        assert party.features.shape[1] == 16  # 2 of the 8 image rows
    blocks = torch.cat(fed.vertical.blocks)
    assert torch.equal(blocks.sort().values, torch.arange(64))
