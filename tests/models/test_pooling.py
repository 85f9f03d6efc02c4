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


def test_other_inputs_and_transforms_take_max_pool2d_itself():
    x = _input((4, 3, 8, 8), torch.float32)
    assert not pooling._fast(x.transpose(2, 3))  # not NCHW-contiguous
    assert not pooling._fast(x[:, :1])  # one channel: the layouts coincide
    assert not pooling._fast(x.to(torch.bfloat16))
    per_example = vmap(grad(lambda xi: max_pool2d(xi.unsqueeze(0), 2).square().sum()))(x)  # torch.func: plain op
    ref = vmap(grad(lambda xi: F.max_pool2d(xi.unsqueeze(0), 2).square().sum()))(x)
    assert torch.equal(per_example, ref)


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
