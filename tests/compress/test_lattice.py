"""The modulo lattice quantizer: exact decoding inside the safe radius, failure flags, bias, bits, errors."""
from __future__ import annotations

import math

import pytest
import torch

from trustfl.compress import HadamardRotation, Lattice, unpack_bits
from trustfl.errors import ConfigError, MessageError


def _gen(seed: int, device: str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _lattice_point(enc32, lat32: Lattice, d: int) -> torch.Tensor:
    """step·z from a b = 32 encoding (its modulo is the identity), in the coded (rotated) domain."""
    z = unpack_bits(enc32.payload["codes"], 32, lat32.coded_length(d), dtype=torch.int32)
    return lat32.step * z.to(torch.float32)


@pytest.mark.parametrize("bits,step,scale", [(3, 0.25, 3.0), (8, 1 / 64, 5.0), (14, 1e-4, 0.2), (21, 1e-5, 1.0),
                                             (32, 1e-3, 1.0)])
def test_code_mode_is_exact_within_the_safe_radius(bits, step, scale):
    lat = Lattice(bits, step, mode="code")
    assert not lat.rotated and not lat.dithered
    g = _gen(bits)
    x = torch.randn(5, 300, generator=g) * scale
    gap = (torch.rand(5, 300, generator=g) * 2 - 1) * 0.99 * (lat.safe_radius - step / 2)
    enc = lat.encode(x, None, shared_seed=0)
    dec, failures = lat.decode(enc, x + gap, shared_seed=0)
    assert dec.dtype == torch.float32 and dec.shape == x.shape
    assert torch.equal(dec, step * torch.round(x / step))
    assert failures.tolist() == [0] * 5
    eps = torch.finfo(torch.float32).eps * float(x.abs().max())  # float32 rounding of x/step and step·z
    assert (dec - x).abs().max() <= step / 2 + 2 * eps  # biased rounding, but within half a step


@pytest.mark.parametrize("bits", [6, 14])
def test_paper_mode_is_exact_within_the_safe_radius(bits):
    step, d, seed = 1e-3, 1000, 21
    lat, lat32 = Lattice(bits, step), Lattice(32, step)
    assert lat.rotated and lat.dithered
    rot = HadamardRotation(lat.block)
    g = _gen(1)
    x = torch.randn(4, d, generator=g) * 0.2
    # |(H·D·gap)_j| <= sqrt(block)·|gap|∞, so this gap stays inside the radius after any rotation
    gap = (torch.rand(4, d, generator=g) * 2 - 1) * 0.9 * lat.safe_radius / math.sqrt(rot.block_for(d))
    key = x + gap
    assert (rot.forward(x, seed) - rot.forward(key, seed)).abs().max() < lat.safe_radius
    enc, enc32 = lat.encode(x, _gen(5), seed), lat32.encode(x, _gen(5), seed)  # the same dither draws
    dec, failures = lat.decode(enc, key, seed)
    assert failures.tolist() == [0] * 4
    # b bits decode to the same lattice point as b = 32, where the modulo is the identity ...
    assert torch.equal(dec, lat32.decode(enc32, key, seed)[0])
    # ... which is the inverse rotation of step·z, adjacent to the rotated x
    point = _lattice_point(enc32, lat32, d)
    assert (dec - rot.inverse(point, seed, d)).abs().max() < 1e-6
    assert (point - rot.forward(x, seed)).abs().max() < step * (1 + 1e-3)


def test_code_mode_flags_the_edge_band_and_aliases_by_multiples_of_q_step():
    bits, step = 8, 2.0 ** -8
    q = 2 ** bits
    lat = Lattice(bits, step, mode="code")
    x = torch.arange(-3, 5, dtype=torch.float32).view(1, 8) * 7 * step  # on the lattice: exact arithmetic
    offsets = torch.tensor([[q / 2 - 0.5, -(q / 2 + 0.5), 0.7 * q, 3.0, -100.0, 0.0, 126.9, -126.9]])
    dec, failures = lat.decode(lat.encode(x, None, 0), x + offsets * step, 0)
    wrapped = (dec - x) / (q * step)
    assert wrapped.tolist() == [[0.0, -1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    # column 0: beyond the safe radius, decoded right, flagged; column 1: just beyond q·step/2, decoded one
    # period off, flagged; column 2: far beyond, aliased to a point that looks safe — not flagged (a limit of
    # any receiver-side check, documented in Lattice)
    assert failures.tolist() == [2]


def test_paper_mode_flags_a_rotated_coordinate_beyond_the_radius():
    bits, step, d, seed = 8, 1e-3, 512, 4  # d a multiple of the block: the rotation loses nothing
    q = 2 ** bits
    lat, lat32 = Lattice(bits, step), Lattice(32, step)
    rot = HadamardRotation(lat.block)
    x = torch.randn(1, d, generator=_gen(2)) * 0.1
    enc, enc32 = lat.encode(x, _gen(3), seed), lat32.encode(x, _gen(3), seed)
    point = _lattice_point(enc32, lat32, d)  # step·z in the rotated domain
    key_rot = point + (torch.rand(1, d, generator=_gen(4)) - 0.5) * 0.5 * step
    key_rot[0, 100] = point[0, 100] + (q / 2 + 0.5) * step
    key = rot.inverse(key_rot, seed, d)
    dec, failures = lat.decode(enc, key, seed)
    assert failures.tolist() == [1]
    err = (rot.forward(dec, seed) - point) / (q * step)  # whole periods of the lattice, in the rotated domain
    assert abs(float(err[0, 100]) - 1.0) < 1e-3
    err[0, 100] = 0.0
    assert err.abs().max() < 1e-3


@pytest.mark.parametrize("rotate", [True, False])
def test_dithered_decoding_is_unbiased(rotate):
    step, n = 0.01, 4000
    lat = Lattice(10, step, rotate=rotate, dither=True)
    x = torch.randn(1, 48, generator=_gen(6)) * 0.05
    dec, failures = lat.decode(lat.encode(x.expand(n, 48), _gen(7), 9), x[0], 9)
    assert int(failures.sum()) == 0
    err = dec - x
    # every rotated coordinate errs by less than step (variance <= step²/4), and an orthonormal rotation keeps
    # that variance per coordinate: the mean of n independent encodings has standard error <= step/(2·sqrt(n))
    se = step / (2 * math.sqrt(n))
    assert err.mean(dim=0).abs().max() < 5 * se
    assert err.std() > 0.2 * step  # the encodings really are random


def test_code_mode_is_deterministic_and_biased():
    step, n = 0.01, 4000
    lat = Lattice(10, step, mode="code")
    x = torch.randn(1, 48, generator=_gen(6)) * 0.05
    enc = lat.encode(x.expand(n, 48), _gen(7), 9)
    assert torch.equal(enc.payload["codes"], lat.encode(x.expand(n, 48), None, 9).payload["codes"])
    dec, _ = lat.decode(enc, x[0], 9)
    assert torch.equal(dec, dec[:1].expand(n, 48))  # no randomness
    bias = (dec - x).mean(dim=0)
    assert bias.abs().max() <= step / 2 * (1 + 1e-5)
    assert bias.abs().max() > 50 * step / (2 * math.sqrt(n))  # far outside what noise would explain


def test_same_generator_same_codes():
    lat = Lattice(12, 1e-3)
    x = torch.randn(3, 700, generator=_gen(8)) * 0.3
    a = lat.encode(x, _gen(1), 5).payload["codes"]
    assert torch.equal(a, lat.encode(x, _gen(1), 5).payload["codes"])
    assert not torch.equal(a, lat.encode(x, _gen(2), 5).payload["codes"])  # other dither
    assert not torch.equal(a, lat.encode(x, _gen(1), 6).payload["codes"])  # other rotation


def test_32_bits_is_the_identity_modulo():
    lat = Lattice(32, 1e-3, mode="code")
    x = torch.randn(2, 50, generator=_gen(9))
    dec, failures = lat.decode(lat.encode(x, None, 0), x + 100.0, 0)  # a key 1e5 steps away
    assert torch.equal(dec, 1e-3 * torch.round(x / 1e-3)) and failures.tolist() == [0, 0]


@pytest.mark.parametrize("bits", [1, 5, 8, 14, 16, 32])
def test_bits_are_exactly_the_packed_codes(bits):
    d = 1000
    x = torch.randn(3, d, generator=_gen(bits)) * 0.01
    for lat, n in ((Lattice(bits, 1e-3, mode="code"), d), (Lattice(bits, 1e-3), 1024)):
        enc = lat.encode(x, _gen(0), 0)
        assert list(enc.payload) == ["codes"]
        assert enc.payload["codes"].shape == (3, math.ceil(bits * n / 8))
        assert enc.bits_per_row() == 8 * math.ceil(bits * n / 8) == 8 * enc.nbytes() // 3
        assert lat.bits_per_coordinate == bits


def test_key_broadcasts_and_is_required():
    lat = Lattice(10, 1e-3)
    x = torch.randn(3, 200, generator=_gen(10)) * 0.1
    key = x[0] + 0.01
    enc = lat.encode(x, _gen(11), 1)
    a, fa = lat.decode(enc, key, 1)
    b, fb = lat.decode(enc, key.expand(3, 200), 1)
    assert torch.equal(a, b) and torch.equal(fa, fb) and fa.dtype == torch.int64
    with pytest.raises(MessageError, match="key"):
        lat.decode(enc, None, 1)
    with pytest.raises(MessageError, match="key"):
        lat.decode(enc, key[:10], 1)


@pytest.mark.parametrize("kwargs,name", [
    ({"bits": 0}, "bits"), ({"bits": 33}, "bits"), ({"bits": 40}, "bits"), ({"bits": 8.0}, "bits"),
    ({"step": 0.0}, "step"), ({"step": -1e-3}, "step"), ({"step": float("nan")}, "step"),
    ({"step": float("inf")}, "step"), ({"step": "0.1"}, "step"), ({"block": 100}, "block"), ({"block": 0}, "block"),
    ({"mode": "fast"}, "mode"), ({"rotate": 1}, "rotate"), ({"dither": "yes"}, "dither"),
])
def test_bad_parameters_raise_config_error_naming_them(kwargs, name):
    with pytest.raises(ConfigError, match=f"`{name}`"):
        Lattice(**kwargs)


def test_error_message_gives_the_range_and_the_value():
    with pytest.raises(ConfigError, match=r"`bits` must be an integer in 1\.\.32, found 40\."):
        Lattice(bits=40)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_round_trip_matches_the_guarantees():
    lat = Lattice(14, 1e-4)
    x = torch.randn(4, 5000, device="cuda") * 0.1
    key = x + (torch.rand(4, 5000, device="cuda") - 0.5) * 1e-3
    enc = lat.encode(x, _gen(0, "cuda"), 3)
    assert enc.payload["codes"].device.type == "cuda"
    dec, failures = lat.decode(enc, key, 3)
    assert dec.device.type == "cuda" and failures.device.type == "cuda"
    assert int(failures.sum()) == 0
    assert (dec - x).abs().max() < 16 * 1e-4  # |error| <= sqrt(block)·step per coordinate
    # the rotation is drawn on the CPU: a CPU receiver decodes a GPU sender's message identically
    dec_cpu, _ = lat.decode(type(enc)({k: v.cpu() for k, v in enc.payload.items()}, enc.rows, enc.dim), key.cpu(), 3)
    assert (dec_cpu - dec.cpu()).abs().max() < 1e-6


def test_modes_and_overrides_resolve():
    import dataclasses

    paper, code = Lattice(), Lattice(mode="code")
    assert (paper.rotated, paper.dithered, code.rotated, code.dithered) == (True, True, False, False)
    assert dataclasses.replace(paper, mode="code") == code  # overrides stay unset, so the mode decides
    mixed = Lattice(mode="code", dither=True)
    assert (mixed.rotated, mixed.dithered) == (False, True)


def test_a_step_below_float32s_normal_range_is_refused():
    """step = 1e-45 (a float32 denormal) was accepted and decoded ones(1, 4) to NaN with 0 failures."""
    with pytest.raises(ConfigError, match=r"`step` must be a number in \[1\.17549e-38, .*float32.*found 1e-45"):
        Lattice(step=1e-45)
    with pytest.raises(ConfigError, match="`step`"):
        Lattice(step=1e-39)
    tiny = torch.finfo(torch.float32).tiny  # the smallest step accepted still quantizes
    for lat in (Lattice(8, tiny, mode="code"), Lattice(8, tiny)):
        x = torch.full((1, 4), 3e-37)
        dec, failures = lat.decode(lat.encode(x, _gen(0), 0), x, 0)
        assert failures.tolist() == [0] and (dec - x).abs().max() <= 16 * tiny


def test_a_step_whose_window_passes_half_of_float32s_range_is_refused():
    """step = 1e308 was accepted: inf in float32, so every message decoded to NaN and was rejected (3 of 3 every
    round, and the run's warning blamed `client.lr`). The largest step, 2**(127 − bits), decodes finite values."""
    with pytest.raises(ConfigError, match=r"`step` must be a number in \[1\.17549e-38, 1\.03846e\+34\] .*1e\+308"):
        Lattice(bits=14, step=1e308)
    for bits in (1, 14, 32):
        big = 2.0 ** (127 - bits)
        with pytest.raises(ConfigError, match="`step`"):
            Lattice(bits=bits, step=big * (1 + 2 ** -52))
        for lat in (Lattice(bits, big, mode="code"), Lattice(bits, big)):
            x = torch.tensor([[1.0, -3e37, 1e38, 0.0]])
            key = torch.tensor([0.0, 1.7e38, -1.7e38, 1e30])
            dec, _ = lat.decode(lat.encode(x, _gen(0), 0), key, 0)
            assert torch.isfinite(dec).all(), (bits, lat.mode)
