"""torchrun execution: one simulated federation split across processes (``torch.distributed``).

``torchrun --nproc_per_node=N -m trustfl run CONFIG`` starts N processes (ranks). Every rank builds the same
federation from the same config and runs the same rounds; only the clients' local training is split:

- rank ``k`` trains a contiguous slice of the round's cohort (rows ``⌊k·m/N⌋ … ⌊(k+1)·m/N⌋``), vectorized on its
  own device with the configured executor (:class:`DistributedExecutor` wraps it);
- the ranks all-gather what the server needs, in cohort row order: every client's message ``(m, d)``, local
  loss, step count, new client-state entries and extras (slices of unequal size are padded to the largest and
  trimmed);
- everything after local training (client stages, attacks, screening, aggregation, server stages, the server
  optimizer, ledgers) then runs on every rank on identical inputs with the same (seed, round, client, stage)
  generators, so every rank holds the same new state without a broadcast. A cheap guard checks it: each round
  the ranks compare a digest of the model they start from (and the cohort) and raise
  :class:`~trustfl.errors.DistributedError` if they differ.

Every draw is keyed by (seed, round, client, stage), never by execution order, so the split run equals the
single-process run to floating-point error (the vectorized computation of a smaller slice may round
differently). Only rank 0 writes the run directory and shows progress (``trustfl/experiment.py``).

Backends: ``gloo`` on CPU; on a machine with CUDA, ``cpu:gloo,cuda:nccl`` (tensors on a GPU go through NCCL,
small Python objects through gloo) and rank ``k`` uses ``cuda:LOCAL_RANK``.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import torch

from trustfl.engine.executors import AbstractExecutor, ClientResults, LocalJob, check_start
from trustfl.engine.local import ClientPlan
from trustfl.errors import DistributedError
from trustfl.types import CohortContext

_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK")


@dataclass(frozen=True)
class Ranks:
    """This process's place in a torchrun job.

    Attributes:
      rank: this process's rank, ``0 ≤ rank < world_size`` (rank 0 writes the run directory).
      world_size: the number of processes.
      local_rank: the rank on this machine (selects ``cuda:local_rank``).
    """

    rank: int
    world_size: int
    local_rank: int

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size or self.local_rank < 0:
            raise DistributedError(f"torchrun environment: RANK must be in [0, WORLD_SIZE) and LOCAL_RANK >= 0, "
                                   f"found RANK={self.rank}, WORLD_SIZE={self.world_size}, "
                                   f"LOCAL_RANK={self.local_rank}.")

    @property
    def main(self) -> bool:
        """Whether this is rank 0, the one that writes."""
        return self.rank == 0


def ranks_from_env(environ: Mapping[str, str] | None = None) -> Ranks | None:
    """The torchrun placement from ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK``; ``None`` for a single process
    (``WORLD_SIZE`` unset or 1).

    Raises:
      DistributedError: a variable is not an integer or out of range.
    """
    env = os.environ if environ is None else environ
    if env.get("WORLD_SIZE", "").strip() in ("", "1"):
        return None
    try:
        world, rank = int(env["WORLD_SIZE"]), int(env.get("RANK", ""))
        local = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError:
        shown = ", ".join(f"{k}={env.get(k)!r}" for k in _ENV)
        raise DistributedError(f"torchrun environment: WORLD_SIZE, RANK and LOCAL_RANK must be integers, found "
                               f"{shown}.") from None
    return Ranks(rank, world, local)


def backend() -> str:
    """``cpu:gloo,cuda:nccl`` where CUDA is available (a run may put its tensors on either), else ``gloo``."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


@contextlib.contextmanager
def session(ranks: Ranks | None) -> Iterator[Ranks | None]:
    """Join the torchrun job's process group for the duration of a run (nothing for a single process).

    Binds ``cuda:LOCAL_RANK`` as this process's CUDA device where there is one, initialises the default group
    (``env://``: torchrun's ``MASTER_ADDR``/``MASTER_PORT``) unless the caller already did, and destroys the group
    on exit if it created it.

    Raises:
      DistributedError: an existing process group has another world size than ``WORLD_SIZE``.
    """
    if ranks is None:
        yield None
        return
    import torch.distributed as dist

    if torch.cuda.is_available() and ranks.local_rank < torch.cuda.device_count():
        torch.cuda.set_device(ranks.local_rank)
    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group(backend())
    elif dist.get_world_size() != ranks.world_size or dist.get_rank() != ranks.rank:
        raise DistributedError(f"a process group of world size {dist.get_world_size()} (rank {dist.get_rank()}) "
                               f"is already initialised, but WORLD_SIZE={ranks.world_size}, RANK={ranks.rank}.")
    try:
        yield ranks
    finally:
        if owned and dist.is_initialized():
            dist.destroy_process_group()


