"""A deployed server: trustfl's server half over a transport (Flower, or in-process for tests).

:class:`RemoteEngine` is an engine like the simulator's synchronous one, so the shared run loop gives a deployment
the same run directory (``config.toml``, ``metrics.jsonl``, ``summary.json``, ``model.pt``, plots, checkpoints),
evaluation and progress. Its round::

    sample the cohort → admit (budgets) → encode the downlink → send each cohort node its request
    → wait up to ``deploy.round_timeout_s`` → screening → aggregation → server stages → server optimizer
    → ledgers → metrics (``dropped``, ``bytes_up``/``bytes_down`` from what was sent, ``wire_bytes_up``/
    ``wire_bytes_down`` as the transport counted them, e.g. Flower's array records with their headers)

The server never sees a node's data, state, seed or private key; it relays only public keys. DP events are
computed by the server from the configuration and each node's reported number of local steps (a node cannot
lower another's charge). A node that fails or times out is *dropped* from the round: the round aggregates
whoever answered if the rule's minimum is met, and is skipped with a notice otherwise (as is a round whose
malformed or non-finite replies leave too few). A dropped node is
charged its planned round (it may have released its message before the failure): ledgers err on the side of
more ε, never less. Pairwise-cancelling noise does not cancel across an absent peer; the round's
``<stage>/sum_noise_std`` is computed for the rows that actually arrived. A deployment resumed from its checkpoint
charges again what its :class:`SendJournal` says was sent after it, unless a node sends the same reply again.
"""
from __future__ import annotations

import abc
import json
import math
import os
import re
import secrets as _os_secrets
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch

from trustfl.core.rng import SERVER
from trustfl.core.runfiles import DEPLOYMENT_JOURNAL
from trustfl.deploy.checks import check_deployable
from trustfl.deploy.wire import Hello, TrainRequest, Wire, pack_directory, read_reply
from trustfl.engine.base import AbstractEngine
from trustfl.engine.federation import EngineState, Federation, refuse_meta_params
from trustfl.engine.local import ClientPlan, num_local_steps
from trustfl.engine.round_parts import (Arrivals, admit, client_charges, conclude, make_plan, round_events,
                                       sample_cohort)
from trustfl.engine.sync import initial_state
from trustfl.errors import ConfigError, MessageError
from trustfl.privacy.correlated import CorrelatedNoise
from trustfl.privacy.keys import PublicKeyDirectory


MAX_METRIC_NAME = 200
"""The longest metric name a node may report (a client stage's name, ``/``, its metric's name)."""


class AbstractTransport(abc.ABC):
    """How the server reaches its nodes. ``client id → wire message``; a failure is a string naming it."""

    @abc.abstractmethod
    def hello(self, num_nodes: int, timeout: float, run_id: str = "") -> dict[int, Wire]:
        """Wait until ``num_nodes`` nodes are connected (at most ``timeout`` seconds) and return each one's hello,
        keyed by the client id it announces. ``run_id`` names the run (the same when it is resumed): a node
        keeps its state under it.

        Raises:
          ConfigError: if the nodes do not match ``num_nodes`` (too few in time, too many, a duplicate id).
        """

    @abc.abstractmethod
    def train(self, requests: dict[int, Wire], timeout: float) -> dict[int, Wire | str]:
        """Send each client its request and collect the replies within ``timeout`` seconds (a failed or late
        node maps to a string saying why)."""

    @property
    def bytes_sent(self) -> tuple[int, int]:
        """Array bytes ``(down, up)`` the transport has carried so far (for the deployment benchmark)."""
        return 0, 0


RUN_ID = re.compile(r"[0-9a-f]{32}")
"""A run's id: 32 hex digits (:class:`SendJournal` draws 16 random bytes); a node names its state file by it."""


