"""The attack interface: omniscient Byzantine clients, for simulation only.

An update-level attack sees the honest messages of the round (after the client-side privacy stages, so the noisy
ones; docs/papers/cafcor.md, "What the attacker sees") and returns the rows the ``f`` Byzantine clients send. A
data-level attack (``data_level = True``) instead poisons the Byzantine clients' training data; the engine then runs
their local updates like honest ones and never calls :meth:`AbstractAttack.craft`.

Input and range: every ``craft`` first checks ``honest`` with :func:`check_honest` and raises
:class:`~trustfl.errors.MessageError`, naming the attack and the bad rows, for a non-finite row, a shape other than
``(h, d)`` with ``d >= 1``, or a non-floating dtype. Finite honest rows of any size never overflow inside an attack:
a vector whose plain computation overflows is recomputed in float64 (float64 rows: rescaled by a power of two),
and a value beyond the dtype's range (e.g. FOE's ``−2·mean`` of rows near the float32 maximum) saturates at
``±finfo(dtype).max``. Only ``inf`` and ``nan`` send non-finite rows, on purpose.
"""
from __future__ import annotations

import abc
import math
from typing import TYPE_CHECKING, Callable, ClassVar

import torch

from trustfl.core.checks import check_number
from trustfl.core.finite import all_finite, finite_rows
from trustfl.core.registry import component_name
from trustfl.errors import ConfigError, MessageError
from trustfl.types import RoundContext

if TYPE_CHECKING:  # attacks sit beside aggregate in the layering; the aggregator is only passed in
    from trustfl.aggregate.base import AbstractAggregator


class AbstractAttack(abc.ABC):
    """Base of every attack. Concrete attacks are frozen dataclasses registered as ``("attack", name)``.

    Attributes:
      data_level: ``True`` when the attack poisons data (:meth:`poison`) rather than crafting messages.
    """

    data_level: ClassVar[bool] = False
    min_honest: ClassVar[int] = 1
    """The fewest honest rows :meth:`craft` needs (ALIE's standard deviation: 2); a round with fewer leaves the
    Byzantine clients idle (they send nothing, the row's ``attack_idle``)."""

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
          ConfigError: for update-level attacks, which have no data form.
        """
        raise ConfigError(f"{self.label()} is an update-level attack (data_level=False): it has no "
                          "poison(); the engine must call craft() instead.")

    def label(self) -> str:
        """``attack 'name'`` for error messages: the registered name of this attack's class."""
        return component_name("attack", self)


def check_honest(honest: torch.Tensor, num_byzantine: int, min_rows: int = 1,
                 attack: AbstractAttack | None = None) -> None:
    """Validate the arguments of :meth:`AbstractAttack.craft` (every attack calls this first).

    Args:
      honest, num_byzantine: as given to ``craft``.
      min_rows: the fewest honest rows the attack needs.
      attack: the caller, named in the errors.

    Raises:
      MessageError: if ``honest`` is not a floating ``(h, d)`` tensor with ``h >= min_rows``, ``d >= 1`` and
        finite entries; the message names the attack and the non-finite rows.
      ConfigError: if ``num_byzantine`` is not an integer ``>= 0``.
    """
    who = "attack" if attack is None else attack.label()
    if not isinstance(honest, torch.Tensor) or honest.ndim != 2 or honest.shape[1] == 0:
        shape = tuple(honest.shape) if isinstance(honest, torch.Tensor) else type(honest).__name__
        raise MessageError(f"{who}: `honest` must be a 2-D (h, d) tensor with d >= 1, found {shape}.")
    if not honest.is_floating_point():
        raise MessageError(f"{who}: `honest` must have a floating dtype, found {honest.dtype}.")
    if honest.shape[0] < min_rows:
        raise MessageError(f"{who}: `honest` must have at least {min_rows} row(s) for this attack, found "
                           f"{honest.shape[0]}.")
    bad = ~finite_rows(honest)
    if bool(bad.any()):
        rows = torch.nonzero(bad).flatten().tolist()
        listed = str(rows) if len(rows) <= 10 else f"{rows[:10]} and {len(rows) - 10} more"
        raise MessageError(f"{who}: honest rows {listed} are not finite (NaN or ±inf); drop them before crafting.")
    check_number("num_byzantine", num_byzantine, integer=True, low=0, where=who)


def round_context(ctx: object, attack: AbstractAttack, why: str) -> RoundContext:
    """``ctx`` if it is a :class:`~trustfl.types.RoundContext`, else a :class:`~trustfl.errors.MessageError` naming
    the attack and ``why`` it needs one (``craft(h, f, None)`` suits only the attacks that draw nothing)."""
    if not isinstance(ctx, RoundContext):
        raise MessageError(f"{attack.label()}: `ctx` must be the round's RoundContext ({why}), found "
                           f"{type(ctx).__name__}.")
    return ctx


def without_overflow(fn: Callable[[torch.Tensor], torch.Tensor], honest: torch.Tensor) -> torch.Tensor:
    """``fn(honest)`` for a positively homogeneous ``fn`` (``fn(c·H) = c·fn(H)``, ``c > 0``), never inf from overflow.

    The plain result is returned when finite. Otherwise ``fn`` is evaluated in float64 (float64 rows: on ``H``
    scaled by a power of two, exact, and scaled back) and the result saturates at ``±finfo(dtype).max``.
    """
    out = fn(honest)
    if all_finite(out):
        return out
    big = torch.finfo(honest.dtype).max
    if honest.dtype != torch.float64:
        return fn(honest.to(torch.float64)).clamp(-big, big).to(honest.dtype)
    e = math.frexp(float(honest.abs().max()))[1]  # max|H| < 2**e
    out = fn(torch.ldexp(honest, torch.tensor(-e, device=honest.device)))
    return torch.ldexp(out.clamp(-math.ldexp(big, -e), math.ldexp(big, -e)), torch.tensor(e, device=honest.device))


def saturate(x: torch.Tensor) -> torch.Tensor:
    """``x`` with ``±inf`` replaced by ``±finfo(dtype).max`` (a value beyond the dtype's range)."""
    big = torch.finfo(x.dtype).max
    return x.clamp(-big, big)


def repeat_row(row: torch.Tensor, num_byzantine: int) -> torch.Tensor:
    """All Byzantine clients send the same vector (CafCor, Sec. 5): ``(d,) -> (f, d)``, a fresh tensor."""
    return row.unsqueeze(0).expand(num_byzantine, -1).clone()


def check_finite_number(value: float, name: str) -> None:
    """Raise ``ConfigError`` unless ``value`` is a finite real number."""
    check_number(name, value, finite=True)
