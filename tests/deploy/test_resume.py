"""Resuming a deployment whose server was interrupted: the server continues from its checkpoint, each node from
the state it kept under the run's id, and every release a node may have made is charged.

The server is stopped *after* its nodes answered round 2 and before it checkpointed that round, the worst moment:
the nodes have released their replies, the server's ledgers do not know it.
"""
from __future__ import annotations

import json
import os
import stat
import sys

import pytest
import torch

from trustfl.config.load import load_config
from trustfl.deploy.loopback import InProcessTransport
from trustfl.deploy.node import NodeRuntime
from trustfl.deploy.server import run_deployment
from trustfl.errors import ConfigError, MessageError
from trustfl.experiment import run_experiment

sys.path.insert(0, os.path.dirname(__file__))
from test_protocol import CAFCOR, FEDAVG_DP_ROBUST, _config  # noqa: E402

IGNORED = {"wall_time_s", "round_time_s", "resent", "replayed"}


class ServerLost(RuntimeError):
    pass


class StopsAfterRound(InProcessTransport):
    """Nodes in this process; the server "dies" in round ``stop`` (1-based) once the first ``reached`` nodes of
    the round have answered (all of them by default; 0: the requests went out, no node got one)."""

    def __init__(self, nodes, stop=None, reached=None):
        super().__init__(nodes)
        self.stop, self.reached = stop, reached

    def train(self, requests, timeout):
        if self.stop is None or next(iter(requests.values()))[1]["round"] + 1 != self.stop:
            return super().train(requests, timeout)
        self.stop = None
        super().train(dict(list(requests.items())[:self.reached]), timeout)
        raise ServerLost("the server's machine went down")


def _nodes(cfg):
    return [NodeRuntime(cfg, i) for i in range(cfg.data.num_clients)]


def _interrupted(cfg, tmp_path, name="dep", reached=None):
    transport = StopsAfterRound(_nodes(cfg), stop=2, reached=reached)
    with pytest.raises(ServerLost):
        run_deployment(cfg, transport, tmp_path / name, progress=False, plots=False)
    return transport, tmp_path / name


def _rows(rows):
    return [{k: v for k, v in r.items() if k not in IGNORED} for r in rows]


@pytest.mark.parametrize("spec", [FEDAVG_DP_ROBUST, CAFCOR], ids=["fedavg_dp_cwtm", "cafcor_momentum_pair_noise"])
def test_a_resumed_deployment_equals_the_uninterrupted_one(spec, tmp_path):
    """Nodes that kept their state send round 2's replies again (replayed): nothing new is released or charged,
    and the run ends bit for bit as if never interrupted (CafCor: the nodes' momentum and pair keys kept too)."""
    cfg = _config(spec)
    whole = run_deployment(cfg, InProcessTransport(_nodes(cfg)), tmp_path / "whole", progress=False, plots=False)
    transport, run_dir = _interrupted(cfg, tmp_path)
    journal = [json.loads(line) for line in (run_dir / "deployment.jsonl").read_text().splitlines()]
    assert [e.get("round") for e in journal] == [None, 0, 1] and journal[2]["sent"] == [0, 1, 2, 3]
    assert len(journal[0]["run_id"]) == 32
    resumed = run_deployment(cfg, transport, resume=run_dir, progress=False, plots=False)
    assert torch.equal(resumed.params, whole.params)
    assert not torch.equal(whole.params, torch.zeros_like(whole.params))
    assert [(r["resent"], r["replayed"]) for r in resumed.rows] == [(0, 0), (4, 4), (0, 0)]
    assert _rows(resumed.rows) == _rows(whole.rows)
    assert resumed.summary["epsilon"] == whole.summary["epsilon"]


