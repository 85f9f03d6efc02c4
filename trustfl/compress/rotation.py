"""Shared-seed randomized Walsh–Hadamard rotation, x' = H·D·x, in blocks.

``D`` is a diagonal of random ±1 signs drawn from the shared seed and ``H`` the normalised (orthonormal,
symmetric, ``H·H = I``) Sylvester–Hadamard matrix of size ``block``, applied to consecutive blocks of the
zero-padded vector. The rotation spreads a vector's energy evenly over the coordinates of each block, so the
largest coordinate of ``x − key`` after rotation is about ``‖x − key‖·sqrt(2·log(block)/block)`` — what the
lattice quantizer's per-coordinate decode radius needs (Davies et al. 2021; Suresh et al. 2017).

On a CPU the transform of a block is a few small matmuls with precomputed ±1 matrices of size at most 16, one
per Kronecker factor of ``H = … ⊗ H_16 ⊗ H_16`` (``block = 256``: two), each along its own axis of the block:
about ``2·16`` flops per coordinate and factor, in one pass over memory each. The ``log2(block/16)`` butterfly
passes they replaced (a pair of whole-tensor add/sub each) cost 3x more on a 2-core Intel Xeon, where they were
memory bound (``benchmarks/compress_speed.py``). On other devices (and under a reduced
``torch.set_float32_matmul_precision``) all ``log2(block)`` stages are butterflies.

Example:
  >>> rot = HadamardRotation(block=4)
  >>> x = torch.tensor([[3.0, 4.0, 0.0, 0.0, 1.0]])
  >>> y = rot.forward(x, shared_seed=7)
  >>> tuple(y.shape), round(float(y.norm()), 4)
  ((1, 8), 5.099)
  >>> torch.allclose(rot.inverse(y, 7, d=5), x, atol=1e-6)
  True
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from trustfl.errors import ConfigError, MessageError

_BASE = 16  # size of the dense Kronecker factors: a 16×16 matmul beat 8, 32 and 64 on one CPU thread


def check_block(block: object) -> int:
    """Return ``block`` if it is a power of two ≥ 1, else raise :class:`ConfigError`."""
    if isinstance(block, bool) or not isinstance(block, int) or block < 1 or block & (block - 1):
        raise ConfigError(f"`block` must be a power of 2 (e.g. 256), found {block!r}.")
    return block


@functools.lru_cache(maxsize=8)
def _signs(seed: int, n: int, device: torch.device) -> torch.Tensor:
    # Drawn by a CPU generator whatever the device, so that a CPU sender and a GPU receiver (or two GPU
    # models) derive the same D from the shared seed; cached because every message of a round uses one seed.
    gen = torch.Generator(device="cpu").manual_seed(int(seed) & ((1 << 63) - 1))
    bits = torch.randint(0, 2, (n,), generator=gen, dtype=torch.int8)
    return (bits * 2 - 1).to(device=device, dtype=torch.float32)


@functools.lru_cache(maxsize=16)
def _hadamard_matrix(n: int, scale: float, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h * scale).to(device=device, dtype=dtype)


def hadamard_transform(x: torch.Tensor, block: int, scale: float = 1.0) -> torch.Tensor:
    """``scale ×`` the normalised Walsh–Hadamard transform of each ``block`` of the last dimension of ``x`` (m, n).

    ``n`` must be a multiple of ``block``. The result is a new tensor; ``x`` is not modified. With ``scale = 1``
    the transform is its own inverse. ``scale`` is folded into the first stage (free on a CPU).
    """
    check_block(block)
    if x.ndim != 2 or x.shape[1] % block:
        raise MessageError(f"hadamard_transform needs an (m, n) tensor with n a multiple of block={block}, "
                           f"found shape {tuple(x.shape)}.")
    return _transform(x, block, scale, spare=None)


def _transform(x: torch.Tensor, block: int, scale: float, spare: torch.Tensor | None) -> torch.Tensor:
    """:func:`hadamard_transform`, overwriting ``spare`` (which may be ``x`` itself) instead of allocating."""
    m, n = x.shape
    # The dense stage is a matmul only where float32 matmuls are exact float32 (a CPU at "highest" precision):
    # TF32 on GPUs, or bf16 under a lower matmul precision, would cost the lattice ~3 decimal digits. Elsewhere
    # every stage is a butterfly, which on a GPU is cheap anyway.
    exact_mm = x.device.type == "cpu" and torch.get_float32_matmul_precision() == "highest"
    base = min(block, _BASE) if exact_mm else 1
    if base == 1:
        y = x * (float(scale) / math.sqrt(block))
    else:
        h = _hadamard_matrix(base, float(scale) / math.sqrt(block), x.device, x.dtype)
        y = torch.mm(x.reshape(-1, base), h).view(m, n)
    if base == block:
        return y
    spare = torch.empty_like(y) if spare is None else spare
    half = base
    while base > 1 and half < block:  # H_{k·half} = H_k ⊗ H_half: k×k ±1 matrix on the middle axis of (k, half)
        k = min(_BASE, block // half)
        torch.matmul(_hadamard_matrix(k, 1.0, x.device, x.dtype), y.view(-1, k, half), out=spare.view(-1, k, half))
        y, spare = spare, y
        half *= k
    while half < block:  # butterflies on the outer Kronecker factor: (a, b) -> (a + b, a − b)
        src, dst = y.view(-1, 2, half), spare.view(-1, 2, half)
        torch.add(src[:, 0], src[:, 1], out=dst[:, 0])
        torch.sub(src[:, 0], src[:, 1], out=dst[:, 1])
        y, spare = spare, y
        half *= 2
    return y


@dataclass(frozen=True)
class HadamardRotation:
    """x ↦ H·D·x per block of ``block`` coordinates, with ``D`` from a shared seed.

    Args:
      block: the Hadamard block size, a power of 2. A vector shorter than ``block`` uses the next power of two
        ≥ its length instead, so small vectors are not padded far.

    Math:
      ``forward(x)`` pads ``x`` (m, d) with zeros to ``n = padded(d)`` coordinates and returns ``H·D·x``;
      ``inverse(y, d)`` returns the first ``d`` coordinates of ``D·H·y``. Both preserve the Euclidean norm.
    """

    block: int = 256

    def __post_init__(self) -> None:
        check_block(self.block)

    def block_for(self, d: int) -> int:
        """The block used for vectors of length ``d``: ``min(block, next power of two ≥ d)``."""
        return min(self.block, 1 << max(d - 1, 0).bit_length())

    def padded(self, d: int) -> int:
        """Rotated length of a vector of length ``d``: ``d`` rounded up to a multiple of ``block_for(d)``."""
        b = self.block_for(d)
        return -(-d // b) * b

    def signs(self, shared_seed: int, d: int, device: torch.device | str) -> torch.Tensor:
        """The ±1 diagonal ``D`` (float32, length ``padded(d)``) for ``shared_seed``, on ``device``."""
        return _signs(int(shared_seed), self.padded(d), torch.device(device))

    def forward(self, x: torch.Tensor, shared_seed: int, scale: float = 1.0) -> torch.Tensor:
        """``scale·H·D·x`` for ``x`` (m, d) or (d,): a new float32 tensor of shape (m, padded(d)) or (padded(d),)."""
        flat = x.ndim == 1
        x2 = (x.reshape(1, -1) if flat else x).to(torch.float32)
        m, d = x2.shape
        n = self.padded(d)
        signs = self.signs(shared_seed, d, x2.device)
        buf = torch.empty(m, n, dtype=torch.float32, device=x2.device)
        buf[:, d:] = 0.0
        torch.mul(x2, signs[:d], out=buf[:, :d])
        y = _transform(buf, self.block_for(d), scale, spare=buf)  # buf is ours: reuse it
        return y.view(-1) if flat else y

    def inverse(self, y: torch.Tensor, shared_seed: int, d: int, scale: float = 1.0,
                overwrite: bool = False) -> torch.Tensor:
        """``scale·D·H·y`` cut to its first ``d`` coordinates: a new float32 tensor of shape (m, d).

        ``overwrite=True`` lets the transform use ``y`` (float32, contiguous) as scratch space.
        """
        y = y.to(torch.float32)
        block = self.block_for(d)
        if y.ndim != 2 or y.shape[1] != self.padded(d):
            raise MessageError(f"inverse expects (m, {self.padded(d)}) for d={d}, found {tuple(y.shape)}.")
        h = _transform(y, block, scale, spare=y if overwrite and y.is_contiguous() else None)
        return h[:, :d] * self.signs(shared_seed, d, y.device)[:d]
