"""Views for self-supervised local training: a part that augments every gathered cohort batch.

The executor gathers each step's batch ``{"x": (m, B, C, H, W), ...}`` (row ``i``: client ``i``'s examples) and, when
the local job has an augmentation, passes it through :meth:`CohortViews.apply`, which adds
``"views": (m, B, 2V, C, H, W)``: 2V augmented views x ∼ 𝒜(·|x̄) of every example (views ``v`` and ``v + V`` are the
positive pairs of the FedSC paper's mini-batch estimator, Sec. 5.2). Client ``i``'s draws come from its own
``"views"`` generator of the round, on the data's device, advanced step after step, so its views depend only on
(seed, round, client) and its own batches: the vectorized and the sequential executor see the same views. The
augmentation itself runs once on the whole cohort (:func:`trustfl.selfsup.augment.make_views_cohort`); padding rows
are augmented too and masked by the loss.

Example:
  >>> aug = CohortViews(num_views=1)
  >>> gens = [torch.Generator().manual_seed(i) for i in range(3)]
  >>> tuple(aug.apply({"x": torch.rand(3, 4, 1, 8, 8)}, gens)["views"].shape)
  (3, 4, 2, 1, 8, 8)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.selfsup.augment import DEFAULT, Augmentation, make_views_cohort
from trustfl.types import CohortContext

__all__ = ["CohortViews", "view_representations"]


@register("augmentation", "views")
@dataclass(frozen=True)
class CohortViews:
    """2V augmented views of every example of every client's batch (the kernel :class:`Augmentation`).

    Args:
      num_views: V >= 1 (2V views per example; the FedSC paper's experiments train with two views, V = 1).
      shift, brightness, contrast, dropout, noise_std, flip, shift_mode: the kernel's parameters
        (:class:`Augmentation`).
    """

    num_views: int = 1
    shift: int = 2
    brightness: Sequence[float] = (0.7, 1.3)
    contrast: Sequence[float] = (1.0, 1.0)
    dropout: float = 0.2
    noise_std: float = 0.1
    flip: bool = False
    shift_mode: str = "crop"
    kernel: Augmentation = field(init=False, repr=False)

    def __post_init__(self) -> None:
        check_number("num_views", self.num_views, integer=True, low=1)
        object.__setattr__(self, "kernel", Augmentation(self.shift, tuple(self.brightness), tuple(self.contrast),
                                                        self.dropout, self.noise_std, self.flip,
                                                        self.shift_mode))

    def check_input_shape(self, shape: Sequence[int]) -> None:
        """Refuse examples that are not images ``(C, H, W)``, and a shift of an image's side or more (it would move
        the image out of its frame and pad every view by that much); ConfigError naming the key."""
        if len(shape) != 3:
            raise ConfigError(f"`client.augment`: augmentation 'views' needs image examples (C, H, W), the data set's "
                              f"have shape {tuple(shape)}; use an image data set (e.g. digits_canvas).")
        side = min(shape[1:])
        if self.shift >= side:
            raise ConfigError(f"`client.augment.shift` (`recipe.augment.shift` in the self-supervised recipes) = "
                              f"{self.shift} moves an image by its side ({side} pixels) or more; at most {side - 1}.")

    def init(self, cohort: CohortContext) -> list[torch.Generator]:
        """The cohort's ``"views"`` generators of the round, one per client, on its device."""
        return [cohort.generator(i, "views") for i in range(cohort.size)]

    def apply(self, batch: Mapping[str, torch.Tensor], state: Any) -> dict[str, torch.Tensor]:
        """``batch`` with ``"views"`` ``(m, B, 2V, C, H, W)`` added (``state``: the clients' generators)."""
        x = batch["x"]
        if x.dim() != 5:
            raise ConfigError(f"augmentation 'views' needs image batches (m, B, C, H, W), found shape "
                              f"{tuple(x.shape)}; use an image data set (e.g. digits_canvas).")
        return {**batch, "views": make_views_cohort(x, 2 * self.num_views, state, self.kernel)}

    def views(self, x: torch.Tensor, num_views: int, generators: Sequence[torch.Generator]) -> torch.Tensor:
        """``num_views`` views ``(m, N, num_views, C, H, W)`` of ``x`` ``(m, N, C, H, W)`` with this kernel (e.g. for
        DP-CalR's V sharing views)."""
        return make_views_cohort(x, num_views, generators, self.kernel)


def view_representations(represent: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, num_views: int,
                         generators: Sequence[torch.Generator], augment: CohortViews | None = None,
                         chunk: int = 256) -> Iterator[tuple[int, torch.Tensor]]:
    """``(start, z)`` for each chunk of ``chunk`` samples of every client: ``z`` ``(m, k, num_views, H)`` the
    representations of ``num_views`` views of ``x[:, start:start + k]`` (``x`` ``(m, N, C, H, W)``), client ``i``'s
    views from ``generators[i]`` with ``augment``'s kernel (the default kernel without one). For client statistics
    computed at the received model (FedSC's DP-CalR, FedCA's dictionary)."""
    m = x.shape[0]
    for start in range(0, x.shape[1], chunk):
        xs = x[:, start:start + chunk]
        k = xs.shape[1]
        views = augment.views(xs, num_views, generators) if augment is not None \
            else make_views_cohort(xs, num_views, generators, DEFAULT)
        yield start, represent(views.reshape(m * k * num_views, *views.shape[3:])).view(m, k, num_views, -1)
