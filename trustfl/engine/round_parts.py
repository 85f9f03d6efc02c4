"""The parts of a round every engine shares: admission, the uplink, screening, aggregation and the server update.

An engine decides *when* clients train and *which* model each starts from; it then hands the clients' local
results to :func:`deliver`, which runs the fixed server-side pipeline (docs/architecture.md):

client stages (clip, noise, ...) → uplink (what the server decodes; a compressor, or a model message turned into
the server's delta) → [attacks.inject, simulation only] → screening (NaN/Inf/wrong shape dropped) → aggregate
(pre-aggregators + rule) → server stages → server optimizer → shared statistics → accountant.charge(events).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import torch

from trustfl.aggregate.base import aggregator_name
from trustfl.aggregate.coordinate import coordinate_median
from trustfl.client.state import ClientStateStore
from trustfl.client.step_budget import checked_max_steps
from trustfl.core.checks import describe_value
from trustfl.core.finite import all_finite, finite_rows
from trustfl.core.stage import stage_out_problem
from trustfl.core.rng import SERVER, make_generator
from trustfl.engine.executors import ClientResults
from trustfl.engine.federation import EngineState, Federation
from trustfl.engine.local import ClientPlan, num_local_steps, step_event
from trustfl.errors import ConfigError
from trustfl.privacy.events import composed
from trustfl.types import CohortContext, RoundContext

if TYPE_CHECKING:
    from dp_accounting import dp_event


@dataclass(frozen=True)
class Uplink:
    """What the server receives from the client-stage outputs ``x (m, d)`` of clients ``ids``.

    ``to_server(x, ids) -> (server_view, bits_per_row, decode_failures)``; ``None`` sends ``x`` as float32
    deltas (the synchronous FedAvg message). ``scale`` multiplies the aggregate before the server optimizer
    (QuAFL's ``s/(s+1)``, FedNova's ``τ_eff``).
    """

    to_server: Callable[[torch.Tensor, list[int]], tuple[torch.Tensor, int, int]] | None = None
    scale: float | torch.Tensor = 1.0


def broadcast(fed: Federation, state: EngineState, r: int, receivers: int) -> tuple[dict[str, torch.Tensor], int]:
    """What every cohort client receives, decoded (the model and the transforms' shared statistics), and the
    bytes sent to ``receivers`` clients. Downlink stages encode it; the model goes through the downlink
    compressor, if any."""
    payload = {"model": state.params, **fed.local_chain.downlink(state.shared)}
    encoded = fed.downlink.encode(payload)
    received = fed.downlink.decode(encoded, {k: v.dtype for k, v in payload.items()})
    bytes_down = fed.downlink.nbytes(encoded) * receivers
    if fed.links is not None and fed.links.downlink is not None:
        sent = fed.links.down(state.params, r)
        received["model"] = sent.decoded[0]
        rest = fed.downlink.nbytes({k: v for k, v in encoded.items() if k != "model"})
        bytes_down = (rest + sent.bits_per_message // 8) * receivers
    return received, bytes_down


def compressed_deltas(fed: Federation, r: int) -> Uplink:
    """The uplink of delta messages (FedAvg, FedBuff): through the uplink compressor, if any (a lattice
    quantizer decodes against 0, the delta's natural reference point)."""
    if fed.links is None or fed.links.uplink is None:
        return Uplink()

    def to_server(x: torch.Tensor, ids: list[int]) -> tuple[torch.Tensor, int, int]:
        sent = fed.links.up(x, None, r, ids)
        return sent.decoded, sent.bits_per_message, sent.decode_failures
    return Uplink(to_server)


def sample_cohort(fed: Federation, r: int) -> list[int]:
    """The clients the server draws in round ``r`` (its own "cohort" stream)."""
    return fed.cohort.sample(list(range(fed.num_clients)), make_generator(fed.seed, r, SERVER, "cohort"))


def make_plan(fed: Federation, cid: int, r: int, max_steps: int | None = None) -> ClientPlan:
    """Client ``cid``'s job in round ``r``; ``max_steps`` (an engine's clock) overrides the step budget."""
    flip = bool(fed.attack is not None and fed.attack.data_level and cid in fed.byzantine)
    rows = fed.client_rows[cid]
    planned = num_local_steps(fed.training, int(rows.numel()), fed.batch_sizes[cid])
    budget = checked_max_steps(fed.step_budget, cid, planned, fed.seed, r) if max_steps is None else max_steps
    noise = fed.noise_multipliers[cid]
    if noise != noise:  # NaN: another node's client (build_federation's for_client)
        raise ConfigError(f"client {cid}'s noise multiplier was not calibrated: this federation was built for "
                          f"another client's node.")
    return ClientPlan(cid, rows, fed.batch_sizes[cid], noise, flip, budget)


def round_events(fed: Federation, plan: ClientPlan, steps: int) -> dp_event.DpEvent | None:
    event = step_event(fed.training, plan)
    if event is None or steps == 0:
        return None
    from dp_accounting import dp_event

    return event if steps == 1 else dp_event.SelfComposedDpEvent(event, steps)


def client_charges(fed: Federation, plan: ClientPlan, steps: int, stage_events: list) -> list:
    """What a round charges the client of ``plan``: its ``steps`` local steps' event (if any), then ``stage_events``
    (the per-round events of the noise stages its message passes through)."""
    local = round_events(fed, plan, steps)
    return ([] if local is None else [local]) + list(stage_events)


def screen(x: torch.Tensor, d: int) -> torch.Tensor:
    """Rows the server accepts: right width and every coordinate finite."""
    if x.ndim != 2 or x.shape[1] != d:
        return torch.zeros(x.shape[0] if x.ndim else 0, dtype=torch.bool, device=x.device)
    return finite_rows(x)  # two reductions, no (n, d) temporary


def _rows_of_one_matrix(received: list[Any], width: int, like: torch.Tensor) -> torch.Tensor | None:
    """The matrix whose consecutive rows ``received`` are, in order (the simulator's messages usually are): the
    stacked rows without a copy of a cohort's ``(n, d)`` messages; ``None`` when they are not."""
    first = received[0] if received else None
    base = getattr(first, "_base", None)
    if not isinstance(base, torch.Tensor) or base.shape != (len(received), width) or not base.is_contiguous() \
            or base.dtype != like.dtype or base.device != like.device:
        return None
    start = base.storage_offset()
    for i, m in enumerate(received):
        if not isinstance(m, torch.Tensor) or m._base is not base or m.shape != (width,) or m.stride() != (1,) \
                or m.storage_offset() != start + i * width:
            return None
    return base


def stack_rows(received: list[Any], width: int, like: torch.Tensor) -> tuple[torch.Tensor, list[bool]]:
    """Stack well-formed rows (dense, width, ``like``'s dtype and device); a malformed one becomes a NaN row."""
    shaped = [isinstance(m, torch.Tensor) and m.layout == torch.strided and m.shape == (width,)
              and m.dtype == like.dtype and m.device == like.device for m in received]
    if not received:
        return like.new_zeros((0, width)), shaped
    whole = _rows_of_one_matrix(received, width, like)
    if whole is not None:
        return whole, shaped
    return torch.stack([m if ok else like.new_full((width,), float("nan")) for m, ok in zip(received, shaped)]), shaped


def admit(fed: Federation, r: int, cohort: list[int], metrics: dict[str, Any],
          max_steps: dict[int, int] | None = None) -> tuple[list[ClientPlan], list[int], list[int]]:
    """Plans of the cohort's training clients, the crafted (Byzantine) ids, and the cohort after admission.

    Budgets are never silently exceeded: a client whose round would overspend sits the round out. A round charges
    a client its local steps and the events of the noise stages (client and server) that it passes through.
    """
    trainers = [c for c in cohort if c not in fed.byzantine or (fed.attack is not None and fed.attack.data_level)]
    training = set(trainers)
    crafted = [c for c in cohort if c not in training]
    plans = [make_plan(fed, c, r, None if max_steps is None else max_steps[c]) for c in trainers]
    if fed.ledger is not None:
        ledger = fed.ledger
        stages = list(fed.client_stages.round_events()) + list(fed.server_stages.round_events())
        kept = []
        for p in plans:
            steps = num_local_steps(fed.training, int(p.rows.numel()), p.batch_size)  # the planned work
            parts = client_charges(fed, p, steps, stages)
            if parts and p.client_id in ledger and ledger[p.client_id].would_exceed(
                    parts[0] if len(parts) == 1 else composed(parts)):
                continue
            kept.append(p)
        metrics["clients_out_of_budget"] = len(plans) - len(kept)
        plans = kept
    return plans, crafted, sorted([p.client_id for p in plans] + crafted)


def cohort_context(fed: Federation, r: int, plans: list[ClientPlan], received: dict[str, torch.Tensor],
                   store: ClientStateStore, lr: float | None = None,
                   personal: dict[str, torch.Tensor] | None = None, seed: int | None = None) -> CohortContext:
    """The cohort's local-training context; ``seed`` keys the clients' own streams (default the run seed; a
    deployed node's private seed)."""
    params = received["model"]
    device = params.device
    ids = [p.client_id for p in plans]
    return CohortContext(
        client_ids=tuple(ids), round=r, seed=fed.seed if seed is None else seed,
        lr=fed.training.lr if lr is None else lr,
        batch_sizes=torch.tensor([float(p.batch_size) for p in plans], dtype=torch.float64, device=device),
        noise_multipliers=torch.tensor([p.noise_multiplier for p in plans], dtype=torch.float64, device=device),
        received=received, client_state=store.gather(ids, fed.local_chain.client_state_defaults(params)),
        layout=fed.layout, personal=personal or {})


def weights(fed: Federation) -> torch.Tensor | None:
    if fed.weighting == "uniform":
        return None
    return fed.reports["num_samples"].to(torch.float64).clamp(min=1)


def context(fed: Federation, r: int, ids: list[int], weights_all: torch.Tensor | None,
            seed: int | None = None) -> RoundContext:
    """The round's context for ``ids``; ``seed`` keys its generators (default the run seed)."""
    index = torch.tensor(ids, dtype=torch.long)
    return RoundContext(round=r, seed=fed.seed if seed is None else seed, client_ids=tuple(ids),
                        weights=None if weights_all is None else weights_all[index],
                        num_byzantine=len(fed.byzantine), num_clients=fed.num_clients,
                        reports={k: v[index] for k, v in fed.reports.items()})


@dataclass
class Arrivals:
    """What reaches the server in a round, before screening: one message per cohort client and its extras.

    ``rows[c]`` is client ``c``'s message (any object: a malformed one is screened out); ``extras[key][c]`` the
    values it sent beside it; ``events`` the clients' DP events of the round (charged to their ledgers);
    ``stage_metrics`` the client stages' metrics; ``bits_row`` the compressed size of one message (``None``:
    float32 rows); ``train_loss`` the trainers' mean local loss (``None``: nobody trained).
    """

    cohort: list[int]
    rows: dict[int, Any]
    extras: dict[str, dict[int, Any]]
    events: list[tuple[int, Any]]
    stage_metrics: dict[str, Any]
    train_loss: float | None = None
    bits_row: int | None = None
    failures: int = 0
    compressed: bool = False


def deliver(fed: Federation, state: EngineState, plans: list[ClientPlan], crafted: list[int], cohort: list[int],
            results: ClientResults, store: ClientStateStore, bytes_down: int, metrics: dict[str, Any],
            uplink: Uplink = Uplink(), extra_bytes_up: int = 0) -> tuple[EngineState, dict[str, Any]]:
    """Everything after local training: client stages → uplink → attack → screening → aggregation → server.

    ``extra_bytes_up``: bytes the clients sent earlier in the round (client statistics' uploads)."""
    r = state.round
    d = fed.layout.numel
    trainers = [p.client_id for p in plans]
    events = []
    for p, steps in zip(plans, results.num_steps):
        ev = round_events(fed, p, steps)
        # Data-level Byzantine clients train too, but have no privacy to protect and no ledger.
        if ev is not None and p.client_id not in fed.byzantine:
            events.append((p.client_id, ev))

    ctx_train = context(fed, r, trainers, weights(fed))
    out = fed.client_stages.apply(results.updates, state.client_stages, ctx_train)
    client_state, messages = out.state, out.x
    events.extend(out.events)
    bits_row, failures = None, 0
    if uplink.to_server is not None and trainers:
        messages, bits_row, failures = uplink.to_server(messages, trainers)

    rows: dict[int, torch.Tensor] = dict(zip(trainers, messages))
    view, view_state = messages, state.attack_view
    if fed.attack_view is not None:
        # Simulation-only oracle: the messages without privacy noise, through their own stage state (its DP
        # events are not charged: nothing of it is released).
        start_state = state.attack_view if state.attack_view is not None else fed.attack_view.init(fed.layout)
        shadow = fed.attack_view.apply(results.updates, start_state, ctx_train)
        view, view_state = shadow.x, shadow.state
        if uplink.to_server is not None and trainers:
            view = uplink.to_server(view, trainers)[0]
    honest = [i for i, c in enumerate(trainers) if c not in fed.byzantine]  # rows of trainers that craft nothing
    if crafted:
        # The adversary sees the honest messages the server would accept (a diverged client's NaN row is not one).
        honest_rows = _finite_rows_among(view, honest)
        if len(honest_rows) >= getattr(fed.attack, "min_honest", 1):  # an attack of your own: 1
            byz = fed.attack.craft(view[honest_rows], len(crafted),
                                   ctx_train.select(torch.tensor(honest_rows, dtype=torch.long)), fed.aggregator)
            for i, c in enumerate(crafted):
                rows[c] = byz[i] if isinstance(byz, torch.Tensor) and byz.ndim == 2 and i < byz.shape[0] else byz
        else:  # nothing to craft from (an all-Byzantine cohort, every honest client diverged, or one honest row for
            # ALIE's standard deviation): they send nothing
            metrics["attack_idle"] = len(crafted)
    # Crafted clients' extras are zero (the attack acts on the message only) or, with `attack.extras = "crafted"`,
    # the attack applied to the honest clients' finite extras as to their messages.
    extras = {key: dict(zip(trainers, results.extras[key])) for key in fed.local_chain.extras_widths(fed.layout)}
    if crafted and fed.attack_extras == "crafted":
        for key, by_client in extras.items():
            sent = results.extras[key]
            keep = _finite_rows_among(sent, honest)
            if len(keep) >= getattr(fed.attack, "min_honest", 1):
                chosen = ctx_train.select(torch.tensor(keep, dtype=torch.long))
                by_client.update(zip(crafted, fed.attack.craft(sent[keep], len(crafted), chosen, fed.aggregator)))
    arrivals = Arrivals(cohort, rows, extras, events, dict(out.metrics), _trained_loss(results), bits_row, failures,
                        uplink.to_server is not None)
    state = dataclasses.replace(state, client_stages=client_state, attack_view=view_state,
                                clients=store.state_dict())
    return conclude(fed, state, arrivals, bytes_down, metrics, uplink.scale, extra_bytes_up)


def _trained_loss(results: ClientResults) -> float | None:
    """The mean local loss of the clients that took a step (``None``: none did). A client the clock or its step
    budget stopped before its first step has no loss; its 0 was averaged in (a QuAFL round of 3 steps in 5 clients
    reported 3/5 of the loss)."""
    losses = results.train_loss
    if len(results.num_steps) == len(losses):
        losses = losses[[i for i, n in enumerate(results.num_steps) if n > 0]]
    return float(losses.mean()) if len(losses) else None


def _finite_rows_among(x: torch.Tensor, rows: list[int]) -> list[int]:
    """Those of ``rows`` whose row of ``x`` is finite (a list: it indexes ``x`` on any device)."""
    return [i for i, ok in zip(rows, finite_rows(x[rows]).tolist()) if ok] if rows else []


def check_update(out: Any, who: str, params: torch.Tensor, r: int, n: int) -> None:
    """Refuse (ConfigError naming it) what an aggregator returns unless it is a StageOut whose ``x`` is a finite
    vector of the model's shape, dtype and device (:func:`~trustfl.core.stage.stage_out_problem`): an aggregator of
    your own that breaks this would otherwise crash a later round or corrupt the model. Built-in rules always meet
    it (finite rows in, finite aggregate out)."""
    problem = stage_out_problem(out, params, params.new_ones(1, dtype=torch.bool))
    if problem is not None:
        raise ConfigError(f"{who} {problem} in round {r + 1} (from {n} finite messages); it must return a StageOut "
                          f"whose `x` is finite and, as the model, {describe_value(params)}.")


def conclude(fed: Federation, state: EngineState, arrivals: Arrivals, bytes_down: int, metrics: dict[str, Any],
             scale: float | torch.Tensor = 1.0, extra_bytes_up: int = 0,
             server_seed: int | None = None) -> tuple[EngineState, dict[str, Any]]:
    """The server's half of a round: screening → aggregation → server stages → server optimizer → shared
    statistics → ledgers, from what arrived (a simulated cohort's messages or a deployment's replies).

    ``server_seed`` keys the server's draws (e.g. central noise; default the run seed): a deployment's own secret,
    which no node holding the run's config can recompute."""
    r = state.round
    d = fed.layout.numel
    cohort, events, stage_metrics = arrivals.cohort, list(arrivals.events), dict(arrivals.stage_metrics)
    weights_all = weights(fed)
    # What reaches the server: one message (and its extras) per cohort client, in client order.
    stacked, shaped = stack_rows([arrivals.rows.get(c) for c in cohort], d, state.params)
    accepted = screen(stacked, d)
    if arrivals.bits_row is None:
        bytes_up = sum(int(stacked[i].numel()) * stacked.element_size() for i, ok in enumerate(shaped) if ok)
    else:
        bytes_up = sum(shaped) * arrivals.bits_row // 8
    extras: dict[str, torch.Tensor] = {}
    for key, width in fed.local_chain.extras_widths(fed.layout).items():
        by_client = arrivals.extras.get(key, {})
        ex, ex_shaped = stack_rows([by_client.get(c, state.params.new_zeros(width)) for c in cohort], width,
                                   state.params)
        accepted &= screen(ex, width)
        bytes_up += sum(int(ex[i].numel()) * ex.element_size() for i, ok in enumerate(ex_shaped) if ok)
        extras[key] = ex
    rejected = int((~accepted).sum())
    bytes_up += extra_bytes_up
    metrics.update({"cohort_size": len(cohort), "rejected": rejected})
    usable = len(cohort) - rejected
    # Fewer messages passed screening than the rule needs (e.g. NaN senders beyond what it tolerates): the round
    # is skipped, the model stays, and the run goes on: no message can stop the server.
    enough = usable > 0 and fed.aggregator.too_few(usable) is None
    if usable and not enough:
        metrics["skipped"] = 1
    if arrivals.compressed:
        metrics["decode_failures"] = int(arrivals.failures)

    new = dataclasses.replace(
        state, round=r + 1, bytes_up_total=state.bytes_up_total + bytes_up,
        bytes_down_total=state.bytes_down_total + bytes_down, rejected_total=state.rejected_total + rejected)
    if enough:
        keep = torch.nonzero(accepted).flatten()
        ctx = context(fed, r, cohort, weights_all, server_seed).select(keep)
        agg = fed.aggregator.apply(stacked if rejected == 0 else stacked[keep], state.aggregator, ctx)
        check_update(agg, aggregator_name(fed.aggregator), state.params, r, usable)
        stage_metrics.update({f"aggregator/{k}": v for k, v in agg.metrics.items()})
        srv = fed.server_stages.apply(agg.x, state.server_stages, ctx)
        events.extend(srv.events)
        stage_metrics.update(srv.metrics)
        step = srv.x if isinstance(scale, float) and scale == 1.0 else srv.x * scale
        stepped, optimizer_state = fed.server_optimizer.step(state.params, step, state.server_optimizer)
        if all_finite(stepped):
            new.params, new.server_optimizer = stepped, optimizer_state
        else:  # finite messages, a finite aggregate, and a step beyond the dtype (a huge server.lr): the model stays
            metrics["diverged"] = 1
        new.aggregator, new.server_stages = agg.state, srv.state
        kept = {k: v[keep] for k, v in extras.items()}
        if fed.extras_rule == "median":  # a Byzantine minority's extras cannot move the server's state far
            kept = {k: coordinate_median(v).expand_as(v) for k, v in kept.items()}
        new.shared = fed.local_chain.server_update(state.shared, kept, ctx)
    if fed.ledger is not None:
        if events:  # Byzantine clients (e.g. label flippers that follow the protocol) have no privacy: no ledger
            fed.ledger.charge([(c, e) for c, e in events if c in fed.ledger])
        # Every round, charged here or not: the statistics' releases (exchange) and a deployment's earlier sends
        # are charged to the ledgers before this point, and a checkpoint must hold them.
        new.ledger = fed.ledger.state_dict()
    metrics.update({"bytes_up": bytes_up, "bytes_down": bytes_down, "bytes_up_total": new.bytes_up_total,
                    "bytes_down_total": new.bytes_down_total})
    if arrivals.train_loss is not None:
        metrics["train_loss"] = arrivals.train_loss
    metrics.update({k: float(v) if isinstance(v, (int, float, torch.Tensor)) else v
                    for k, v in stage_metrics.items()})
    return new, metrics
