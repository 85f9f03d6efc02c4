"""Ghost clipping with nn.LayerNorm, nn.GroupNorm and nn.Embedding (trustfl/client/ghost_direct.py).

The oracle is test_ghost_conv.py's per-example autograd loop (one backward per example, float64): the per-example
norms and clipped sums of ``clipped_grad_sum(method="ghost")`` must agree with it to a relative error of 1e-12, for
clip norms below, between and above the per-example norms, with padding rows contributing nothing.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.client.test_ghost_conv import MASK, _check, _data, _stack
from trustfl.client import ghost
from trustfl.client.per_example import clipped_grad_sum, supports_ghost


class _LayerNormNet(nn.Module):
    """Linear → LayerNorm (optionally without bias) → tanh → Linear, and a LayerNorm over two trailing dims."""

    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.norm = nn.LayerNorm(8, eps=1e-3, bias=bias)
        self.norm2d = nn.LayerNorm((2, 4))
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.norm(self.fc1(x)))
        return self.fc2(self.norm2d(h.view(-1, 2, 4)).flatten(1))


class _GroupNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 6, 3, padding=1)
        self.norm = nn.GroupNorm(3, 6)
        self.fc = nn.Linear(6 * 5 * 5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.norm(self.conv(x))).flatten(1))


class _EmbeddingNet(nn.Module):
    """Token ids (T = 7, repeats likely in a vocabulary of 9) → embedding → mean over tokens → Linear."""

    def __init__(self, padding_idx: int | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(9, 5, padding_idx=padding_idx)
        self.fc = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.embed(x)).mean(1))


def _nets(factory, **kw) -> list[nn.Module]:
    torch.manual_seed(0)
    nets = [factory(**kw).double() for _ in range(2)]
    with torch.no_grad():  # affine parameters away from their (1, 0) initialisation, different per client
        for i, net in enumerate(nets):
            for name, p in net.named_parameters():
                if "norm" in name:
                    p.add_(0.3 * (i + 1) * torch.randn_like(p))
    return nets


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_layer_norm(bias):
    nets = _nets(_LayerNormNet, bias=bias)
    x, y = _data(2, 4, (6,), classes=3)
    layers = ghost.ghost_layers(nets[0], [k for k, _ in nets[0].named_parameters()])
    assert [l.kind for l in layers] == ["linear", "layer_norm", "layer_norm", "linear"]
    assert layers[1].eps == 1e-3 and layers[2].norm_shape == (2, 4)
    _check(nets[0], _stack(nets), x, y)


def test_group_norm():
    nets = _nets(_GroupNormNet)
    x, y = _data(2, 4, (2, 5, 5), classes=3, seed=1)
    _check(nets[0], _stack(nets), x, y)


@pytest.mark.parametrize("padding_idx", [None, 2], ids=["plain", "padding_idx"])
def test_embedding_with_repeated_tokens(padding_idx):
    nets = _nets(_EmbeddingNet, padding_idx=padding_idx)
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(0, 9, (2, 4, 7), generator=gen)
    x[0, 0, :3] = 2  # a repeated token (the padding one when padding_idx = 2)
    y = torch.randint(0, 3, (2, 4), generator=gen)
    assert any(len(set(row.tolist())) < 7 for row in x.flatten(0, 1))  # the Gram form's equality terms matter
    _check(nets[0], _stack(nets), x, y)


def test_only_the_bias_or_only_the_scale_trained():
    nets = _nets(_LayerNormNet)
    x, y = _data(2, 4, (6,), classes=3)
    params = _stack(nets)
    for drop in ("norm.weight", "norm.bias"):
        subset = {k: v for k, v in params.items() if k != drop}
        sums, _ = clipped_grad_sum(nets[0], subset, {"x": x, "y": y}, MASK, 0.1, method="ghost")
        vmap_sums, _ = clipped_grad_sum(nets[0], subset, {"x": x, "y": y}, MASK, 0.1, method="vmap")
        assert set(sums) == set(subset)
        for k in subset:
            torch.testing.assert_close(sums[k], vmap_sums[k], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("kw", [{"max_norm": 1.0}, {"scale_grad_by_freq": True}, {"sparse": True}])
def test_embedding_options_with_other_gradients_fall_back(kw):
    net = nn.Embedding(9, 5, **kw).double()
    params = {k: v.detach().unsqueeze(0) for k, v in net.named_parameters()}
    with pytest.raises(ghost.GhostUnsupportedError, match="Embedding"):
        ghost.ghost_layers(net, list(params))
    assert not supports_ghost(net, params, {"x": torch.zeros(1, 2, 3, dtype=torch.long)})


def test_a_cohort_too_large_for_one_pass_runs_in_client_groups_with_the_same_results(monkeypatch):
    """ghost.PASS_BUDGET bounds one pass's memory; grouping the clients changes no result."""
    from trustfl.client.ghost_plan import ghost_plan
    from trustfl.models import build_model
    from trustfl.objectives.builtin import CrossEntropy
    nets = [build_model("cnn_cafcor", (1, 28, 28), 10, seed=s).double() for s in range(3)]
    params = _stack(nets)
    x, y = _data(3, 4, (1, 28, 28), classes=10, seed=5)
    # the default budget: a float32 cnn_cafcor client of 64 examples alone in a pass, an MLP cohort of 10 in one
    plan = ghost_plan(nets[0], params, {"x": x, "y": y}, CrossEntropy())
    assert ghost.clients_per_pass(plan, 64, 4) == 1
    mlp = build_model("mlp", (784,), 10, seed=0, hidden=(256,))
    mlp_params = _stack([mlp])
    mlp_plan = ghost_plan(mlp, mlp_params, {"x": torch.zeros(1, 1, 784), "y": torch.zeros(1, 1, dtype=torch.long)},
                          CrossEntropy())
    assert ghost.clients_per_pass(mlp_plan, 256, 4) >= 10
    mask = torch.tensor([[1.0, 1, 0, 1], [1, 1, 1, 1], [0, 1, 1, 1]])
    sizes = []
    real = ghost.clients_per_pass
    monkeypatch.setattr(ghost, "clients_per_pass", lambda *a: sizes.append(real(*a)) or sizes[-1])
    monkeypatch.setattr(ghost, "PASS_BUDGET", 1)  # one client per pass
    grouped = clipped_grad_sum(nets[0], params, {"x": x, "y": y}, mask, 0.5, method="ghost")
    monkeypatch.setattr(ghost, "PASS_BUDGET", 1 << 40)  # the whole cohort in one pass
    whole = clipped_grad_sum(nets[0], params, {"x": x, "y": y}, mask, 0.5, method="ghost")
    assert sizes[0] == 1 and sizes[1] >= 3
    torch.testing.assert_close(grouped[1], whole[1], rtol=1e-12, atol=0)
    for k in whole[0]:
        torch.testing.assert_close(grouped[0][k], whole[0][k], rtol=1e-12, atol=1e-15)
