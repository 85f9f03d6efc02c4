"""Explicit randomness: every random draw comes from a generator derived from (seed, round, client, stage).

Library code never calls ``torch.manual_seed``. Seeds are derived by hashing the key tuple with BLAKE2b, so a
stream depends only on its own key: adding a client or a stage never shifts another stream, and a resumed run
draws exactly what an uninterrupted one would.
"""
from __future__ import annotations

import hashlib
import numbers

import numpy as np
import torch

from trustfl.errors import ConfigError

SERVER = -1
"""Client id used for draws made by the server (cohort sampling, central noise, attacks)."""


def derive_seed(seed: int, *keys: object) -> int:
    """Return a 63-bit seed for the stream named by ``(seed, *keys)``.

    Args:
      seed: the run seed.
      *keys: any reprs-stable values, e.g. ``(round, client, "noise")``.

    Example:
      >>> derive_seed(0, 1, 2, "noise") == derive_seed(0, 1, 2, "noise")
      True
      >>> derive_seed(0, 1, 2, "noise") != derive_seed(0, 1, 3, "noise")
      True
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):  # 1.5 would be 1, inf an OverflowError
        raise ConfigError(f"`seed` must be an integer, found {seed!r}.")
    text = repr((int(seed),) + tuple(keys)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & ((1 << 63) - 1)


def make_generator(seed: int, *keys: object, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` (default the CPU) seeded from ``derive_seed(seed, *keys)``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(seed, *keys))
    return gen


def numpy_rng(seed: int, *keys: object) -> np.random.Generator:
    """A NumPy PCG64 generator seeded from ``derive_seed(seed, *keys)``."""
    return np.random.default_rng(derive_seed(seed, *keys))
