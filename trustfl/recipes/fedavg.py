"""FedAvg (McMahan et al. 2017, arXiv:1602.05629): local SGD, sample-size-weighted mean, server SGD.

Everything FedAvg needs is the engine's default pipeline; the recipe exists so that ``algorithm = "fedavg"``
names it, and it leaves every axis (privacy, attack, aggregator, server optimizer) to the config.

``[recipe]`` keys: none (a key there, e.g. FedProx's ``mu``, is a ConfigError naming it).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from trustfl.core.registry import register
from trustfl.recipes.base import AbstractRecipe, recipe_keys

if TYPE_CHECKING:
    from trustfl.config.schema import ExperimentConfig


class FedAvg(AbstractRecipe):
    def configure(self, cfg: "ExperimentConfig") -> "ExperimentConfig":
        recipe_keys(cfg, "fedavg", ())
        return cfg


@register("algorithm", "fedavg")
def fedavg() -> AbstractRecipe:
    return FedAvg()
