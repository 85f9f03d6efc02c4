"""The compressor interface: ``encode`` on the sender, ``decode`` on the receiver, exact bit counts.

A compressor maps a batch of ``m`` messages ``x`` of shape ``(m, d)`` to an :class:`Encoded` whose payload
tensors all have a leading row dimension ``m``; the bits a message costs are counted from the bytes of those
tensors (:meth:`Encoded.bits_per_row`), so the accounting can never drift from what is produced. The engine
places the two halves: the sender encodes, the receiver decodes, with a key (reference point)
for quantizers whose decoding needs one (:attr:`AbstractCompressor.needs_key`).

Randomness: ``gen`` is the sender's private generator (dithering, stochastic rounding), on ``x``'s device, or one
per row when the rows come from several senders (:attr:`AbstractCompressor.rowwise_generators`); ``shared_seed``
is an integer both ends know (the lattice quantizer's random rotation).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np
import torch

from trustfl.core.checks import describe_value
from trustfl.core.registry import component_name
from trustfl.core.rng import run_draws
from trustfl.errors import ConfigError, MessageError

Layout = dict[str, tuple[tuple[int, ...], torch.dtype]]
"""A payload's tensors by name: ``(shape, dtype)`` each."""

_F32_MAX = torch.finfo(torch.float32).max


@dataclass(frozen=True)
class Encoded:
    """What one encoder call transmits: ``payload`` tensors with a leading row dimension m (one row per message).

    Attributes:
      payload: the transmitted tensors, e.g. ``{"codes": uint8 (m, nbytes), "scale": float32 (m, k)}``.
      rows: ``m``.
      dim: ``d``, the coordinates per message (before any padding the encoder adds).
    """

    payload: dict[str, torch.Tensor]
    rows: int
    dim: int

    def __post_init__(self) -> None:
        if not isinstance(self.payload, dict) or not all(isinstance(t, torch.Tensor) for t in self.payload.values()):
            raise MessageError(f"`payload` must be a dict of tensors, found {type(self.payload).__name__}"
                               f"{'' if not isinstance(self.payload, dict) else ' holding non-tensors'}.")
        for name, t in self.payload.items():
            if t.ndim == 0 or t.shape[0] != self.rows:
                raise MessageError(f"payload tensor {name!r} must have a leading dimension of {self.rows} rows, "
                                   f"found shape {tuple(t.shape)}.")

    def bits_per_row(self) -> int:
        """``8 ×`` the bytes of all payload tensors ``/ rows``: the bits one message actually costs."""
        return 8 * sum(t[0].numel() * t.element_size() for t in self.payload.values()) if self.rows else 0

    def nbytes(self) -> int:
        """Bytes of the whole payload (all rows)."""
        return sum(t.numel() * t.element_size() for t in self.payload.values())


