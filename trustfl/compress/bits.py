"""Vectorized bit packing: ``(m, d)`` integers of ``bits`` bits each ↔ ``(m, ceil(bits·d/8))`` bytes.

The layout of one row, for ``bits = 8·a + r`` (``0 <= r < 8``), is byte-plane-major so that every step reads
and writes whole contiguous slices (strided byte copies are ~10× slower on CPU):

1. ``a`` byte planes of ``d`` bytes: plane ``k`` holds bits ``8k..8k+7`` of every value.
2. The high ``r`` bits of every value. With ``per = lcm(r, 8)/r`` values to a word of ``w = lcm(r, 8)/8`` bytes
   (at most 56 bits) and ``G = d // per`` full words, value ``j < per·G`` sits in word ``j % G`` at bit offset
   ``r·(j // G)``; the words are written as ``w`` byte planes of ``G`` bytes. The last ``d − per·G < per``
   values share one more word, of which only the ``ceil(r·(d − per·G)/8)`` bytes that carry bits are sent.

So a row takes ``a·d + w·G + ceil(r·(d − per·G)/8) = ceil(bits·d/8)`` bytes, no bit wasted beyond the last
partial byte. Every step is a whole-tensor operation; the only Python loops run over the (at most 8) byte planes
and word slots, never over coordinates or rows.

Example:
  >>> v = torch.tensor([[1, 2, 3, 4, 5]])
  >>> packed = pack_bits(v, 3)
  >>> packed.dtype, tuple(packed.shape)
  (torch.uint8, (1, 2))
  >>> unpack_bits(packed, 3, 5).tolist()
  [[1, 2, 3, 4, 5]]
"""
from __future__ import annotations

import math

import torch

from trustfl.core.checks import check_number
from trustfl.errors import ConfigError, MessageError


def packed_nbytes(bits: int, d: int) -> int:
    """Bytes per row of :func:`pack_bits`: ``ceil(bits·d/8)``."""
    return (bits * d + 7) // 8


def check_bits(bits: object, name: str = "bits") -> int:
    """Return ``bits`` if it is an integer in 1..32, else raise :class:`ConfigError` naming ``name``."""
    return check_number(name, bits, integer=True, low=1, high=32)


def _word(r: int) -> tuple[int, int, torch.dtype]:
    """(values per word, bytes per word, word dtype) for the ``r``-bit stream."""
    span = r * 8 // math.gcd(r, 8)  # lcm(r, 8) bits: a whole number of values and of bytes
    return span // r, span // 8, torch.int32 if span <= 24 else torch.int64


