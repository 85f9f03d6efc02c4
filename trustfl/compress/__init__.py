"""Compressors: encode/decode pairs over ``(m, d)`` message rows with exact bit counts.

Registered under the kind ``"compressor"``: ``identity``, ``lattice`` (Davies et al. 2021, QuAFL's quantizer),
``qsgd`` (Alistarh et al. 2017) and ``qsgd_minmax`` (what QuAFL's code calls QSGD).

Example:
  >>> import torch, trustfl
  >>> comp = trustfl.build("compressor", "lattice", bits=8, step=1e-2)
  >>> x = torch.randn(4, 1000, generator=torch.Generator().manual_seed(0)) * 0.1
  >>> enc = comp.encode(x, torch.Generator().manual_seed(1), shared_seed=7)
  >>> enc.bits_per_row()                 # 1000 coordinates padded to 1024 by the rotation, 8 bits each
  8192
  >>> dec, failures = comp.decode(enc, key=x + 0.05, shared_seed=7)
  >>> failures.tolist(), bool((dec - x).abs().max() < 0.1)
  ([0, 0, 0, 0], True)
"""
from trustfl.compress.base import AbstractCompressor, Encoded
from trustfl.compress.bits import pack_bits, packed_nbytes, unpack_bits
from trustfl.compress.identity import Identity
from trustfl.compress.lattice import Lattice
from trustfl.compress.qsgd import QSGD, QSGDMinMax
from trustfl.compress.rotation import HadamardRotation, hadamard_transform

__all__ = ["AbstractCompressor", "Encoded", "HadamardRotation", "Identity", "Lattice", "QSGD", "QSGDMinMax",
           "hadamard_transform", "pack_bits", "packed_nbytes", "unpack_bits"]
