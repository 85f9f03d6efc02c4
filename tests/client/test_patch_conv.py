"""A one-client ghost pass's convolutions by patches (trustfl.client.patch_conv): which ones, their exactness against
a per-example autograd loop (float64, 1e-12 relative), the forward and input gradient against PyTorch's convolution,
and that every module keeps its own forward after the pass."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.client.test_ghost_conv import _check, _data, _stack
from trustfl.client import ghost, patch_conv
from trustfl.client.per_example import clipped_grad_sum
from trustfl.models import build_model

ONE = torch.tensor([[1.0, 1, 0, 1, 1]])  # one client, a padding row


@pytest.fixture
def patched_calls(monkeypatch):
    """The number of convolutions computed by patches so far."""
    calls = [0]
    apply = patch_conv._PatchProduct.apply

    def counting(*args):
        calls[0] += 1
        return apply(*args)
    monkeypatch.setattr(patch_conv._PatchProduct, "apply", counting)
    return calls


class _Geometry(nn.Module):
    def __init__(self, kernel, stride, padding, dilation, bias: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, kernel, stride=stride, padding=padding, dilation=dilation, bias=bias)
        self.conv2 = nn.Conv2d(4, 5, 2)
        with torch.no_grad():
            out = self.conv2(self.conv(torch.zeros(1, 3, 11, 10)))
        self.fc = nn.Linear(out.numel(), 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv2(torch.tanh(self.conv(x)))).flatten(1))


GEOMETRIES = {"strided": ((3, 2), (2, 1), 0, (2, 1)), "dilated": (3, 1, 0, (1, 2)), "padded": ((2, 3), 1, (1, 2), 1),
              "unit": (1, 1, 0, 1)}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_patched_norms_and_sums_equal_the_per_example_loop(geometry, bias, patched_calls, monkeypatch):
    """Every geometry by patches (forced, whatever would pay): norms and clipped sums == the autograd loop."""
    monkeypatch.setattr(patch_conv, "pays", lambda layer, x: True)
    torch.manual_seed(4)
    net = _Geometry(*GEOMETRIES[geometry], bias=bias).double()
    x, y = _data(1, 5, (3, 11, 10), 3, seed=7)
    _check(net, _stack([net]), x, y, mask=ONE)
    assert patched_calls[0] >= 2 * 3  # both convolutions, at each clip norm


def test_cnn_cafcor_computes_by_patches_and_equals_the_loop(patched_calls):
    net = build_model("cnn_cafcor", (1, 28, 28), 10, seed=1).double()
    x, y = _data(1, 5, (1, 28, 28), 10, seed=8)
    _check(net, _stack([net]), x, y, mask=ONE, n_clips=2)
    assert patched_calls[0] == 2 * 2


def test_which_convolutions_compute_by_patches(patched_calls):
    """cnn_cafcor's two convolutions (unpadded; 8×8 outputs or a products form); none of cnn_rhdp's (padded), none
    of a cohort's (vmap), none on another device, none of a grouped, 1-D or subclassed convolution."""
    def run(net, m=1, side=28, channels=1):
        x, y = _data(m, 4, (channels, side, side), 10, seed=9)
        clipped_grad_sum(net, _stack([net] * m), {"x": x.float(), "y": y}, torch.ones(m, 4), 1.0)

    run(build_model("cnn_cafcor", (1, 28, 28), 10, seed=0))
    assert patched_calls[0] == 2
    run(build_model("cnn_rhdp", (1, 28, 28), 10, seed=0))
    run(build_model("cnn_cafcor", (1, 28, 28), 10, seed=0), m=2)
    assert patched_calls[0] == 2

    class Sub(nn.Conv2d):
        pass
    layer = ghost.GhostLayer("c", "conv2d", "w", "b", (4, 2, 3, 3), kernel_size=(3, 3))
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert patch_conv.applies(layer, nn.Conv2d(2, 4, 3), cpu)
    assert not patch_conv.applies(layer, nn.Conv2d(2, 4, 3), cuda)
    assert not patch_conv.applies(layer, Sub(2, 4, 3), cpu)
    assert not patch_conv.applies(ghost.GhostLayer("c", "conv2d", "w", "b", (4, 1, 3, 3), kernel_size=(3, 3),
                                                   groups=2), nn.Conv2d(2, 4, 3, groups=2), cpu)
    assert not patch_conv.applies(ghost.GhostLayer("c", "conv1d", "w", "b", (4, 2, 1, 3), kernel_size=(1, 3)),
                                  nn.Conv1d(2, 4, 3), cpu)
    own = nn.Conv2d(2, 4, 3)
    own.forward = lambda x: x  # a forward of the user's own
    assert not patch_conv.applies(layer, own, cpu)
    # an 8×8 output always pays; 24×24 pays where the per-example gradients would be products (1 channel), not where
    # a grouped convolution would compute them (64 weights per channel); padding never pays
    assert patch_conv.pays(layer, torch.zeros(4, 2, 10, 10))
    assert patch_conv.pays(ghost.GhostLayer("c", "conv2d", "w", "b", (4, 1, 5, 5), kernel_size=(5, 5)),
                           torch.zeros(4, 1, 28, 28))
    assert not patch_conv.pays(ghost.GhostLayer("c", "conv2d", "w", "b", (4, 8, 3, 3), kernel_size=(3, 3)),
                               torch.zeros(4, 8, 26, 26))
    assert not patch_conv.pays(ghost.GhostLayer("c", "conv2d", "w", "b", (4, 2, 3, 3), kernel_size=(3, 3),
                                                padding=(1, 1)), torch.zeros(4, 2, 8, 8))


