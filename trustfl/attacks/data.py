"""Data-level Byzantine attacks (simulation only): the Byzantine clients train on poisoned data.

Warning:
  A data-level attack (``data_level = True``) is not applied through :meth:`AbstractAttack.craft`. The engine runs
  the Byzantine clients' local updates exactly as the honest ones (same local update, clipping and noise stages,
  unless the recipe says otherwise), but on batches passed through :meth:`AbstractAttack.poison`. CafCor
  (Sec. 5, "Attacks") leaves open whether label-flipping clients add DP noise or momentum; that is the recipe's choice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from trustfl.attacks.base import AbstractAttack, check_honest
from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.errors import ConfigError, DataError
from trustfl.types import RoundContext

if TYPE_CHECKING:
    from trustfl.aggregate.base import AbstractAggregator


def flip_labels(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Map every label ``y`` to ``num_classes − 1 − y`` (``9 − y`` for 10 classes; ByzFL's convention).

    Args:
      y: integer class labels in ``[0, num_classes)``, any shape.
      num_classes: the number of classes, ``>= 2``.

    Returns:
      The flipped labels, same shape and dtype as ``y``.

    Raises:
      ConfigError: if ``num_classes < 2``.
      DataError: if ``y`` is not an integer tensor or has a label outside ``[0, num_classes)``.

    Example:
      >>> flip_labels(torch.tensor([0, 3, 9]), 10).tolist()
      [9, 6, 0]
    """
    check_number("num_classes", num_classes, integer=True, low=2)
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise DataError(f"label_flip: `y` must hold integer class labels, found dtype {y.dtype}.")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise DataError(f"label_flip: labels must lie in [0, {num_classes}), found range "
                        f"[{int(y.min())}, {int(y.max())}].")
    return (num_classes - 1) - y


@register("attack", "label_flip")
@dataclass(frozen=True)
class LabelFlip(AbstractAttack):
    """Byzantine clients train on flipped labels ``y → num_classes − 1 − y`` (CafCor, Sec. 5, "LF").

    The engine applies :meth:`poison` to each Byzantine training batch and otherwise runs the protocol;
    :meth:`craft` is never used and raises.
    """

    data_level: ClassVar[bool] = True

    def flip_labels(self, y: torch.Tensor, num_classes: int) -> torch.Tensor:
        """See :func:`flip_labels`."""
        return flip_labels(y, num_classes)

    def poison(self, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(x, flip_labels(y, num_classes))``; the inputs are unchanged."""
        return x, flip_labels(y, num_classes)

    def craft(self, honest: torch.Tensor, num_byzantine: int, ctx: RoundContext,
              aggregator: AbstractAggregator | None = None) -> torch.Tensor:
        """Not used: label flipping is a data-level attack.

        Raises:
          MessageError: for malformed ``honest`` (as every attack, :func:`~trustfl.attacks.base.check_honest`).
          ConfigError: otherwise, always; the engine must run the Byzantine clients' local updates on
            :meth:`poison`-ed batches instead.
        """
        check_honest(honest, num_byzantine, attack=self)
        raise ConfigError("label_flip is a data-level attack (data_level=True): the engine must run the Byzantine "
                          "clients' local updates on batches passed through poison(), not call craft().")
