"""Core building blocks: stages and chains, seed derivation, registries. Imports nothing else from trustfl."""
from trustfl.core.registry import build, lookup, names, register, kinds
from trustfl.core.rng import derive_seed, make_generator
from trustfl.core.stage import AbstractStage, StageOut, chain

__all__ = ["AbstractStage", "StageOut", "build", "chain", "derive_seed", "kinds", "lookup",
           "make_generator", "names", "register"]