@pytest.mark.parametrize("reached", [0, 2])
def test_a_server_stopped_before_every_node_answered_resumes_to_the_same_model(reached, tmp_path):
    """Stopped when no node, or only two of four, had answered round 2: those send their kept replies again, the
    others train round 2 for the first time. The model is the uninterrupted run's; every request the journal
    says went out is charged again, so the others' ε errs on the high side. (A budget with room for that: with
    the noise calibrated to spend it in 3 rounds, the over-charged clients would sit round 3 out.)"""
    cfg = _config(FEDAVG_DP_ROBUST, "client.dp.noise_multiplier=1.0", "client.dp.epsilon=100.0")
    whole = run_deployment(cfg, InProcessTransport(_nodes(cfg)), tmp_path / "whole", progress=False, plots=False)
    transport, run_dir = _interrupted(cfg, tmp_path, reached=reached)
    resumed = run_deployment(cfg, transport, resume=run_dir, progress=False, plots=False)
    assert torch.equal(resumed.params, whole.params)
    assert (resumed.rows[1]["resent"], resumed.rows[1]["replayed"]) == (4, reached)
    eps, eps_whole = resumed.summary["epsilon"], whole.summary["epsilon"]
    assert all(eps[str(c)] == pytest.approx(eps_whole[str(c)], rel=1e-12) for c in range(reached))
    assert all(eps[str(c)] > eps_whole[str(c)] for c in range(reached, 4))


def test_nodes_that_lost_their_state_are_charged_for_both_releases_and_never_past_their_budget(tmp_path):
    """Nodes that start afresh (no state kept) train round 2 again: a second release. The server charged the
    first before admission, so round 2 costs two rounds; the noise was calibrated for 3 rounds, so round 3 finds
    every client out of budget and trains no one: ε never passes the budget."""
    cfg = _config(FEDAVG_DP_ROBUST, secrets="node")
    _, run_dir = _interrupted(cfg, tmp_path)
    resumed = run_deployment(cfg, InProcessTransport(_nodes(cfg)), resume=run_dir, progress=False, plots=False)
    rows = resumed.rows
    assert [(r["resent"], r["replayed"]) for r in rows] == [(0, 0), (4, 0), (0, 0)]
    whole = run_experiment(cfg, tmp_path / "sim", progress=False, plots=False)  # the same charges, uninterrupted
    assert rows[0]["epsilon_max"] == pytest.approx(whole.rows[0]["epsilon_max"], rel=1e-12)
    assert rows[1]["epsilon_max"] == pytest.approx(whole.rows[2]["epsilon_max"], rel=1e-12)  # 3 rounds' worth
    assert rows[2]["clients_out_of_budget"] == 4 and rows[2]["cohort_size"] == 0
    assert rows[2]["epsilon_max"] == rows[1]["epsilon_max"] <= cfg.client.dp.epsilon * (1 + 1e-9)


def test_a_resume_that_cannot_be_the_runs_is_refused_in_one_line(tmp_path):
    cfg = _config(FEDAVG_DP_ROBUST)
    transport, run_dir = _interrupted(cfg, tmp_path)
    with pytest.raises(ConfigError, match="^resume: the experiment deployed is not the one in .*config.toml"
                                          ".*`seed`"):  # the key that differs is named
        run_deployment(_config(FEDAVG_DP_ROBUST, "seed=7"), transport, resume=run_dir, progress=False)
    # and the other way round: a deployment's directory is not continued as a simulation (its nodes hold state)
    with pytest.raises(ConfigError, match=r"^resume: .*dep holds deployment.jsonl: it is the run directory of a "
                                          r"deployment"):
        run_experiment(None, resume=run_dir, progress=False, plots=False)
    sim = run_experiment(cfg, tmp_path / "sim", progress=False, plots=False)
    with pytest.raises(ConfigError, match="holds no deployment.jsonl: it is not the run directory of a deploy"):
        run_deployment(cfg, transport, resume=sim.run_dir, progress=False)
    with pytest.raises(ConfigError, match="holds no config.toml"):
        run_deployment(cfg, transport, resume=tmp_path, progress=False)
    for out, resume in [(tmp_path / "new", run_dir), (None, 3)]:
        with pytest.raises(ConfigError, match="^run_deployment: `resume` must be the path of an interrupted run"):
            run_deployment(cfg, transport, out, resume=resume, progress=False)
    journal = run_dir / "deployment.jsonl"
    journal.write_text(journal.read_text() + '{"round": "x"}\n')
    with pytest.raises(ConfigError, match="deployment.jsonl, line 4, is not a journal entry"):
        run_deployment(cfg, transport, resume=run_dir, progress=False)
    lines = journal.read_text().splitlines()[:-1]
    journal.write_text("\n".join(lines[:2] + ['{"round": 1, "sent": [0, 9]}']) + "\n")
    with pytest.raises(ConfigError, match=r"names client\(s\) \[9\] in round 2, not among the run's 4"):
        run_deployment(cfg, transport, resume=run_dir, progress=False)
    journal.write_text('{"run_id": "../../etc"}\n')
    with pytest.raises(ConfigError, match="line 1, holds no run id"):
        run_deployment(cfg, transport, resume=run_dir, progress=False)


