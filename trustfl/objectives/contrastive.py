"""InfoNCE with an optional dictionary of extra negatives: the local loss of FedCA (the FedSC paper's baseline).

For one client's batch of B images with two views each, let u_i and w_i be the unit-normalised projector outputs of
the two views of image i, and d_1..d_K the unit vectors of a dictionary the server sent (FedCA: the other clients'
per-sample representations, :mod:`trustfl.selfsup.dictionary`). With temperature τ:

- ``"joint"`` (FedCA's dictionary module as its paper describes it; default): the dictionary entries are further
  negatives in the softmax of every anchor,
  ℓ_i = −log( e^{u_i·w_i/τ} / (Σ_k e^{u_i·w_k/τ} + Σ_d e^{u_i·d/τ}) );
- ``"code"`` (the FedSC authors' ``Client_CA``, kept to reproduce their numbers): two separate cross-entropies,
  ℓ_i = 0.8·(−log softmax_i(u_i·Wᵀ/τ)) + 0.2·(−log softmax_i(u_i·Dᵀ/τ)), whose second term takes the i-th
  dictionary entry as image i's "positive" (an arbitrary pairing: the entries belong to other clients' images).
  Rows beyond the dictionary's size get no second term.

Without a dictionary (or before the first one arrives) both are InfoNCE, ℓ_i = −log softmax_i(u_i·Wᵀ/τ), in one
direction as the authors' code computes it. A client's batch loss is the mean of ℓ_i over its real rows; padding
rows are neither anchors nor negatives, and padded dictionary entries never enter a softmax.

References:
  van den Oord et al., *Representation Learning with Contrastive Predictive Coding*, 2018 (InfoNCE).
  Zhang et al., *Federated unsupervised representation learning*, FITEE 2023 (FedCA).

Example:
  >>> u = torch.tensor([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]])   # two images, views aligned
  >>> bool(info_nce_losses(u, temperature=0.1).max() < 1e-4)
  True
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn

from trustfl.core.checks import check_number
from trustfl.core.functional import functional_call
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.objectives.base import AbstractObjective, Batch, view_pair_outputs

__all__ = ["DICTIONARY_LOSSES", "InfoNCE", "info_nce_losses", "masked_logits"]

DICTIONARY_LOSSES = ("joint", "code")
CODE_WEIGHT = 0.2
"""The dictionary term's weight in the authors' ``Client_CA`` (the batch term has 1 − 0.2)."""


def masked_logits(logits: torch.Tensor, keep: torch.Tensor, temperature: float) -> torch.Tensor:
    """Cosine logits at ``temperature`` with the entries where ``keep`` is False set to a finite value that no
    softmax can feel (e^{fill − max} underflows to 0): masked entries drop out without −inf (no NaN gradient when a
    whole row is masked)."""
    return torch.where(keep, logits, -(2.0 / temperature + 1e4))


def info_nce_losses(outputs: torch.Tensor, temperature: float = 0.1, mask: Optional[torch.Tensor] = None,
                    dictionary: Optional[torch.Tensor] = None, dictionary_mask: Optional[torch.Tensor] = None,
                    mode: str = "joint") -> torch.Tensor:
    """Per-image losses ``(B,)`` of one client's two-view projections ``outputs`` ``(B, 2, H)`` (module notes).

    Args:
      mask: ``(B,)`` real rows (default: all); padding rows get loss 0 and are no negatives.
      dictionary: ``(K, H)`` extra negatives (normalised here); ``dictionary_mask`` ``(K,)`` its real entries.
      mode: ``"joint"`` or ``"code"`` (:data:`DICTIONARY_LOSSES`).
    """
    u, w = F.normalize(outputs[:, 0], dim=-1), F.normalize(outputs[:, 1], dim=-1)
    b = u.shape[0]
    rows = torch.ones(b, dtype=torch.bool, device=u.device) if mask is None else mask.bool()
    positive = (u * w).sum(-1) / temperature
    batch_logits = masked_logits(u @ w.T / temperature, rows.unsqueeze(0), temperature)      # (B, B)
    if dictionary is None:
        losses = torch.logsumexp(batch_logits, dim=1) - positive
        return torch.where(rows, losses, 0.0)
    d = F.normalize(dictionary, dim=-1)
    valid = torch.ones(d.shape[0], dtype=torch.bool, device=d.device) if dictionary_mask is None \
        else dictionary_mask.bool()
    dict_logits = masked_logits(u @ d.T / temperature, valid.unsqueeze(0), temperature)     # (B, K)
    if mode == "joint":
        losses = torch.logsumexp(torch.cat([batch_logits, dict_logits], dim=1), dim=1) - positive
        return torch.where(rows, losses, 0.0)
    # "code": row i's target is the i-th real dictionary entry (rank i among the valid ones)
    rank = torch.cumsum(valid.long(), 0) - 1
    target = valid.unsqueeze(0) & (rank.unsqueeze(0) == torch.arange(b, device=u.device).unsqueeze(1))  # (B, K)
    has_target = target.any(1)
    dict_term = torch.logsumexp(dict_logits, dim=1) - (dict_logits * target).sum(1)
    batch_term = torch.logsumexp(batch_logits, dim=1) - positive
    mixed = (1 - CODE_WEIGHT) * batch_term + CODE_WEIGHT * torch.where(has_target, dict_term, 0.0)
    losses = torch.where(valid.any(), mixed, batch_term)   # no dictionary yet: plain InfoNCE (the authors' code)
    return torch.where(rows, losses, 0.0)


@register("objective", "info_nce")
@dataclass(frozen=True)
class InfoNCE(AbstractObjective):
    """InfoNCE on two views per image (the batch's ``views`` ``(B, 2, *input_shape)``), with the server's dictionary
    of negatives when a client statistic sends one (``personal["dictionary"]`` ``(K, H)`` and
    ``personal["dictionary_mask"]`` ``(K,)``). :meth:`forward` without views returns the projector output (the kNN
    monitor's features).

    Args:
      temperature: τ > 0 (0.1 in the authors' code).
      dictionary_loss: ``"joint"`` (the FedCA paper) or ``"code"`` (the FedSC authors' ``Client_CA``).
    """

    task: ClassVar[str] = "custom"
    reads_labels: ClassVar[bool] = False
    input_key: ClassVar[str] = "views"
    batch_coupled: ClassVar[bool] = True
    temperature: float = 0.1
    dictionary_loss: str = "joint"

    def __post_init__(self) -> None:
        check_number("temperature", self.temperature, low=0, low_open=True, finite=True)
        if self.dictionary_loss not in DICTIONARY_LOSSES:
            raise ConfigError(f"`dictionary_loss` must be one of {DICTIONARY_LOSSES}, found {self.dictionary_loss!r}.")

    def forward(self, model: nn.Module, params: Mapping[str, torch.Tensor], batch: Batch) -> torch.Tensor:
        if self.input_key not in batch:
            return functional_call(model, params, (batch["x"],))
        return view_pair_outputs("info_nce", model, params, batch, self.input_key)

    def losses(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        if outputs.dim() != 3 or outputs.shape[1] != 2:
            raise ConfigError(f"objective 'info_nce' needs the projections of two views, (B, 2, H), found shape "
                              f"{tuple(outputs.shape)}.")
        return info_nce_losses(outputs, self.temperature)

    def client_loss(self, outputs: torch.Tensor, batch: Batch, mask: torch.Tensor,
                    personal: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The mean of ℓ_i over the real rows of one client's padded batch, with its dictionary if it has one."""
        losses = info_nce_losses(outputs, self.temperature, mask, personal.get("dictionary"),
                                 personal.get("dictionary_mask"), self.dictionary_loss)
        return losses.sum() / mask.to(losses.dtype).sum().clamp(min=1)