def pack_bits(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``values`` (integers in ``[0, 2**bits)``) into ``ceil(bits·d/8)`` bytes per row.

    Args:
      values: an integer tensor of shape ``(m, d)``. Only the low ``bits`` bits of each entry are sent, so an
        ``int32`` tensor may carry its two's-complement bit pattern when ``bits = 32``.
      bits: bits per value, 1..32.

    Returns:
      A ``uint8`` tensor of shape ``(m, ceil(bits·d/8))`` on ``values``' device.

    Raises:
      ConfigError: if ``bits`` is not an integer in 1..32.
      MessageError: if ``values`` is not a 2-D integer tensor.
    """
    check_bits(bits)
    if values.ndim != 2 or values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
        raise MessageError(f"pack_bits takes an (m, d) integer tensor, found {values.dtype} {tuple(values.shape)}.")
    if values.dtype not in (torch.int32, torch.int64):
        values = values.to(torch.int64)
    m, d = values.shape
    a, r = divmod(bits, 8)
    out = torch.empty(m, packed_nbytes(bits, d), dtype=torch.uint8, device=values.device)
    for k in range(a):  # casting to uint8 keeps the low byte (modular conversion)
        out[:, k * d:(k + 1) * d] = values if k == 0 else values >> (8 * k)
    if r:
        per, w, dtype = _word(r)
        high_mask = ((1 << r) - 1) << (8 * a)  # the r bits above the byte planes
        groups, rest = divmod(d, per)
        pos = a * d
        if groups:
            slots = values[:, :per * groups].reshape(m, per, groups)  # a view: only the last dim is split
            word = None
            for i in range(per):  # slot i's bits go to offset r·i of the word
                part = (slots[:, i] & high_mask).to(dtype)
                part = _shift_(part, r * i - 8 * a)
                word = part if word is None else word.bitwise_or_(part)
            for j in range(w):
                out[:, pos + j * groups:pos + (j + 1) * groups] = word >> (8 * j) if j else word
            pos += w * groups
        if rest:
            tail = (values[:, per * groups:] >> (8 * a) & ((1 << r) - 1)).to(dtype)
            tail = tail << torch.arange(0, r * rest, r, device=values.device, dtype=dtype)
            tail = tail.sum(dim=1, keepdim=True, dtype=dtype)  # disjoint bits: the sum is the bitwise or
            shifts = torch.arange(0, 8 * (out.shape[1] - pos), 8, device=values.device, dtype=dtype)
            out[:, pos:] = tail >> shifts
    return out


def unpack_bits(packed: torch.Tensor, bits: int, d: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the ``(m, d)`` values, as ``dtype`` (``int64`` or ``int32``).

    Args:
      packed: ``uint8`` of shape ``(m, ceil(bits·d/8))``.
      bits: bits per value, 1..32.
      d: values per row.
      dtype: ``torch.int64`` (values in ``[0, 2**bits)``) or ``torch.int32`` (the same, except that for
        ``bits = 32`` the values come back as their two's-complement ``int32`` bit pattern).

    Raises:
      ConfigError: if ``bits`` is not an integer in 1..32.
      ConfigError: if ``dtype`` is not ``torch.int32`` or ``torch.int64``.
      MessageError: if ``packed`` does not have the shape :func:`pack_bits` produces.
    """
    check_bits(bits)
    if dtype not in (torch.int32, torch.int64):
        raise ConfigError(f"unpack_bits returns int32 or int64, found dtype {dtype}.")
    if packed.dtype != torch.uint8 or packed.ndim != 2 or packed.shape[1] != packed_nbytes(bits, d):
        raise MessageError(f"unpack_bits expects uint8 (m, {packed_nbytes(bits, d)}) for bits={bits}, d={d}; "
                           f"found {packed.dtype} {tuple(packed.shape)}.")
    m = packed.shape[0]
    a, r = divmod(bits, 8)
    out = torch.empty(m, d, dtype=dtype, device=packed.device)
    if r:
        per, w, wdtype = _word(r)
        high_mask = ((1 << r) - 1) << (8 * a)
        groups, rest = divmod(d, per)
        pos = a * d
        if groups:
            word = packed[:, pos:pos + groups].to(wdtype)
            for j in range(1, w):
                word |= packed[:, pos + j * groups:pos + (j + 1) * groups].to(wdtype) << (8 * j)
            slots = out[:, :per * groups].view(m, per, groups)
            for i in range(per):  # slot i's bits, moved straight to their place above the byte planes
                shift = 8 * a - r * i
                moved = word << shift if shift > 0 else word >> -shift if shift < 0 else word
                torch.bitwise_and(moved, high_mask, out=slots[:, i])
            pos += w * groups
        if rest:
            tail_bytes = packed[:, pos:].to(wdtype)
            tail_bytes = tail_bytes << torch.arange(0, 8 * tail_bytes.shape[1], 8, device=packed.device,
                                                    dtype=wdtype)
            tail = tail_bytes.sum(dim=1, keepdim=True, dtype=wdtype)
            shifts = torch.arange(0, r * rest, r, device=packed.device, dtype=wdtype)
            out[:, per * groups:] = ((tail >> shifts) & ((1 << r) - 1)) << (8 * a)
        for k in range(a):
            out |= packed[:, k * d:(k + 1) * d].to(dtype) << (8 * k) if k else packed[:, :d]
    else:
        out.copy_(packed[:, :d])
        for k in range(1, a):
            out |= packed[:, k * d:(k + 1) * d].to(dtype) << (8 * k)
    return out


def _shift_(x: torch.Tensor, bits: int) -> torch.Tensor:
    """``x << bits`` (``x >> -bits`` when negative), in place."""
    if bits > 0:
        return x.bitwise_left_shift_(bits)
    if bits < 0:
        return x.bitwise_right_shift_(-bits)
    return x
