"""FedCA's dictionary module as one client statistic: per-sample representations shared as negatives.

Client half, at the received model before local training: every sample x̄ of the client gets the mean projector
output of V augmented views (V = 2, from the client's ``"<name>/views"`` stream), e_x̄ = (1/V) Σ_v z(x_v).

Server half: the store of every client's entries. An uploaded entry replaces a sample's stored one as
d ← normalise(β·d_old + (1 − β)·e) (β = ``ema``, 0.5 in the FedSC authors' ``Client_CA``; a client's first upload
is d ← normalise(e)); the server does the moving average a client would do on its own dictionary, with the same
result, since the stored entry is the one the client last sent. Each participant then receives the dictionary of
the *other* clients' entries (``"dictionary"`` ``(K, H)`` with ``"dictionary_mask"`` ``(K,)``: K = J·N_max slots,
padding and the client's own slots masked), which the ``info_nce`` objective uses as extra negatives.

Who uploads: the round's cohort (every participant, every round). Privacy: none. The entries are the clients'
per-sample representations, sent in the clear (the FedSC paper lists this as FedCA's leakage); this statistic
charges no DP event, and a run that needs protection should not use it. Bytes down count every slot sent, padding
included.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F

from trustfl.client.statistics import AbstractClientStatistic
from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.selfsup.views import view_representations

__all__ = ["FedCADictionary"]


@register("client_statistic", "fedca_dictionary")
@dataclass(frozen=True)
class FedCADictionary(AbstractClientStatistic):
    """Per-sample representations uploaded by the participants, shared as the others' negatives (module notes).

    Args:
      views: V >= 1 views averaged per sample (2 in the authors' code).
      ema: β in [0, 1), the weight of a sample's previous entry.
      chunk: samples per client per forward pass (bounds memory).
    """

    views: int = 2
    ema: float = 0.5
    chunk: int = 256

    def __post_init__(self) -> None:
        check_number("views", self.views, integer=True, low=1)
        check_number("ema", self.ema, low=0, high=1, high_open=True)
        check_number("chunk", self.chunk, integer=True, low=1)

    # -- server half -----------------------------------------------------------------------------------------
    def server_init(self, sizes: Sequence[int]) -> dict[str, Any]:
        return {"sizes": torch.tensor([int(s) for s in sizes], dtype=torch.long), "entries": None,
                "filled": torch.zeros(len(sizes), dtype=torch.bool)}

    def uploaders(self, round, cohort, state, num_clients):
        return list(cohort)

    def server_update(self, state, client_ids, values):
        sizes = state["sizes"]
        longest = max(int(sizes.max()), 1) if sizes.numel() else 1
        entries = state["entries"]
        if entries is None:
            entries = values.new_zeros((sizes.numel(), longest, values.shape[-1]))
        ids = torch.as_tensor(list(client_ids), dtype=torch.long)
        new = values.new_zeros((len(ids), longest, values.shape[-1]))
        new[:, :values.shape[1]] = values[:, :longest]
        filled = state["filled"].clone()
        old = entries[ids.to(entries.device)]
        seen = filled[ids].to(values.device).view(-1, 1, 1)
        mixed = torch.where(seen, self.ema * old + (1 - self.ema) * new, new)
        real = (torch.arange(longest).unsqueeze(0) < sizes[ids].unsqueeze(1)).to(values.device).unsqueeze(-1)
        entries = entries.clone()
        entries[ids.to(entries.device)] = torch.where(real, F.normalize(mixed, dim=-1), 0.0)
        filled[ids] = True
        return {"sizes": sizes, "entries": entries, "filled": filled}

    def personal(self, state, round, client_ids):
        entries = state["entries"]
        if entries is None or not client_ids:
            return {}
        j, longest, h = entries.shape
        real = (torch.arange(longest).unsqueeze(0) < state["sizes"].unsqueeze(1)) & state["filled"].unsqueeze(1)
        owner = torch.arange(j).unsqueeze(1).expand(j, longest).reshape(-1)
        ids = torch.as_tensor(list(client_ids), dtype=torch.long)
        mask = real.reshape(1, -1) & (owner.unsqueeze(0) != ids.unsqueeze(1))                 # (m, K)
        m = len(client_ids)
        return {"dictionary": entries.reshape(1, j * longest, h).expand(m, -1, -1),
                "dictionary_mask": mask.to(entries.device)}

    # -- client half -----------------------------------------------------------------------------------------
    def compute(self, represent, x, mask, client_ids, generator, augment=None):
        views_gen = [generator(c, "views") for c in client_ids]
        values = torch.cat([z.mean(2) for _, z in view_representations(represent, x, self.views, views_gen,
                                                                      augment, self.chunk)], dim=1)
        return torch.where(mask.unsqueeze(-1), values, 0.0)   # padding rows carry nothing


def dictionary_of(state: Mapping[str, Any], client: int) -> torch.Tensor:
    """Client ``client``'s stored entries ``(|D_client|, H)`` (for inspection and tests)."""
    return state["entries"][client, :int(state["sizes"][client])]
