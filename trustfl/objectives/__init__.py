"""Objectives: what a client minimises, as per-example losses (the only place a loss function is named).

Registered as ``("objective", name)``: ``cross_entropy`` (classification), ``mse`` (regression), ``bce`` (binary /
multi-label); self-supervised: ``spectral_contrastive`` (FedSC), ``byol`` (the BYOL baselines), ``fedx`` (FedX's
cross knowledge distillation) and ``info_nce`` (InfoNCE with a dictionary of negatives, FedCA). A user's own
objective is a function ``fn(outputs, batch) -> per-example losses`` registered with :func:`register_objective` from
their module (name the module in the config's ``plugins``).
"""
from trustfl.objectives.base import AbstractObjective, LossObjective, register_objective
from trustfl.objectives import builtin  # noqa: F401  (registers the built-in objectives)

__all__ = ["AbstractObjective", "LossObjective", "register_objective"]
