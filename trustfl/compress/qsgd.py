"""Stochastic uniform quantizers: QSGD (Alistarh et al. 2017) and the min–max variant QuAFL's code calls QSGD.

Both round stochastically, ``floor(y + u)`` with ``u`` uniform in (0, 1) from the sender's generator, so the
decoded value is an unbiased estimate of the input; both send their scales as float32 headers, which the bit
counts include. A bucket or segment whose norm or range float32 cannot carry (above ``2**127``, or a unit below
float32's range) is coded in float64 at both ends, its norm capped at float32's largest value; ordinary ones are
untouched.

References:
  Alistarh, Grubic, Li, Tomioka, Vojnovic. "QSGD: Communication-efficient SGD via gradient quantization and
  encoding", NeurIPS 2017. https://arxiv.org/abs/1610.02132
  QuAFL code, ``quantizer.QSGD_Quantizer``: https://github.com/ShayanTalaei/QuAFL
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, Sequence

import torch

from trustfl.compress.base import AbstractCompressor, Encoded, Layout, add_dither_, check_segments
from trustfl.compress.bits import pack_bits, packed_nbytes, unpack_bits
from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.errors import ConfigError


def _code_bits(values: int) -> int:
    """Bits of a fixed-length code for ``values`` distinct symbols."""
    return max(1, math.ceil(math.log2(values)))


def _check_int(value: object, name: str, low: int, hint: str = "", high: int | None = None) -> int:
    return check_number(name, value, integer=True, low=low, high=high, note=hint)


_F32_MAX = torch.finfo(torch.float32).max
_HUGE = 2.0 ** 127  # a scale above it may round level·unit past float32's largest value


def _norm(y: torch.Tensor, dim: int) -> torch.Tensor:
    """The float32 L2 norm of ``y`` along ``dim``. Where the float32 sum of squares overflows (a norm above ~1.8e19)
    though ``y`` is finite, it is summed in float64 instead and capped at float32's largest value, which is still
    >= every ``|y_j|`` (all the quantizers need of their scale to stay unbiased); where it may have underflowed (a
    norm below 1e-18: squares below float32's range, a row of 1e-40 had norm 0 and decoded as zeros), it is summed
    in float64 too."""
    norm = torch.linalg.vector_norm(y, dim=dim)
    over = torch.isinf(norm) | (norm < 1e-18)
    if bool(over.any()):  # rare: ordinary norms are left bit for bit as they were
        wide = torch.linalg.vector_norm(y.double(), dim=dim)
        wide = torch.where(torch.isfinite(wide), wide.clamp(max=_F32_MAX), wide).to(torch.float32)
        norm = torch.where(over, wide, norm)
    return norm


def _wide(lo: torch.Tensor, hi: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Where float32 would overflow (or lose the unit) for a finite range ``lo < hi`` whose levels are spaced at
    ``1/factor`` (``factor``: the float32 levels per unit of x): a range above 2**127, or ``factor`` beyond float32.
    Those segments are coded in float64 at both ends; the test reads only the headers, so both ends agree."""
    return torch.isfinite(lo) & torch.isfinite(hi) & (hi > lo) & ((hi - lo > _HUGE) | torch.isinf(factor))


@register("compressor", "qsgd_minmax")
@dataclass(frozen=True)
class QSGDMinMax(AbstractCompressor):
    """Min–max stochastic uniform quantization per segment: the quantizer QuAFL's code calls "QSGD".

    Args:
      levels: ``k >= 2`` levels per segment (default 16, the QuAFL notebook's ``q_levels``), at most
        ``2**24 + 1`` (``2**23 + 1`` with ``l2``): the codes ``0..k − 1`` (``0..2k − 2``) are float32 integers,
        exact up to ``2**24``.
      l2: use ``fmin = 0``, ``fmax = ‖x_seg‖₂`` (the code's ``L2=True``) instead of the segment's min and max.
      segments: sizes of the consecutive segments of a row (the model's parameter tensors, summing to ``d``);
        ``None`` treats the whole row as one segment. See also :meth:`with_segments`.

    Math (per segment; ``unit = (fmax − fmin)/(k − 1)``):
      ``v = clamp(floor((x − fmin)/unit + u), 0, k − 1)``, decoded ``fmin + v·unit``; unbiased. A constant
      segment (``fmax = fmin``) decodes exactly. With ``l2=True`` the level is signed,
      ``v = clamp(floor(x/unit + u), −(k − 1), k − 1)`` — the authors' code leaves negative levels unclamped,
      which keeps it unbiased — and is sent as ``v + k − 1``.

    Bits: ``ceil(log2 k)`` per coordinate (``ceil(log2(2k − 1))`` with ``l2``), packed, plus ``fmin`` and
    ``fmax`` (only the norm with ``l2``) as float32 per segment. The authors' code counts ``log2 k`` bits per
    coordinate and ignores the per-tensor header; here every transmitted byte is counted.

    Example:
      >>> qz = QSGDMinMax(levels=5)
      >>> enc = qz.encode(torch.tensor([[0.0, 1.0, 2.0, 4.0]]), torch.Generator().manual_seed(0), 0)
      >>> enc.bits_per_row()                      # 4 coordinates × 3 bits → 2 bytes, + fmin, fmax
      80
      >>> qz.decode(enc, None, 0)[0].tolist()     # the grid 0, 1, 2, 3, 4 holds these exactly
      [[0.0, 1.0, 2.0, 4.0]]
    """

    rowwise_generators: ClassVar[bool] = True  # the dither through add_dither_

    levels: int = 16
    l2: bool = False
    segments: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.l2, bool):
            raise ConfigError(f"`l2` must be true or false, found {self.l2!r}.")
        _check_int(self.levels, "levels", 2, high=2 ** 23 + 1 if self.l2 else 2 ** 24 + 1,
                   hint="the codes are float32 integers, exact up to 2**24" + (" (signed with l2)" if self.l2 else ""))
        object.__setattr__(self, "segments", check_segments(self.segments))

    @property
    def code_bits(self) -> int:
        """Bits per coordinate of the packed levels."""
        return _code_bits(2 * self.levels - 1 if self.l2 else self.levels)

    @property
    def bits_per_coordinate(self) -> float:
        return float(self.code_bits)

    def with_segments(self, sizes: Sequence[int]) -> "QSGDMinMax":
        return replace(self, segments=check_segments(sizes))

    def _sizes(self, d: int) -> tuple[int, ...]:
        if self.segments is None:
            return (d,)
        if sum(self.segments) != d:
            raise ConfigError(f"qsgd_minmax: `segments` sum to {sum(self.segments)}, but the messages have d = {d}.")
        return self.segments

    def _unit(self, fmin: torch.Tensor, fmax: torch.Tensor) -> torch.Tensor:
        return (fmax - fmin) / (self.levels - 1)

    def _wide(self, lo: torch.Tensor, fmax: torch.Tensor, unit: torch.Tensor) -> list[torch.Tensor | None]:
        """Per segment, the rows coded in float64 (see :func:`_wide`), or ``None`` where there are none."""
        wide = _wide(lo, fmax, 1.0 / unit)
        if not bool(wide.any()):
            return [None] * wide.shape[1]
        return [w if bool(w.any()) else None for w in wide.unbind(1)]

    def _unit64(self, lo: torch.Tensor, fmax: torch.Tensor, rows: torch.Tensor, i: int) -> torch.Tensor:
        """The unit of segment ``i`` of ``rows``, in float64."""
        return (fmax[rows, i:i + 1].double() - lo[rows, i:i + 1].double()) / (self.levels - 1)

    def payload_layout(self, rows: int, dim: int) -> Layout:
        header = (rows, len(self._sizes(dim)))
        names = ("norm",) if self.l2 else ("fmin", "fmax")
        return {"codes": ((rows, packed_nbytes(self.code_bits, dim)), torch.uint8),
                **{name: (header, torch.float32) for name in names}}

    def encode(self, x: torch.Tensor, gen: torch.Generator | None, shared_seed: int) -> Encoded:
        self.check_encode_args(x, gen, shared_seed)
        m, d = x.shape
        y = x.to(torch.float32, copy=True)
        parts = y.split(self._sizes(d), dim=1)  # a loop over segments (parameter tensors), not coordinates
        if self.l2:
            fmin = None
            fmax = torch.stack([_norm(p, 1) for p in parts], dim=1)
        else:
            fmin = torch.stack([p.amin(dim=1) for p in parts], dim=1)
            fmax = torch.stack([p.amax(dim=1) for p in parts], dim=1)
        lo = torch.zeros_like(fmax) if fmin is None else fmin
        unit = self._unit(lo, fmax)
        inv = torch.where(unit > 0, 1.0 / unit, torch.zeros_like(unit))  # constant segment: every level is 0
        wide = self._wide(lo, fmax, unit)
        for i, p in enumerate(parts):
            rows = wide[i]
            orig = None if rows is None else p[rows].double()
            if fmin is not None:
                p.sub_(fmin[:, i:i + 1])
            p.mul_(inv[:, i:i + 1])
            if rows is not None:  # a range beyond float32, or a unit below it: these rows in float64
                p[rows] = ((orig - lo[rows, i:i + 1].double()) / self._unit64(lo, fmax, rows, i)).to(torch.float32)
        add_dither_(y, gen).floor_()
        top = self.levels - 1
        if self.l2:
            y.clamp_(-top, top).add_(top)
        else:
            y.clamp_(0, top)
        codes = pack_bits(y.to(torch.int32), self.code_bits)
        header = {"norm": fmax} if self.l2 else {"fmin": fmin, "fmax": fmax}
        return Encoded({"codes": codes, **header}, rows=m, dim=d)

    def decode(self, enc: Encoded, key: torch.Tensor | None, shared_seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = self.check_decode_args(enc, key, shared_seed)
        device = enc.payload["codes"].device if key is None else key.device
        p = {k: v.to(device) for k, v in enc.payload.items()}
        fmax = p["norm"] if self.l2 else p["fmax"]
        fmin = None if self.l2 else p["fmin"]
        lo = torch.zeros_like(fmax) if fmin is None else fmin
        unit = self._unit(lo, fmax)
        wide = self._wide(lo, fmax, unit)
        out = unpack_bits(p["codes"], self.code_bits, enc.dim, dtype=torch.int32).to(torch.float32)
        if self.l2:
            out.sub_(self.levels - 1)
        for i, part in enumerate(out.split(self._sizes(enc.dim), dim=1)):
            rows = wide[i]
            signed = None if rows is None else part[rows].double()
            part.mul_(unit[:, i:i + 1])
            if fmin is not None:
                part.add_(fmin[:, i:i + 1])
            if rows is not None:  # as encode: these rows in float64, the result within [lo, fmax]
                part[rows] = (lo[rows, i:i + 1].double() + signed * self._unit64(lo, fmax, rows, i)).to(torch.float32)
        return out, torch.zeros(enc.rows, dtype=torch.int64, device=device)


@register("compressor", "qsgd")
@dataclass(frozen=True)
class QSGD(AbstractCompressor):
    """Norm-based QSGD (Alistarh et al. 2017): per bucket, the norm and ``s`` stochastic levels with a sign.

    Args:
      levels: ``s`` quantization levels, ``1..2**23`` (default 7: 1 sign bit + 3 level bits per coordinate); the
        codes ``0..2s`` are float32 integers, exact up to ``2**24``.
      bucket: coordinates per bucket (each bucket has its own norm; e.g. 512), or ``None`` (default) for one
        bucket per row. The last bucket of a row may be shorter.

    Math (per bucket ``x_B``): ``ℓ_j = floor(s·|x_j|/‖x_B‖₂ + u_j)`` in ``0..s``, decoded
    ``‖x_B‖₂ · sign(x_j) · ℓ_j / s``: unbiased, and ``E‖Q(x_B) − x_B‖² <= min(d_B/s², sqrt(d_B)/s)·‖x_B‖²``
    (Lemma 3.1 of the paper). A zero bucket decodes exactly. (Rounding ``s·x_j/‖x_B‖`` stochastically with its
    sign gives the same distribution as rounding the magnitude.)

    Bits: the signed level ``sign·ℓ + s`` in a fixed-length code of ``ceil(log2(2s + 1)) = 1 + ceil(log2(s + 1))``
    bits (a sign bit plus the level), packed, plus one float32 norm per bucket. The paper's Elias coding of
    the levels, which shrinks sparse messages further, is not implemented.

    Example:
      >>> qz = QSGD(levels=2)
      >>> enc = qz.encode(torch.tensor([[3.0, -4.0, 0.0, 0.0]]), torch.Generator().manual_seed(0), 0)
      >>> enc.bits_per_row()                      # 4 × 3 bits → 2 bytes, + a float32 norm
      48
      >>> dec, _ = qz.decode(enc, None, 0)
      >>> all(v in (-5.0, -2.5, 0.0, 2.5, 5.0) for v in dec[0].tolist())
      True
    """

    rowwise_generators: ClassVar[bool] = True  # the dither through add_dither_

    levels: int = 7
    bucket: int | None = None

    def __post_init__(self) -> None:
        _check_int(self.levels, "levels", 1, high=2 ** 23,
                   hint="the signed levels 0..2·levels are float32 integers, exact up to 2**24")
        if self.bucket is not None:
            _check_int(self.bucket, "bucket", 1, "or unset for one bucket per row")

    @property
    def code_bits(self) -> int:
        """Bits per coordinate: the sign and the level."""
        return _code_bits(2 * self.levels + 1)

    @property
    def bits_per_coordinate(self) -> float:
        return float(self.code_bits)

    def _buckets(self, d: int) -> tuple[int, int]:
        size = d if self.bucket is None else min(self.bucket, d)
        size = max(size, 1)
        return size, -(-d // size)

    def _bucketed(self, x: torch.Tensor, size: int, count: int) -> torch.Tensor:
        """``x`` (m, d) as (m, count, size), zero-padded (a copy when padding is needed)."""
        m, d = x.shape
        if count * size != d:
            x = torch.nn.functional.pad(x, (0, count * size - d))
        return x.view(m, count, size)

    def payload_layout(self, rows: int, dim: int) -> Layout:
        return {"codes": ((rows, packed_nbytes(self.code_bits, dim)), torch.uint8),
                "norm": ((rows, self._buckets(dim)[1]), torch.float32)}

    def _wide(self, norm: torch.Tensor) -> torch.Tensor | None:
        """The buckets coded in float64 (see :func:`_wide`), or ``None`` where there are none."""
        wide = _wide(torch.zeros_like(norm), norm, self.levels / norm)
        return wide if bool(wide.any()) else None

    def encode(self, x: torch.Tensor, gen: torch.Generator | None, shared_seed: int) -> Encoded:
        self.check_encode_args(x, gen, shared_seed)
        m, d = x.shape
        size, count = self._buckets(d)
        y = self._bucketed(x.to(torch.float32, copy=True), size, count)
        norm = _norm(y, 2)
        scale = torch.where(norm > 0, self.levels / norm, torch.zeros_like(norm))
        wide = self._wide(norm)
        orig = None if wide is None else y[wide].double()
        y.mul_(scale.unsqueeze(2))
        if wide is not None:  # a norm beyond float32's comfort (or below it): these buckets in float64
            y[wide] = (orig * (self.levels / norm[wide].double()).unsqueeze(1)).to(torch.float32)
        y = y.view(m, count * size)[:, :d]
        add_dither_(y, gen).floor_().clamp_(-self.levels, self.levels).add_(self.levels)
        return Encoded({"codes": pack_bits(y.to(torch.int32), self.code_bits), "norm": norm}, rows=m, dim=d)

    def decode(self, enc: Encoded, key: torch.Tensor | None, shared_seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = self.check_decode_args(enc, key, shared_seed)
        device = enc.payload["codes"].device if key is None else key.device
        m, d = enc.rows, enc.dim
        size, count = self._buckets(d)
        levels = unpack_bits(enc.payload["codes"].to(device), self.code_bits, d, dtype=torch.int32)
        out = self._bucketed(levels.to(torch.float32).sub_(self.levels), size, count)
        norm = enc.payload["norm"].to(device)
        wide = self._wide(norm)
        signed = None if wide is None else out[wide].double()
        out.mul_((norm / self.levels).unsqueeze(2))
        if wide is not None:  # as encode: these buckets in float64, the result within ±norm
            out[wide] = (signed * (norm[wide].double() / self.levels).unsqueeze(1)).to(torch.float32)
        out = out.view(m, count * size)
        return (out if count * size == d else out[:, :d].contiguous()), torch.zeros(m, dtype=torch.int64,
                                                                                   device=device)
