"""Shared types: parameter layouts, contexts and stage outputs (frozen dataclasses)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from trustfl.core.rng import SERVER, make_generator

Params = dict[str, torch.Tensor]
"""Named model parameters, in the model's ``named_parameters()`` order."""

Metrics = Mapping[str, float]


@dataclass(frozen=True)
class ParamLayout:
    """How named parameters map onto one flat vector (the wire format of every message).

    Flattening follows ``names`` order, so row ``i`` of a message matrix always means the same coordinates.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, params: Mapping[str, torch.Tensor]) -> "ParamLayout":
        return cls(tuple(params), tuple(tuple(p.shape) for p in params.values()))

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    def flatten(self, params: Mapping[str, torch.Tensor], batch_dims: int = 0) -> torch.Tensor:
        """Concatenate params into ``(*batch, numel)``; ``batch_dims`` leading dims are kept (stacked clients)."""
        parts = [params[n].reshape(*params[n].shape[:batch_dims], -1) for n in self.names]
        return torch.cat(parts, dim=-1)

    def unflatten(self, flat: torch.Tensor) -> Params:
        """Inverse of :meth:`flatten`; views into ``flat`` (leading batch dims are kept)."""
        batch = flat.shape[:-1]
        out: Params = {}
        offset = 0
        for name, shape in zip(self.names, self.shapes):
            size = math.prod(shape)
            out[name] = flat[..., offset:offset + size].reshape(*batch, *shape)
            offset += size
        return out


@dataclass(frozen=True)
class RoundContext:
    """What a stage may know about the round it runs in.

    Row ``i`` of the message matrix a stage receives belongs to ``client_ids[i]``. Client-side stages must
    compute row ``i`` from row ``i``, client ``i``'s state and client ``i``'s generator only.
    """

    round: int
    seed: int
    client_ids: tuple[int, ...]
    weights: torch.Tensor | None = None
    num_byzantine: int = 0
    num_clients: int = 0
    reports: Mapping[str, torch.Tensor] = field(default_factory=dict)
    """Per-row values the clients sent beside their messages (e.g. ``num_samples``, ``reported_epsilon``), and,
    in simulation only, oracle values under names starting with ``oracle_`` (e.g. ``oracle_noise_variance``)."""
    pair_keys: Any = None
    """A deployed client's own key pairs and the relayed public-key directory, ``({id: ClientKeys}, directory)``,
    for pairwise-seeded noise; ``None``: the simulator derives every client's keys from ``seed``."""

    def generator(self, stage: str, client: int = SERVER, device: torch.device | str = "cpu") -> torch.Generator:
        """The generator of ``stage`` for ``client`` (default: the server) in this round, on ``device`` (that of
        the data it draws for; the same seed on every device, but each device type has its own stream)."""
        return make_generator(self.seed, self.round, client, stage, device=device)

    def with_rows(self, client_ids: tuple[int, ...], weights: torch.Tensor | None) -> "RoundContext":
        """The same round with rows that no longer belong to clients (e.g. buckets): reports are dropped."""
        return RoundContext(self.round, self.seed, client_ids, weights, self.num_byzantine, self.num_clients)

    def select(self, rows: torch.Tensor) -> "RoundContext":
        """The same round restricted to the given row indices (e.g. after rejecting invalid messages)."""
        idx = rows.tolist()
        return RoundContext(self.round, self.seed, tuple(self.client_ids[i] for i in idx),
                            None if self.weights is None else self.weights[rows], self.num_byzantine,
                            self.num_clients, {k: v[rows] for k, v in self.reports.items()})


@dataclass(frozen=True)
class ClientContext:
    """What a client knows when it trains: who it is, the round, its data size and the run seed."""

    client_id: int
    round: int
    seed: int
    num_samples: int

    def generator(self, stage: str) -> torch.Generator:
        return make_generator(self.seed, self.round, self.client_id, stage)


PrivacyEvent = tuple[int, Any]
"""``(client_id, dp_accounting.DpEvent)``: a DP event charged to one client's ledger."""


@dataclass(frozen=True)
class StageOut:
    """The result of one stage application: new value, new state, metrics and DP events."""

    x: torch.Tensor
    state: Any = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    events: tuple[PrivacyEvent, ...] = ()


@dataclass(frozen=True)
class CohortContext:
    """What local-training parts (gradient methods, gradient transforms) may know about the clients training
    together in one call; row ``i`` of every tensor belongs to ``client_ids[i]`` and is computed from it alone.

    Attributes:
      client_ids: the clients, one per row.
      round, seed: the round and the run seed (generators derive from them).
      lr: the local learning rate ``η_l``.
      batch_sizes: ``(m,)`` expected batch sizes ``E|S_i|``.
      noise_multipliers: ``(m,)`` sample-level noise multipliers ``z_i`` (0 without DP-SGD).
      received: what the server sent, decoded: ``"model"`` (the global parameters, unstacked) and any shared
        statistics of the gradient transforms (e.g. SCAFFOLD's ``"scaffold/c"``), flat.
      client_state: each client's own entries from the client state store, stacked ``(m, ...)``.
      layout: the parameters' flat layout.
      personal: what the server sent each client alone, stacked ``(m, ...)`` (row ``i`` went to client ``i``
        only; e.g. FedSC's R̃_{−j} from a client statistic's server half); empty for most algorithms.
    """

    client_ids: tuple[int, ...]
    round: int
    seed: int
    lr: float
    batch_sizes: torch.Tensor
    noise_multipliers: torch.Tensor
    received: Mapping[str, torch.Tensor]
    client_state: Mapping[str, torch.Tensor]
    layout: ParamLayout
    personal: Mapping[str, torch.Tensor] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.client_ids)

    @property
    def device(self) -> torch.device:
        """Where the clients train: the device of the received model."""
        return self.received["model"].device

    def generator(self, row: int, stage: str) -> torch.Generator:
        """The generator of ``stage`` for the client of row ``row`` in this round, on :attr:`device`."""
        return make_generator(self.seed, self.round, self.client_ids[row], stage, device=self.device)

    def select(self, start: int, stop: int) -> "CohortContext":
        """Rows ``start:stop`` (a group of a cohort split for memory)."""
        return CohortContext(self.client_ids[start:stop], self.round, self.seed, self.lr,
                             self.batch_sizes[start:stop], self.noise_multipliers[start:stop], self.received,
                             {k: v[start:stop] for k, v in self.client_state.items()}, self.layout,
                             {k: v[start:stop] for k, v in self.personal.items()})
