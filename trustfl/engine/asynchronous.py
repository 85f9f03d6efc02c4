"""The asynchronous engine: server steps on a virtual clock (QuAFL, FedBuff, FedAsync; FedAvg/FedNova in time).

The engine decides *when*: each server step it asks its schedule which clients report, how many local steps each
completed by then (``trustfl.simtime``: lazy, a client computes only when it reports), and from which model
each started; the clients' local work of one step runs as one vectorized call (clients with fewer completed steps
are masked). Everything after local training is the synchronous engine's pipeline
(:func:`trustfl.engine.round_parts.deliver`), so DP noise, robust aggregators, attacks and accounting run
unchanged under every schedule. Schedules:

- ``polling`` (QuAFL, Alg. 1): s clients sampled per step report their partial progress ``Y^i`` (model message,
  decoded by the server against ``X_t``); ``X_{t+1} = X_t/(s+1) + Σ Q(Y^i)/(s+1)``; each client mixes
  ``X^i = Q(X_t)/(s+1) + s·Y^i/(s+1)`` and restarts; a step lasts ``sit·b/32 + swt``.
- ``synchronous`` (FedAvg, FedNova in simulated time): the step waits for the slowest sampled client.
- ``buffered`` (FedBuff, FedAsync): every client trains continuously from the model it last received; the
  ``buffer`` clients that finish first report, weighted by staleness.

Every metrics row carries ``sim_time``, ``server_step``, ``local_steps`` (this step and total) and
``bits_up``/``bits_down`` (this step and total). The clock and each client's model live in the checkpointed
state, so a resumed run reproduces the uninterrupted one.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from trustfl.client.state import ClientStateStore
from trustfl.client.transforms import SGD
from trustfl.core.checks import check_number
from trustfl.core.registry import component_name, register
from trustfl.engine.base import AbstractEngine
from trustfl.engine.executors import ClientResults, LocalJob
from trustfl.engine.federation import EngineState, Federation, refuse_meta_params
from trustfl.engine.links import Links
from trustfl.engine.local import num_local_steps
from trustfl.engine.round_parts import (Uplink, admit, broadcast, cohort_context, compressed_deltas, deliver,
                                        sample_cohort, weights)
from trustfl.engine.sync import initial_state as sync_initial_state
from trustfl.errors import ConfigError
from trustfl.simtime.clock import MAX_TIME, TIME_NOTE, ClockState, completed_steps, expected_steps, finish_times
from trustfl.simtime.speed import AbstractSpeedModel

BASE = "async/base"
"""Client-store key of a client's own model (QuAFL's ``X^i``; FedBuff's last received server model)."""


def _one_of(name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"`{name}` must be one of {', '.join(repr(a) for a in allowed)}, found {value!r}.")


def _positive(name: str, value: object, zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value >= 0 if zero else value > 0)
    if not ok:
        raise ConfigError(f"`{name}` must be a finite number {'>= 0' if zero else '> 0'}, found {value!r}.")


@dataclass(frozen=True)
class Timing:
    """Simulated time: client speeds, the server interaction time ``sit`` (for 32-bit messages; scaled by the
    links' bits, ``sit(b) = sit·b/32``), the server waiting time ``swt`` and an optional time limit. ``sit`` and
    ``swt`` (``engine.interaction_time``, ``engine.wait_time``) lie in ``[0, MAX_TIME]``."""

    speed: AbstractSpeedModel
    interaction_time: float = 1.0
    wait_time: float = 0.0
    time_limit: float = 0.0

    def __post_init__(self) -> None:
        for name in ("interaction_time", "wait_time"):  # added at every server step
            check_number(f"engine.{name}", getattr(self, name), low=0, high=MAX_TIME, note=TIME_NOTE)

    def interaction(self, fed: Federation) -> float:
        if fed.links is None:
            return self.interaction_time
        return self.interaction_time * (fed.links.nominal_bits("up") + fed.links.nominal_bits("down")) / 64


