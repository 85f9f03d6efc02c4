"""The synchronous round engine (STYLE.md pipeline):

sample → downlink (encode, decode) → client state store → local chain (objective → gradient method → gradient
transforms → local SGD) → client stages (clip, noise, correlated noise, momentum) → [attacks.inject, simulation
only] → server screening (drop NaN/Inf/wrong-shape messages and extras) → aggregate (pre-aggregators + rule)
→ server stages (central noise) → server optimizer → shared statistics → accountant.charge(events) → report.

The engine decides *when* stages run; the stages decide *what* happens.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
from dp_accounting import dp_event

from trustfl.client.state import ClientStateStore
from trustfl.core.registry import register
from trustfl.core.rng import SERVER, make_generator
from trustfl.engine.base import AbstractEngine
from trustfl.engine.federation import EngineState, Federation
from trustfl.engine.local import ClientPlan, num_local_steps, step_event
from trustfl.types import CohortContext, RoundContext


def initial_state(fed: Federation) -> EngineState:
    params = fed.initial_params.clone()
    return EngineState(round=0, params=params, server_optimizer=fed.server_optimizer.init(params),
                       client_stages=fed.client_stages.init(fed.layout), aggregator=fed.aggregator.init(fed.layout),
                       server_stages=fed.server_stages.init(fed.layout),
                       ledger=None if fed.ledger is None else fed.ledger.state_dict(),
                       attack_view=None if fed.attack_view is None else fed.attack_view.init(fed.layout),
                       shared=fed.local_chain.server_init(params))


def _plan(fed: Federation, cid: int, r: int) -> ClientPlan:
    flip = bool(fed.attack is not None and fed.attack.data_level and cid in fed.byzantine)
    rows = fed.client_rows[cid]
    planned = num_local_steps(fed.training, int(rows.numel()), fed.batch_sizes[cid])
    return ClientPlan(cid, rows, fed.batch_sizes[cid], fed.noise_multipliers[cid], flip,
                      fed.step_budget.max_steps(cid, planned, fed.seed, r))


def _round_events(fed: Federation, plan: ClientPlan, steps: int) -> dp_event.DpEvent | None:
    event = step_event(fed.training, plan)
    if event is None or steps == 0:
        return None
    return event if steps == 1 else dp_event.SelfComposedDpEvent(event, steps)


def _screen(x: torch.Tensor, d: int) -> torch.Tensor:
    """Rows the server accepts: right width and every coordinate finite."""
    if x.ndim != 2 or x.shape[1] != d:
        return torch.zeros(x.shape[0] if x.ndim else 0, dtype=torch.bool)
    return torch.isfinite(x).all(dim=1)


def _stack(received: list[Any], width: int, like: torch.Tensor) -> tuple[torch.Tensor, list[bool]]:
    """Stack well-formed rows (width, ``like``'s dtype and device); a malformed one becomes a NaN row."""
    shaped = [isinstance(m, torch.Tensor) and m.shape == (width,) and m.dtype == like.dtype
              and m.device == like.device for m in received]
    if not received:
        return like.new_zeros((0, width)), shaped
    return torch.stack([m if ok else like.new_full((width,), float("nan")) for m, ok in zip(received, shaped)]), shaped


def run_round(fed: Federation, state: EngineState) -> tuple[EngineState, dict[str, Any]]:
    """Run round ``state.round`` and return the new state and the round's metrics."""
    start = time.perf_counter()
    r = state.round
    d = fed.layout.numel
    chain = fed.local_chain
    metrics: dict[str, Any] = {"round": r + 1}
    candidates = list(range(fed.num_clients))
    cohort = fed.cohort.sample(candidates, make_generator(fed.seed, r, SERVER, "cohort"))

    trainers = [c for c in cohort if c not in fed.byzantine or (fed.attack is not None and fed.attack.data_level)]
    crafted = [c for c in cohort if c not in trainers]
    plans = [_plan(fed, c, r) for c in trainers]
    # Budgets are never silently exceeded: a client whose round would overspend sits the round out.
    if fed.ledger is not None:
        ledger = fed.ledger
        kept = []
        for p in plans:
            steps = num_local_steps(fed.training, int(p.rows.numel()), p.batch_size)
            event = _round_events(fed, p, steps)
            if event is not None and p.client_id in ledger and ledger[p.client_id].would_exceed(event):
                continue
            kept.append(p)
        metrics["clients_out_of_budget"] = len(plans) - len(kept)
        plans = kept
        trainers = [p.client_id for p in plans]
    cohort = sorted(trainers + crafted)

    # Downlink: what every cohort client receives, encoded; clients decode it before training.
    payload = {"model": state.params, **chain.downlink(state.shared)}
    encoded = fed.downlink.encode(payload)
    received_payload = fed.downlink.decode(encoded, {k: v.dtype for k, v in payload.items()})
    bytes_down = fed.downlink.nbytes(encoded) * len(cohort)

    store = ClientStateStore.from_state_dict(state.clients)
    device = state.params.device
    job_ctx = CohortContext(
        client_ids=tuple(trainers), round=r, seed=fed.seed, lr=fed.training.lr,
        batch_sizes=torch.tensor([float(p.batch_size) for p in plans], dtype=torch.float64, device=device),
        noise_multipliers=torch.tensor([p.noise_multiplier for p in plans], dtype=torch.float64, device=device),
        received=received_payload, client_state=store.gather(trainers, chain.client_state_defaults(state.params)),
        layout=fed.layout)
    results = fed.executor.run(fed.local_job(), plans, job_ctx)
    store = store.scatter(trainers, results.client_state)
    events = []
    for p, steps in zip(plans, results.num_steps):
        ev = _round_events(fed, p, steps)
        # Data-level Byzantine clients train too, but have no privacy to protect and no ledger.
        if ev is not None and p.client_id not in fed.byzantine:
            events.append((p.client_id, ev))

    weights_all = _weights(fed)
    ctx_train = _context(fed, r, trainers, weights_all)
    out = fed.client_stages.apply(results.updates, state.client_stages, ctx_train)
    client_state, messages = out.state, out.x
    events.extend(out.events)
    stage_metrics = dict(out.metrics)

    rows: dict[int, torch.Tensor] = dict(zip(trainers, messages))
    view, view_state = messages, state.attack_view
    if fed.attack_view is not None:
        # Simulation-only oracle: the messages without privacy noise, through their own stage state (its DP
        # events are not charged: nothing of it is released).
        start_state = state.attack_view if state.attack_view is not None else fed.attack_view.init(fed.layout)
        shadow = fed.attack_view.apply(results.updates, start_state, ctx_train)
        view, view_state = shadow.x, shadow.state
    if crafted:
        honest_ids = [c for c in trainers if c not in fed.byzantine]
        honest = view[[trainers.index(c) for c in honest_ids]] if honest_ids else view[:0]
        byz = fed.attack.craft(honest, len(crafted), ctx_train.select(torch.tensor(
            [trainers.index(c) for c in honest_ids], dtype=torch.long)), fed.aggregator)
        for i, c in enumerate(crafted):
            rows[c] = byz[i] if isinstance(byz, torch.Tensor) and byz.ndim == 2 and i < byz.shape[0] else byz
    # What reaches the server: one message (and its extras) per cohort client, in client order. Crafted
    # messages carry zero extras: the attacks act on the model message only.
    stacked, shaped = _stack([rows[c] for c in cohort], d, state.params)
    accepted = _screen(stacked, d)
    bytes_up = sum(int(stacked[i].numel()) * stacked.element_size() for i, ok in enumerate(shaped) if ok)
    extras: dict[str, torch.Tensor] = {}
    for key, width in chain.extras_widths(fed.layout).items():
        by_client = dict(zip(trainers, results.extras[key]))
        ex, ex_shaped = _stack([by_client.get(c, state.params.new_zeros(width)) for c in cohort], width,
                               state.params)
        accepted &= _screen(ex, width)
        bytes_up += sum(int(ex[i].numel()) * ex.element_size() for i, ok in enumerate(ex_shaped) if ok)
        extras[key] = ex
    rejected = int((~accepted).sum())
    metrics.update({"cohort_size": len(cohort), "rejected": rejected})

    new = dataclasses.replace(
        state, round=r + 1, client_stages=client_state, bytes_up_total=state.bytes_up_total + bytes_up,
        bytes_down_total=state.bytes_down_total + bytes_down, rejected_total=state.rejected_total + rejected,
        attack_view=view_state, clients=store.state_dict())
    if bool(accepted.any()):
        keep = torch.nonzero(accepted).flatten()
        ctx = _context(fed, r, cohort, weights_all).select(keep)
        agg = fed.aggregator.apply(stacked[keep], state.aggregator, ctx)
        stage_metrics.update({f"aggregator/{k}": v for k, v in agg.metrics.items()})
        srv = fed.server_stages.apply(agg.x, state.server_stages, ctx)
        events.extend(srv.events)
        stage_metrics.update(srv.metrics)
        new.params, new.server_optimizer = fed.server_optimizer.step(state.params, srv.x, state.server_optimizer)
        new.aggregator, new.server_stages = agg.state, srv.state
        new.shared = chain.server_update(state.shared, {k: v[keep] for k, v in extras.items()}, ctx)
    if fed.ledger is not None and events:
        # Byzantine clients (e.g. label flippers that follow the protocol) have no privacy to protect: no ledger.
        fed.ledger.charge([(c, e) for c, e in events if c in fed.ledger])
        new.ledger = fed.ledger.state_dict()
    metrics.update({"bytes_up": bytes_up, "bytes_down": bytes_down, "bytes_up_total": new.bytes_up_total,
                    "bytes_down_total": new.bytes_down_total})
    if len(results.train_loss):
        metrics["train_loss"] = float(results.train_loss.mean())
    metrics.update({k: float(v) if isinstance(v, (int, float, torch.Tensor)) else v
                    for k, v in stage_metrics.items()})
    new.wall_time_s = state.wall_time_s + time.perf_counter() - start
    return new, metrics


def _weights(fed: Federation) -> torch.Tensor | None:
    if fed.weighting == "uniform":
        return None
    return fed.reports["num_samples"].to(torch.float64).clamp(min=1)


def _context(fed: Federation, r: int, ids: list[int], weights_all: torch.Tensor | None) -> RoundContext:
    index = torch.tensor(ids, dtype=torch.long)
    return RoundContext(round=r, seed=fed.seed, client_ids=tuple(ids),
                        weights=None if weights_all is None else weights_all[index],
                        num_byzantine=len(fed.byzantine), num_clients=fed.num_clients,
                        reports={k: v[index] for k, v in fed.reports.items()})


@register("engine", "sync")
class SyncEngine(AbstractEngine):
    """Synchronous rounds: the server waits for every sampled client, then updates once (FedAvg's schedule)."""

    def initial_state(self, fed: Federation) -> EngineState:
        return initial_state(fed)

    def run_round(self, fed: Federation, state: EngineState) -> tuple[EngineState, dict[str, Any]]:
        return run_round(fed, state)