def share(m: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s rows ``[lo, hi)`` of ``m``: contiguous, sizes differing by at most one (possibly empty).

    >>> [share(5, k, 2) for k in range(2)]
    [(0, 2), (2, 5)]
    """
    return rank * m // world_size, (rank + 1) * m // world_size


def digest(*parts: Any) -> str:
    """A short SHA-256 of tensors (their bytes, dtype and shape) and plain values, to compare across ranks."""
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, torch.Tensor):
            t = p.detach().to("cpu").contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(repr(p).encode())
    return h.hexdigest()[:16]


def _layout(t: torch.Tensor) -> tuple[tuple[int, ...], str]:
    return tuple(t.shape[1:]), str(t.dtype).removeprefix("torch.")


def _gather_rows(local: torch.Tensor | None, counts: list[int], shape: tuple[int, ...], dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """All-gather each rank's ``(counts[k], *shape)`` rows into one ``(Σ counts, *shape)`` tensor, rank order."""
    import torch.distributed as dist

    widest = max(counts)
    padded = torch.zeros((widest, *shape), dtype=dtype, device=device)
    if local is not None and local.shape[0]:
        padded[:local.shape[0]] = local.to(device)
    parts = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(parts, padded)
    return torch.cat([p[:c] for p, c in zip(parts, counts)])


def gather_results(local: ClientResults, check: str, device: torch.device) -> ClientResults:
    """Every rank's slice of the cohort's results, concatenated in rank (= cohort row) order, on every rank.

    Small parts (row counts, step counts, the tensors' shapes and the ranks' ``check`` digests) travel as one
    object all-gather; the tensors as padded tensor all-gathers.

    Raises:
      DistributedError: the ranks' ``check`` digests differ (they no longer run the same federation state).
    """
    import torch.distributed as dist

    meta = {"rows": int(local.updates.shape[0]), "num_steps": list(local.num_steps), "check": check,
            "updates": _layout(local.updates), "train_loss": _layout(local.train_loss),
            "client_state": {k: _layout(v) for k, v in local.client_state.items()},
            "extras": {k: _layout(v) for k, v in local.extras.items()}}
    metas: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(metas, meta)
    checks = [m["check"] for m in metas]
    if len(set(checks)) > 1:
        raise DistributedError(f"torchrun ranks diverged: they start this round from different states (digests "
                               f"{checks}); a non-deterministic kernel in a server-side stage (e.g. on a GPU) or "
                               f"a config that differs between ranks can cause it. Run with the same config and "
                               f"`torch.use_deterministic_algorithms(True)`, or in one process.")
    counts = [m["rows"] for m in metas]
    ref = next((m for m in metas if m["rows"]), metas[0])  # an empty slice's dicts have no keys

    def gather(name: str, key: str | None, value: torch.Tensor | None) -> torch.Tensor:
        shape, dtype = ref[name] if key is None else ref[name][key]
        return _gather_rows(value, counts, shape, getattr(torch, dtype), device)

    return ClientResults(
        gather("updates", None, local.updates), gather("train_loss", None, local.train_loss),
        [s for m in metas for s in m["num_steps"]],
        {k: gather("client_state", k, local.client_state.get(k)) for k in ref["client_state"]},
        {k: gather("extras", k, local.extras.get(k)) for k in ref["extras"]})


@dataclass(frozen=True)
class DistributedExecutor(AbstractExecutor):
    """Runs this rank's slice of the cohort with ``inner`` and all-gathers every rank's results.

    Every rank calls :meth:`run` with the whole cohort (the same plans, context and starts); rank ``k`` trains
    rows :func:`share` ``(m, k, world_size)`` and returns the results of all ``m`` clients, in row order, equal
    on every rank.

    Args:
      inner: the configured executor (vectorized or sequential) that trains the slice.
      ranks: this process's place in the job.
    """

    inner: AbstractExecutor
    ranks: Ranks

    def run(self, job: LocalJob, plans: Sequence[ClientPlan], cohort: CohortContext,
            start: torch.Tensor | None = None) -> ClientResults:
        check_start(start, len(plans), cohort.layout.numel)
        lo, hi = share(len(plans), self.ranks.rank, self.ranks.world_size)
        part = None if start is None else start[lo:hi]
        local = self.inner.run(job, plans[lo:hi], cohort.select(lo, hi), part)
        check = digest(cohort.round, cohort.client_ids, cohort.received["model"])
        return gather_results(local, check, cohort.device)


def check_same(ranks: Ranks | None, *parts: Any) -> None:
    """Raise :class:`DistributedError` unless every rank passes equal ``parts`` (compared by :func:`digest`)."""
    if ranks is None:
        return
    import torch.distributed as dist

    mine = digest(*parts)
    every: list[Any] = [None] * ranks.world_size
    dist.all_gather_object(every, mine)
    if len(set(every)) > 1:
        raise DistributedError(f"torchrun ranks ended with different models (digests {every}); a non-deterministic "
                               f"kernel in a server-side stage can cause it: run in one process.")


def from_main(ranks: Ranks | None, value: Any) -> Any:
    """Rank 0's ``value`` on every rank (a picklable object); ``value`` itself for a single process."""
    if ranks is None:
        return value
    import torch.distributed as dist

    box = [value if ranks.main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
