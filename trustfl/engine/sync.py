"""The synchronous round engine (STYLE.md pipeline):

sample → client.local_update → client stages (clip, noise, correlated noise, momentum) → [attacks.inject,
simulation only] → server screening (drop NaN/Inf/wrong-shape messages) → aggregate (pre-aggregators + rule)
→ server stages (central noise) → server optimizer → accountant.charge(events) → report.

The engine decides *when* stages run; the stages decide *what* happens.
"""
from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from dp_accounting import dp_event
from torch.func import functional_call

from trustfl.core.rng import SERVER, make_generator
from trustfl.engine.federation import EngineState, Federation
from trustfl.engine.local import ClientPlan, num_local_steps, step_event
from trustfl.types import RoundContext

BYTES_PER_FLOAT32 = 4


def initial_state(fed: Federation) -> EngineState:
    params = fed.initial_params.clone()
    return EngineState(round=0, params=params, server_optimizer=fed.server_optimizer.init(params),
                       client_stages=fed.client_stages.init(fed.layout), aggregator=fed.aggregator.init(fed.layout),
                       server_stages=fed.server_stages.init(fed.layout),
                       ledger=None if fed.ledger is None else fed.ledger.state_dict(),
                       attack_view=None if fed.attack_view is None else fed.attack_view.init(fed.layout))


def _plan(fed: Federation, cid: int) -> ClientPlan:
    flip = bool(fed.attack is not None and fed.attack.data_level and cid in fed.byzantine)
    return ClientPlan(cid, fed.client_rows[cid], fed.batch_sizes[cid], fed.noise_multipliers[cid], flip)


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


def run_round(fed: Federation, state: EngineState) -> tuple[EngineState, dict[str, Any]]:
    """Run round ``state.round`` and return the new state and the round's metrics."""
    start = time.perf_counter()
    r = state.round
    d = fed.layout.numel
    metrics: dict[str, Any] = {"round": r + 1}
    candidates = list(range(fed.num_clients))
    cohort = fed.cohort.sample(candidates, make_generator(fed.seed, r, SERVER, "cohort"))

    trainers = [c for c in cohort if c not in fed.byzantine or (fed.attack is not None and fed.attack.data_level)]
    crafted = [c for c in cohort if c not in trainers]
    plans = [_plan(fed, c) for c in trainers]
    # Budgets are never silently exceeded: a client whose round would overspend sits the round out.
    if fed.ledger is not None:
        ledger = fed.ledger
        kept = []
        for p in plans:
            steps = _planned_steps(fed, p)
            event = _round_events(fed, p, steps)
            if event is not None and p.client_id in ledger and ledger[p.client_id].would_exceed(event):
                continue
            kept.append(p)
        metrics["clients_out_of_budget"] = len(plans) - len(kept)
        plans = kept
        trainers = [p.client_id for p in plans]
    cohort = sorted(trainers + crafted)

    params = fed.layout.unflatten(state.params)
    results = fed.executor.run(fed.model, params, plans, fed.train_data, fed.training, fed.seed, r)
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
    # What reaches the server: one message per cohort client, in client order.
    received = [rows[c] for c in cohort]
    shaped = [isinstance(m, torch.Tensor) and m.shape == (d,) and m.dtype == state.params.dtype for m in received]
    bytes_up = sum(int(m.numel()) * m.element_size() for m, ok in zip(received, shaped) if ok)
    bytes_down = len(cohort) * d * BYTES_PER_FLOAT32
    stacked = torch.stack([m if ok else torch.full((d,), float("nan"), dtype=state.params.dtype)
                           for m, ok in zip(received, shaped)]) if cohort else torch.zeros(0, d)
    accepted = _screen(stacked, d)
    rejected = int((~accepted).sum())
    metrics.update({"cohort_size": len(cohort), "rejected": rejected})

    new = EngineState(r + 1, state.params, state.server_optimizer, client_state, state.aggregator,
                      state.server_stages, state.ledger, state.bytes_up_total + bytes_up,
                      state.bytes_down_total + bytes_down, state.wall_time_s, state.rejected_total + rejected,
                      view_state)
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


def _planned_steps(fed: Federation, plan: ClientPlan) -> int:
    return num_local_steps(fed.training, int(plan.rows.numel()), plan.batch_size)


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


@torch.no_grad()
def evaluate(fed: Federation, params: torch.Tensor) -> dict[str, float]:
    """Test accuracy and mean cross-entropy of the global model on the held-out test set."""
    named = fed.layout.unflatten(params)
    x, y = fed.dataset.test_x, fed.dataset.test_y
    correct, loss = 0, 0.0
    for i in range(0, x.shape[0], fed.eval_batch_size):
        logits = functional_call(fed.model, named, (x[i:i + fed.eval_batch_size],))
        yb = y[i:i + fed.eval_batch_size]
        loss += float(F.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(1) == yb).sum())
    n = max(x.shape[0], 1)
    return {"accuracy": correct / n, "loss": loss / n}
