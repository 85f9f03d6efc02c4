"""The client state store: what each client carries between its participations, keyed by client id.

A client's entry is a mapping of named tensors (its own model for personalisation or asynchronous training, its
SCAFFOLD control variate ``c_i``, optimizer state, counters). Only clients that have state are allocated, so a
population of 10⁶ stateless clients costs an empty dict. Client code of a round sees only its own entry: the
engine gathers the rows of the round's clients, and scatters back what each client returned.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from trustfl.errors import MessageError

Entry = dict[str, torch.Tensor]


class ClientStateStore:
    """Per-client named tensors; ``state_dict()`` is what a checkpoint saves and :meth:`from_state_dict` restores.

    Example:
      >>> store = ClientStateStore()
      >>> store = store.scatter([3, 7], {"c": torch.tensor([[1.0], [2.0]])})
      >>> store.gather([7, 5], {"c": torch.zeros(1)})["c"].tolist()
      [[2.0], [0.0]]
      >>> len(store)
      2
    """

    def __init__(self, entries: Mapping[int, Entry] | None = None) -> None:
        self._entries: dict[int, Entry] = dict(entries or {})

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, client_id: int) -> bool:
        return client_id in self._entries

    def entry(self, client_id: int) -> Mapping[str, torch.Tensor]:
        """Client ``client_id``'s entry (empty if it has none yet)."""
        return dict(self._entries.get(client_id, {}))

    def gather(self, client_ids: Sequence[int], defaults: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Stack ``(m, ...)`` the entries ``defaults`` names for ``client_ids``; a client without one gets the
        default (the state of a client that has not taken part yet)."""
        out: dict[str, torch.Tensor] = {}
        for key, default in defaults.items():
            rows = []
            for cid in client_ids:
                value = self._entries.get(cid, {}).get(key, default)
                if value.shape != default.shape:
                    raise MessageError(f"client {cid}'s state {key!r} has shape {tuple(value.shape)}, expected "
                                       f"{tuple(default.shape)}.")
                rows.append(value)
            out[key] = torch.stack(rows) if rows else default.new_zeros((0, *default.shape))
        return out

    def scatter(self, client_ids: Sequence[int], values: Mapping[str, torch.Tensor]) -> "ClientStateStore":
        """A new store in which row ``i`` of every value is client ``client_ids[i]``'s new entry for that key."""
        if not values:
            return self
        entries = dict(self._entries)
        for i, cid in enumerate(client_ids):
            entry = dict(entries.get(cid, {}))
            for key, stacked in values.items():
                entry[key] = stacked[i].detach().clone()
            entries[cid] = entry
        return ClientStateStore(entries)

    def nbytes(self) -> int:
        """Bytes held by all entries."""
        return sum(t.numel() * t.element_size() for e in self._entries.values() for t in e.values())

    def state_dict(self) -> dict[int, Entry]:
        return {cid: dict(entry) for cid, entry in self._entries.items()}

    @classmethod
    def from_state_dict(cls, data: Mapping[int, Entry] | None) -> "ClientStateStore":
        return cls({int(k): dict(v) for k, v in (data or {}).items()})
