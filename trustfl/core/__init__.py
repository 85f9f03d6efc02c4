"""Core building blocks: stages and chains, seed derivation, registries. Imports nothing else from trustfl."""
from __future__ import annotations

from typing import TYPE_CHECKING

from trustfl.core.lazy import lazy_exports

if TYPE_CHECKING:
    from trustfl.core.registry import build, kinds, lookup, names, register
    from trustfl.core.rng import derive_seed, make_generator
    from trustfl.core.stage import AbstractStage, StageOut, chain

# Loaded on first access: importing trustfl.core.registry must not import torch through this package.
__getattr__, __dir__ = lazy_exports(__name__, {
    "trustfl.core.registry": ("build", "kinds", "lookup", "names", "register"),
    "trustfl.core.rng": ("derive_seed", "make_generator"),
    "trustfl.core.stage": ("AbstractStage", "StageOut", "chain"),
})

__all__ = ["AbstractStage", "StageOut", "build", "chain", "derive_seed", "kinds", "lookup",
           "make_generator", "names", "register"]