@dataclass(frozen=True)
class Polling:
    """QuAFL's non-blocking symmetric averaging (Alg. 1, §2.2).

    Args:
      client_averaging: the client keeps ``s/(s+1)`` of its progress (off: it adopts ``Q(X_t)``; Fig. 3).
      server_averaging: the server keeps ``1/(s+1)`` of its model (off: the plain mean of the ``Q(Y^i)``).
      decode_key: the client's reference point for decoding ``X_t``: ``"base"`` (its ``X^i``, the paper) or
        ``"current"`` (its post-step model, the authors' code).
      speed_weights: damp client ``i``'s progress by ``η_i = H_min/H_i`` (weighted QuAFL; ``H_i`` from the
        clock's closed form ``expected_steps``); off in all the paper's experiments but Fig. 2.
      lr_scale: multiply the local learning rate (the authors' code uses ``(s+1)/s``).
    """

    client_averaging: bool = True
    server_averaging: bool = True
    decode_key: str = "base"
    speed_weights: bool = False
    lr_scale: float = 1.0

    def __post_init__(self) -> None:
        _one_of("decode_key", self.decode_key, ("base", "current"))
        _positive("lr_scale", self.lr_scale)


@dataclass(frozen=True)
class Synchronous:
    """The step waits for every sampled client (FedAvg in simulated time).

    Args:
      deadline: ``0``: every client does its planned steps (FedAvg). ``> 0``: a client does the steps it
        completes before ``deadline`` (at least one), and the update is normalised (FedNova, Wang et al. 2020:
        ``x ← x − τ_eff Σ p_i (x − x_i)/τ_i``, ``τ_eff = Σ p_i τ_i``).
    """

    deadline: float = 0.0

    def __post_init__(self) -> None:
        _positive("deadline", self.deadline, zero=True)


@dataclass(frozen=True)
class Buffered:
    """Clients train continuously; the ``cohort.size`` that finish ``K`` steps first fill the buffer.

    Args:
      mixing: ``"fedbuff"``: ``x ← x + η_g · mean_i w(τ_i) Δ_i``; ``"fedasync"``: the client sends its model
        ``x_i`` and ``x ← x + α (1+τ)^{−a} (x_i − x)`` (Xie et al. 2019, polynomial staleness).
      staleness: FedBuff's weight ``w(τ) = 1/√(1+τ)`` (``"sqrt"``, Nguyen et al. 2022) or ``"none"`` (the QuAFL
        authors' simplification).
      server_lr: ``η_g``; ``alpha``, ``a``: FedAsync's mixing weight (in (0, 1]) and staleness exponent.
      refresh: the model a reporting client restarts from: ``"updated"`` (the new server model) or ``"current"``
        (the model from before this step's update, the QuAFL authors' FedBuff).
      lr_scale: multiply the local learning rate (the authors' FedBuff uses ``s/n``).
    """

    mixing: str = "fedbuff"
    staleness: str = "sqrt"
    server_lr: float = 1.0
    alpha: float = 0.6
    a: float = 0.5
    refresh: str = "updated"
    lr_scale: float = 1.0

    def __post_init__(self) -> None:
        _one_of("mixing", self.mixing, ("fedbuff", "fedasync"))
        _one_of("staleness", self.staleness, ("sqrt", "none"))
        _one_of("refresh", self.refresh, ("updated", "current"))
        for name in ("server_lr", "lr_scale"):
            _positive(name, getattr(self, name))
        check_number("alpha", self.alpha, low=0, high=1, low_open=True, note="FedAsync's mixing weight")
        _positive("a", self.a, zero=True)


Schedule = Polling | Synchronous | Buffered
register("schedule", "polling")(Polling)
register("schedule", "synchronous")(Synchronous)
register("schedule", "buffered")(Buffered)


def _job(fed: Federation, lr_scale: float) -> LocalJob:
    job = fed.local_job()
    if lr_scale == 1.0:
        return job
    return dataclasses.replace(job, chain=dataclasses.replace(job.chain, optimizer=SGD(fed.training.lr * lr_scale)))


def _planned(fed: Federation, ids: list[int]) -> list[int]:
    return [num_local_steps(fed.training, int(fed.client_rows[c].numel()), fed.batch_sizes[c]) for c in ids]


def _scaled(results: ClientResults, factor: torch.Tensor) -> ClientResults:
    return dataclasses.replace(results, updates=results.updates * factor.to(results.updates).unsqueeze(1))


