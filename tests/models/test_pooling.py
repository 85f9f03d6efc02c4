"""trustfl.models.pooling.max_pool2d: F.max_pool2d's values, indices' routing of gradients, and layouts, bit for bit."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from trustfl.models import build_model, pooling
from trustfl.models.pooling import max_pool2d


def _input(shape, dtype, seed=0):
    """Values with many exact ties (a ReLU's zeros, and a constant patch of positives), as images give them."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype).relu_()
    x[..., : shape[2] // 3, :] = 0.25
    return x


@pytest.mark.parametrize("shape,k", [((4, 5, 24, 24), 2), ((3, 7, 9, 11), 2), ((2, 3, 12, 12), 3), ((5, 2, 8, 8), 4)],
                         ids=["even", "odd_sides", "k3", "k4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_gradients_and_layouts_are_those_of_max_pool2d(shape, k, dtype):
    x = _input(shape, dtype)
    assert pooling._fast(x)
    g = torch.randn(shape[0], shape[1], shape[2] // k, shape[3] // k, generator=torch.Generator().manual_seed(1),
                    dtype=dtype)
    out = {}
    for name, pool in (("ours", max_pool2d), ("torch", F.max_pool2d)):
        leaf = x.clone().requires_grad_(True)
        y = pool(leaf, k)
        (dx,) = torch.autograd.grad(y, leaf, g)
        out[name] = (y, dx)
        with torch.no_grad():
            out[name + " no grad"] = (pool(x, k),)
    for key in ("ours", "ours no grad"):
        for a, b in zip(out[key], out[key.replace("ours", "torch")]):
            assert torch.equal(a, b) and a.stride() == b.stride()
    assert out["ours"][1].abs().gt(0).sum() == g.numel()  # one gradient per window: ties routed to one element


def test_nan_windows_propagate_as_in_max_pool2d():
    x = _input((2, 3, 8, 8), torch.float32)
    x[0, 1, 2, 3] = float("nan")
    x[1, 2, 6, 6] = float("nan")
    leaf = x.clone().requires_grad_(True)
    y = max_pool2d(leaf, 2)
    (dx,) = torch.autograd.grad(y, leaf, torch.ones_like(y))
    ref_leaf = x.clone().requires_grad_(True)
    ref = F.max_pool2d(ref_leaf, 2)
    (ref_dx,) = torch.autograd.grad(ref, ref_leaf, torch.ones_like(ref))
    torch.testing.assert_close(y, ref, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(dx, ref_dx) and int(y.isnan().sum()) == 2
    with torch.no_grad():  # the values-only kernel as well
        torch.testing.assert_close(max_pool2d(x, 2), F.max_pool2d(x, 2), rtol=0, atol=0, equal_nan=True)


def test_other_inputs_take_pytorchs_pooling():
    x = _input((4, 3, 8, 8), torch.float32)
    assert not pooling._fast(x.transpose(2, 3))  # not NCHW-contiguous
    assert not pooling._fast(x[:, :1])  # one channel: the layouts coincide
    assert not pooling._fast(x.to(torch.bfloat16))
    for y in (x.transpose(2, 3), x[:, :1], x.to(torch.bfloat16)):
        assert torch.equal(max_pool2d(y, 2), F.max_pool2d(y, 2))


def _spy(monkeypatch) -> list[tuple[int, ...]]:
    """The shapes the channels-last kernel pools (under vmap: the physical, folded tensor)."""
    seen: list[tuple[int, ...]] = []
    forward = pooling._ChannelsLastMaxPool.forward
    monkeypatch.setattr(pooling._ChannelsLastMaxPool, "forward",
                        staticmethod(lambda x, k: seen.append(tuple(x.shape)) or forward(x, k)))
    return seen


def test_under_vmap_the_clients_fold_into_the_channels(monkeypatch):
    """A cohort's forward under vmap (autograd outside, as batched_mean_grad runs it) and per-example gradients
    (vmap of torch.func.grad): PyTorch's bits, the clients' planes pooled as channels of one tensor."""
    x = _input((3, 4, 5, 8, 8), torch.float32)  # (clients, N, C, H, W)
    seen = _spy(monkeypatch)
    g = torch.randn(3, 4, 5, 4, 4, generator=torch.Generator().manual_seed(3))
    out = {}
    for name, pool in (("ours", max_pool2d), ("torch", F.max_pool2d)):
        leaf = x.clone().requires_grad_(True)
        y = vmap(lambda xi: pool(xi, 2))(leaf)
        out[name] = (y, *torch.autograd.grad(y, leaf, g),
                     vmap(grad(lambda xi: pool(xi.unsqueeze(0), 2).square().sum()))(x[0]))
    assert all(torch.equal(a, b) for a, b in zip(out["ours"], out["torch"]))
    assert seen[0] == (4, 15, 8, 8) and (1, 20, 8, 8) in seen  # clients × channels; examples × channels


@pytest.mark.parametrize("name", ["cnn_cafcor", "cnn_rhdp"])
def test_cohort_gradients_keep_their_bits(name, monkeypatch):
    from trustfl.client.per_example import batched_mean_grad
    from trustfl.objectives.builtin import CrossEntropy
    nets = [build_model(name, (1, 28, 28), 10, seed=s) for s in range(3)]
    stacked = {k: torch.stack([dict(n.named_parameters())[k].detach() for n in nets]) for k, _ in
               nets[0].named_parameters()}
    batch = {"x": _input((3, 8, 1, 28, 28), torch.float32), "y": torch.randint(0, 10, (3, 8))}
    mask = torch.ones(3, 8)
    mask[1, 5:] = 0
    seen = _spy(monkeypatch)
    ours = batched_mean_grad(nets[0], CrossEntropy(), stacked, batch, mask)
    assert seen  # the vmap rule ran
    monkeypatch.setattr(pooling, "_fast", lambda _x: False)
    monkeypatch.setattr(pooling, "_wrapped", lambda _x: False)
    ref = batched_mean_grad(nets[0], CrossEntropy(), stacked, batch, mask)
    assert all(torch.equal(ours[0][k], ref[0][k]) for k in ref[0]) and torch.equal(ours[1], ref[1])


@pytest.mark.parametrize("name", ["cnn_cafcor", "cnn_rhdp"])
def test_zoo_cnn_gradients_keep_their_bits(name, monkeypatch):
    """A whole training gradient of the zoo's CNNs is bitwise the one with F.max_pool2d (the layers below the pools
    see the gradient layout they saw before)."""
    net = build_model(name, (1, 28, 28), 10, seed=0)
    x = _input((16, 1, 28, 28), torch.float32)
    y = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(2))

    def grads():
        net.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        return {k: p.grad for k, p in net.named_parameters()}
    ours = grads()
    monkeypatch.setattr(pooling, "_fast", lambda _x: False)
    ref = grads()
    assert all(torch.equal(ours[k], ref[k]) for k in ref)
