"""The FedSC paper's BYOL-family baselines (Table 2): FedAvg+BYOL, FedU and FedEMA, each a recipe.

Pipeline: augmentation ``views`` (two views per image) → objective ``byol`` (online backbone + projector +
predictor against a target network that follows them by a moving average every local step, reset to the client's
starting weights every round as the FedSC authors' code does) → plain local SGD → uniform averaging of the whole
online network, predictor included. FedU and FedEMA add one gradient transform each that chooses where a client
starts (:mod:`trustfl.client.divergence_aware`); the target network and a client's local model never leave it.

- ``algorithm = "fedavg_byol"``: every client starts from the global model.
- ``algorithm = "fedu"``: global encoder; the client's own predictor unless the divergence is below
  ``recipe.threshold`` (0.4).
- ``algorithm = "fedema"``: encoder and predictor start at μ·W_l + (1 − μ)·W_g, μ = min(λ‖W_g − W_l‖, 1),
  λ = ``recipe.tau``/d at the first divergence (τ = 0.7).

``[recipe]`` keys: ``ema`` (τ of the target, 0.99), ``views`` (must stay 1: two views), ``augment`` (the views'
kernel, as for FedSC), ``threshold`` (FedU), ``tau`` (FedEMA). The model must be ``sc_mlp`` or ``sc_cnn``; it gets
a predictor ``[128]`` unless ``model.predictor`` is set. Evaluation: linear probe on the backbone, kNN on the
projector, the random-init floor (as FedSC).
"""
from __future__ import annotations

import dataclasses

from trustfl.config.schema import Component, ExperimentConfig
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.recipes.base import AbstractRecipe, recipe_keys, recipe_number
from trustfl.recipes.fedsc import self_supervised_client, self_supervised_run, two_view_model

COMMON = ("ema", "views", "augment")
EXTRA = {"fedavg_byol": {}, "fedu": {"threshold": 0.4}, "fedema": {"tau": 0.7}}
"""Each algorithm's own ``[recipe]`` keys and defaults, passed to its start transform (all numbers > 0)."""


class BYOLRecipe(AbstractRecipe):
    """FedAvg+BYOL, with FedU's or FedEMA's start transform (``transform``: its registered name, or ``None``)."""

    def __init__(self, algorithm: str, transform: str | None = None) -> None:
        self.algorithm, self.transform = algorithm, transform

    def configure(self, cfg: ExperimentConfig) -> ExperimentConfig:
        rec = recipe_keys(cfg, self.algorithm, COMMON + tuple(EXTRA[self.algorithm]))
        ema = recipe_number(rec, "ema", 0.99, low=0, high=1, high_open=True)
        model = two_view_model(cfg, rec, self.algorithm, predictor=True)
        client = self_supervised_client(cfg, rec, self.algorithm, "byol", "the BYOL baselines are not private")
        if self.transform is not None:
            if any(c.name == self.transform for c in cfg.client.transforms):
                raise ConfigError(f"`client.transforms` already holds {self.transform!r}; algorithm "
                                  f"{self.algorithm!r} adds it.")
            params = {key: recipe_number(rec, key, default, low=0, low_open=True, finite=True)
                      for key, default in EXTRA[self.algorithm].items()}
            client = dataclasses.replace(client, transforms=[*client.transforms, Component(self.transform, params)])
        return self_supervised_run(cfg, Component("byol", {"ema": ema}), client, model=model)


@register("algorithm", "fedavg_byol")
def fedavg_byol() -> AbstractRecipe:
    return BYOLRecipe("fedavg_byol")


@register("algorithm", "fedu")
def fedu() -> AbstractRecipe:
    return BYOLRecipe("fedu", "fedu")


@register("algorithm", "fedema")
def fedema() -> AbstractRecipe:
    return BYOLRecipe("fedema", "fedema")
