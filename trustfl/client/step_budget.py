"""Per-client step budgets: how many of its planned local steps a client completes this round.

Systems heterogeneity (FedProx, Li et al. 2020, §5.2): a *straggler* completes only part of its local work. With
``stragglers(fraction)``, each participating client is a straggler with probability ``fraction`` and then
completes ``K ~ U{1, …, planned}`` steps, drawn from its own ``"step_budget"`` generator for the round. The
engine gives the budget to the executors as an input (``ClientPlan.max_steps``); privacy accounting charges the
steps actually taken.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np
import torch

from trustfl.core.registry import component_name, register
from trustfl.core.rng import make_generator
from trustfl.errors import ConfigError


class AbstractStepBudget(abc.ABC):
    @abc.abstractmethod
    def max_steps(self, client_id: int, planned: int, seed: int, round_: int) -> int | None:
        """The most steps ``client_id`` completes this round (``None``: all ``planned``)."""


def checked_max_steps(budget: AbstractStepBudget, client_id: int, planned: int, seed: int,
                      round_: int) -> int | None:
    """``budget.max_steps(...)``, refused (ConfigError naming the budget) unless ``None`` or an integer >= 0: a
    negative count would cut steps from the end as a slice does, and a float would fail deep in a round."""
    steps = budget.max_steps(client_id, planned, seed, round_)
    if steps is None or (isinstance(steps, (int, np.integer)) and not isinstance(steps, bool) and steps >= 0):
        return steps if steps is None else int(steps)
    raise ConfigError(f"`client.step_budget`: {component_name('step_budget', budget)} gave {steps!r} steps for "
                      f"client {client_id} in round {round_ + 1}; it must give None (every planned step) or an "
                      f"integer >= 0.")


@register("step_budget", "full")
@dataclass(frozen=True)
class FullWork(AbstractStepBudget):
    """Every client completes all its planned steps."""

    def max_steps(self, client_id, planned, seed, round_):
        return None


@register("step_budget", "stragglers")
@dataclass(frozen=True)
class Stragglers(AbstractStepBudget):
    """A share ``fraction`` of clients completes ``U{1, …, planned}`` steps (FedProx's systems heterogeneity).

    Args:
      fraction: probability that a participating client is a straggler, in ``[0, 1]``.
    """

    fraction: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= self.fraction <= 1:
            raise ConfigError(f"`fraction` must be in [0, 1], found {self.fraction!r}.")

    def max_steps(self, client_id, planned, seed, round_):
        if planned <= 1 or self.fraction == 0:
            return None
        gen = make_generator(seed, round_, client_id, "step_budget")
        draws = torch.rand(2, generator=gen, dtype=torch.float64)
        if float(draws[0]) >= self.fraction:
            return None
        return 1 + min(planned - 1, int(float(draws[1]) * planned))
