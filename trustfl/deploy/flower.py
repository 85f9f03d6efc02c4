"""trustfl over Flower's Message API: a ``ServerApp`` that runs trustfl's server loop and a ``ClientApp`` that runs
one client's half per node (needs the optional extra: ``pip install 'trustfl[flower]'``, flwr 1.41).

No Flower ``Strategy`` is used: the server is :class:`trustfl.deploy.server.RemoteEngine` with
:class:`FlowerTransport`, which sends trustfl's wire messages (:mod:`trustfl.deploy.wire`) as an ``ArrayRecord``
(``"arrays"``) plus a ``ConfigRecord`` (``"config"``). Settings come from the Flower run config, written by
``trustfl deploy app``: ``trustfl-config`` (the experiment TOML, text), ``run-dir`` (where the server writes the
run directory) and ``data-dir``; each node's ``partition-id`` (its client id) comes from its node config
(``--node-config "partition-id=k"``), optionally with its own ``data-dir``, and with ``key-file`` and
``public-keys`` (:mod:`trustfl.deploy.pinned`).

A node keeps its state (secrets, stage state, client-store entry, its last reply) in Flower's ``context.state``
between messages; Flower runs each message in a fresh process, so nothing else survives. A Flower run's context
ends with the run: given a ``state-dir`` in its node config, a node also writes its state to a file there, named by
the trustfl run's id, which a resumed run (run config ``resume``: the run directory) finds again.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from trustfl.core.runfiles import unused_run_dir
from trustfl.deploy.node import NodeRuntime
from trustfl.deploy.pinned import read_private_key, read_public_keys
from trustfl.deploy.server import RUN_ID, AbstractTransport, run_deployment
from trustfl.deploy.wire import TrainRequest, Wire
from trustfl.engine.checkpoint import write_atomically
from trustfl.errors import ConfigError, MessageError, TrustFLError

POLL_S = 0.05
"""How often the server polls for replies (``Grid.send_and_receive`` sleeps 3 s between polls)."""
STATE_KEY = "trustfl"


def to_content(wire: Wire) -> RecordDict:
    arrays, config = wire
    plain = {k: _plain(v) for k, v in config.items() if v is not None}
    return RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}), "config": ConfigRecord(plain)})


def from_content(content: RecordDict) -> Wire:
    """The wire message in ``content``; anything unreadable becomes empty (the server screens it out)."""
    try:
        arrays = {k: a.numpy() for k, a in content["arrays"].items()} if "arrays" in content else {}
        config = dict(content["config"]) if "config" in content else {}
        return arrays, config
    except Exception:  # an untrusted payload: never let it crash the server
        return {}, {}


def _plain(v: Any) -> Any:
    return v.item() if hasattr(v, "item") and not isinstance(v, (bytes, str)) else v


class FlowerTransport(AbstractTransport):
    """trustfl's transport over a Flower ``Grid``: node ids are mapped to client ids by each node's hello."""

    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.node_of: dict[int, int] = {}
        self._down = self._up = 0

    def _exchange(self, messages: list[Message], timeout: float) -> dict[str, Message]:
        ids = {mid for mid in self.grid.push_messages(messages) if mid}
        replies: dict[str, Message] = {}
        deadline = time.monotonic() + timeout
        while ids and time.monotonic() < deadline:
            for reply in self.grid.pull_messages(ids):
                replies[reply.metadata.reply_to_message_id] = reply
                ids.discard(reply.metadata.reply_to_message_id)
            if ids:
                time.sleep(POLL_S)
        return replies

    def hello(self, num_nodes: int, timeout: float, run_id: str = "") -> dict[int, Wire]:
        deadline = time.monotonic() + timeout
        nodes = sorted(self.grid.get_node_ids())
        while len(nodes) < num_nodes and time.monotonic() < deadline:
            time.sleep(0.5)
            nodes = sorted(self.grid.get_node_ids())
        if len(nodes) != num_nodes:
            raise ConfigError(f"`data.num_clients` is {num_nodes} but {len(nodes)} node(s) are connected after "
                              f"`deploy.startup_timeout_s` = {timeout:g} s; start one node per client.")
        hello = ConfigRecord({"hello": True, "run_id": run_id})
        messages = [Message(RecordDict({"config": hello}), nid, "query") for nid in nodes]
        replies = self._exchange(messages, max(deadline - time.monotonic(), 10.0))
        out: dict[int, Wire] = {}
        for msg in messages:
            reply = replies.get(msg.metadata.message_id)
            if reply is None or reply.has_error():
                why = "no reply" if reply is None else f"error {reply.error.code}: {reply.error.reason}"
                raise ConfigError(f"node {msg.metadata.dst_node_id} did not introduce itself ({why}); check its "
                                  f"`partition-id` node config and its log.")
            wire = from_content(reply.content)
            cid = wire[1].get("client_id")
            if not isinstance(cid, int) or isinstance(cid, bool):  # a ConfigRecord may carry a list or a string
                raise MessageError(f"node {msg.metadata.dst_node_id} sent a malformed hello: its client_id is "
                                   f"{type(cid).__name__} {str(cid)[:40]!r}, not an int.")
            if cid in out:
                raise ConfigError(f"two nodes announce partition-id {cid}; give each node its own.")
            out[cid] = wire
            self.node_of[cid] = msg.metadata.dst_node_id
        return out

    def train(self, requests: dict[int, Wire], timeout: float) -> dict[int, Wire | str]:
        messages = []
        for cid, wire in requests.items():
            msg = Message(to_content(wire), self.node_of[cid], "train")
            self._down += msg.content["arrays"].count_bytes()
            messages.append(msg)
        replies = self._exchange(messages, timeout)
        out: dict[int, Wire | str] = {}
        for cid, msg in zip(requests, messages):
            reply = replies.get(msg.metadata.message_id)
            if reply is None:
                out[cid] = f"no reply within {timeout:g} s"
            elif reply.has_error():
                out[cid] = f"error {reply.error.code}: {reply.error.reason}"
            else:
                if "arrays" in reply.content:
                    self._up += reply.content["arrays"].count_bytes()
                out[cid] = from_content(reply.content)
        return out

    @property
    def bytes_sent(self) -> tuple[int, int]:
        return self._down, self._up


def _config(run_config: Any) -> Any:
    import tomllib

    from trustfl.config.load import config_from_dict

    text = str(run_config.get("trustfl-config", ""))
    if not text:
        raise ConfigError("the Flower run config has no `trustfl-config`; write the app with `trustfl deploy app`.")
    try:
        return config_from_dict(tomllib.loads(text))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"the Flower run config's `trustfl-config` is not valid TOML: {err}") from None


server_app = ServerApp()
client_app = ClientApp()


@server_app.main()
def _server_main(grid: Grid, context: Context) -> None:
    try:
        cfg = _config(context.run_config)
        resume = str(context.run_config.get("resume", "")) or None
        out = None if resume else str(context.run_config.get("run-dir", "")) or None
        if out is not None:  # an app run again writes beside its earlier runs, never over them
            out = str(unused_run_dir(Path(out)))
        data_dir = str(context.run_config.get("data-dir", "")) or None
        result = run_deployment(cfg, FlowerTransport(grid), out, resume=resume, data_dir=data_dir)
        print(f"[trustfl deploy] run directory: {result.run_dir}", file=sys.stderr, flush=True)
    except TrustFLError as err:  # one line, as the CLI prints it; then an exception Flower reports
        print(f"trustfl: error: {err}", file=sys.stderr, flush=True)
        raise DeploymentRefused(f"trustfl: error: {err}") from None


class DeploymentRefused(Exception):
    """A user error that stopped the ServerApp, raised to Flower as an exception: Flower uploads the app's log and
    marks the run ``finished:failed`` with this line as its reason. (``SystemExit`` skipped both: ``flwr run``
    printed nothing and the run was failed a minute later for want of a heartbeat.)"""


_NODES: dict[tuple, NodeRuntime] = {}
"""Built nodes by (experiment, partition, data directory): a ClientApp process that outlives one message (Flower's
``process`` isolation) builds its node once."""


def _node(context: Context, checked_noise: float | None = None) -> NodeRuntime:
    """The node of this message; ``checked_noise``: its noise multiplier as calibrated at its hello (kept in its
    state), so that a train message neither calibrates nor checks again (about 1.5 s of every message's start)."""
    cid = context.node_config.get("partition-id")
    data_dir = str(context.node_config.get("data-dir", context.run_config.get("data-dir", ""))) or None
    key = (str(context.run_config.get("trustfl-config", "")), cid, data_dir)
    if key not in _NODES:
        _NODES.clear()
        cid = int(cid) if isinstance(cid, int) else cid
        key_path, public_path = (str(context.node_config.get(k, "")) for k in ("key-file", "public-keys"))
        own = read_private_key(key_path, cid) if key_path and isinstance(cid, int) else None
        _NODES[key] = NodeRuntime(_config(context.run_config), cid, data_dir=data_dir, checked_noise=checked_noise,
                                  key=own, pinned=read_public_keys(public_path) if public_path else None)
    return _NODES[key]


def _state_file(context: Context, run_id: str) -> Path | None:
    """Where the node keeps its state beyond the Flower run (``state-dir`` in its node config), or None."""
    state_dir = str(context.node_config.get("state-dir", ""))
    if not state_dir or not run_id:
        return None
    if not RUN_ID.fullmatch(run_id):  # from the server: never a path of its choosing
        raise MessageError(f"this node refuses the hello: its run id {run_id[:40]!r} is not 32 hex digits.")
    return Path(state_dir) / f"trustfl-node-{context.node_config.get('partition-id')}-{run_id}.pt"


def _state(node: NodeRuntime, context: Context, run_id: str = "") -> dict:
    """The node's state: this Flower run's, else the one its state file kept for the trustfl run, else new."""
    if STATE_KEY in context.state:
        return NodeRuntime.load_state(context.state[STATE_KEY]["blob"])
    path = _state_file(context, run_id)
    if path is not None and path.is_file():
        try:
            return NodeRuntime.load_state(path.read_bytes())
        except Exception as err:  # torch.load's errors are of many kinds
            raise MessageError(f"this node's state file {path} cannot be read ({type(err).__name__}); it cannot "
                               f"resume this run.") from None
    return {**node.new_state(), "run_id": run_id}


def _keep(state: dict, context: Context) -> None:
    blob = NodeRuntime.save_state(state)  # serialised once, for the context and the file
    context.state[STATE_KEY] = ConfigRecord({"blob": blob})
    path = _state_file(context, str(state.get("run_id", "")))
    if path is not None:  # its secrets: readable by its owner only, and never half written
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(blob, path, private=True)
        except OSError as err:
            raise ConfigError(f"node config `state-dir`: this node cannot write its state file {path} "
                              f"({err.strerror or err}).") from None


@client_app.query()
def _hello(msg: Message, context: Context) -> Message:
    node = _node(context)
    config = msg.content["config"] if "config" in msg.content else {}
    state = _state(node, context, str(config.get("run_id", "")))
    _keep(state, context)
    return Message(to_content(node.hello(state).to_wire()), reply_to=msg)


def _trainer(context: Context) -> tuple[NodeRuntime, dict]:
    """The node of a train message and its state: the node built with the multiplier its hello kept."""
    if STATE_KEY not in context.state:
        raise MessageError("this node was asked to train before it introduced itself (no hello).")
    state = NodeRuntime.load_state(context.state[STATE_KEY]["blob"])
    return _node(context, state.get("noise_multiplier")), state


@client_app.train()
def _train(msg: Message, context: Context) -> Message:
    node, state = _trainer(context)
    request = TrainRequest.from_wire(from_content(msg.content))
    reply, state = node.train(request, state)
    _keep(state, context)
    return Message(to_content(reply.to_wire()), reply_to=msg)
