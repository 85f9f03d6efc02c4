"""The synchronous round engine (docs/architecture.md, "One round, end to end"):

sample → downlink (encode, decode) → [client statistics: uploads at the received model, personal downlink] →
client state store → local chain (objective → gradient method → gradient
transforms → local SGD) → client stages (clip, noise, correlated noise, momentum) → uplink (compressor) →
[attacks.inject, simulation only] → server screening (drop NaN/Inf/wrong-shape messages and extras) → aggregate
(pre-aggregators + rule) → server stages (central noise) → server optimizer → shared statistics →
accountant.charge(events) → report.

The engine decides *when* stages run; the stages decide *what* happens. Everything after local training is
:func:`trustfl.engine.round_parts.deliver`, shared with the asynchronous engine.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

from trustfl.client.state import ClientStateStore
from trustfl.client.transforms import SGD
from trustfl.core.registry import register
from trustfl.engine.base import AbstractEngine
from trustfl.engine.exchange import exchange
from trustfl.engine.executors import LocalJob
from trustfl.engine.federation import EngineState, Federation, refuse_meta_params
from trustfl.engine.local import round_lr
from trustfl.engine.round_parts import admit, broadcast, cohort_context, compressed_deltas, deliver, sample_cohort


def initial_state(fed: Federation) -> EngineState:
    params = fed.initial_params.clone()
    return EngineState(round=0, params=params, server_optimizer=fed.server_optimizer.init(params),
                       client_stages=fed.client_stages.init(fed.layout), aggregator=fed.aggregator.init(fed.layout),
                       server_stages=fed.server_stages.init(fed.layout),
                       ledger=None if fed.ledger is None else fed.ledger.state_dict(),
                       attack_view=None if fed.attack_view is None else fed.attack_view.init(fed.layout),
                       shared=fed.local_chain.server_init(params))


def round_job(fed: Federation, r: int) -> tuple[LocalJob, float]:
    """The clients' local job in round ``r`` and its learning rate (a schedule sets this round's local SGD)."""
    job, lr = fed.local_job(), round_lr(fed.training, r, fed.rounds)
    if lr != fed.training.lr:
        job = dataclasses.replace(job, chain=dataclasses.replace(job.chain, optimizer=SGD(lr)))
    return job, lr


def run_round(fed: Federation, state: EngineState) -> tuple[EngineState, dict[str, Any]]:
    """Run round ``state.round`` and return the new state and the round's metrics."""
    start = time.perf_counter()
    refuse_meta_params(state)
    r = state.round
    metrics: dict[str, Any] = {"round": r + 1}
    plans, crafted, cohort = admit(fed, r, sample_cohort(fed, r), metrics)

    received, bytes_down = broadcast(fed, state, r, len(cohort))
    personal, statistics, stat_up, stat_down, stat_metrics = exchange(fed, state, r, plans, received)
    if fed.statistics:  # the statistics' server halves folded this round's uploads in before training
        state = dataclasses.replace(state, statistics=statistics)
        metrics.update(stat_metrics)
    store = ClientStateStore.from_state_dict(state.clients)
    job, lr = round_job(fed, r)
    results = fed.executor.run(job, plans, cohort_context(fed, r, plans, received, store, lr=lr, personal=personal))
    store = store.scatter([p.client_id for p in plans], results.client_state)
    new, metrics = deliver(fed, state, plans, crafted, cohort, results, store, bytes_down + stat_down, metrics,
                           compressed_deltas(fed, r), extra_bytes_up=stat_up)
    new.wall_time_s = state.wall_time_s + time.perf_counter() - start
    return new, metrics


@register("engine", "sync")
class SyncEngine(AbstractEngine):
    """Synchronous rounds: the server waits for every sampled client, then updates once (FedAvg's schedule)."""

    def initial_state(self, fed: Federation) -> EngineState:
        return initial_state(fed)

    def run_round(self, fed: Federation, state: EngineState) -> tuple[EngineState, dict[str, Any]]:
        return run_round(fed, state)
