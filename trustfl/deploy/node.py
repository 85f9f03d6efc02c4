"""A deployed node: trustfl's client half for one client, the same local training and client stages as the simulator.

A node is built from the same TOML file as the server and knows which client it is (Flower's ``partition-id``).
It reads only its own rows of the data, keeps its own state between rounds (the client stages' state, e.g.
CafCor's worker momentum, and its client-state-store entry, e.g. SCAFFOLD's control variate) and its own
secrets: a private seed for its randomness (batches, DP noise) and an X25519 key pair whose public half is all
the server relays. A round at the node::

    decode the downlink → its plan (rows, batch size, noise multiplier, step budget, as the simulator's)
    → local training (objective → gradient method → gradient transforms → local SGD)
    → client stages (clip, noise, correlated noise with pair seeds from its own key, momentum)
    → uplink compressor, if any (its own rounding, from its own seed) → reply

With ``deploy.secrets = "run_seed"`` the node derives its seed and key from the run seed exactly as the simulator
does, so a deployment reproduces the simulation (to float rounding); the server could then reproduce the noise,
so that setting is for testing a deployment only.
"""
from __future__ import annotations

import dataclasses
import io
import secrets as _os_secrets
from typing import Any

import torch

from trustfl.client.state import ClientStateStore
from trustfl.config.build import build_federation
from trustfl.config.schema import ExperimentConfig
from trustfl.core.checks import describe_value
from trustfl.core.finite import all_finite
from trustfl.deploy.wire import Hello, TrainReply, TrainRequest, unpack_directory
from trustfl.engine.federation import Federation
from trustfl.engine.round_parts import cohort_context, context, make_plan, weights
from trustfl.engine.sync import round_job
from trustfl.errors import ConfigError, MessageError
from trustfl.privacy.correlated import CorrelatedNoise, simulation_key_seed
from trustfl.privacy.keys import ClientKeys, PublicKeyDirectory

NodeState = dict[str, Any]


def uplink_message(links: Any, x: torch.Tensor, r: int, cid: int,
                   seed: int) -> tuple[torch.Tensor | None, dict[str, torch.Tensor] | None]:
    """What a node sends of its ``(1, d)`` message ``x``: ``(x[0], None)`` without an uplink compressor, else
    ``(None, payload)`` encoded with its own dither from its own ``seed``. No compressor's code carries NaN or ±inf
    (the lattice's integer cast lands them on a finite point): such a message goes with an empty payload, which the
    server screens out as malformed, as the simulation rejects it."""
    if links is None or links.uplink is None:
        return x[0], None
    if not all_finite(x):
        return None, {}
    return None, links.encode(x, r, [cid], "up", seed).payload


