"""Ghost norms and clipped sums for nn.Conv1d / nn.Conv2d (any stride, padding, dilation, groups; with or without bias).

The oracle is a per-example autograd loop written here (one backward per example, float64); the per-example norms and
the clipped sums of ``clipped_grad_sum(method="ghost")`` must agree with it to a relative error of 1e-12.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from trustfl.client import ghost
from trustfl.client.per_example import clipped_grad_sum, supports_ghost
from trustfl.models import build_model

RTOL = 1e-12
MASK = torch.tensor([[1.0, 1, 1, 0], [1, 0, 1, 1]])  # padding rows in both clients


@pytest.fixture(params=["grouped_convolution", "products"])
def conv_form(request, monkeypatch):
    """Both ways to materialise a convolution's per-example weight gradients, each wherever the materialised form
    applies: one convolution backward with the examples as groups (the CPU's choice for output channels of at least
    ghost.GROUPED_MIN_KERNEL weights; forced here for the small test layers) and batched products of the unfolded
    matrices (CUDA's, and the CPU's for small kernels)."""
    if request.param == "products":
        monkeypatch.setattr(ghost, "_by_grouped_convolution", lambda layer, g: False)
    else:
        monkeypatch.setattr(ghost, "GROUPED_MIN_KERNEL", 1)
    return request.param


def _stack(nets: list[nn.Module]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([dict(n.named_parameters())[k].detach() for n in nets])
            for k, _ in nets[0].named_parameters()}


def _data(m: int, b: int, shape: tuple[int, ...], classes: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, b, *shape, generator=gen, dtype=torch.float64)
    return x, torch.randint(0, classes, (m, b), generator=gen)


def _loop_grads(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor):
    """Per-example gradients ``[client][example] -> {name: grad}`` by one autograd backward per example."""
    out = []
    for i in range(x.shape[0]):
        leaves = {k: v[i].clone().requires_grad_(True) for k, v in params.items()}
        row = []
        for b in range(x.shape[1]):
            loss = F.cross_entropy(functional_call(model, leaves, (x[i, b:b + 1],)), y[i, b:b + 1], reduction="sum")
            row.append(dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values())))))
        out.append(row)
    return out


def _loop_norms(grads, mask: torch.Tensor) -> torch.Tensor:
    return torch.tensor([[float(torch.sqrt(sum(g.square().sum() for g in ex.values()))) if mask[i, b] else 0.0
                          for b, ex in enumerate(row)] for i, row in enumerate(grads)], dtype=torch.float64)


def _loop_clipped_sums(grads, norms: torch.Tensor, mask: torch.Tensor, c: float) -> dict[str, torch.Tensor]:
    sums = {}
    for k in grads[0][0]:
        per_client = []
        for i, row in enumerate(grads):
            s = torch.zeros_like(row[0][k])
            for b, ex in enumerate(row):
                if mask[i, b]:
                    s = s + min(1.0, c / (float(norms[i, b]) + 1e-6)) * ex[k]
            per_client.append(s)
        sums[k] = torch.stack(per_client)
    return sums


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a - ref).abs().max() / ref.abs().max().clamp(min=1e-300))


def _check(model: nn.Module, params, x, y, mask=MASK, n_clips: int = 3):
    """Ghost norms and clipped sums == the autograd loop, for C below, between and above the per-example norms."""
    assert supports_ghost(model, params, {"x": x, "y": y})  # the ghost path runs, not the vmap fallback
    grads = _loop_grads(model, params, x, y)
    ref_norms = _loop_norms(grads, mask)
    real = ref_norms[mask != 0]
    clips = [0.5 * float(real.min()), float(real.median()), 2.0 * float(real.max())][:n_clips]
    for c in clips:
        sums, norms = clipped_grad_sum(model, params, {"x": x, "y": y}, mask, c, method="ghost")
        assert torch.all(norms[mask == 0] == 0)
        assert float(((norms - ref_norms).abs() / ref_norms.clamp(min=1e-300))[mask != 0].max()) <= RTOL
        ref = _loop_clipped_sums(grads, ref_norms, mask, c)
        assert set(sums) == set(ref)
        for k in ref:
            assert _rel(sums[k], ref[k]) <= RTOL, (c, k, _rel(sums[k], ref[k]))


class _Conv2dNet(nn.Module):
    def __init__(self, c_in: int, c_out: int, side: int, bias: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, dilation=2, groups=2, bias=bias)
        with torch.no_grad():
            out = self.conv(torch.zeros(1, c_in, side, side))
        self.fc = nn.Linear(out.numel(), 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.conv(x)).flatten(1))


# (C_in, C_out, side): T = 16 output positions with small groups -> materialised form; T = 4 with wide groups -> Gram
GEOMETRIES = {"materialised": (4, 6, 9), "gram": (8, 16, 5)}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_conv2d_stride_padding_dilation_groups(geometry, bias, conv_form):
    c_in, c_out, side = GEOMETRIES[geometry]
    torch.manual_seed(0)
    nets = [_Conv2dNet(c_in, c_out, side, bias).double() for _ in range(2)]
    layer = ghost.ghost_layers(nets[0], [k for k, _ in nets[0].named_parameters()])[0]
    assert (layer.kind, layer.groups, layer.stride, layer.padding, layer.dilation) == ("conv2d", 2, (2, 2), (1, 1),
                                                                                       (2, 2))
    t = nets[0].fc.in_features // c_out
    assert ghost._use_gram(t, c_in // 2 * 9, c_out // 2) == (geometry == "gram")
    x, y = _data(2, 4, (c_in, side, side), 3, seed=1)
    _check(nets[0], _stack(nets), x, y)


class _Conv1dNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 3, stride=2, padding=2, dilation=2)
        self.depthwise = nn.Conv1d(4, 4, 3, padding="same", groups=4, bias=False)
        self.fc = nn.Linear(4 * 6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.depthwise(torch.tanh(self.conv(x)))).flatten(1))


def test_conv1d(conv_form):
    torch.manual_seed(1)
    nets = [_Conv1dNet().double() for _ in range(2)]
    layers = ghost.ghost_layers(nets[0], [k for k, _ in nets[0].named_parameters()])
    assert [(l.kind, l.kernel_size, l.padding, l.groups) for l in layers[:2]] == [
        ("conv1d", (1, 3), (0, 2), 1), ("conv1d", (1, 3), (0, 1), 4)]
    x, y = _data(2, 4, (3, 11), 3, seed=2)
    _check(nets[0], _stack(nets), x, y)


class _SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 5, 3, padding=1)
        self.fc = nn.Linear(5 * 4 * 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1))


def test_small_cnn_and_chunked_paths(monkeypatch, conv_form):
    torch.manual_seed(2)
    nets = [_SmallCNN().double() for _ in range(2)]
    x, y = _data(2, 4, (2, 8, 8), 4, seed=3)
    _check(nets[0], _stack(nets), x, y)
    monkeypatch.setattr(ghost, "MATERIALISE_BUDGET", 7)  # chunked norms, no cached per-example gradients
    _check(nets[0], _stack(nets), x, y, n_clips=1)
    gnets = [_Conv2dNet(8, 16, 5, True).double() for _ in range(2)]
    _check(gnets[0], _stack(gnets), *_data(2, 4, (8, 5, 5), 3, seed=4), n_clips=1)


def test_padding_rows_contribute_nothing():
    torch.manual_seed(3)
    nets = [_Conv1dNet().double() for _ in range(2)]
    params = _stack(nets)
    x, y = _data(2, 4, (3, 11), 3, seed=5)
    sums, norms = clipped_grad_sum(nets[0], params, {"x": x, "y": y}, MASK, 0.3, method="ghost")
    x2 = x.clone()
    x2[MASK == 0] = float("nan")  # garbage in padding rows must not leak
    y2 = y.clone()
    y2[MASK == 0] = 2
    sums2, norms2 = clipped_grad_sum(nets[0], params, {"x": x2, "y": y2}, MASK, 0.3, method="ghost")
    assert torch.equal(norms, norms2) and all(torch.equal(sums[k], sums2[k]) for k in sums)
    # the same as dropping the padding rows: client 0 alone with its first three examples
    one = {k: v[:1] for k, v in params.items()}
    sums3, norms3 = clipped_grad_sum(nets[0], one, {"x": x[:1, :3], "y": y[:1, :3]}, torch.ones(1, 3), 0.3,
                                     method="ghost")
    assert torch.allclose(norms3, norms[:1, :3], rtol=RTOL, atol=0)
    for k in sums:
        assert _rel(sums3[k], sums[k][:1]) <= RTOL


def test_cnn_cafcor_batch4_matches_materialised_and_loop(conv_form):
    nets = [build_model("cnn_cafcor", (1, 28, 28), 10, seed=s).double() for s in range(2)]
    params = _stack(nets)
    x, y = _data(2, 4, (1, 28, 28), 10, seed=6)
    _check(nets[0], params, x, y, n_clips=2)
    for c in (0.05, 1e3):
        g_sums, g_norms = clipped_grad_sum(nets[0], params, {"x": x, "y": y}, MASK, c, method="ghost")
        v_sums, v_norms = clipped_grad_sum(nets[0], params, {"x": x, "y": y}, MASK, c, method="vmap")
        assert float(((g_norms - v_norms).abs() / v_norms.clamp(min=1e-300))[MASK != 0].max()) <= RTOL
        for k in v_sums:
            assert _rel(g_sums[k], v_sums[k]) <= RTOL, k


def test_the_grouped_convolution_form_is_chosen_on_the_cpu_for_channels_of_many_weights(monkeypatch):
    net = build_model("cnn_cafcor", (1, 28, 28), 10, seed=0)
    conv1, conv2 = ghost.ghost_layers(net, [k for k, _ in net.named_parameters()])[:2]
    g1, g2 = torch.zeros(64, 20, 24, 24), torch.zeros(64, 50, 8, 8)
    assert not ghost._by_grouped_convolution(conv1, g1)  # 25 weights per channel: the products are faster
    assert ghost._by_grouped_convolution(conv2, g2)  # 500
    small = ghost.ghost_layers(nn.Conv2d(4, 16, 3, padding=1), ["weight"])[0]  # 36 weights per channel
    assert not ghost._by_grouped_convolution(small, torch.zeros(64, 16, 16, 16))
    assert ghost._by_grouped_convolution(ghost.ghost_layers(nn.Conv2d(8, 16, 3), ["weight"])[0],
                                         torch.zeros(64, 16, 14, 14))  # 72
    assert not ghost._by_grouped_convolution(conv2, g2.to("meta"))  # not measured off the CPU
    assert not ghost._by_grouped_convolution(conv2, g2[:, :, :1, :1])  # one position: the rank-one form
    monkeypatch.setattr(ghost, "MATERIALISE_BUDGET", 64 * 50 * 500 - 1)  # does not fit: chunked products
    assert not ghost._by_grouped_convolution(conv2, g2)
    monkeypatch.setattr(ghost, "GROUPED_MIN_KERNEL", 1)
    gram = ghost.ghost_layers(_Conv2dNet(8, 16, 5, True), ["conv.weight"])[0]  # T = 4: the Gram form
    assert not ghost._by_grouped_convolution(gram, torch.zeros(4, 16, 2, 2))


class _Circular(nn.Module):
    def __init__(self, **kw: object) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 2, 4, **kw)
        self.fc = nn.Linear(2 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).flatten(1))


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("kw", [{"padding": 2, "padding_mode": "circular"}, {"padding": "same"}],
                         ids=["circular", "asymmetric_same"])
def test_unsupported_conv_padding_falls_back(kw, monkeypatch):
    monkeypatch.setattr(ghost, "_FALLBACKS", set())
    torch.manual_seed(4)
    net = _Circular(**kw).double()
    params = _stack([net])
    x, y = _data(1, 3, (2, 8 if kw["padding"] == "same" else 7), 3, seed=7)
    with pytest.raises(ghost.GhostUnsupportedError, match="padding"):
        ghost.ghost_layers(net, list(params))
    assert not supports_ghost(net, params, {"x": x, "y": y})
    with pytest.warns(UserWarning, match="falls back.*padding"):
        sums, norms = clipped_grad_sum(net, params, {"x": x, "y": y}, torch.ones(1, 3), 0.5, method="ghost")
    grads = _loop_grads(net, params, x, y)
    ref_norms = _loop_norms(grads, torch.ones(1, 3))
    assert torch.allclose(norms, ref_norms, rtol=1e-10, atol=0)


@pytest.mark.parametrize("keys", [("conv.bias", "fc.weight"), ("conv.weight",)], ids=["bias_only", "weight_only"])
def test_grouped_conv_subset_of_params(keys):
    torch.manual_seed(5)
    nets = [_Conv2dNet(8, 16, 5, True).double() for _ in range(2)]
    params = {k: v for k, v in _stack(nets).items() if k in keys}
    x, y = _data(2, 4, (8, 5, 5), 3, seed=8)
    _check(nets[0], params, x, y, n_clips=2)
