"""Client statistics: values clients compute from their own data at the received model *before* local training.

Some algorithms exchange more than a model: in FedSC (Algorithm 1 of the FedSC paper) every participant computes its
representation correlation matrix at θ^{t−1} (DP-CalR, Algorithm 2), uploads it, and the server sends each
participant a statistic of the *other* clients' matrices (R̃_{−j}) before the participants train. A client statistic
is that exchange as one part, with a client half and a server half:

- client half: :meth:`AbstractClientStatistic.compute` maps the uploaders' data (padded ``(m, N, ...)``, a mask) and a
  function giving representations at the received model to one value per client ``(m, ...)``; row ``i`` depends on
  client ``i``'s data and generators only. :meth:`release` is the DP event of one upload (charged to the client's
  ledger; ``None``: nothing private is released);
- server half: :meth:`server_init` / :meth:`server_update` keep the server's state (a plain mapping of tensors, saved
  in checkpoints); :meth:`uploaders` says who uploads in a round; :meth:`personal` is what each cohort client
  receives, stacked ``(m, ...)``: it reaches local training as ``CohortContext.personal`` (an objective reads it in
  ``client_loss``).

The engine decides when (after the downlink, before local training; :mod:`trustfl.engine.exchange`); the part
decides what.
"""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import torch

from trustfl.core.finite import finite_rows

if TYPE_CHECKING:
    from dp_accounting import dp_event

Represent = Callable[[torch.Tensor], torch.Tensor]
"""Representations ``(n, H)`` of inputs ``(n, *input_shape)`` at the model the clients received (no gradient)."""
GeneratorFor = Callable[[int, str], torch.Generator]
"""``(client id, stream) -> torch.Generator`` of the round, on the data's device."""


class AbstractClientStatistic(abc.ABC):
    """A pre-training exchange: clients upload a value of their data, the server sends each participant its own."""

    @abc.abstractmethod
    def server_init(self, sizes: Sequence[int]) -> dict[str, Any]:
        """The server's initial state for clients of data set sizes ``sizes`` (public, as in every weighted mean)."""

    @abc.abstractmethod
    def uploaders(self, round: int, cohort: Sequence[int], state: Mapping[str, Any], num_clients: int) -> list[int]:
        """The clients that compute and upload in round ``round`` (0-based), given the round's training cohort."""

    def release(self, client_id: int) -> dp_event.DpEvent | None:
        """The DP event of one upload of ``client_id`` (``None``: no privacy mechanism)."""
        return None

    @abc.abstractmethod
    def compute(self, represent: Represent, x: torch.Tensor, mask: torch.Tensor, client_ids: Sequence[int],
                generator: GeneratorFor, augment: Any = None) -> torch.Tensor:
        """One value per uploader, ``(m, ...)``, from its examples ``x`` ``(m, N, ...)`` (``mask`` ``(m, N)``: real
        rows) at the received model."""

    def admissible(self, client_ids: Sequence[int], values: torch.Tensor) -> torch.Tensor:
        """``(m,)`` bool: the uploads the server folds in (an upload is a message, screened like any). Default: the
        finite ones; a statistic whose honest values are bounded also refuses what exceeds the bound."""
        return finite_rows(values.reshape(values.shape[0], -1))

    @abc.abstractmethod
    def server_update(self, state: Mapping[str, Any], client_ids: Sequence[int],
                      values: torch.Tensor) -> dict[str, Any]:
        """Fold the accepted uploads (rows of ``values``, clients ``client_ids``) into the state."""

    @abc.abstractmethod
    def personal(self, state: Mapping[str, Any], round: int, client_ids: Sequence[int]) -> dict[str, torch.Tensor]:
        """What each of ``client_ids`` receives before training, stacked ``(m, ...)`` (may be empty)."""
