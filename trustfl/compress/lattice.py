"""Cubic-lattice quantizer with modulo encoding and a reference point (Davies et al. 2021, as used by QuAFL).

The sender maps each (optionally rotated) coordinate to an integer lattice index ``z`` and transmits only
``z mod 2**b``; the receiver picks, per coordinate, the lattice point congruent to it that is nearest to its own
reference point (key). The error therefore depends on the distance between sender and receiver, not on the norm
of the message.

References:
  Davies, Gurunathan, Moshrefi, Ashkboos, Alistarh. "New bounds for distributed mean estimation and variance
  reduction", ICLR 2021, Lemma 23. https://arxiv.org/abs/2002.09268
  Zakerinia, Talaei, Nadiradze, Alistarh. "Communication-efficient federated learning with data and client
  heterogeneity" (QuAFL), Lemma 3.1. https://arxiv.org/abs/2206.10032
  Code: https://github.com/ShayanTalaei/QuAFL (``quantizer.Lattice_Quantizer``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from trustfl.compress.base import AbstractCompressor, Encoded, Layout, add_dither_
from trustfl.compress.bits import check_bits, pack_bits, packed_nbytes, unpack_bits
from trustfl.compress.rotation import HadamardRotation, check_block
from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.errors import ConfigError

_MODES = ("paper", "code")
_MIN_STEP = torch.finfo(torch.float32).tiny  # 2**-126, float32's smallest normal number
_MAX_WINDOW_EXP = 127
"""The window ``2**bits·step`` is at most ``2**127``: a decoded value lies within half of it from the key, so it stays
finite in float32 (largest ``≈ 2**128``) for every key up to ``2**127 ≈ 1.7e38``."""


@register("compressor", "lattice")
@dataclass(frozen=True)
class Lattice(AbstractCompressor):
    """Modulo lattice quantizer: send ``z mod 2**b`` per coordinate, decode with the receiver's key.

    Args:
      bits: ``b``, bits per coordinate, 1..32 (``q = 2**b`` residues). ``b = 32`` makes the modulo the
        identity on the int32 range.
      step: the lattice side ``s``, at least float32's smallest normal number ``2**-126 ≈ 1.2e-38`` (below it
        ``1/s`` overflows float32 or ``s`` has no exact float32 value, and every message would decode to NaN) and
        at most ``2**(127 − b)`` (``≈ 1.0e34`` at ``b = 14``: beyond, the window ``q·s`` passes half of float32's
        range, and at ``1e308`` every message decoded to NaN).
      mode: ``"paper"`` (default): shared-seed random rotation and dithered, unbiased rounding, as the QuAFL
        paper describes (its Lemma 3.1 assumes an unbiased quantizer). ``"code"``: the authors' released code —
        no rotation, round to nearest (deterministic, biased by up to ``step/2`` per coordinate).
      rotate: ``True``/``False`` overrides the mode's rotation (``x' = H·D·x`` in blocks of ``block``, D
        random ±1 from the shared seed, H the normalised Walsh–Hadamard matrix; zero-padded to a multiple of
        the block); ``None`` (default) follows the mode. :attr:`rotated` is the resolved value.
      dither: ``True``/``False`` overrides the mode's rounding: ``z = floor(x'/s + u)`` with ``u`` uniform in
        (0, 1) from the sender's generator (unbiased up to ``2**-17·s``: see ``add_dither_``; error < s)
        instead of ``z = round(x'/s)`` (error ≤ s/2); ``None`` follows the mode. :attr:`dithered` is the
        resolved value.
      block: Hadamard block size, a power of 2. The default 256 costs ~0.8 ms per rotation of 431k coordinates
        on one CPU thread (1024: ~1.1 ms; an encode + decode rotates three times) while spreading a spike
        over 256 coordinates (16× smaller); the zero padding adds less than one block per message.

    Math (per coordinate, in the rotated domain when rotating; ``q = 2**b``):
      encode: ``z = floor(x'/s + u)`` (or ``round(x'/s)``); send ``v = z mod q`` packed at ``b`` bits.
      decode: ``m = round(key'/(q·s) − v/q)``; ``x̂' = q·s·m + s·v``; then ``x̂ = D·H·x̂'``.
      Decoding is exact (``x̂' = s·z``) whenever ``|x' − key'| < q·s/2 − s``; otherwise it may be off by a
      multiple of ``q·s``. ``failures`` counts the coordinates with ``|x̂' − key'| > q·s/2 − s``: decoded
      within one step of the edge of the window around the key, so possibly wrong (a flagged coordinate may
      still be right).

    Warning:
      The receiver cannot see every failure. A coordinate whose gap ``|x' − key'|`` exceeds ``q·s/2`` by more
      than a step aliases to a lattice point that may lie well inside the window, and is not flagged (the
      rotation makes a single far coordinate rare by spreading the gap over its block). ``failures > 0`` is
      an alarm that the step is too small for the distance between the models, not a complete count; in a
      simulator, compare with the true ``x`` to count every wrong coordinate.

    Bits: ``ceil(b·n/8)`` bytes per message and nothing else (``b``, ``s`` and the seed are shared), where
    ``n = d`` without rotation and ``d`` rounded up to a multiple of the block with it.

    Arithmetic is float32, so exactness also needs ``|x'/s| < 2**24``.

    Example:
      >>> lat = Lattice(bits=4, step=0.1, mode="code")
      >>> x = torch.tensor([[0.31, -0.52, 1.04]])
      >>> enc = lat.encode(x, None, shared_seed=0)
      >>> enc.bits_per_row()                       # ceil(4·3/8) = 2 bytes
      16
      >>> dec, failures = lat.decode(enc, key=torch.tensor([0.2, -0.4, 0.9]), shared_seed=0)
      >>> [round(v, 4) for v in dec[0].tolist()], failures.tolist()
      ([0.3, -0.5, 1.0], [0])
    """

    rowwise_generators: ClassVar[bool] = True  # the dither through add_dither_

    needs_key: ClassVar[bool] = True

    bits: int = 14
    step: float = 1e-4
    mode: str = "paper"
    rotate: bool | None = None
    dither: bool | None = None
    block: int = 256

    def __post_init__(self) -> None:
        check_bits(self.bits)
        check_number("step", self.step, low=_MIN_STEP, high=2.0 ** (_MAX_WINDOW_EXP - self.bits),
                     note=f"the lattice side, with bits = {self.bits}: the quantizer computes x/step and step·z in "
                          "float32; below float32's smallest normal number 1/step overflows to inf or step loses "
                          f"its exact value, and above 2**({_MAX_WINDOW_EXP} - bits) the window 2**bits·step of "
                          "decoded values around the key passes half of float32's range")
        if self.mode not in _MODES:
            raise ConfigError(f"`mode` must be one of {list(_MODES)}, found {self.mode!r}.")
        for name in ("rotate", "dither"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"`{name}` must be true, false or unset (the mode's default), found {value!r}.")
        check_block(self.block)

    @property
    def rotated(self) -> bool:
        """Whether messages are rotated: ``rotate``, or the mode's default (``"paper"``: yes)."""
        return self.mode == "paper" if self.rotate is None else self.rotate

    @property
    def dithered(self) -> bool:
        """Whether rounding is dithered: ``dither``, or the mode's default (``"paper"``: yes)."""
        return self.mode == "paper" if self.dither is None else self.dither

    @property
    def bits_per_coordinate(self) -> float:
        return float(self.bits)

    @property
    def safe_radius(self) -> float:
        """``q·s/2 − s``: decoding is exact for every coordinate with ``|x' − key'|`` below it."""
        return (2.0 ** self.bits / 2 - 1) * self.step

    def _rotation(self) -> HadamardRotation:
        return HadamardRotation(self.block)

    def coded_length(self, d: int) -> int:
        """Coordinates actually coded for a message of ``d``: ``d``, or ``d`` padded to the block when rotating."""
        return self._rotation().padded(d) if self.rotated else d

    def payload_layout(self, rows: int, dim: int) -> Layout:
        return {"codes": ((rows, packed_nbytes(self.bits, self.coded_length(dim))), torch.uint8)}

    def encode(self, x: torch.Tensor, gen: torch.Generator | None, shared_seed: int) -> Encoded:
        self.check_encode_args(x, gen, shared_seed)
        m, d = x.shape
        if self.rotated:  # y = H·D·x / s, the 1/s folded into the Hadamard matrix; a fresh buffer
            y = self._rotation().forward(x, shared_seed, scale=1.0 / self.step)
        else:
            y = x.to(torch.float32, copy=True).div_(self.step)
        if self.dithered:
            add_dither_(y, gen).floor_()
        else:
            y.round_()
        # pack_bits keeps the low b bits: two's complement makes them z mod q, also for negative z
        return Encoded({"codes": pack_bits(y.to(torch.int32), self.bits)}, rows=m, dim=d)

    def decode(self, enc: Encoded, key: torch.Tensor | None, shared_seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = self.check_decode_args(enc, key, shared_seed)
        n = self.coded_length(enc.dim)
        c = unpack_bits(enc.payload["codes"].to(key.device), self.bits, n, dtype=torch.int32)
        if self.bits > 24:  # sign-extend to the residue in [−q/2, q/2), so that float32 holds it exactly
            shift = 32 - self.bits
            c <<= shift
            c >>= shift
        c = c.to(torch.float32)
        # t: the key in lattice units, key'/s
        t = self._rotation().forward(key, shared_seed, scale=1.0 / self.step) if self.rotated else key / self.step
        q = float(2 ** self.bits)
        f = torch.sub(t, c).div_(q)  # the key's offset from the received residue, in periods of q
        z = torch.round(f)  # m: the index ≡ c (mod q) nearest the key is c + q·m
        # |x̂' − key'| = s·q·|f − m|; flagged when > q·s/2 − s, i.e. |f − m| > 1/2 − 1/q
        dist = f.sub_(z).abs_()
        edge = 0.5 - 1.0 / q
        if dist.device.type == "cpu" and (dist.numel() == 0 or bool(dist.amax() <= edge)):  # the common case
            failures = torch.zeros(enc.rows, dtype=torch.int64)
        else:
            failures = (dist > edge).sum(dim=1, dtype=torch.int64)
        z.mul_(q).add_(c)
        if self.rotated:
            return self._rotation().inverse(z, shared_seed, enc.dim, scale=self.step, overwrite=True), failures
        return z.mul_(self.step), failures
