"""pack_bits / unpack_bits: round trips for every width, exact byte counts and the documented layout."""
from __future__ import annotations

import pytest
import torch

from trustfl.compress.bits import pack_bits, packed_nbytes, unpack_bits
from trustfl.errors import ConfigError, MessageError

DIMS = (1, 5, 8, 13, 100, 257)


def _reference_pack(row: list[int], bits: int) -> list[int]:
    """The layout of the module docstring, one value at a time (slow, for small d)."""
    d = len(row)
    a, r = divmod(bits, 8)
    out = [(v >> (8 * k)) & 255 for k in range(a) for v in row]
    if r:
        per = {1: 8, 2: 4, 3: 8, 4: 2, 5: 8, 6: 4, 7: 8}[r]
        w = per * r // 8
        groups, rest = divmod(d, per)
        high = [(v >> (8 * a)) & ((1 << r) - 1) for v in row]
        words = [0] * groups
        for j in range(per * groups):
            words[j % groups] |= high[j] << (r * (j // groups))
        out += [(word >> (8 * k)) & 255 for k in range(w) for word in words]
        tail = 0
        for i, v in enumerate(high[per * groups:]):
            tail |= v << (r * i)
        out += [(tail >> (8 * k)) & 255 for k in range((r * rest + 7) // 8)]
    return out


@pytest.mark.parametrize("bits", range(1, 33))
def test_round_trip_and_byte_count_for_every_width(bits):
    g = torch.Generator().manual_seed(bits)
    for d in DIMS:
        values = torch.randint(0, 2 ** bits, (3, d), generator=g, dtype=torch.int64)
        packed = pack_bits(values, bits)
        assert packed.dtype == torch.uint8
        assert packed.shape == (3, (bits * d + 7) // 8) == (3, packed_nbytes(bits, d))
        assert torch.equal(unpack_bits(packed, bits, d), values)
        as_int32 = unpack_bits(packed, bits, d, dtype=torch.int32)
        assert as_int32.dtype == torch.int32
        if bits < 32:
            assert torch.equal(as_int32.long(), values)
            assert torch.equal(pack_bits(values.int(), bits), packed)  # int32 input, same bytes
        else:  # the two's-complement bit pattern
            assert torch.equal(as_int32.long() & 0xFFFFFFFF, values)
            assert torch.equal(pack_bits(as_int32, bits), packed)


@pytest.mark.parametrize("bits", [1, 3, 5, 6, 7, 8, 11, 14, 16, 21, 32])
def test_layout_matches_the_documented_reference(bits):
    g = torch.Generator().manual_seed(100 + bits)
    values = torch.randint(0, 2 ** bits, (2, 29), generator=g, dtype=torch.int64)
    packed = pack_bits(values, bits)
    for i in range(2):
        assert packed[i].tolist() == _reference_pack(values[i].tolist(), bits)


def test_extreme_values_survive():
    for bits in (1, 7, 13, 31, 32):
        top = 2 ** bits - 1
        values = torch.tensor([[0, top, top, 0, top, 1, top - 1, top]], dtype=torch.int64)
        assert torch.equal(unpack_bits(pack_bits(values, bits), bits, 8), values)


def test_high_bits_beyond_the_width_are_dropped():
    values = torch.tensor([[0b1_0101, 0b11_1111]])
    assert unpack_bits(pack_bits(values, 4), 4, 2).tolist() == [[0b0101, 0b1111]]


@pytest.mark.parametrize("bits", [0, 33, -1, 4.0, True])
def test_bad_width_raises_config_error_naming_bits(bits):
    with pytest.raises(ConfigError, match="`bits`"):
        pack_bits(torch.zeros(1, 3, dtype=torch.int64), bits)


def test_bad_shapes_raise():
    with pytest.raises(MessageError, match=r"\(m, d\) integer tensor, found torch.int64 \(3,\)"):
        pack_bits(torch.zeros(3, dtype=torch.int64), 4)
    with pytest.raises(MessageError, match=r"\(m, d\) integer tensor, found torch.float32"):
        pack_bits(torch.zeros(1, 3), 4)  # float input
    with pytest.raises(MessageError, match=r"\(m, 2\)"):
        unpack_bits(torch.zeros(1, 3, dtype=torch.uint8), 4, 3)
    with pytest.raises(ConfigError, match="int32 or int64"):
        unpack_bits(torch.zeros(1, 2, dtype=torch.uint8), 4, 3, dtype=torch.int16)