class AsyncEngine(AbstractEngine):
    """Server steps on a virtual clock; ``fed.schedule`` decides who reports and ``fed.timing`` how long it takes."""

    def check(self, fed: Federation) -> None:
        """Refuse settings the schedule cannot run (before any training)."""
        _check(fed)

    def initial_state(self, fed: Federation) -> EngineState:
        _check(fed)
        state = sync_initial_state(fed)
        clock = ClockState.initial(fed.num_clients)
        state.clock = {"clock": clock.state_dict(), "local_steps_total": 0}
        if isinstance(fed.schedule, Buffered):
            ids = torch.arange(fed.num_clients)
            k = fed.training.steps
            state.clock["finish"] = finish_times(clock.last_contact, clock.durations(ids, fed.timing.speed, fed.seed,
                                                                                      k), k)
            state.clock["version"] = torch.zeros(fed.num_clients, dtype=torch.long)
        if isinstance(fed.schedule, Polling) and fed.schedule.speed_weights:
            state.clock["speed_weights"] = _speed_weights(fed)
        return state

    def finished(self, fed: Federation, state: EngineState) -> bool:
        limit = fed.timing.time_limit
        return bool(limit) and bool(state.clock) and float(state.clock["clock"]["server_time"]) >= limit

    def run_round(self, fed: Federation, state: EngineState) -> tuple[EngineState, dict[str, Any]]:
        start = time.perf_counter()
        refuse_meta_params(state)
        r = state.round
        metrics: dict[str, Any] = {"round": r + 1}
        clock = ClockState.from_state_dict(state.clock["clock"])
        schedule = fed.schedule
        if isinstance(schedule, Polling):
            new, metrics = _polling(fed, state, clock, schedule, metrics)
        elif isinstance(schedule, Synchronous):
            new, metrics = _synchronous(fed, state, clock, schedule, metrics)
        else:
            new, metrics = _buffered(fed, state, clock, schedule, metrics)
        steps = int(metrics.pop("_local_steps"))
        failures = int(state.clock.get("decode_failures_total", 0)) + int(metrics.get("decode_failures", 0))
        new.clock = {**new.clock, "clock": clock.state_dict(),
                     "local_steps_total": int(state.clock["local_steps_total"]) + steps,
                     "decode_failures_total": failures}
        if fed.links is not None:
            metrics["decode_failures_total"] = failures
        metrics.update({"sim_time": clock.server_time, "server_step": r + 1, "local_steps": steps,
                        "local_steps_total": new.clock["local_steps_total"],
                        "bits_up": 8 * (new.bytes_up_total - state.bytes_up_total),
                        "bits_down": 8 * (new.bytes_down_total - state.bytes_down_total),
                        "bits_up_total": 8 * new.bytes_up_total, "bits_down_total": 8 * new.bytes_down_total})
        new.wall_time_s = state.wall_time_s + time.perf_counter() - start
        return new, metrics


register("engine", "async")(AsyncEngine)


def _check(fed: Federation) -> None:
    if fed.timing is None or fed.schedule is None:
        raise ConfigError("the async engine needs `engine.speed` and a schedule (`engine.schedule` or a recipe).")
    size = fed.cohort.size if fed.cohort.kind == "uniform" else 0
    if size > fed.num_clients:
        raise ConfigError(f"`cohort.size` (s = {size}) must not exceed the number of clients "
                          f"(`data.num_clients` = {fed.num_clients}).")
    if not isinstance(fed.schedule, Synchronous):
        if fed.cohort.kind != "uniform":
            raise ConfigError("`cohort.sampler` must be \"uniform\" (s clients per server step) for the "
                              f"{type(fed.schedule).__name__.lower()} schedule.")
        if fed.training.steps < 1:
            raise ConfigError("`client.steps` (K, the most local steps between two contacts) must be >= 1 for "
                              f"the {type(fed.schedule).__name__.lower()} schedule.")
    down = None if fed.links is None else fed.links.downlink
    if down is not None and down.needs_key and not isinstance(fed.schedule, Polling):
        raise ConfigError(f"`compress.downlink`: {component_name('compressor', down)} decodes against a reference "
                          f"point the clients of the {type(fed.schedule).__name__.lower()} schedule do not hold; use "
                          "it with the polling schedule (QuAFL) or pick a compressor without a key (qsgd, "
                          "qsgd_minmax).")
    if isinstance(fed.schedule, Polling) and fed.timing.interaction(fed) + fed.timing.wait_time == 0:
        raise ConfigError("`engine.interaction_time` and `engine.wait_time` are both 0: a polling (QuAFL) server step "
                          "would take no simulated time, so the clock would stay at 0 and no client ever complete a "
                          "local step; set either > 0.")
    idle = idle_schedule_params(fed)
    if idle:
        raise ConfigError(f"`engine.schedule.{idle[0][0]}` is set but does nothing: {idle[0][1]}; remove it.")


