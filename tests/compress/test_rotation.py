"""The shared-seed randomized Hadamard rotation: orthonormal, invertible, seeded."""
from __future__ import annotations

import pytest
import scipy.linalg
import torch

from trustfl.compress.rotation import HadamardRotation, hadamard_transform
from trustfl.errors import ConfigError


def _x(m: int, d: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(m, d, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("block", [1, 2, 16, 32, 64, 256, 512, 1024, 4096])
def test_hadamard_transform_matches_the_dense_matrix(block):
    x = _x(3, 2 * block, seed=block)
    dense = torch.tensor(scipy.linalg.hadamard(block), dtype=torch.float64) / block ** 0.5
    expected = (x.double().view(-1, block) @ dense).view(3, 2 * block)
    torch.testing.assert_close(hadamard_transform(x, block).double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("d,block", [(1000, 256), (431, 64), (5, 256), (4096, 1024)])
def test_rotation_is_orthonormal_and_inverts(d, block):
    rot = HadamardRotation(block)
    x = _x(4, d)
    y = rot.forward(x, shared_seed=3)
    assert y.shape == (4, rot.padded(d)) and rot.padded(d) % rot.block_for(d) == 0
    assert rot.padded(d) - d < rot.block_for(d)
    torch.testing.assert_close(y.norm(dim=1), x.norm(dim=1), rtol=1e-5, atol=0)
    assert (rot.inverse(y, 3, d) - x).abs().max() < 1e-5
    # the rotation spreads a spike over its whole block
    spike = torch.zeros(1, d)
    spike[0, d // 2] = 1.0
    spread = rot.forward(spike, shared_seed=3).abs()
    nonzero = spread[spread > 0]
    assert nonzero.numel() == rot.block_for(d)
    torch.testing.assert_close(nonzero, torch.full_like(nonzero, rot.block_for(d) ** -0.5))


def test_same_seed_same_rotation_other_seeds_differ():
    rot = HadamardRotation(256)
    x = _x(2, 1000)
    a = rot.forward(x, 11)
    assert torch.equal(a, rot.forward(x.clone(), 11))
    assert torch.equal(rot.signs(11, 1000, "cpu"), rot.signs(11, 1000, "cpu"))
    for other in (12, 0, 2 ** 40):
        b = rot.forward(x, other)
        assert (a - b).abs().max() > 0.1
        # decoding with the wrong seed does not give x back
        assert (rot.inverse(a, other, 1000) - x).abs().max() > 0.1


def test_one_dimensional_input_is_a_single_row():
    rot = HadamardRotation(64)
    x = _x(1, 100)
    torch.testing.assert_close(rot.forward(x[0], 5), rot.forward(x, 5)[0])


def test_small_vectors_use_a_smaller_block():
    rot = HadamardRotation(256)
    assert rot.block_for(5) == 8 and rot.padded(5) == 8
    assert rot.block_for(300) == 256 and rot.padded(300) == 512


@pytest.mark.parametrize("block", [0, 3, 100, -4, 2.0])
def test_block_must_be_a_power_of_two(block):
    with pytest.raises(ConfigError, match="`block`"):
        HadamardRotation(block)


def test_reduced_matmul_precision_falls_back_to_exact_butterflies():
    x = _x(2, 512)
    exact = hadamard_transform(x, 256)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        fallback = hadamard_transform(x, 256)
    finally:
        torch.set_float32_matmul_precision(before)
    torch.testing.assert_close(fallback, exact, atol=1e-5, rtol=1e-5)
