"""FedX (Han et al., ECCV 2022) as the FedSC paper runs it: two-sided cross knowledge distillation (Table 2's
baseline).

Pipeline: augmentation ``views`` (two views per image) → objective ``fedx`` (local and global NT-Xent plus local
and global relational losses against the received model, kept frozen on the client; :mod:`trustfl.objectives.fedx`)
→ plain local SGD → uniform averaging of the whole network, predictor included. Nothing but the model is exchanged.

``[recipe]`` keys (all optional): ``temperature`` (τ, 0.1), ``target_temperature`` (τ₂ of the relational target,
0.01), ``views`` (must stay 1: two views), ``augment`` (the views' kernel, as for FedSC). The model must be
``sc_mlp`` or ``sc_cnn``; it gets a predictor ``[128]`` unless ``model.predictor`` is set. Evaluation as FedSC.
"""
from __future__ import annotations

import dataclasses

from trustfl.config.schema import Component, ExperimentConfig
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.recipes.base import AbstractRecipe, recipe_keys, recipe_number
from trustfl.recipes.fedsc import self_supervised_client, self_supervised_run

KEYS = ("temperature", "target_temperature", "views", "augment")
MODELS = ("sc_mlp", "sc_cnn")


class FedXRecipe(AbstractRecipe):
    def configure(self, cfg: ExperimentConfig) -> ExperimentConfig:
        rec = recipe_keys(cfg, "fedx", KEYS)
        if recipe_number(rec, "views", 1, integer=True, low=1) != 1:
            raise ConfigError("`recipe.views` must be 1 with algorithm 'fedx': its losses pair two views of every "
                              "image.")
        if cfg.model.name not in MODELS:
            raise ConfigError(f"`model.name` is {cfg.model.name!r}; algorithm 'fedx' needs an encoder with a "
                              f"projector and a predictor: one of {MODELS}.")
        model = cfg.model
        if "predictor" not in model.params:
            model = dataclasses.replace(model, params={**model.params, "predictor": [128]})
        objective = Component("fedx", {
            "temperature": recipe_number(rec, "temperature", 0.1, low=0, low_open=True, finite=True),
            "target_temperature": recipe_number(rec, "target_temperature", 0.01, low=0, low_open=True,
                                                finite=True)})
        client = self_supervised_client(cfg, rec, "fedx", "fedx", "FedX is not private")
        return self_supervised_run(cfg, objective, client, model=model)


@register("algorithm", "fedx")
def fedx() -> AbstractRecipe:
    return FedXRecipe()
