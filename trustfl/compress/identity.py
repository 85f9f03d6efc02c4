"""The identity compressor: full-precision float32, 32 bits per coordinate."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from trustfl.compress.base import AbstractCompressor, Encoded, Layout
from trustfl.core.registry import register


@register("compressor", "identity")
@dataclass(frozen=True)
class Identity(AbstractCompressor):
    """Send every coordinate as float32 and decode it exactly (QuAFL's "b = 32" full-precision baseline).

    Bits: ``32·d`` per message.

    Example:
      >>> enc = Identity().encode(torch.tensor([[1.5, -2.0]]), None, shared_seed=0)
      >>> enc.bits_per_row()
      64
      >>> dec, failures = Identity().decode(enc, None, shared_seed=0)
      >>> dec.tolist(), failures.tolist()
      ([[1.5, -2.0]], [0])
    """

    rowwise_generators: ClassVar[bool] = True  # no randomness

    @property
    def bits_per_coordinate(self) -> float:
        return 32.0

    def payload_layout(self, rows: int, dim: int) -> Layout:
        return {"values": ((rows, dim), torch.float32)}

    def encode(self, x: torch.Tensor, gen: torch.Generator | None, shared_seed: int) -> Encoded:
        self.check_encode_args(x, gen, shared_seed)
        return Encoded({"values": x.to(torch.float32, copy=True)}, rows=x.shape[0], dim=x.shape[1])

    def decode(self, enc: Encoded, key: torch.Tensor | None, shared_seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        key = self.check_decode_args(enc, key, shared_seed)
        values = enc.payload["values"]
        device = values.device if key is None else key.device
        return (values.to(device, copy=True),
                torch.zeros(enc.rows, dtype=torch.int64, device=device))
