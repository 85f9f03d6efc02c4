"""Executors run the local training of a cohort: all at once (vectorized, the default) or one client at a time.

Both run the same local chain (gradient method → gradient transforms → local optimizer) on the same batches with
the same generators, so they agree to floating-point error; neither knows which parts the chain holds. The
vectorized executor stacks the clients' parameters and runs every local step of the whole cohort as one batched
computation (``torch.func.vmap`` over clients inside the gradient methods); clients with fewer steps or smaller
batches are masked (a masked step leaves parameters and transform state untouched). It is an execution detail:
row ``i`` of every batched tensor is computed from client ``i``'s data, state and generators only.

Each client starts from its own parameters when it has them (``start``, flat ``(m, d)``), else from the
received model, or where a personalizing gradient transform puts it (FedU, FedEMA); the update is the progress
``θ_local − θ_start`` (``θ_received`` unless ``start`` is given). An objective with local state (BYOL's target
network) gets it initialised from the starting parameters and updated after every step.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from trustfl.client.gradients import PerExampleClipped
from trustfl.client.transforms import LocalChain
from trustfl.core import memory
from trustfl.core.registry import register
from trustfl.engine import chunking
from trustfl.engine.local import ClientPlan, LocalTraining, TrainData, batch_matrix
from trustfl.errors import ConfigError
from trustfl.objectives.base import AbstractObjective
from trustfl.types import CohortContext, Params


@dataclass
class ClientResults:
    """What the cohort returns: flat messages ``(m, d)``, training statistics, new client state and extras."""

    updates: torch.Tensor
    train_loss: torch.Tensor
    num_steps: list[int] = field(default_factory=list)
    client_state: dict[str, torch.Tensor] = field(default_factory=dict)
    """New client-state-store entries, stacked ``(m, ...)`` (row ``i``: client ``i``)."""
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    """Values sent beside the message, stacked ``(m, k)`` (e.g. SCAFFOLD's ``Δc_i``)."""


@dataclass(frozen=True)
class LocalJob:
    """Everything a cohort's local training needs besides the clients' plans and context."""

    model: nn.Module
    objective: AbstractObjective
    chain: LocalChain
    training: LocalTraining
    data: TrainData
    augment: Any = None
    """Maps every gathered batch to an augmented one with the clients' own generators (``init(cohort) -> state``,
    ``apply(batch, state) -> batch``; :class:`trustfl.selfsup.views.CohortViews`); ``None``: batches as gathered."""


class AbstractExecutor(abc.ABC):
    @abc.abstractmethod
    def run(self, job: LocalJob, plans: Sequence[ClientPlan], cohort: CohortContext,
            start: torch.Tensor | None = None) -> ClientResults:
        """Run every planned client's local training.

        Args:
          job: model, objective, local chain, schedule and data.
          plans: one per client, row order of ``cohort``.
          cohort: the clients' context (``cohort.received["model"]`` is the flat received model).
          start: ``(m, d)`` flat per-client starting parameters (read, never written); ``None``: every client
            starts from the received model.
        """


def _concat(parts: list[ClientResults], updates: torch.Tensor) -> ClientResults:
    """The groups' results as the cohort's, in client order; ``updates`` already holds every group's messages."""
    keys_state = parts[0].client_state.keys()
    keys_extra = parts[0].extras.keys()
    return ClientResults(updates, torch.cat([p.train_loss for p in parts]),
                         [s for p in parts for s in p.num_steps],
                         {k: torch.cat([p.client_state[k] for p in parts]) for k in keys_state},
                         {k: torch.cat([p.extras[k] for p in parts]) for k in keys_extra})


def run_group(job: LocalJob, plans: Sequence[ClientPlan], cohort: CohortContext,
              start: torch.Tensor | None) -> ClientResults:
    """Local training of ``plans`` as one stacked computation (the core of both executors)."""
    m = len(plans)
    layout = cohort.layout
    received = cohort.received["model"]
    device = cohort.device
    schedules = [batch_matrix(job.training, p, cohort.seed, cohort.round) for p in plans]
    num_steps = [int(x.shape[0]) for x in schedules]
    total_steps = max(num_steps, default=0)
    # (steps, m, widest) positions into each client's own rows, -1 pads: one copy per client, not per batch
    widest = max((int(x.shape[1]) for x in schedules if x.shape[0]), default=1)
    if m and all(x.shape == (total_steps, widest) for x in schedules):
        pos = torch.stack(schedules, 1)
    else:
        pos = torch.full((total_steps, m, widest), -1, dtype=torch.long)
        for i, x in enumerate(schedules):
            pos[:x.shape[0], i, :x.shape[1]] = x
    sizes = (pos >= 0).sum(2)  # (steps, m) examples per batch, 0 where a client has no step (on the CPU, host-known)
    # The group's data and each client's rows into it: dense data as they are, a generated population's clients
    # materialised here, once per group (memory follows the cohort, not the population).
    data, rows = job.data.for_cohort([p.rows for p in plans], device)
    job = replace(job, data=data)
    longest = max(int(r.numel()) for r in rows) or 1
    # (m, longest) each client's rows, 0 pads (a last all-zero row of the full width keeps one column if all are empty)
    own_rows = torch.nn.utils.rnn.pad_sequence([*rows, torch.zeros(longest, dtype=torch.long)], batch_first=True)[:m]
    pos, own_rows = pos.to(device), own_rows.to(device)  # schedules are drawn on the CPU, indices live with the data
    # Which rows step, known from the schedules before any computation (no host sync inside the loop): every
    # scheduled step counts for a method that steps on empty batches (DP-SGD), only non-empty ones otherwise.
    has_step = torch.arange(total_steps).unsqueeze(1) < torch.tensor(num_steps).unsqueeze(0)  # (steps, m)
    if job.chain.method.skips_empty_batches:
        has_step &= sizes > 0
    everyone = has_step.all(1)
    # Steps at which no client's batch is padded (host-known): the gradient method may skip the mask arithmetic.
    full = (everyone & (sizes == widest).all(1)).tolist()
    everyone = everyone.tolist()
    host_steps, has_step = has_step, has_step.to(device)
    flip: torch.Tensor | bool = torch.tensor([p.flip_labels for p in plans], device=device) \
        if any(p.flip_labels for p in plans) else False

    owned = True  # params are this group's own tensors (else views of the received model, copied before a step)
    if start is None and job.chain.personalizes:  # FedU / FedEMA: each client mixes the global with its own model
        params = {k: v.clone() for k, v in layout.unflatten(job.chain.personalize(received, cohort)).items()}
    elif start is None:  # the received model broadcast, no copy: the first step only reads it (see _like_gradients)
        params = {k: v.detach().unsqueeze(0).expand(m, *v.shape) for k, v in layout.unflatten(received).items()}
        owned = False
    elif job.chain.personalizes:
        raise ConfigError(f"`client.transforms`: {[n for n, t in job.chain.transforms if t.personalizes]} choose "
                          f"where a client starts each round, but this engine's clients continue from their own "
                          f"models; use `engine.kind = \"sync\"`.")
    else:  # views of the clients' own starts, which the first step only reads; _like_gradients copies them once
        params = {k: v.detach() for k, v in layout.unflatten(start).items()}
        owned = False
    # Where each client started, flat: the received model broadcast or the clients' own starts (no copy).
    start_flat = received.unsqueeze(0).expand(m, -1) if start is None else start
    chain, method = job.chain, job.chain.method
    states = None  # initialised after the first gradient, once the parameters have the gradients' layout
    loss_sum = torch.zeros(m, dtype=torch.float64, device=device)
    masks = pos >= 0  # (steps, m, widest), and every step's rows into the data, computed once
    all_rows = torch.gather(own_rows.expand(total_steps, m, longest), 2, pos.clamp(min=0))
    augment_state = None if job.augment is None else job.augment.init(cohort)
    local = job.objective.local_state_init(params, cohort)  # e.g. BYOL's target network, read through `personal`
    fused = None
    for s in range(total_steps):
        batch = job.data.gather(all_rows[s], flip)
        if job.augment is not None:
            batch = job.augment.apply(batch, augment_state)
        step_cohort = replace(cohort, personal={**cohort.personal, **local}) if local else cohort
        active = None if everyone[s] else has_step[s]
        if s == 0 and not local:  # plain SGD fused into the gradient's products, decided once per group
            fused = chain.fused_sgd(job.model, job.objective, params, batch)
            if fused is not None:
                params, owned = fused.own(params, copy=not owned), True
        if fused is not None:
            # the rows that sit a partial step out, as indices: known on the host, moved to the data's device
            idle = None if everyone[s] else torch.nonzero(~host_steps[s]).flatten().to(device)
            losses = fused.step(params, batch, masks[s], idle)
            loss_sum += losses.double() if everyone[s] else torch.where(has_step[s], losses.double(), 0.0)
            continue
        grads, losses = method.compute(job.model, job.objective, params, batch, masks[s], step_cohort, full[s])
        if states is None:
            params = _like_gradients(params, grads, owned)
            states = chain.init(params, cohort)
        if everyone[s]:
            loss_sum += losses.detach().double()
        else:
            loss_sum += torch.where(has_step[s], losses.detach().double(), 0.0)
        with torch.no_grad():
            chain.step(grads, states, params, active)
            if local:
                local = job.objective.local_state_update(local, params, active, batch, masks[s])
    if states is None:
        params = _like_gradients(params, {}, owned)
        states = chain.init(params, cohort)
    steps_t = torch.tensor(num_steps, dtype=torch.float64, device=device)
    if chain.transforms:
        end_flat = layout.flatten(params, batch_dims=1)
        client_state, extras = chain.finish(states, start_flat, end_flat, steps_t)
        updates = end_flat - start_flat  # each client's progress from where it started (the received model by default)
    else:  # nothing reads the end point: the same differences, written straight into the flat messages
        client_state, extras = {}, {}
        updates = torch.empty_like(start_flat, memory_format=torch.contiguous_format)
        for out, end, begin in zip(layout.unflatten(updates).values(), (params[n] for n in layout.names),
                                   layout.unflatten(start_flat).values()):
            torch.sub(end, begin, out=out)
    return ClientResults(updates, (loss_sum / steps_t.clamp(min=1)).float(), num_steps, client_state, extras)


def _like_gradients(params: dict[str, torch.Tensor], grads: Mapping[str, torch.Tensor],
                    owned: bool) -> dict[str, torch.Tensor]:
    """``params`` copied into the memory layout of their gradients where the two differ (same values).

    Batched linear layers return weight gradients transposed in memory (``(m, in, out)`` storage for an
    ``(m, out, in)`` weight). An in-place update of a row-major parameter by such a gradient walks one of the two
    against its storage order, which costs several times a streaming update on the CPU (the whole stacked model
    is read and written every local step); once the parameters share the gradients' layout, the SGD step, the
    momentum and every gradient transform stream through both. Done once per round, before the first step.

    ``owned`` False: ``params`` are still the received model broadcast over the clients (views of it, which the
    first step only reads); every client's own copy is written here, once, in its gradient's layout.
    """
    out = {}
    for name, p in params.items():
        g = grads.get(name)
        if g is None or g.shape != p.shape:
            out[name] = p if owned else p.clone(memory_format=torch.contiguous_format)
            continue
        if g.stride() == p.stride() and owned:
            out[name] = p
            continue
        like = torch.empty_like(g, dtype=p.dtype)  # the gradient's strides when they are dense, else row-major
        out[name] = p if like.stride() == p.stride() and owned else like.copy_(p)
    return out


def check_start(start: Any, m: int, d: int) -> None:
    """Refuse starting points that are not the clients' flat ``(m, d)`` parameters (``None`` passes)."""
    if start is not None and (not isinstance(start, torch.Tensor) or tuple(start.shape) != (m, d)):
        found = tuple(start.shape) if isinstance(start, torch.Tensor) else type(start).__name__
        raise ConfigError(f"an executor's `start` must be the {m} clients' flat starting parameters, a ({m}, {d}) "
                          f"tensor; found {found}.")


def _groups(job: LocalJob, plans: Sequence[ClientPlan], cohort: CohortContext,
            start: torch.Tensor | None, size: int) -> ClientResults:
    check_start(start, len(plans), cohort.layout.numel)
    if not plans:
        received = cohort.received["model"]
        extras = {k: received.new_zeros((0, w)) for k, w in job.chain.extras_widths(cohort.layout).items()}
        return ClientResults(received.new_zeros((0, received.numel())), received.new_zeros(0), [], {}, extras)
    m = len(plans)
    if size >= m:
        return run_group(job, plans, cohort, start)
    parts, updates = [], None
    for i in range(0, m, size):
        group_start = None if start is None else start[i:i + size]
        part = run_group(job, plans[i:i + size], cohort.select(i, i + size), group_start)
        if updates is None:  # the cohort's (m, d) messages are written once, not held twice by a concatenation
            updates = part.updates.new_empty((m, part.updates.shape[1]))
        updates[i:i + size] = part.updates
        parts.append(replace(part, updates=updates[i:i + size]))  # the group's own buffer is released here
    return _concat(parts, updates)


@register("executor", "vectorized")
class VectorizedExecutor(AbstractExecutor):
    """All clients of a cohort in one batched computation (stacked parameters, vmap over clients).

    Args:
      max_clients_per_batch: split larger cohorts into groups of at most this many clients (bounds memory);
        0 runs the whole cohort at once; ``"auto"``: the largest group whose estimated memory fits in the free
        memory of the run's device (:mod:`trustfl.engine.chunking`).
    """

    def __init__(self, max_clients_per_batch: int | str = 0) -> None:
        if max_clients_per_batch != "auto" and (isinstance(max_clients_per_batch, bool)
                                                or not isinstance(max_clients_per_batch, int)
                                                or max_clients_per_batch < 0):
            raise ConfigError(f"`max_clients_per_batch` must be an integer >= 0 or \"auto\", found "
                              f"{max_clients_per_batch!r}.")
        self.max_clients_per_batch = max_clients_per_batch
        self._per_client: dict[tuple[int, int], tuple[int, int]] = {}  # (id of the model, widest batch) -> (bytes,
        # activation bytes) of one client, for "auto"

    def group_size(self, job: LocalJob, plans: Sequence[ClientPlan], cohort: CohortContext) -> int:
        """How many clients one batched computation trains (the whole cohort unless a limit applies)."""
        m = max(len(plans), 1)
        if self.max_clients_per_batch != "auto":
            group = min(self.max_clients_per_batch or m, m)
            chunking.refuse_group_beyond_free(m, group, cohort.received["model"].numel(), cohort.device)
            return group
        with_rows = [p for p in plans if p.rows.numel()]
        if not with_rows:
            return m
        batch = max(p.batch_size for p in plans)
        key = (id(job.model), batch)
        if key not in self._per_client:
            received = cohort.received["model"]
            data, rows = job.data.for_cohort([with_rows[0].rows[:1]], received.device)
            example = data.gather(rows[0].to(received.device))
            acts = chunking.activation_numel(job.model, cohort.layout.unflatten(received), example,
                                             job.objective.forward)
            method = job.chain.method
            materialised = isinstance(method, PerExampleClipped) and method.method == "vmap"
            self._per_client[key] = (chunking.bytes_per_client(received.numel(), acts, batch, materialised),
                                     chunking.activation_bytes(acts, batch))
        per_client, acts_bytes = self._per_client[key]
        messages = chunking.message_bytes(m, cohort.received["model"].numel())  # they fill as the cohort trains
        return chunking.group_size(m, per_client, max(memory.free_memory(cohort.device) - messages, 0),
                                   acts_bytes if cohort.device.type == "cpu" else 0)

    def run(self, job, plans, cohort, start=None) -> ClientResults:
        return _groups(job, plans, cohort, start, self.group_size(job, plans, cohort))


@register("executor", "sequential")
class SequentialExecutor(AbstractExecutor):
    """One client at a time (the reference for the vectorized executor: no padding, no masks across clients)."""

    def run(self, job, plans, cohort, start=None) -> ClientResults:
        return _groups(job, plans, cohort, start, 1)
