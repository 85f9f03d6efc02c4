"""SCAFFOLD (Karimireddy et al. 2020, Algorithm 1, option II): FedAvg with control variates.

The recipe adds one part to FedAvg's pipeline: the ``scaffold`` gradient transform, which corrects every local
gradient by ``c − c_i``, keeps ``c_i`` in the client state store, sends ``Δc_i`` beside the model delta and owns
the server variate ``c`` (sent on the downlink). The server step is the configured server optimizer on the
aggregated deltas (``server.lr`` is the paper's global step ``η_g``). The paper averages uniformly; the
aggregation weighting is left to ``server.weighting`` so that a comparison with FedAvg changes one thing only.

``[recipe]`` keys: none.

Reference: Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, *SCAFFOLD: stochastic controlled averaging for
federated learning*, ICML 2020. https://arxiv.org/abs/1910.06378
"""
from __future__ import annotations

import dataclasses

from trustfl.config.schema import Component, ExperimentConfig
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.recipes.base import AbstractRecipe, recipe_keys


class Scaffold(AbstractRecipe):
    def configure(self, cfg: ExperimentConfig) -> ExperimentConfig:
        recipe_keys(cfg, "scaffold", ())
        if any(c.name == "scaffold" for c in cfg.client.transforms):
            raise ConfigError("`client.transforms` already holds \"scaffold\"; algorithm = \"scaffold\" adds it.")
        transforms = [*cfg.client.transforms, Component("scaffold")]
        return dataclasses.replace(cfg, client=dataclasses.replace(cfg.client, transforms=transforms))


@register("algorithm", "scaffold")
def scaffold() -> AbstractRecipe:
    return Scaffold()