def idle_schedule_params(fed: Federation) -> list[tuple[str, str]]:
    """``(parameter, why)`` of each parameter of ``fed.schedule``, set away from its default, that this federation
    makes do nothing (the run's bits and metrics stay the same): a key to refuse, as ``config/inert.py`` does."""
    sched, idle = fed.schedule, []
    if isinstance(sched, Polling):
        down = None if fed.links is None else fed.links.downlink
        if sched.decode_key != "base" and (down is None or not down.needs_key):
            sent = "the model reaches the clients uncompressed" if down is None else \
                f"`compress.downlink`, {component_name('compressor', down)}, decodes without a reference point"
            idle.append(("decode_key", f"{sent}; only a keyed downlink (\"lattice\") decodes against the client's "
                                       "model"))
        if sched.speed_weights:
            means = fed.timing.speed.mean_step(torch.arange(fed.num_clients))
            if bool((means == means[0]).all()):
                idle.append(("speed_weights", "every client has the same mean step time, so every weight "
                                              "η_i = H_min/H_i is 1"))
    elif isinstance(sched, Buffered):
        default = Buffered()
        theirs, other = (("fedasync", ("alpha", "a")) if sched.mixing == "fedbuff"
                         else ("fedbuff", ("server_lr", "staleness")))
        idle += [(k, f'`mixing` is "{sched.mixing}" ({" and ".join(other)} are "{theirs}"\'s)') for k in other
                 if getattr(sched, k) != getattr(default, k)]
        stale = "a" if sched.mixing == "fedasync" else "staleness"
        if sched.refresh == "updated" and fed.cohort.size == fed.num_clients and \
                getattr(sched, stale) != getattr(default, stale):
            idle.append((stale, "every client reports at every step and restarts from the updated model, so the "
                                "staleness τ is always 0"))
    return idle


def _speed_weights(fed: Federation) -> torch.Tensor:
    """``η_i = H_min/H_i`` with ``H_i`` the expected completed steps between two contacts (simtime closed form)."""
    n, s, k = fed.num_clients, fed.cohort.size, fed.training.steps
    c = fed.timing.interaction(fed) + fed.timing.wait_time
    means = fed.timing.speed.mean_step(torch.arange(n)).tolist()
    h = torch.tensor([expected_steps(s / n, c, m, k) for m in means], dtype=torch.float64)
    return h.min() / h