def _count(v: Any) -> bool:
    """An int >= 0 as JSON gives it (not a bool, a float or a string)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


class SendJournal:
    """``deployment.jsonl`` in the run directory: the run's id, then each round's recipients, written (and
    synced) *before* the requests go out.

    A server resumed from its checkpoint runs again the rounds after it. A node may already have released its
    reply to such a round; what the journal says was sent is charged again, unless the node sends that same reply
    again (``replayed``).
    """

    NAME = DEPLOYMENT_JOURNAL

    def __init__(self, run_dir: Path | None, resume: bool) -> None:
        self.path = None if run_dir is None else Path(run_dir) / self.NAME
        self.sent_before: dict[int, Counter[int]] = {}
        if not resume:
            self.run_id = _os_secrets.token_hex(16)
            if self.path is not None:
                self._append({"run_id": self.run_id}, mode="w")
            return
        if self.path is None or not self.path.is_file():
            raise ConfigError(f"resume: {run_dir} holds no {self.NAME}: it is not the run directory of a "
                              f"deployment, so its nodes' state cannot be found.")
        self.run_id = ""
        try:
            lines = self.path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"resume: {self.path} cannot be read ({type(err).__name__}).") from None
        for k, line in enumerate(lines, 1):
            try:
                entry = json.loads(line)
                if k == 1:
                    self.run_id = str(entry["run_id"])
                else:
                    r, sent = entry["round"], entry["sent"]
                    if not (_count(r) and isinstance(sent, list) and all(map(_count, sent))):
                        raise ValueError("not a round and a list of client ids")  # e.g. true, "012", [1.7], 1e400
                    self.sent_before.setdefault(r, Counter()).update(sent)
            except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: nested too deep for json
                raise ConfigError(f"resume: {self.path}, line {k}, is not a journal entry; the file was "
                                  f"altered.") from None
        if not RUN_ID.fullmatch(self.run_id):
            raise ConfigError(f"resume: {self.path}, line 1, holds no run id; the file was altered.")

    def record(self, r: int, clients: list[int]) -> None:
        if self.path is not None:
            self._append({"round": r, "sent": clients})

    def _append(self, entry: dict[str, Any], mode: str = "a") -> None:
        with open(self.path, mode) as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())


class RemoteEngine(AbstractEngine):
    """The synchronous schedule with every client's half run by a remote node through ``transport``.

    ``run_dir``: where the :class:`SendJournal` is kept (``None``: no journal, the run cannot be resumed);
    ``resume``: the run continues from its checkpoint. ``server_seed``: the seed of the server's draws (central
    noise, a randomized rule); ``None``: the run seed, which every node holds (``deploy.secrets = "run_seed"``).
    """

    def __init__(self, transport: AbstractTransport, round_timeout_s: float, startup_timeout_s: float,
                 run_dir: Path | None = None, resume: bool = False, server_seed: int | None = None) -> None:
        self.transport = transport
        self.server_seed = server_seed
        self.round_timeout_s, self.startup_timeout_s = round_timeout_s, startup_timeout_s
        self.directory: PublicKeyDirectory | None = None
        self.journal = SendJournal(run_dir, resume)

    def connect(self, fed: Federation) -> None:
        """Collect every node's hello: the public-key directory and the clients' example counts."""
        n = fed.num_clients
        hellos = {}
        for cid, wire in self.transport.hello(n, self.startup_timeout_s, self.journal.run_id).items():
            try:
                hellos[cid] = Hello.from_wire(wire)
            except MessageError as err:
                raise MessageError(f"the node announcing partition-id {cid} sent a malformed hello: {err}") from None
        if sorted(hellos) != list(range(n)):
            raise ConfigError(f"`data.num_clients` is {n} but the nodes announced client ids {sorted(hellos)}; "
                              f"start one node per client with partition-id 0..{n - 1}.")
        # The server built the same partition the nodes load: their weights are its counts, never a node's word
        # (a node announcing 2**62 examples took over a weighted robust rule). Another count: other data.
        own = fed.reports["num_samples"]
        other = next((c for c in range(n) if hellos[c].num_samples != int(own[c])), None)
        if other is not None:
            raise MessageError(f"the node of client {other} announced {hellos[other].num_samples} training examples, "
                               f"but its partition of the run's data holds {int(own[other])}: it loaded other data "
                               f"(another data-dir or file?) or is not honest; the run does not start.")
        self.directory = PublicKeyDirectory.of({cid: h.public_key for cid, h in hellos.items()})

    def initial_state(self, fed: Federation) -> EngineState:
        return initial_state(fed)

    def run_round(self, fed: Federation, state: EngineState) -> tuple[EngineState, dict[str, Any]]:
        if self.directory is None:
            self.connect(fed)
        start = time.perf_counter()
        refuse_meta_params(state)
        r = state.round
        metrics: dict[str, Any] = {"round": r + 1}
        resent = self._charge_earlier_sends(fed, r)  # before admission: a budget counts what may be released
        plans, _, cohort = admit(fed, r, sample_cohort(fed, r), metrics)
        payload = {"model": state.params, **fed.local_chain.downlink(state.shared)}
        encoded = fed.downlink.encode(payload)
        dtypes = {k: str(v.dtype).removeprefix("torch.") for k, v in payload.items()}
        coded: dict[str, torch.Tensor] = {}
        links = fed.links
        if links is not None and links.downlink is not None:  # the model through the compressor, the rest as it is
            coded = links.encode(state.params.unsqueeze(0), r, [SERVER], "down").payload
            encoded = {k: v for k, v in encoded.items() if k != "model"}
        request = TrainRequest(r, encoded, dtypes, pack_directory(self.directory), coded).to_wire()
        self.journal.record(r, [p.client_id for p in plans])
        sent_before = self.transport.bytes_sent
        replies = self.transport.train({p.client_id: request for p in plans}, self.round_timeout_s)
        sent_after = self.transport.bytes_sent
        bytes_down = (fed.downlink.nbytes(encoded) + fed.downlink.nbytes(coded)) * len(plans)
        uplink = None if links is None else links.uplink
        coded_up: dict[int, Any] = {}

        answered, dropped, replayed, rows, losses = [], [], [], {}, []
        extras: dict[str, dict[int, Any]] = {k: {} for k in fed.local_chain.extras_widths(fed.layout)}
        node_metrics: dict[str, list[float]] = {}
        events = []
        stage_events = fed.client_stages.round_events()
        for p in plans:
            budget = step_budget(fed, p)
            wire = replies.get(p.client_id, "no reply")
            reply = None if isinstance(wire, str) else read_reply(wire)
            if reply is None or reply.client_id != p.client_id:
                dropped.append(p.client_id)  # charged its planned round: it may have released its message
                steps = budget
            else:
                answered.append(p.client_id)
                if reply.replayed and p.client_id in resent:  # the release charged before the interruption
                    replayed.append(p.client_id)
                rows[p.client_id] = reply.message
                if uplink is not None:
                    coded_up[p.client_id] = reply.coded
                for k in extras:
                    extras[k][p.client_id] = reply.extras.get(k)
                if reply.train_loss is not None:
                    losses.append(reply.train_loss)
                for k, v in reply.metrics.items():
                    node_metrics.setdefault(k, []).append(v)
                steps = budget if reply.num_steps is None else min(reply.num_steps, budget)
            ev = round_events(fed, p, steps)
            if ev is not None and p.client_id not in replayed:
                events.append((p.client_id, ev))
        events.extend((p.client_id, e) for p in plans if p.client_id not in replayed for e in stage_events)
        stage_metrics = node_stage_metrics(node_metrics, fed, len(answered))
        for name, stage in fed.client_stages.stages:
            if isinstance(stage, CorrelatedNoise):  # what is left in the sum of the rows that arrived
                stage_metrics[f"{name}/sum_noise_std"] = stage.sum_noise_std(len(answered), fed.num_clients)
        # float64: each loss is a finite float32 (read_reply), but a float32 sum of two near 3e38 is inf
        loss = math.fsum(losses) / len(losses) if losses else None
        bits_row, failures = None, 0
        if uplink is not None:
            decoded, bits_row, failures = decoded_uplink(fed, r, coded_up, state.params)
            rows.update(decoded)
        arrivals = Arrivals(answered, rows, extras, events, stage_metrics, loss, bits_row, failures,
                            uplink is not None)
        metrics.update({"dropped": len(dropped), "dropped_clients": dropped, "resent": len(resent),
                        "replayed": len(replayed),
                        "wire_bytes_down": sent_after[0] - sent_before[0],
                        "wire_bytes_up": sent_after[1] - sent_before[1]})
        new, metrics = conclude(fed, state, arrivals, bytes_down, metrics, server_seed=self.server_seed)
        if dropped and not answered:  # requests went out and no node answered: as skipped as too few answers
            metrics["skipped"] = 1
        if metrics.get("skipped"):  # too few usable replies for the rule: the model stays, the sends are charged
            usable = metrics["cohort_size"] - metrics["rejected"]
            why = "none is left" if usable == 0 else f"the rest is too few: {fed.aggregator.too_few(usable)}"
            print(f"[trustfl deploy] round {state.round + 1} skipped: {metrics['dropped']} node(s) dropped, "
                  f"{metrics['rejected']} reply(ies) rejected, and {why}", file=sys.stderr, flush=True)
        new.wall_time_s = state.wall_time_s + time.perf_counter() - start
        return new, metrics


    def _charge_earlier_sends(self, fed: Federation, r: int) -> set[int]:
        """Charge, before admission, each request of round ``r`` the journal says went out before the run was
        interrupted (its reply may have been released); return those clients."""
        earlier = self.journal.sent_before.get(r, Counter())
        strangers = sorted(c for c in earlier if not 0 <= c < fed.num_clients)
        if strangers:
            raise ConfigError(f"resume: {self.journal.path} names client(s) {strangers[:8]} in round {r + 1}, not "
                              f"among the run's {fed.num_clients}; the file was altered.")
        if fed.ledger is not None and earlier:
            stage_events = fed.client_stages.round_events()
            charges = []
            for cid, times in sorted(earlier.items()):
                plan = make_plan(fed, cid, r)
                charges += [(cid, e) for e in client_charges(fed, plan, step_budget(fed, plan), stage_events)] * times
            fed.ledger.charge([(c, e) for c, e in charges if c in fed.ledger])
        return set(earlier)


def step_budget(fed: Federation, plan: ClientPlan) -> int:
    """The local steps a client's plan allows: the planned work, capped by its step budget."""
    planned = num_local_steps(fed.training, int(plan.rows.numel()), plan.batch_size)
    return planned if plan.max_steps is None else min(planned, plan.max_steps)


