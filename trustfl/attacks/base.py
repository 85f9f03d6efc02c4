"""The attack interface: omniscient Byzantine clients, for simulation only.

An update-level attack sees the honest messages of the round (after the client-side privacy stages, so the noisy
ones, cafcor.md §7 item 11) and returns the rows the ``f`` Byzantine clients send. A data-level attack
(``data_level = True``) instead poisons the Byzantine clients' training data; the engine then runs their local
updates like honest ones and never calls :meth:`AbstractAttack.craft`.
"""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar

import torch

from trustfl.errors import ConfigError, TrustFLError
from trustfl.types import RoundContext

if TYPE_CHECKING:  # attacks sit beside aggregate in the layering; the aggregator is only passed in
    from trustfl.aggregate.base import AbstractAggregator


class AbstractAttack(abc.ABC):
    """Base of every attack. Concrete attacks are frozen dataclasses registered as ``("attack", name)``.

    Attributes:
      data_level: ``True`` when the attack poisons data (:meth:`poison`) rather than crafting messages.
    """

    data_level: ClassVar[bool] = False

    @abc.abstractmethod
    def craft(self, honest: torch.Tensor, num_byzantine: int, ctx: RoundContext,
              aggregator: AbstractAggregator | None = None) -> torch.Tensor:
        """Return the Byzantine rows of the round.

        Args:
          honest: the honest messages of the round, shape ``(h, d)``, floating point.
          num_byzantine: ``f``, the number of rows to return (``0`` gives an empty ``(0, d)`` tensor).
          ctx: the round context; random attacks draw from ``ctx.generator("attack")`` (the server stream).
          aggregator: the server's rule, used only by attacks that optimise against it (line search).

        Returns:
          A ``(f, d)`` tensor with ``honest``'s dtype.
        """

    def poison(self, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Poison one training batch of a Byzantine client (data-level attacks only).

        Raises:
          TrustFLError: for update-level attacks, which have no data form.
        """
        raise TrustFLError(f"{type(self).__name__} is an update-level attack (data_level=False): it has no "
                           "poison(); the engine must call craft() instead.")


def check_honest(honest: torch.Tensor, num_byzantine: int, min_rows: int = 1) -> None:
    """Validate the arguments of :meth:`AbstractAttack.craft`.

    Raises:
      TrustFLError: if ``honest`` is not a floating ``(h, d)`` matrix with ``h >= min_rows`` or ``num_byzantine``
        is not an integer ``>= 0``.
    """
    if honest.ndim != 2 or not honest.is_floating_point():
        raise TrustFLError(f"`honest` must be a floating (h, d) tensor, found shape {tuple(honest.shape)} and "
                           f"dtype {honest.dtype}.")
    if honest.shape[0] < min_rows:
        raise TrustFLError(f"`honest` must have at least {min_rows} row(s) for this attack, found "
                           f"{honest.shape[0]}.")
    if not isinstance(num_byzantine, int) or isinstance(num_byzantine, bool) or num_byzantine < 0:
        raise TrustFLError(f"`num_byzantine` must be an integer >= 0, found {num_byzantine!r}.")


def repeat_row(row: torch.Tensor, num_byzantine: int) -> torch.Tensor:
    """All Byzantine clients send the same vector (cafcor.md §4.2): ``(d,) -> (f, d)``, a fresh tensor."""
    return row.unsqueeze(0).expand(num_byzantine, -1).clone()


def check_finite_number(value: float, name: str) -> None:
    """Raise ``ConfigError`` unless ``value`` is a finite real number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not abs(float(value)) < float("inf"):
        raise ConfigError(f"`{name}` must be a finite number, found {value!r}.")