class AbstractCompressor(abc.ABC):
    """An encode/decode pair over ``(m, d)`` float rows.

    Attributes:
      needs_key: ``True`` when decoding needs the receiver's reference point (the lattice quantizer).
      bits_per_coordinate: the nominal bits per coordinate, for scaling communication time
        (``sit(b) = sit_32 · b / 32``); :meth:`Encoded.bits_per_row` gives the exact count, headers included.
    """

    needs_key: ClassVar[bool] = False
    rowwise_generators: ClassVar[bool] = False
    """``True``: :meth:`encode` also takes one generator per row and encodes row ``i`` as it would alone with
    ``gen[i]`` (trustfl's compressors, through :func:`add_dither_`). Otherwise the engine encodes the messages of
    several senders one row at a time, each with its sender's generator."""

    @property
    @abc.abstractmethod
    def bits_per_coordinate(self) -> float:
        """Nominal bits per coordinate."""

    @abc.abstractmethod
    def encode(self, x: torch.Tensor, gen: torch.Generator | None, shared_seed: int) -> Encoded:
        """Encode ``x`` (m, d) float rows.

        Args:
          x: the messages, one per row.
          gen: private randomness of the sender (dithering, stochastic rounding), on ``x``'s device; ``None``
            uses torch's default generator (not reproducible); one generator per row where
            :attr:`rowwise_generators` is ``True``.
          shared_seed: an integer both ends know (for the random rotation).
        """

    @abc.abstractmethod
    def decode(self, enc: Encoded, key: torch.Tensor | None, shared_seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode ``enc``.

        Args:
          enc: what :meth:`encode` produced.
          key: (m, d) or (d,) (broadcast to every row) reference points; required iff :attr:`needs_key`.
          shared_seed: the integer given to :meth:`encode`.

        Returns:
          ``(decoded, failures)``: decoded (m, d) float32 on the key's device (the payload's when there is no
          key), and failures (m,) int64, the coordinates detected as decoded wrongly or unsafely (always 0 for
          compressors that cannot fail).
        """

    def payload_layout(self, rows: int, dim: int) -> Layout | None:
        """The payload :meth:`encode` makes of ``rows`` messages of ``dim`` coordinates, or ``None`` (the default,
        for compressors of your own): then :meth:`check_decode_args` does not check the payload."""
        return None

    def check_encode_args(self, x: object, gen: object, shared_seed: object) -> None:
        """Raise :class:`MessageError` naming this compressor unless ``x`` is a floating (m, d) matrix whose finite
        values fit float32, ``gen`` is ``None``, a ``torch.Generator`` or (with :attr:`rowwise_generators`) one per
        row, and ``shared_seed`` is an integer."""
        where = component_name("compressor", self)
        check_rows(x, where)
        rows = x.shape[0]  # type: ignore[union-attr]
        if not (gen is None or isinstance(gen, torch.Generator) or (
                self.rowwise_generators and isinstance(gen, (list, tuple)) and len(gen) == rows
                and all(isinstance(g, torch.Generator) for g in gen))):
            allowed = f", a torch.Generator or a list of {rows} (one per row)" if self.rowwise_generators else \
                " or a torch.Generator"
            raise MessageError(f"{where}: `gen` must be None{allowed}, found {describe_value(gen)}.")
        _check_seed(shared_seed, where)
        if x.element_size() > 4 and bool((x.isfinite() & (x.abs() > _F32_MAX)).any()):  # type: ignore[union-attr]
            raise MessageError(f"{where}: the messages hold finite values beyond float32's range (±{_F32_MAX:.6g}), "
                               f"which the float32 encoding would turn into ±inf; scale them down.")

    def check_decode_args(self, enc: object, key: torch.Tensor | None, shared_seed: object) -> torch.Tensor | None:
        """Raise :class:`MessageError` naming this compressor unless ``enc`` is an :class:`Encoded` whose payload
        has the names, shapes and dtypes :meth:`payload_layout` gives (not another compressor's, nor other
        settings'), ``key`` fits it (see :func:`check_key`) and ``shared_seed`` is an integer; return the key as
        :func:`check_key` does."""
        where = component_name("compressor", self)
        if not isinstance(enc, Encoded):
            raise MessageError(f"{where} decodes an Encoded (what encode() returns), found {describe_value(enc)}.")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (enc.rows, enc.dim)) \
                or enc.rows < 0 or enc.dim < 1:
            raise MessageError(f"{where}: an Encoded needs rows >= 0 and dim >= 1, found rows={enc.rows!r}, "
                               f"dim={enc.dim!r}.")
        layout = self.payload_layout(enc.rows, enc.dim)
        if layout is not None:
            if set(enc.payload) != set(layout):
                raise MessageError(f"{where} cannot decode a payload holding {sorted(enc.payload)}: it encodes "
                                   f"{sorted(layout)} (was this payload made by another compressor?).")
            for name, (shape, dtype) in layout.items():
                t = enc.payload[name]
                if tuple(t.shape) != shape or t.dtype != dtype:
                    raise MessageError(f"{where} cannot decode payload tensor {name!r} of {t.dtype} "
                                       f"{tuple(t.shape)}: it encodes {dtype} {shape} for {enc.rows} message(s) of "
                                       f"{enc.dim} coordinates (made by another compressor or other settings?).")
        key = check_key(key, enc, required=self.needs_key, where=where)
        _check_seed(shared_seed, where)
        return key

    def with_segments(self, sizes: Sequence[int]) -> "AbstractCompressor":
        """This compressor for messages made of consecutive segments (parameter tensors) of ``sizes``.

        Compressors whose statistics are per tensor (``qsgd_minmax``) return a copy that uses the boundaries;
        the others ignore them and return ``self``.
        """
        check_segments(sizes)
        return self


def check_segments(sizes: Sequence[int] | None, name: str = "segments") -> tuple[int, ...] | None:
    """Return ``sizes`` as a tuple of positive ints (or ``None``), else raise :class:`ConfigError`."""
    if sizes is None:
        return None
    sizes = tuple(sizes)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ConfigError(f"`{name}` must be a non-empty sequence of positive integers, found {sizes!r}.")
    return sizes


def check_rows(x: object, where: str = "") -> None:
    """Raise :class:`MessageError` (naming ``where``, e.g. "compressor 'qsgd'") unless ``x`` is a floating
    ``(m, d)`` matrix with ``d >= 1`` that requires no gradient."""
    if not isinstance(x, torch.Tensor) or x.ndim != 2 or not x.is_floating_point() or x.shape[1] == 0:
        found = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor) else describe_value(x)
        who = f"{where} encodes" if where else "compressors encode"
        raise MessageError(f"{who} a floating (m, d) tensor with d >= 1, found {found}.")
    if x.requires_grad:  # nothing of a compressor is differentiable: its in-place integer steps would fail in autograd
        raise MessageError(f"{where or 'a compressor'}: the messages require grad; encode `x.detach()`.")


def check_key(key: torch.Tensor | None, enc: Encoded, required: bool, where: str = "") -> torch.Tensor | None:
    """``key`` as float32 (m, d) or (d,), or ``None``; raise :class:`MessageError` if required and missing or
    misshapen."""
    prefix = f"{where}: " if where else ""
    if key is None:
        if required:
            raise MessageError(f"{prefix}this compressor decodes against a reference point: pass `key` ((m, d) or "
                               f"(d,)).")
        return None
    if not isinstance(key, torch.Tensor) or key.shape not in ((enc.rows, enc.dim), (enc.dim,)):
        found = tuple(key.shape) if isinstance(key, torch.Tensor) else describe_value(key)
        raise MessageError(f"{prefix}`key` must be a tensor of shape ({enc.rows}, {enc.dim}) or ({enc.dim},), "
                           f"found {found}.")
    return key.to(torch.float32)


def _check_seed(seed: object, where: str) -> None:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise MessageError(f"{where}: `shared_seed` must be an integer both ends know, found {describe_value(seed)}.")


_DITHER_BITS = 16


def add_dither_(y: torch.Tensor, gen: torch.Generator | Sequence[torch.Generator] | None) -> torch.Tensor:
    """Add a uniform dither ``u`` in (0, 1) to ``y`` in place and return ``y``; draws from ``gen`` on y's device.

    ``u = (k + ½)/2**16`` with ``k`` uniform on ``0..2**16 − 1``: four draws per 64 random bits, which is 4×
    cheaper than ``torch.rand`` on one CPU thread. ``floor(y + u)`` is then an unbiased rounding of ``y`` up to
    ``2**-17`` (plus float32 rounding of ``y + u``, which is coarser than that once ``|y| >= 2**8``).

    ``gen`` may also be one generator per row of a 2-D ``y`` (the senders of a batch of messages): row ``i`` then
    gets what ``y[i:i+1]`` alone gets from ``gen[i]``, bit for bit, so a sender encoding its own message on its
    own machine draws the dither the simulation drew for it.
    """
    if gen is None or isinstance(gen, torch.Generator):
        numel = y.numel()
        words = torch.empty((numel + 3) // 4, dtype=torch.int64, device=y.device)
        words.random_(-2 ** 63, None, generator=gen)  # the full 64-bit range (a bare random_() leaves the sign bit 0)
        k = words.view(torch.int16)[:numel].view(y.shape)  # uniform on −2**15..2**15 − 1
    else:
        gens = list(gen)
        if y.ndim != 2 or y.shape[0] != len(gens):
            raise ConfigError(f"add_dither_ needs one generator per row: {len(gens)} for a {tuple(y.shape)} tensor.")
        width = y.shape[1]
        words = torch.empty((len(gens), (width + 3) // 4), dtype=torch.int64, device=y.device)
        run_draws([lambda i=i: words[i].random_(-2 ** 63, None, generator=gens[i]) for i in range(len(gens))],
                  words.numel(), y.device)
        k = words.view(torch.int16)[:, :width]
    y.add_(k, alpha=2.0 ** -_DITHER_BITS)
    return y.add_(0.5 + 2.0 ** -(_DITHER_BITS + 1))
