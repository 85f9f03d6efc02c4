"""FedProx (Li et al. 2020): FedAvg whose clients minimise ``F_k(θ) + (μ/2)‖θ − θ^t‖²`` (eq. 2).

The recipe is one part added to FedAvg's pipeline: the ``proximal`` gradient transform (``g ← g + μ(θ − θ^t)``).
Partial local work of stragglers (§5.2, "systems heterogeneity") is the step budget ``client.step_budget =
{ name = "stragglers", fraction = … }``, which any algorithm may use. Every other axis comes from the config.

``[recipe]`` keys: ``mu`` (default 0.01; 0 is FedAvg, bitwise).

Reference: Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, *Federated optimization in heterogeneous networks*,
MLSys 2020. https://arxiv.org/abs/1812.06127
"""
from __future__ import annotations

import dataclasses
import math

from trustfl.config.schema import Component, ExperimentConfig
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.recipes.base import AbstractRecipe, recipe_keys

DEFAULT_MU = 0.01


class FedProx(AbstractRecipe):
    def configure(self, cfg: ExperimentConfig) -> ExperimentConfig:
        rec = recipe_keys(cfg, "fedprox", ("mu",))
        mu = rec.get("mu", DEFAULT_MU)
        if isinstance(mu, bool) or not isinstance(mu, (int, float)) or not (0 <= mu and math.isfinite(mu)):
            raise ConfigError(f"`recipe.mu` must be a finite number >= 0, found {mu!r}.")
        if any(c.name == "proximal" for c in cfg.client.transforms):
            raise ConfigError("`client.transforms` already holds \"proximal\"; with algorithm = \"fedprox\" set "
                              "`recipe.mu` instead.")
        transforms = [Component("proximal", {"mu": float(mu)}), *cfg.client.transforms]
        return dataclasses.replace(cfg, client=dataclasses.replace(cfg.client, transforms=transforms))


@register("algorithm", "fedprox")
def fedprox() -> AbstractRecipe:
    return FedProx()
