"""A built federation: every object one simulated experiment needs, and the state it carries between rounds."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from torch import nn

from trustfl.aggregate.base import AbstractAggregator
from trustfl.attacks.base import AbstractAttack
from trustfl.client.step_budget import AbstractStepBudget, FullWork
from trustfl.client.transforms import LocalChain
from trustfl.core.stage import Chain
from trustfl.data.datasets import Dataset
from trustfl.engine.executors import AbstractExecutor, LocalJob
from trustfl.engine.local import LocalTraining, TrainData
from trustfl.errors import MessageError
from trustfl.evaluate.base import AbstractEvaluator
from trustfl.objectives.base import AbstractObjective
from trustfl.objectives.precision import Autocast
from trustfl.privacy.accountant import LedgerBook
from trustfl.server.downlink import Downlink
from trustfl.server.optimizers import AbstractServerOptimizer
from trustfl.types import ParamLayout


class ClientRows(Sequence[torch.Tensor]):
    """Each client's example indices, stored compactly (one index array and ``n + 1`` offsets).

    ``rows[i]`` is client ``i``'s int64 indices (a view); a population of 10⁶ clients costs 8 MB of offsets.
    ``indices = None`` (:meth:`contiguous`): client ``i`` owns the rows ``offsets[i] .. offsets[i+1]`` (a generated
    population's virtual rows), and no index array is stored.
    """

    def __init__(self, indices: torch.Tensor | None, offsets: torch.Tensor) -> None:
        self.indices, self.offsets = indices, offsets
        # the offsets' own memory as NumPy: a round looks up every client's rows, a tensor index per lookup costs more
        self._bounds = offsets.numpy()

    @classmethod
    def contiguous(cls, offsets: torch.Tensor) -> "ClientRows":
        """Client ``i`` owns rows ``offsets[i] .. offsets[i+1]`` (int64 offsets, ``num_clients + 1`` of them)."""
        return cls(None, offsets)

    @classmethod
    def from_arrays(cls, arrays: Sequence[np.ndarray], num_clients: int) -> "ClientRows":
        sizes = np.zeros(num_clients, dtype=np.int64)
        sizes[:len(arrays)] = [len(a) for a in arrays]
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        flat = np.concatenate([np.asarray(a, dtype=np.int64) for a in arrays]) if len(arrays) else np.zeros(0)
        return cls(torch.as_tensor(flat, dtype=torch.long), torch.as_tensor(offsets, dtype=torch.long))

    def __len__(self) -> int:
        return int(self.offsets.numel()) - 1

    def __getitem__(self, i: int) -> torch.Tensor:  # type: ignore[override]
        if not -len(self) <= i < len(self):
            raise IndexError(f"client {i} out of range for {len(self)} clients")
        i %= len(self)
        start, stop = int(self._bounds[i]), int(self._bounds[i + 1])
        if self.indices is None:
            return torch.arange(start, stop, dtype=torch.long)
        return self.indices[start:stop]

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (self[i] for i in range(len(self)))

    def sizes(self) -> list[int]:
        return self.offsets.diff().tolist()


@dataclass
class CohortSampler:
    """Who takes part in a round: everyone, ``size`` clients uniformly without replacement, or Poisson(rate)."""

    kind: str = "all"
    size: int = 0
    rate: float = 0.0

    def sample(self, candidates: list[int], generator: torch.Generator) -> list[int]:
        if self.kind == "all" or not candidates:
            return list(candidates)
        if self.kind == "uniform":
            k = min(self.size, len(candidates))
            pick = torch.randperm(len(candidates), generator=generator)[:k]
        else:
            pick = torch.nonzero(torch.rand(len(candidates), generator=generator) < self.rate).flatten()
        return sorted(candidates[i] for i in pick.tolist())


@dataclass
class Federation:
    """The simulated parties and the server's pipeline.

    ``client_rows[i]`` are client ``i``'s training examples; the simulator holds them all, but each local update
    reads only its own client's rows. ``reports`` are per-client values the clients send beside their messages
    (``num_samples``, ``reported_epsilon``) and simulation-only oracles (``oracle_*``).
    """

    seed: int
    rounds: int
    dataset: Dataset
    model: nn.Module
    layout: ParamLayout
    initial_params: torch.Tensor
    train_data: TrainData
    client_rows: Sequence[torch.Tensor]
    batch_sizes: list[int]
    noise_multipliers: list[float]
    training: LocalTraining
    cohort: CohortSampler
    byzantine: frozenset[int]
    attack: AbstractAttack | None
    client_stages: Chain
    aggregator: AbstractAggregator
    server_stages: Chain
    server_optimizer: AbstractServerOptimizer
    executor: AbstractExecutor
    objective: AbstractObjective | None = None
    evaluators: tuple[AbstractEvaluator, ...] = ()
    local_chain: LocalChain | None = None
    downlink: Downlink = field(default_factory=Downlink)
    step_budget: AbstractStepBudget = field(default_factory=FullWork)
    test_data: dict[str, torch.Tensor] = field(default_factory=dict)
    """Held-out named tensors the evaluators read (``x``, ``y``)."""
    ledger: LedgerBook | None = None
    attack_view: Chain | None = None
    """The client stages an attack's view of honest messages goes through when it differs from the transmitted
    one (``attack.view = "noiseless"``: the client chain without its privacy-noise stages); ``None``: the
    attack sees the transmitted messages."""
    weighting: str = "num_samples"
    extras_rule: str = "mean"
    """``server.extras``: ``median`` replaces the kept clients' extras by their coordinate-wise median before the
    transforms' server halves average them."""
    attack_extras: str = "zero"
    """``attack.extras``: ``crafted`` applies an update-level attack to the honest clients' extras too."""
    reports: dict[str, torch.Tensor] = field(default_factory=dict)
    eval_every: int = 1
    eval_batch_size: int = 2048
    timing: Any = None
    """The async engine's clock settings (:class:`trustfl.engine.asynchronous.Timing`)."""
    schedule: Any = None
    """The async engine's schedule (polling, synchronous, buffered)."""
    links: Any = None
    """The compressors on the uplink and downlink (:class:`trustfl.engine.links.Links`); ``None``: float32
    messages both ways."""
    vertical: Any = None
    """The vertical engine's setup (:class:`trustfl.vertical.engine.VerticalSetup`): feature blocks, each party's
    columns, the labels, the activation order and the method."""
    info: dict[str, Any] = field(default_factory=dict)
    """JSON-serialisable facts saved with the run (partition summary, per-client budgets and noise, notices)."""
    augment: Any = None
    """The local batches' augmentation (``client.augment``, e.g. self-supervised views); ``None``: none."""
    statistics: tuple[tuple[str, Any], ...] = ()
    """Named client statistics (``client.statistics``): values the cohort computes at the received model before
    local training and uploads, whose server halves send each participant its own downlink
    (:mod:`trustfl.engine.exchange`)."""
    eval_initial: bool = False
    """Also evaluate the initial model (``engine.eval_initial``; the floor of representation metrics)."""
    compute_dtype: str = "float32"
    """``engine.dtype``: ``bfloat16`` runs local training's forward passes under autocast
    (:class:`trustfl.objectives.precision.Autocast`); evaluation and everything after local training stay float32."""

    @property
    def num_clients(self) -> int:
        return len(self.client_rows)

    def local_job(self) -> LocalJob:
        """What the executors need besides the cohort's plans and context."""
        objective = self.objective
        if self.compute_dtype == "bfloat16" and objective is not None:
            objective = Autocast(objective, torch.bfloat16)
        return LocalJob(self.model, objective, self.local_chain, self.training, self.train_data, self.augment)


@dataclass
class EngineState:
    """Everything that changes between rounds; a checkpoint is this object."""

    round: int
    params: torch.Tensor
    server_optimizer: Any
    client_stages: Any
    aggregator: Any
    server_stages: Any
    ledger: dict[str, Any] | None = None
    bytes_up_total: int = 0
    bytes_down_total: int = 0
    wall_time_s: float = 0.0
    rejected_total: int = 0
    attack_view: Any = None
    """Stage state of ``Federation.attack_view`` (e.g. the noiseless worker momentums), simulation only."""
    clients: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    """The client state store (``ClientStateStore.state_dict()``): only clients that have state."""
    shared: dict[str, Any] = field(default_factory=dict)
    """State of the gradient transforms' server halves (e.g. SCAFFOLD's server control variate)."""
    clock: dict[str, Any] = field(default_factory=dict)
    """An asynchronous engine's virtual clock and schedule state (server time, each client's last contact)."""
    statistics: dict[str, Any] = field(default_factory=dict)
    """State of the client statistics' server halves (e.g. FedSC's stored correlation matrices), by name."""


def refuse_meta_params(state: EngineState) -> None:
    """Refuse (a MessageError) a state whose ``params`` are on the meta device, where a round first reads them (one
    check a round): they have a shape but no values, and torch's own error said only a device was not expected."""
    if state.params.is_meta:
        raise MessageError(f"round {state.round + 1}: the engine state's `params` are on the meta device (a shape "
                           f"without values), so no client can train from them; start from the engine's "
                           f"initial_state(fed) or a checkpoint.")
