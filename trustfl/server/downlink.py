"""The downlink: what the server sends the clients, as named flat tensors through an encode/decode chain.

The payload is ``{"model": θ (d,), **shared}``: the global model and the shared statistics of the gradient
transforms' server halves (e.g. SCAFFOLD's ``"scaffold/c"``). Downlink stages encode it in order on the server
and decode it in reverse on the client; ``bytes_down`` is counted from the encoded tensors. A
lossy stage (``cast`` to bfloat16, later a quantizer) makes clients start from what they actually received.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Mapping

import torch

from trustfl.core.registry import register
from trustfl.errors import ConfigError, MessageError

Payload = dict[str, torch.Tensor]


class AbstractDownlinkStage(abc.ABC):
    """An encode/decode pair applied to every tensor of the downlink payload."""

    @abc.abstractmethod
    def encode(self, payload: Mapping[str, torch.Tensor]) -> Payload:
        """The server's half."""

    @abc.abstractmethod
    def decode(self, payload: Mapping[str, torch.Tensor], dtypes: Mapping[str, torch.dtype]) -> Payload:
        """The client's half; ``dtypes`` are the tensors' dtypes before encoding."""


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float64": torch.float64}


@register("downlink_stage", "cast")
@dataclass(frozen=True)
class Cast(AbstractDownlinkStage):
    """Send every tensor in a narrower float type (``float16``/``bfloat16``); clients cast back.

    Args:
      dtype: ``"float16"``, ``"bfloat16"``, ``"float32"`` or ``"float64"``.

    A finite value beyond the target type's range (``|v| > 65504`` for float16) is refused with a
    :class:`MessageError` naming the tensor, rather than sent to every client as ±inf.

    Example:
      >>> stage = Cast("bfloat16")
      >>> enc = stage.encode({"model": torch.tensor([1.0, 1.00390625])})
      >>> enc["model"].dtype, stage.decode(enc, {"model": torch.float32})["model"].tolist()
      (torch.bfloat16, [1.0, 1.0])
    """

    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPES:
            raise ConfigError(f"`dtype` must be one of {sorted(_DTYPES)}, found {self.dtype!r}.")

    def encode(self, payload):
        dtype = _DTYPES[self.dtype]
        out = {}
        for k, v in payload.items():
            cast = v.to(dtype)
            if v.is_floating_point() and not bool(torch.isfinite(cast).all()) and bool(
                    (torch.isfinite(v) & ~torch.isfinite(cast)).any()):  # a second pass only where the cast holds ±inf
                big = float(v[torch.isfinite(v)].abs().max())
                wider = "bfloat16" if self.dtype == "float16" else "float32" if self.dtype == "bfloat16" else "float64"
                raise MessageError(f"downlink stage `cast`: tensor {k!r} holds a finite value of magnitude {big:.6g}, "
                                   f"beyond {self.dtype}'s range (±{torch.finfo(dtype).max:.6g}): it would reach the "
                                   f"clients as ±inf. Cast to a wider type (dtype = \"{wider}\") or leave it out.")
            out[k] = cast
        return out

    def decode(self, payload, dtypes):
        return {k: v.to(dtypes[k]) for k, v in payload.items()}


@dataclass(frozen=True)
class Downlink:
    """The named downlink stages, applied in order to encode and in reverse to decode."""

    stages: tuple[tuple[str, AbstractDownlinkStage], ...] = ()

    def encode(self, payload: Mapping[str, torch.Tensor]) -> Payload:
        out = dict(payload)
        for _, stage in self.stages:
            out = stage.encode(out)
        return out

    def decode(self, encoded: Mapping[str, torch.Tensor], dtypes: Mapping[str, torch.dtype]) -> Payload:
        out = dict(encoded)
        for _, stage in reversed(self.stages):
            out = stage.decode(out, dtypes)
        return out

    @staticmethod
    def nbytes(encoded: Mapping[str, torch.Tensor]) -> int:
        """Bytes of one encoded payload (what one client receives)."""
        return sum(int(v.numel()) * v.element_size() for v in encoded.values())