@pytest.mark.parametrize("channels", [3, 1], ids=["3ch", "1ch"])  # one channel: copied a kernel row at a time
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_the_patched_convolution_is_pytorchs_to_rounding_and_channels_last(geometry, channels):
    kernel, stride, padding, dilation = GEOMETRIES[geometry]
    conv = nn.Conv2d(channels, 4, kernel, stride=stride, padding=padding, dilation=dilation).double()
    layer = ghost.describe("conv", conv, {"weight": "conv.weight", "bias": "conv.bias"})
    x = torch.randn(5, channels, 11, 10, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        cols = patch_conv.patches(layer, x)
    side = patch_conv.output_side(layer, 11, 10)
    out = patch_conv._PatchProduct.apply(x, cols, conv.weight.detach(), conv.bias.detach(), layer, side)
    ref = conv(x)
    assert out.shape == ref.shape and out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert torch.equal(cols.view(5, *side, -1).flatten(0, 2), F.unfold(x.detach(), kernel, dilation, padding, stride)
                       .view(5, channels, -1, side[0] * side[1]).permute(0, 3, 2, 1).reshape(-1, cols.shape[-1]))
    g = torch.randn_like(ref)
    (want,) = torch.autograd.grad(ref, x, g)
    (got,) = torch.autograd.grad(out, x, g)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_every_module_keeps_its_forward_after_the_pass_even_a_failed_one():
    net = build_model("cnn_cafcor", (1, 28, 28), 10, seed=0)
    plan = [(layer, None) for layer in ghost.ghost_layers(net, [k for k, _ in net.named_parameters()])]
    modules = dict(net.named_modules())
    with pytest.raises(RuntimeError, match="inside"):
        with patch_conv.by_patches([layer for layer, _ in plan], modules, torch.device("cpu")) as columns:
            assert "forward" in vars(net.conv1) and "forward" in vars(net.conv2)
            net(torch.zeros(2, 1, 28, 28))
            assert [c is not None for c in columns] == [True, True, False, False]
            raise RuntimeError("inside")
    assert "forward" not in vars(net.conv1) and "forward" not in vars(net.conv2)
    torch.testing.assert_close(net.conv2(torch.ones(1, 20, 12, 12)),
                               F.conv2d(torch.ones(1, 20, 12, 12), net.conv2.weight, net.conv2.bias))