def decoded_uplink(fed: Federation, r: int, coded: dict[int, Any],
                   like: torch.Tensor) -> tuple[dict[int, torch.Tensor | None], int, int]:
    """The nodes' messages as the server decodes them from what ``compress.uplink`` encoded (a lattice against
    0, as in the simulation), each on its own: ``None`` for a payload of other shapes or dtypes than the
    compressor's, or one it cannot decode (screened out as a malformed message). Also the bits of one message and
    the decode failures the server detects itself."""
    links = fed.links
    template = links.expected_payload(r, "up", like)  # once a round, for every reply
    rows: dict[int, torch.Tensor | None] = {}
    failures = 0
    for cid, payload in coded.items():
        try:
            rows[cid], flagged = links.decode_received(payload, template, r, "up", like, f"node {cid}'s reply")
        except MessageError:
            rows[cid] = None
            continue
        failures += flagged
    return rows, template.bits_per_row(), failures


def node_stage_metrics(reported: dict[str, list[float]], fed: Federation, answered: int) -> dict[str, float]:
    """The round's client-stage metrics from what the nodes reported: the mean of each metric that more than half
    of the answering nodes reported under the name of one of the configured client stages (``"clip/mean_norm"``).
    A node's other keys are dropped, so no node can overwrite a key of the server's row (``round``, ``accuracy``,
    ``epsilon_max``...), which once made the run's own ``metrics.jsonl`` unreadable, nor add keys to it."""
    stages = tuple(f"{name}/" for name, _ in fed.client_stages.stages)
    return {k: sum(v) / len(v) for k, v in reported.items()
            if k.startswith(stages) and len(k) <= MAX_METRIC_NAME and 2 * len(v) > answered} if stages else {}


