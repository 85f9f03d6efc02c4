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

from trustfl.config.schema import Component, ExperimentConfig
from trustfl.core.registry import register
from trustfl.recipes.base import AbstractRecipe, recipe_keys, recipe_number
from trustfl.recipes.fedsc import self_supervised_client, self_supervised_run, two_view_model

KEYS = ("temperature", "target_temperature", "views", "augment")


class FedXRecipe(AbstractRecipe):
    def configure(self, cfg: ExperimentConfig) -> ExperimentConfig:
        rec = recipe_keys(cfg, "fedx", KEYS)
        model = two_view_model(cfg, rec, "fedx", predictor=True)
        objective = Component("fedx", {
            "temperature": recipe_number(rec, "temperature", 0.1, low=0, low_open=True, finite=True),
            "target_temperature": recipe_number(rec, "target_temperature", 0.01, low=0, low_open=True,
                                                finite=True)})
        client = self_supervised_client(cfg, rec, "fedx", "fedx", "FedX is not private")
        return self_supervised_run(cfg, objective, client, model=model)


@register("algorithm", "fedx")
def fedx() -> AbstractRecipe:
    return FedXRecipe()