def _polling(fed: Federation, state: EngineState, clock: ClockState, sched: Polling,
             metrics: dict[str, Any]) -> tuple[EngineState, dict[str, Any]]:
    r, k, x_t = state.round, fed.training.steps, state.params
    sampled = sample_cohort(fed, r)
    sampled_t = torch.tensor(sampled, dtype=torch.long)
    done = clock.steps_done(sampled_t, clock.durations(sampled_t, fed.timing.speed, fed.seed, k))
    plans, crafted, cohort = admit(fed, r, sampled, metrics, dict(zip(sampled, done.tolist())))
    ids = [p.client_id for p in plans]
    s = len(cohort)
    store = ClientStateStore.from_state_dict(state.clients)
    base = store.gather(ids, {BASE: fed.initial_params})[BASE].to(x_t)
    received = {"model": x_t, **fed.local_chain.downlink(state.shared)}
    ctx = cohort_context(fed, r, plans, received, store)
    results = fed.executor.run(_job(fed, sched.lr_scale), plans, ctx, start=base)
    store = store.scatter(ids, results.client_state)
    if sched.speed_weights and ids:
        results = _scaled(results, state.clock["speed_weights"][torch.tensor(ids)])
    sent_models: dict[str, torch.Tensor] = {}

    def to_server(x: torch.Tensor, senders: list[int]) -> tuple[torch.Tensor, int, int]:
        y = base + x  # Y^i = X^i − η η_i h̃_i: the client's model with its completed progress
        sent_models.setdefault("y", y)
        up = _links(fed).up(y, x_t, r, senders)  # the server decodes every message against its X_t
        return up.decoded - x_t, up.bits_per_message, up.decode_failures

    scale = s / (s + 1) if sched.server_averaging else 1.0
    new, metrics = deliver(fed, state, plans, crafted, cohort, results, store, 0, metrics, Uplink(to_server, scale))
    if ids:
        y = sent_models["y"] if "y" in sent_models else base + results.updates
        down = _links(fed).down(x_t, r, base if sched.decode_key == "base" else y)
        decoded = down.decoded
        if decoded.shape[0] > 1 and decoded.stride(0) == 0:  # one model broadcast (float32 link): divide it once
            decoded = decoded[:1]
        # X^i = Q(X_t)/(s+1) + s·Y^i/(s+1), one pass over the (s, d) models (add's alpha: one rounding)
        mixed = torch.add(decoded / (s + 1), y, alpha=s / (s + 1)) if sched.client_averaging else down.decoded
        new.clients = store.scatter(ids, {BASE: mixed}).state_dict()
        _charge_down(new, metrics, down.bits_per_message * s)
        metrics["decode_failures"] = metrics.get("decode_failures", 0) + down.decode_failures
        metrics["zero_step_clients"] = int(sum(1 for n in results.num_steps if n == 0))
    clock.contact(sampled_t, r)
    clock.advance(fed.timing.interaction(fed) + fed.timing.wait_time)
    metrics["_local_steps"] = sum(results.num_steps)
    return new, metrics


def _synchronous(fed: Federation, state: EngineState, clock: ClockState, sched: Synchronous,
                 metrics: dict[str, Any]) -> tuple[EngineState, dict[str, Any]]:
    r, t = state.round, clock.server_time
    sampled = sample_cohort(fed, r)
    sampled_t = torch.tensor(sampled, dtype=torch.long)
    planned = _planned(fed, sampled)
    durations = clock.durations(sampled_t, fed.timing.speed, fed.seed, max(planned, default=1) or 1)
    starts = torch.full((len(sampled),), t, dtype=torch.float64)  # everyone starts from X_t now
    budget = None
    if sched.deadline > 0:  # FedNova: the steps done before the deadline, at least one
        done = completed_steps(starts, durations, t + sched.deadline)
        budget = {c: max(1, min(int(q), p)) for c, q, p in zip(sampled, done.tolist(), planned)}
    plans, crafted, cohort = admit(fed, r, sampled, metrics, budget)
    received, bytes_down = broadcast(fed, state, r, len(cohort))
    store = ClientStateStore.from_state_dict(state.clients)
    results = fed.executor.run(fed.local_job(), plans, cohort_context(fed, r, plans, received, store))
    store = store.scatter([p.client_id for p in plans], results.client_state)
    uplink = compressed_deltas(fed, r)
    if sched.deadline > 0 and plans:
        tau = torch.tensor(results.num_steps, dtype=torch.float64).clamp(min=1)
        w = weights(fed)
        # τ_eff is a host-side scalar: the weights (on the run's device with the reports) join τ on the CPU
        p = torch.ones(len(plans), dtype=torch.float64) if w is None else w[torch.tensor([c.client_id
                                                                                           for c in plans])].cpu()
        results = _scaled(results, 1.0 / tau)
        uplink = Uplink(uplink.to_server, float((p * tau).sum() / p.sum()))
    new, metrics = deliver(fed, state, plans, crafted, cohort, results, store, bytes_down, metrics, uplink)
    steps_of = dict(zip([p.client_id for p in plans], results.num_steps))
    steps = torch.tensor([steps_of.get(c, q if budget is None else budget[c]) for c, q in zip(sampled, planned)])
    slowest = float((finish_times(starts, durations, steps).max() - t).clamp(min=0)) if sampled else 0.0
    clock.contact(sampled_t, r)
    clock.advance(slowest + fed.timing.interaction(fed) + fed.timing.wait_time)
    metrics["_local_steps"] = sum(results.num_steps)
    return new, metrics


