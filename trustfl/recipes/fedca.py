"""FedCA (Zhang et al., FITEE 2023) as the FedSC paper runs it: InfoNCE with a dictionary of the other clients'
per-sample representations as extra negatives (Table 2's baseline).

Pipeline: augmentation ``views`` (two views per image) → client statistic ``fedca_dictionary`` (every participant
uploads the mean projection of two views of each of its samples at the received model; the server keeps a moving
average of every sample's entry and sends each participant the other clients' entries) → objective ``info_nce``
(the dictionary as negatives) → plain local SGD → uniform averaging. The first round trains on InfoNCE alone only if
no dictionary exists yet: the participants upload before they train, so from round 1 on every client but the first
uploader sees the others' entries.

Not built: FedCA's *alignment module* (it aligns local models to a base model trained on public data; the FedSC
authors' code omits it too). Privacy: FedCA sends per-sample representations in the clear; nothing protects them.

``[recipe]`` keys (all optional): ``temperature`` (τ, 0.1), ``dictionary_loss`` (``"joint"``: the paper's single
softmax over batch and dictionary negatives; ``"code"``: the authors' 0.8/0.2 mixture, see
:mod:`trustfl.objectives.contrastive`), ``dictionary_views`` (views averaged per entry, 2), ``dictionary_ema``
(β, 0.5), ``views`` (must stay 1: two views), ``augment`` (the views' kernel, as for FedSC). The model must be
``sc_mlp`` or ``sc_cnn``; evaluation as FedSC (linear probe on the backbone, kNN on the projector, the random-init
floor).
"""
from __future__ import annotations

import dataclasses

from trustfl.config.schema import Component, ExperimentConfig
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.objectives.contrastive import DICTIONARY_LOSSES
from trustfl.recipes.base import AbstractRecipe, recipe_choice, recipe_keys, recipe_number
from trustfl.recipes.fedsc import self_supervised_client, self_supervised_run, two_view_model

KEYS = ("temperature", "dictionary_loss", "dictionary_views", "dictionary_ema", "views", "augment")


class FedCARecipe(AbstractRecipe):
    def configure(self, cfg: ExperimentConfig) -> ExperimentConfig:
        rec = recipe_keys(cfg, "fedca", KEYS)
        model = two_view_model(cfg, rec, "fedca", predictor=False)
        if cfg.data.num_clients < 2:
            raise ConfigError(f"`data.num_clients` must be >= 2 for FedCA (each client's negatives come from the "
                              f"others), found {cfg.data.num_clients}.")
        objective = Component("info_nce", {
            "temperature": recipe_number(rec, "temperature", 0.1, low=0, low_open=True, finite=True),
            "dictionary_loss": recipe_choice(rec, "dictionary_loss", "joint", DICTIONARY_LOSSES)})
        share = {"views": recipe_number(rec, "dictionary_views", 2, integer=True, low=1),
                 "ema": recipe_number(rec, "dictionary_ema", 0.5, low=0, high=1, high_open=True)}
        client = self_supervised_client(cfg, rec, "fedca", "info_nce",
                                        "FedCA shares per-sample representations unprotected")
        client = dataclasses.replace(client, statistics=[Component("fedca_dictionary", share)])
        return self_supervised_run(cfg, objective, client, model=model)


@register("algorithm", "fedca")
def fedca() -> AbstractRecipe:
    return FedCARecipe()
