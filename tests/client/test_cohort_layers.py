"""The opt-in vmap-free cohort forward of ghost clipping (``clipped_grad_sum(cohort_layers=True)``, issue #17).

It must give the default (vmap) path's results: equal to 1e-12 relative at float64, including padding rows (with
garbage in them) and clip factors on both sides of 1.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import trustfl.client.ghost_pass as ghost_pass
import trustfl.client.per_example as pe
from trustfl.client.per_example import clipped_grad_sum
from trustfl.models import build_model


def _stack(nets: list[nn.Module]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([dict(n.named_parameters())[k].detach() for n in nets])
            for k, _ in nets[0].named_parameters()}


def _cohort(make, shape, m: int, b: int, dtype: torch.dtype, seed: int = 0):
    nets = [make(i).to(dtype) for i in range(m)]
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, b, *shape, generator=gen, dtype=dtype)
    y = torch.randint(0, 10, (m, b), generator=gen)
    mask = torch.ones(m, b)
    mask[1, b // 2:] = 0  # padded rows, with garbage in them
    mask[2, 0] = 0
    x[1, -1] = float("nan")
    y[1, -1] = 10**6
    return nets, _stack(nets), {"x": x, "y": y}, mask


def _assert_close(ref, new, rel: float) -> None:
    (s0, n0), (s1, n1) = ref, new
    assert s0.keys() == s1.keys()
    for k in s0:
        assert s1[k].shape == s0[k].shape
        assert (s1[k] - s0[k]).abs().max() <= rel * s0[k].abs().max(), k
    assert (n1 - n0).abs().max() <= rel * n0.abs().max()


def _compare(net: nn.Module, stacked, batch, mask, clip: float, rel: float):
    ref = clipped_grad_sum(net, stacked, batch, mask, clip)
    new = clipped_grad_sum(net, stacked, batch, mask, clip, cohort_layers=True)
    _assert_close(ref, new, rel)
    return ref, new


def test_cnn_cafcor_float64_equal_with_padding_and_both_clip_sides():
    nets, stacked, batch, mask = _cohort(lambda i: build_model("cnn_cafcor", (1, 28, 28), 10, seed=100 + i),
                                         (1, 28, 28), 3, 12, torch.float64)
    ref, _ = clipped_grad_sum(nets[0], stacked, batch, mask, 1.0), None
    norms = ref[1][mask != 0]
    clip = float(norms.median())  # some examples clipped (factor < 1), some not (factor 1)
    (_, n0), _ = _compare(nets[0], stacked, batch, mask, clip, 1e-12)
    real = n0[mask != 0]
    assert bool((real > clip).any()) and bool((real < clip).any())
    assert bool((n0[mask == 0] == 0).all())


def test_cnn_cafcor_float32_close():
    nets, stacked, batch, mask = _cohort(lambda i: build_model("cnn_cafcor", (1, 28, 28), 10, seed=7 + i),
                                         (1, 28, 28), 3, 8, torch.float32)
    _compare(nets[0], stacked, batch, mask, 0.5, 1e-5)


class _Odd(nn.Module):
    """No-bias, grouped, strided and padded convolutions, an in-place ReLU after a tapped layer, a no-bias linear."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 6, 3, stride=2, padding=1)
        self.c2 = nn.Conv2d(6, 4, 3, padding=1, groups=2, bias=False)
        self.c3 = nn.Conv2d(4, 4, (2, 3), dilation=(1, 2), bias=False)
        self.fc = nn.Linear(4 * 4 * 2, 7)
        self.out = nn.Linear(7, 10, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu_(self.c1(x))
        x = torch.tanh(self.c3(torch.relu(self.c2(x))))
        return self.out(torch.relu_(self.fc(x.flatten(1))))


def test_odd_layers_float64_equal():
    def make(i: int) -> nn.Module:
        torch.manual_seed(i)
        return _Odd()
    nets, stacked, batch, mask = _cohort(make, (2, 10, 12), 3, 5, torch.float64, seed=3)
    (_, n0), _ = _compare(nets[0], stacked, batch, mask, 0.3, 1e-12)
    assert bool((n0[mask != 0] > 0.3).any())


def test_frozen_layer_float64_equal():
    nets, stacked, batch, mask = _cohort(lambda i: build_model("cnn_cafcor", (1, 28, 28), 10, seed=i),
                                         (1, 28, 28), 2 + 1, 4, torch.float64)
    part = {k: v for k, v in stacked.items() if k not in ("conv1.bias", "fc1.weight")}
    _compare(nets[0], part, batch, mask, 0.2, 1e-12)


def test_default_is_off_and_one_client_unchanged(monkeypatch):
    assert pe.COHORT_LAYERS is False
    nets, stacked, batch, mask = _cohort(lambda i: build_model("cnn_cafcor", (1, 28, 28), 10, seed=i),
                                         (1, 28, 28), 3, 4, torch.float32)

    def boom(*args, **kwargs):
        raise AssertionError("cohort forward used by default")
    monkeypatch.setattr(ghost_pass, "_cohort_forward", boom)
    clipped_grad_sum(nets[0], stacked, batch, mask, 1.0)
    one = ({k: v[:1] for k, v in stacked.items()}, {k: v[:1] for k, v in batch.items()}, mask[:1])
    a = clipped_grad_sum(nets[0], *one, 1.0)
    b = clipped_grad_sum(nets[0], *one, 1.0, cohort_layers=True)  # one client: the plain path, bitwise
    assert all(torch.equal(a[0][k], b[0][k]) for k in a[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("dtype", [torch.float64])
def test_conv1d_falls_back(dtype):
    def make(i: int) -> nn.Module:
        torch.manual_seed(i)
        return nn.Sequential(nn.Conv1d(2, 3, 3), nn.Flatten(), nn.Linear(3 * 6, 10))
    nets, stacked, batch, mask = _cohort(make, (2, 8), 3, 4, dtype)
    _compare(nets[0], stacked, batch, mask, 0.5, 1e-12)
