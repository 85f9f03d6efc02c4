"""The ``vertical`` engine: asynchronous vertical FL, one activated party per server iteration.

A *round* is ``iterations_per_round`` server iterations (default ``M·⌈D/B⌉``: every party passes over the data
once on average, the VFL-CZOFO code's epoch), so ``rounds`` counts epochs and the run makes
``T = rounds·iterations_per_round`` iterations. Each iteration the engine takes the next party of the
activation order (:mod:`trustfl.vertical.activation`), draws a minibatch of ``B`` sample IDs uniformly without
replacement, and lets the method (:mod:`trustfl.vertical.methods`) run the party's and the server's halves.

The run's flat parameter vector holds every party's model and the head; each party and the server work on their
own slice of it (views), and each party holds only its own columns of the training set. Every draw is keyed by
``(seed, iteration, …)`` and the server's cache, momentum buffers and the iteration counter are in the checkpoint,
so a resumed run reproduces the uninterrupted one. Privacy is charged to the ledgers before each round (all or
nothing). Metrics per round: ``train_loss``, ``iterations``, ``rejected`` (messages with non-finite values,
never applied), ``bytes_up``/``bytes_down`` and, with the clock activation, ``sim_time``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from trustfl.core.registry import register
from trustfl.engine.base import AbstractEngine
from trustfl.engine.federation import EngineState, Federation, refuse_meta_params
from trustfl.privacy.events import self_composed
from trustfl.vertical.methods import Iteration, VerticalMethod
from trustfl.vertical.parties import Party
from trustfl.vertical.server import Server


@dataclass
class VerticalSetup:
    """What the vertical engine needs besides the federation's model, objective and evaluators."""

    blocks: list[torch.Tensor]
    features: list[torch.Tensor]
    """Party ``m``'s columns of the training set, ``(D, d_m)``."""
    labels: torch.Tensor
    batch_size: int
    per_round: int
    order: torch.Tensor
    """The party activated at each of the run's iterations."""
    times: torch.Tensor | None
    party_lr: float
    party_momentum: float
    server_lr: float
    server_momentum: float
    method: VerticalMethod | None = None
    release_event: Any = None
    """The DP event of one protected message (``None``: no DP accounting)."""
    cache_init: str = "forward"
    charge_all: bool = False
    """Charge every release to every party's ledger (DPZV's replies; the baselines with
    ``recipe.release_count = "all"``) instead of to the releasing party's only."""
    info: dict[str, Any] = field(default_factory=dict)
    _order_list: list[int] | None = field(default=None, init=False, repr=False)

    @property
    def num_parties(self) -> int:
        return len(self.blocks)

    @property
    def num_samples(self) -> int:
        return int(self.labels.shape[0])

    def party_at(self, t: int) -> int:
        if self._order_list is None:
            self._order_list = self.order.tolist()
        return self._order_list[t]


