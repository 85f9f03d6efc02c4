"""Recipes: one per paper, the named composition of stages and engine with the paper's defaults.

``algorithm = "fedavg"`` in TOML selects :mod:`trustfl.recipes.fedavg`; a recipe may fill defaults into the
config (``configure``) and attach what only it knows to the built federation (``finalize``).
"""
from trustfl.recipes.base import AbstractRecipe

__all__ = ["AbstractRecipe"]
