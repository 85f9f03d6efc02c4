"""FedAvg (McMahan et al. 2017, arXiv:1602.05629): local SGD, sample-size-weighted mean, server SGD.

Everything FedAvg needs is the engine's default pipeline; the recipe exists so that ``algorithm = "fedavg"``
names it, and it leaves every axis (privacy, attack, aggregator, server optimizer) to the config.
"""
from __future__ import annotations

from trustfl.core.registry import register
from trustfl.recipes.base import AbstractRecipe


@register("algorithm", "fedavg")
def fedavg() -> AbstractRecipe:
    return AbstractRecipe()