def test_a_flower_node_keeps_its_state_in_its_state_dir_for_a_resumed_run(tmp_path):
    """Flower's ``context.state`` ends with the Flower run; a node with a ``state-dir`` also keeps its state in a
    file named by the trustfl run's id (owner-only: it holds the node's secrets), where the next Flower run of
    the same trustfl run (a resume) finds it. The run id comes from the server: never a path."""
    pytest.importorskip("flwr")
    from flwr.app import Context, RecordDict

    from trustfl.deploy import flower

    cfg = _config(FEDAVG_DP_ROBUST, secrets="node")
    node = NodeRuntime(cfg, 1)
    run_id = "0123456789abcdef" * 2

    def context(state_dir):
        return Context(run_id=7, node_id=3, node_config={"partition-id": 1, "state-dir": str(state_dir)},
                       state=RecordDict(), run_config={})

    first = context(tmp_path / "node1")
    state = flower._state(node, first, run_id)
    flower._keep(state, first)
    path = tmp_path / "node1" / f"trustfl-node-1-{run_id}.pt"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = flower._state(node, context(tmp_path / "node1"), run_id)  # a new Flower run: the file's state
    assert again["private_key"] == state["private_key"] and again["seed"] == state["seed"]
    other = flower._state(node, context(tmp_path / "node1"), "f" * 32)  # another trustfl run: a new state
    assert other["private_key"] != state["private_key"]
    assert flower._state(node, context(""), run_id)["private_key"] != state["private_key"]  # no state-dir
    for bad in ["../../x", "AB" * 16, "0" * 31]:
        with pytest.raises(MessageError, match="is not 32 hex digits"):
            flower._state(node, context(tmp_path), bad)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ConfigError, match="^node config `state-dir`: this node cannot write its state file"):
        flower._keep(state, context(tmp_path / "a_file"))
    path.write_bytes(b"not a state")
    with pytest.raises(MessageError, match=f"state file {path} cannot be read"):
        flower._state(node, context(tmp_path / "node1"), run_id)


def test_a_journal_line_nested_too_deep_is_an_altered_file(tmp_path):
    """json's RecursionError on a line nested 100,000 deep escaped as a traceback."""
    from trustfl.deploy.server import SendJournal
    from trustfl.errors import ConfigError
    (tmp_path / SendJournal.NAME).write_text('{"run_id": "' + "a" * 32 + '"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match=r"line 2, is not a journal entry; the file was altered"):
        SendJournal(tmp_path, resume=True)


@pytest.mark.parametrize("entry", ['{"round": 0, "sent": [1e400]}', '{"round": 1e400, "sent": [0]}',
                                   '{"round": true, "sent": [0]}', '{"round": 0, "sent": "012"}',
                                   '{"round": 0, "sent": [1.7]}', '{"round": -1, "sent": [0]}'])
def test_a_journal_entry_of_another_shape_is_an_altered_file(tmp_path, entry):
    """1e400 escaped as an OverflowError traceback; true was read as round 1, "012" as clients 0, 1 and 2."""
    from trustfl.deploy.server import SendJournal
    from trustfl.errors import ConfigError
    (tmp_path / SendJournal.NAME).write_text('{"run_id": "' + "a" * 32 + '"}\n' + entry + "\n")
    with pytest.raises(ConfigError, match=r"line 2, is not a journal entry; the file was altered"):
        SendJournal(tmp_path, resume=True)