class VerticalEngine(AbstractEngine):
    """Runs ``iterations_per_round`` server iterations per round (see the module docstring)."""

    @staticmethod
    def _parties(fed: Federation, master: torch.Tensor, slices: list[slice]) -> list[Party]:
        setup, model = fed.vertical, fed.model
        return [Party.of(m, model.parties[m], master[slices[m]], setup.features[m], setup.party_momentum)
                for m in range(setup.num_parties)]

    def _parts(self, fed: Federation, master: torch.Tensor, state: EngineState,
               slices: list[slice]) -> tuple[list[Party], Server]:
        setup, model = fed.vertical, fed.model
        parties = self._parties(fed, master, slices)
        for m, velocity in state.shared.get("party_velocity", {}).items():
            parties[m].velocity = velocity.clone()
        server = Server(model.head, master[slices[-1]].clone(), setup.labels, state.shared["cache"],
                        fed.objective, setup.server_lr, setup.server_momentum)
        server.velocity.copy_(state.shared["head_velocity"])
        return parties, server

    def initial_state(self, fed: Federation) -> EngineState:
        setup = fed.vertical
        params = fed.initial_params.clone()
        slices = fed.model.slices()
        d_h = fed.model.embedding_dim
        cache = torch.zeros(setup.num_parties, setup.num_samples, d_h, device=params.device, dtype=params.dtype)
        bytes_up = 0
        if setup.cache_init == "forward":  # one warm-up pass of every party over all samples (DPZV §1)
            for party in self._parties(fed, params, slices):
                cache[party.index] = party.embed(party.features)
            bytes_up = 4 * cache.numel()
        head = slices[-1]
        return EngineState(round=0, params=params, server_optimizer=None, client_stages=None, aggregator=None,
                           server_stages=None, ledger=None if fed.ledger is None else fed.ledger.state_dict(),
                           bytes_up_total=bytes_up,
                           shared={"cache": cache, "head_velocity": torch.zeros_like(params[head]),
                                   "party_velocity": {}},
                           clock={"iteration": 0})

    def _charge(self, fed: Federation, first: int, last: int) -> None:
        setup = fed.vertical
        if fed.ledger is None or setup.release_event is None:
            return
        method = setup.method
        counts = torch.bincount(setup.order[first:last], minlength=setup.num_parties).tolist()
        if setup.charge_all:  # e.g. every DPZV reply is seen by the coalition of all parties (Thm 6.1's T)
            counts = [last - first] * setup.num_parties
        events = [(m, self_composed(setup.release_event, c * method.releases)) for m, c in enumerate(counts) if c]
        fed.ledger.charge(events)

    def run_round(self, fed: Federation, state: EngineState) -> tuple[EngineState, dict[str, Any]]:
        start_time = time.perf_counter()
        refuse_meta_params(state)
        setup, method = fed.vertical, fed.vertical.method
        first = state.clock["iteration"]
        last = first + setup.per_round
        self._charge(fed, first, last)
        master = state.params.clone()
        slices = fed.model.slices()
        parties, server = self._parts(fed, master, state, slices)
        device = master.device
        loss_sum = torch.zeros((), device=device, dtype=master.dtype)
        rejected = torch.zeros((), device=device, dtype=torch.long)
        n, b = setup.num_samples, setup.batch_size
        for t in range(first, last):
            it = Iteration(fed.seed, t)
            ids = torch.randperm(n, generator=it.generator(device, "batch"), device=device)[:b]
            ok, loss = method.iterate(it, parties[setup.party_at(t)], server, ids)
            loss_sum += torch.where(ok, loss, 0.0)  # a rejected message's loss is not the model's
            rejected += ~ok
        master[slices[-1]] = server.params
        up, down = method.bytes_per_iteration(b, fed.model.embedding_dim)
        count = last - first
        rejected_n = int(rejected)
        metrics: dict[str, Any] = {"round": state.round + 1, "iterations": last, "rejected": rejected_n,
                                   "bytes_up": up * count, "bytes_down": down * count}
        if rejected_n < count:  # the mean over the accepted iterations (absent when none was)
            metrics["train_loss"] = float(loss_sum) / (count - rejected_n)
        metrics.update({"bytes_up_total": state.bytes_up_total + up * count,  # the warm-up pass's included
                        "bytes_down_total": state.bytes_down_total + down * count})
        if setup.times is not None:
            metrics["sim_time"] = float(setup.times[last - 1])
        shared = {"cache": server.cache.contiguous(), "head_velocity": server.velocity.clone(),
                  "party_velocity": {p.index: p.velocity.clone() for p in parties if p.velocity is not None}}
        new = EngineState(
            round=state.round + 1, params=master.detach().clone(), server_optimizer=None, client_stages=None,
            aggregator=None, server_stages=None, ledger=None if fed.ledger is None else fed.ledger.state_dict(),
            bytes_up_total=state.bytes_up_total + up * count, bytes_down_total=state.bytes_down_total + down * count,
            wall_time_s=state.wall_time_s + time.perf_counter() - start_time,
            rejected_total=state.rejected_total + rejected_n, shared=shared, clock={"iteration": last})
        return new, metrics


register("engine", "vertical")(VerticalEngine)