def _buffered(fed: Federation, state: EngineState, clock: ClockState, sched: Buffered,
              metrics: dict[str, Any]) -> tuple[EngineState, dict[str, Any]]:
    r, k, x_t = state.round, fed.training.steps, state.params
    finish, version = state.clock["finish"].clone(), state.clock["version"].clone()
    order = torch.argsort(finish, stable=True)
    picked = sorted(order[:fed.cohort.size].tolist())
    picked_t = torch.tensor(picked, dtype=torch.long)
    clock.server_time = max(clock.server_time, float(finish[picked_t].max()))
    plans, crafted, cohort = admit(fed, r, picked, metrics, {c: k for c in picked})
    ids = [p.client_id for p in plans]
    store = ClientStateStore.from_state_dict(state.clients)
    base = store.gather(ids, {BASE: fed.initial_params})[BASE].to(x_t)
    received = {"model": x_t, **fed.local_chain.downlink(state.shared)}
    results = fed.executor.run(_job(fed, sched.lr_scale), plans, cohort_context(fed, r, plans, received, store),
                               start=base)
    store = store.scatter(ids, results.client_state)
    tau = (r - version[torch.tensor(ids, dtype=torch.long)]).to(torch.float64) if ids else torch.zeros(0)
    metrics["staleness_mean"] = float(tau.mean()) if ids else 0.0
    if sched.mixing == "fedasync":
        alpha = sched.alpha * (1 + tau) ** (-sched.a)

        def to_server(x: torch.Tensor, senders: list[int]) -> tuple[torch.Tensor, int, int]:
            up = _links(fed).up(base + x, x_t, r, senders)  # the client's model, decoded against x_t
            return (up.decoded - x_t) * alpha.to(x).unsqueeze(1), up.bits_per_message, up.decode_failures
        uplink = Uplink(to_server)
    else:
        w = (1 + tau) ** -0.5 if sched.staleness == "sqrt" else torch.ones_like(tau)

        def to_server(x: torch.Tensor, senders: list[int]) -> tuple[torch.Tensor, int, int]:
            up = _links(fed).up(x, None, r, senders)  # deltas: a lattice decodes them against 0
            return up.decoded * w.to(x).unsqueeze(1), up.bits_per_message, up.decode_failures
        uplink = Uplink(to_server, sched.server_lr)
    new, metrics = deliver(fed, state, plans, crafted, cohort, results, store, 0, metrics, uplink)
    # Reporting clients receive a model and restart: their next K steps start now.
    fresh = new.params if sched.refresh == "updated" else x_t
    if ids:
        down = _links(fed).down(fresh, r, receivers=len(ids))
        new.clients = store.scatter(ids, {BASE: down.decoded}).state_dict()
        _charge_down(new, metrics, down.bits_per_message * len(cohort))
    version[picked_t] = r + 1 if sched.refresh == "updated" else r
    clock.contact(picked_t, r)
    finish[picked_t] = finish_times(clock.last_contact[picked_t], clock.durations(picked_t, fed.timing.speed,
                                                                                  fed.seed, k), k)
    clock.advance(fed.timing.interaction(fed) + fed.timing.wait_time)
    new.clock = {**state.clock, "finish": finish, "version": version}
    metrics["_local_steps"] = sum(results.num_steps)
    return new, metrics


def _links(fed: Federation) -> Links:
    """The federation's links; float32 both ways when it has none (``Links`` sends uncompressed then)."""
    return fed.links if fed.links is not None else Links(None, None, fed.seed)


def _charge_down(new: EngineState, metrics: dict[str, Any], bits: int) -> None:
    new.bytes_down_total += bits // 8
    metrics["bytes_down"] = metrics.get("bytes_down", 0) + bits // 8
    metrics["bytes_down_total"] = new.bytes_down_total
