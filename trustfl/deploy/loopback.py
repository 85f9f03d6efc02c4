"""An in-process transport: the nodes are :class:`NodeRuntime` objects in this process, reached through the same
wire messages as over a network. It runs the deployment protocol without Flower (tests, debugging); the node
state is kept serialised between rounds under the run's id, as a Flower node keeps it (in its state file, when it
has a ``state-dir``): a resumed run finds its nodes' state, a new run starts them afresh.
"""
from __future__ import annotations

from typing import Callable

from trustfl.deploy.node import NodeRuntime
from trustfl.deploy.server import AbstractTransport
from trustfl.deploy.wire import TrainRequest, Wire
from trustfl.errors import ConfigError, MessageError


class InProcessTransport(AbstractTransport):
    """Nodes in this process.

    Args:
      nodes: the node runtimes, one per client.
      fails: ``fails(round, client_id)`` is True when that node should fail in that round (a dropout).
    """

    def __init__(self, nodes: list[NodeRuntime], fails: Callable[[int, int], bool] | None = None) -> None:
        self.nodes = {node.client_id: node for node in nodes}
        if len(self.nodes) != len(nodes):
            raise ConfigError(f"two nodes announce the same partition-id: {[n.client_id for n in nodes]}.")
        self.fails = fails
        self.runs: dict[str, dict[int, bytes]] = {}
        """Each run's node states (run id → client id → saved state)."""
        self.states = self._fresh_states()
        self._down = self._up = 0

    def _fresh_states(self) -> dict[int, bytes]:
        return {cid: NodeRuntime.save_state(node.new_state()) for cid, node in self.nodes.items()}

    def hello(self, num_nodes: int, timeout: float, run_id: str = "") -> dict[int, Wire]:
        if run_id not in self.runs:
            self.runs[run_id] = self._fresh_states() if self.runs else self.states
        self.states = self.runs[run_id]
        return {cid: node.hello(NodeRuntime.load_state(self.states[cid])).to_wire()
                for cid, node in self.nodes.items()}

    def train(self, requests: dict[int, Wire], timeout: float) -> dict[int, Wire | str]:
        replies: dict[int, Wire | str] = {}
        for cid, wire in requests.items():
            self._down += sum(a.nbytes for a in wire[0].values())
            if cid not in self.nodes:
                replies[cid] = "unknown node"
                continue
            request = TrainRequest.from_wire(wire)
            if self.fails is not None and self.fails(request.round, cid):
                replies[cid] = "node failed"
                continue
            node = self.nodes[cid]
            try:
                reply, state = node.train(request, NodeRuntime.load_state(self.states[cid]))
            except MessageError as err:  # the node refuses; over Flower, its ClientApp's error reply
                replies[cid] = f"node refused: {err}"
                continue
            self.states[cid] = NodeRuntime.save_state(state)
            replies[cid] = reply.to_wire()
            self._up += sum(a.nbytes for a in replies[cid][0].values())
        return replies

    @property
    def bytes_sent(self) -> tuple[int, int]:
        return self._down, self._up
