"""Building a model draws its initial weights from its seed only: same weights as ever, global RNG untouched."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from trustfl.core import registry
from trustfl.models.zoo import build_model

# Pinned from the models built before build_model stopped seeding the global RNG (torch.manual_seed(seed) around
# the constructor): the float64 sum of all parameters, the first three values (float.hex) and the count.
PINNED = [
    ("logreg", (64,), 10, 0, {}, -0.7972054928541183,
     ["-0x1.eaa8000000000p-11", "0x1.12a8bc0000000p-4", "-0x1.a5662c0000000p-4"], 650),
    ("mlp", (64,), 10, 3, {}, -13.608479048031313,
     ["-0x1.fba2580000000p-4", "-0x1.93e5a00000000p-4", "-0x1.b698380000000p-5"], 55210),
    ("mlp", (30,), 2, 12345, {"hidden": [16, 8]}, -0.07263497042004019,
     ["0x1.683d880000000p-3", "0x1.1be0fa0000000p-3", "0x1.7009600000000p-3"], 650),
    ("cnn_cafcor", (1, 28, 28), 10, 7, {}, 21.060197506101588,
     ["0x1.c9bc9a0000000p-7", "-0x1.ed7b1a0000000p-4", "0x1.04da3a0000000p-4"], 431080),
    ("cnn_rhdp", (1, 28, 28), 10, 2 ** 40 + 5, {}, -6.475537855908698,
     ["0x1.0e8ad60000000p-3", "-0x1.324a3a0000000p-3", "0x1.4dcc960000000p-3"], 28938),
    ("cnn_rhdp", (3, 32, 32), 10, 1, {}, 0.7474299220008334,
     ["0x1.e7673c0000000p-5", "-0x1.a183620000000p-5", "-0x1.6ec2500000000p-6"], 34538),
]


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()]).double()


@pytest.mark.parametrize("name, shape, classes, seed, params, total, first, numel", PINNED,
                         ids=[f"{c[0]}-{c[3]}" for c in PINNED])
def test_weights_are_the_pinned_ones_and_the_global_rng_is_untouched(name, shape, classes, seed, params, total,
                                                                      first, numel):
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    model = build_model(name, shape, classes, seed, **params)
    assert torch.equal(torch.get_rng_state(), state)
    flat = _flat(model)
    assert flat.numel() == numel
    assert flat.sum().item() == total
    assert [float(x).hex() for x in flat[:3]] == first
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 and p.requires_grad and p.is_leaf
               for p in model.parameters())


def test_same_weights_as_a_constructor_under_the_seed():
    model = build_model("cnn_cafcor", (1, 28, 28), 10, 99)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(99)
        from trustfl.models.zoo import CafCorCNN
        expected = CafCorCNN((1, 28, 28), 10)
    for (n, a), (m, b) in zip(model.state_dict().items(), expected.state_dict().items()):
        assert n == m and torch.equal(a, b)


class _WithNorm(nn.Module):
    """A layer type build_model does not re-initialise itself (parameters and buffers): the fallback path."""

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.fc = nn.Linear(input_shape[0], 8)
        self.norm = nn.BatchNorm1d(8)
        self.extra = nn.Parameter(torch.randn(3))
        self.out = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.out(self.norm(self.fc(x)) + self.extra.sum())


def test_other_layer_types_get_their_own_initialisation_under_the_seed(monkeypatch):
    monkeypatch.setitem(registry._REGISTRY.setdefault("model", {}), "_test_with_norm", _WithNorm)
    state = torch.get_rng_state()
    model = build_model("_test_with_norm", (5,), 3, 42)
    assert torch.equal(torch.get_rng_state(), state)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(42)
        expected = _WithNorm((5,), 3)
    for (n, a), (m, b) in zip(model.state_dict().items(), expected.state_dict().items()):
        assert n == m and torch.equal(a, b)
    assert torch.equal(model.norm.running_var, torch.ones(8))


def test_other_seeds_give_other_weights_and_models_move_between_devices():
    a, b = build_model("mlp", (64,), 10, 0), build_model("mlp", (64,), 10, 1)
    assert not torch.equal(_flat(a), _flat(b))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    moved = a.to(device)
    out = moved(torch.zeros(2, 64, device=device))
    assert out.shape == (2, 10) and out.device.type == device


@pytest.mark.parametrize("name, shape", [("sc_mlp", (1, 10, 10)), ("sc_cnn", (1, 10, 10))])
def test_he_initialisation_has_zero_biases_he_variance_and_comes_from_the_seed(name, shape):
    from trustfl.errors import ConfigError

    torch.manual_seed(1234)
    state = torch.get_rng_state()
    he = build_model(name, shape, 10, 5, init="he")
    assert torch.equal(torch.get_rng_state(), state)
    layers = [m for m in he.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    assert layers and all(torch.count_nonzero(m.bias) == 0 for m in layers)
    for m in layers:
        fan_in = m.weight[0].numel()
        std = float(m.weight.detach().double().std())
        # sampling error of the std of n normal draws is about std/√(2n); 6 of those bound it
        assert abs(std / (2 / fan_in) ** 0.5 - 1) < 6 / (2 * m.weight.numel()) ** 0.5 + 1e-3, (m, std)
    assert torch.equal(_flat(he), _flat(build_model(name, shape, 10, 5, init="he")))
    assert not torch.equal(_flat(he), _flat(build_model(name, shape, 10, 6, init="he")))
    default = build_model(name, shape, 10, 5)
    assert any(torch.count_nonzero(m.bias) > 0 for m in default.modules() if isinstance(m, nn.Linear))
    with pytest.raises(ConfigError, match="model.init"):
        build_model(name, shape, 10, 5, init="xavier")


def test_an_added_head_does_not_change_the_he_initialised_encoder():
    plain = build_model("sc_mlp", (1, 10, 10), 10, 3, init="he")
    with_head = build_model("sc_mlp", (1, 10, 10), 10, 3, init="he", predictor=[16])
    shared = dict(plain.named_parameters())
    assert len(dict(with_head.named_parameters())) == len(shared) + 4
    assert all(torch.equal(p, shared[n]) for n, p in with_head.named_parameters() if not n.startswith("predictor."))


@pytest.mark.parametrize("name, shape, params, key", [
    ("mlp", (8,), {"hidden": 10}, "hidden"),
    ("mlp", (8,), {"hidden": [True]}, "hidden"),
    ("mlp", (8,), {"hidden": "64"}, "hidden"),
    ("sc_mlp", (8,), {"hidden": 10}, "hidden"),
    ("sc_mlp", (8,), {"projector": 3}, "projector"),
    ("sc_mlp", (8,), {"predictor": 3}, "predictor"),
    ("sc_cnn", (1, 8, 8), {"channels": 8}, "channels"),
    ("sc_cnn", (1, 8, 8), {"channels": [8, 8, 8]}, "channels"),
    ("sc_cnn", (1, 8, 8), {"features": [8]}, "features"),
    ("vertical", (8,), {"blocks": [[0, 1], [2, 3]], "party_hidden": 5}, "party_hidden"),
    ("vertical", (8,), {"blocks": [[0, 1], [2, 3]], "head_hidden": [True]}, "head_hidden"),
])
def test_a_layer_size_option_of_the_wrong_type_is_refused_naming_the_key(name, shape, params, key):
    """``hidden = 10`` raised "'int' object is not iterable", ``[true]`` a torch TypeError, ``"64"`` was read as
    the widths [6, 4]; a third ``channels`` width was ignored."""
    from trustfl.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"^`model\.{key}` must "):
        build_model(name, shape, 2, 0, **params)