def run_deployment(cfg: Any, transport: AbstractTransport, out: str | Path | None = None, *,
                   resume: str | Path | None = None, data_dir: str | None = None, progress: bool = True,
                   plots: bool = True, on_eval: Callable[[dict[str, Any]], None] | None = None) -> Any:
    """Run ``cfg`` with its clients on remote nodes reached through ``transport``; the run directory is that of
    a simulation (:func:`trustfl.experiment.run_experiment`), plus the :class:`SendJournal`.

    ``resume``: continue the deployment in that run directory from its checkpoint (``cfg`` must be the run's
    experiment). The server checkpoints after every round (``engine.checkpoint_every`` = 0: never), since a node
    keeps only its last reply.

    Raises:
      ConfigError: if the configuration asks for something a deployment cannot honour (the key is named), the
        nodes do not match ``data.num_clients``, or ``resume`` is not a deployment of this experiment.
    """
    from trustfl.config.load import load_config
    from trustfl.engine.checkpoint import config_difference
    from trustfl.experiment import config_identity, default_run_dir, run_experiment

    if resume is not None:
        if out is not None or not isinstance(resume, (str, os.PathLike)):
            raise ConfigError(f"run_deployment: `resume` must be the path of an interrupted run's directory, without "
                              f"`out` (a new run's), found resume={resume!r}, out={out!r}.")
        run_dir = Path(resume)
        saved = run_dir / "config.toml"
        if not saved.is_file():
            raise ConfigError(f"resume: {run_dir} holds no config.toml; it is not a run directory.")
        saved_identity, identity = config_identity(load_config(saved)), config_identity(cfg)
        if saved_identity != identity:  # the text a checkpoint's config hash hashes
            differ = config_difference(saved_identity, identity, saved.name)
            raise ConfigError(f"resume: the experiment deployed is not the one in {saved}{differ}; deploy that file "
                              f"to resume its run.")
    else:
        run_dir = Path(out) if out is not None else default_run_dir(cfg)

    def engine(fed: Federation) -> RemoteEngine:
        check_deployable(cfg, fed)
        # With the nodes' own secrets the server keeps one too: central noise from the run seed, which every node
        # holds, could be recomputed by any node and subtracted from the model it receives.
        secret = None if cfg.deploy.secrets == "run_seed" else _os_secrets.randbits(63)
        remote = RemoteEngine(transport, cfg.deploy.round_timeout_s, cfg.deploy.startup_timeout_s, run_dir,
                              resume=resume is not None, server_seed=secret)
        remote.connect(fed)
        return remote

    every = min(cfg.engine.checkpoint_every, 1)
    return run_experiment(None if resume is not None else cfg, None if resume is not None else run_dir,
                          resume=resume, data_dir=data_dir, progress=progress, plots=plots, on_eval=on_eval,
                          engine=engine, checkpoint_every=every)