class NodeRuntime:
    """Client ``client_id``'s half of every round, for a node that holds that client's data.

    Args:
      cfg: the experiment, the same file the server runs.
      client_id: which of the ``data.num_clients`` clients this node is.
      data_dir: where the data sets live (as for ``trustfl run``).
      fed: an already built federation of ``cfg`` (tests share one); ``None``: built here, for this client
        alone (only its own noise multiplier is calibrated and its own schedule checked).
      checked_noise: the noise multiplier this node calibrated at an earlier message of the run (its state's
        ``noise_multiplier``): a Flower node, rebuilt at every message, calibrates and checks once, at its hello.
      key: its X25519 key pair made before the run (:mod:`trustfl.deploy.pinned`), in place of a fresh one.
      pinned: every client's public key, given to the node before the run: it refuses a request whose relayed
        directory holds another key (needs ``key``).

    Raises:
      ConfigError: if ``client_id`` is not one of the configured clients, or ``pinned`` does not pin ``key``.
    """

    def __init__(self, cfg: ExperimentConfig, client_id: int, data_dir: str | None = None,
                 fed: Federation | None = None, checked_noise: float | None = None, key: ClientKeys | None = None,
                 pinned: PublicKeyDirectory | None = None) -> None:
        n = cfg.data.num_clients
        if not isinstance(client_id, int) or not 0 <= client_id < n:
            raise ConfigError(f"node `partition-id` must be an integer in [0, {n}) for `data.num_clients` = {n}, "
                              f"found {client_id!r}.")
        self.cfg, self.client_id = cfg, client_id
        if pinned is not None and key is None:
            raise ConfigError(f"node {client_id}: node config `public-keys` needs `key-file`: a node pins the keys "
                              f"only with its own key made with them (`trustfl deploy keys`).")
        if pinned is not None and (client_id not in pinned or key.public_bytes != pinned[client_id]):
            raise ConfigError(f"node {client_id}: node config `public-keys` pins another key for it than its "
                              f"`key-file` holds (each node needs its own key made with the pinned ones).")
        self.key, self.pinned = key, pinned
        self.fed = fed if fed is not None else build_federation(cfg, data_dir=data_dir, quiet=True,
                                                                for_client=client_id, checked_noise=checked_noise)

    # -- state kept between messages (a Flower node runs each message in a fresh process) ---------------------
    def new_state(self) -> NodeState:
        """The node's state before its first round: its secrets, its stages' initial state, no client entry."""
        fed, cid = self.fed, self.client_id
        if self.cfg.deploy.secrets == "run_seed":
            seed, key = fed.seed, ClientKeys.generate(cid, simulation_key_seed(fed.seed))
        else:
            seed, key = _os_secrets.randbits(63), ClientKeys.generate(cid)
        key = key if self.key is None else self.key
        return {"seed": seed, "private_key": key.private_key.private_bytes_raw(),
                "stages": fed.client_stages.init(fed.layout), "clients": {}, "last_round": -1,
                "noise_multiplier": float(fed.noise_multipliers[cid])}

    @staticmethod
    def save_state(state: NodeState) -> bytes:
        buf = io.BytesIO()
        torch.save(state, buf)
        return buf.getvalue()

    @staticmethod
    def load_state(blob: bytes) -> NodeState:
        """The state :meth:`save_state` wrote (tensors, numbers, bytes and dicts only: ``weights_only``)."""
        return torch.load(io.BytesIO(blob), weights_only=True)

    def keys(self, state: NodeState) -> ClientKeys:
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        return ClientKeys(self.client_id, X25519PrivateKey.from_private_bytes(state["private_key"]))

    def _check_received(self, received: dict[str, torch.Tensor]) -> None:
        """Refuse (MessageError) a downlink without the model, or the gradient transforms' server values, of this
        run's shapes and dtypes: it would fail deep in local training with a traceback in the node's log."""
        fed = self.fed
        expected = {"model": fed.initial_params,
                    **fed.local_chain.downlink(fed.local_chain.server_init(fed.initial_params))}
        for key, like in expected.items():
            got = received.get(key)
            if not isinstance(got, torch.Tensor) or got.shape != like.shape or got.dtype != like.dtype:
                found = "nothing" if got is None else describe_value(got)
                raise MessageError(f"node {self.client_id} refuses the request: the server sent {found} as {key!r}, "
                                   f"this run's is {describe_value(like)}.")

    def _decoded_model(self, coded: dict[str, torch.Tensor], r: int) -> torch.Tensor:
        """The model the server sent through ``compress.downlink``, decoded (MessageError: a request without it,
        or with a payload of other shapes than the compressor's)."""
        fed, links = self.fed, self.fed.links
        if links is None or links.downlink is None:
            raise MessageError(f"node {self.client_id} refuses the request: it carries an encoded model, but this "
                               f"run's `compress.downlink` is \"none\".")
        expected = links.expected_payload(r, "down", fed.initial_params)
        what = f"node {self.client_id} refuses the request: its encoded model"
        return links.decode_received(coded, expected, r, "down", fed.initial_params, what)[0]

    # -- the two messages ---------------------------------------------------------------------------------------
    def hello(self, state: NodeState) -> Hello:
        """Who this node is: its id, its public key and how many examples it holds."""
        rows = self.fed.client_rows[self.client_id]
        return Hello(self.client_id, self.keys(state).public_bytes, int(rows.numel()))

    def train(self, request: TrainRequest, state: NodeState) -> tuple[TrainReply, NodeState]:
        """Run this client's half of round ``request.round``; return the reply and the node's new state.

        Raises:
          MessageError: the round is outside the run's rounds, or not after the last round this node trained.
            The node's randomness comes from (its seed, the round), so a replayed round would draw the same noise
            again: two replies to two models would cancel it in their difference. Its noise multiplier is
            calibrated for at most ``rounds`` participations; so each round is answered at most once, in order,
            and never past the run, whatever the server asks. The one exception releases nothing new: asked its
            last round again with the same request (a server resumed from its checkpoint), the node sends its
            kept reply again, marked ``replayed``.
        """
        fed, cid, r = self.fed, self.client_id, request.round
        self._check_pinned(request.directory)
        last = int(state.get("last_round", -1))  # a state saved before nodes kept it: no round trained yet
        digest = request.digest(with_directory=self._draws_pair_noise)
        kept = state.get("last_reply")
        if r == last and kept is not None and kept["digest"] == digest:  # a resumed server asks it again
            return TrainReply(**kept["reply"], replayed=True), state
        if not last < r < self.cfg.rounds:
            why = f"the run has rounds 1-{self.cfg.rounds}" if r >= self.cfg.rounds else \
                f"this node has already trained round {last + 1}; each round is answered once, in order"
            raise MessageError(f"node {cid} refuses to train round {r + 1}: {why} (a replayed round would draw "
                               f"the same noise again, and its privacy is calibrated for {self.cfg.rounds} rounds).")
        device = fed.initial_params.device
        encoded = {k: v.to(device) for k, v in request.payload.items()}
        received = fed.downlink.decode(encoded, request.torch_dtypes())
        if request.coded or (fed.links is not None and fed.links.downlink is not None):
            received["model"] = self._decoded_model(request.coded, r)
        self._check_received(received)
        plan = make_plan(fed, cid, r)
        store = ClientStateStore.from_state_dict(state["clients"])
        job, lr = round_job(fed, r)
        seed = int(state["seed"])
        results = fed.executor.run(job, [plan], cohort_context(fed, r, [plan], received, store, lr=lr, seed=seed))
        store = store.scatter([cid], results.client_state)
        pair_keys = None
        if request.directory:
            pair_keys = ({cid: self.keys(state)}, unpack_directory(request.directory))
        ctx = dataclasses.replace(context(fed, r, [cid], weights(fed)), seed=seed, pair_keys=pair_keys)
        out = fed.client_stages.apply(results.updates, state["stages"], ctx)
        extras = {k: v[0] for k, v in results.extras.items()}
        metrics = {k: float(v) for k, v in out.metrics.items() if isinstance(v, (int, float, torch.Tensor))}
        message, coded = uplink_message(fed.links, out.x, r, cid, seed)
        reply = TrainReply(cid, message, extras, int(results.num_steps[0]), float(results.train_loss[0]), metrics,
                           coded)
        kept = {"digest": digest, "reply": {f.name: getattr(reply, f.name) for f in dataclasses.fields(reply)
                                            if f.name != "replayed"}}
        return reply, {**state, "stages": out.state, "clients": store.state_dict(), "last_round": r,
                       "last_reply": kept}

    def _check_pinned(self, directory: bytes) -> None:
        """Refuse (MessageError) a request whose directory a node drawing pair noise cannot use: none at all (its
        pairs would come from the run's seed, which the server knows), or, with pinned keys, another key than the
        pinned one for any client or a pinned client left out (its pair noise would be left out of the message)."""
        if self._draws_pair_noise and not directory:
            raise MessageError(f"node {self.client_id} refuses the request: it draws pair noise with every peer, and "
                               f"the server relays no public-key directory.")
        if self.pinned is None:
            return
        relayed = unpack_directory(directory) if directory else PublicKeyDirectory.of({})
        other = [c for c in relayed.ids if c not in self.pinned or relayed[c] != self.pinned[c]]
        if other:
            raise MessageError(f"node {self.client_id} refuses the request: the server relays a public key for "
                               f"client(s) {other[:8]} other than the one(s) pinned in its `public-keys` file.")
        missing = [c for c in self.pinned.ids if c not in relayed.ids]
        if missing and self._draws_pair_noise:
            raise MessageError(f"node {self.client_id} refuses the request: the server's directory leaves out "
                               f"client(s) {missing[:8]} pinned in its `public-keys` file (their pair noise would "
                               f"be missing from the message).")

    @property
    def _draws_pair_noise(self) -> bool:
        """Whether its messages hold pair noise drawn from the public-key directory (CafCor's correlated noise)."""
        return any(isinstance(stage, CorrelatedNoise) for _, stage in self.fed.client_stages.stages)
