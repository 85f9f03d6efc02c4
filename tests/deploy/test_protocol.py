"""The deployment protocol without Flower: server half + node halves through the wire messages, in-process.

Equality with the simulator (same config and seed, ``deploy.secrets = "run_seed"``), dropouts, skipped rounds,
malformed replies screened as in simulation, refusals of simulation-only settings, and the secrecy of the pair
seeds from the server.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from trustfl.config.build import build_federation
from trustfl.config.load import load_config
from trustfl.deploy.loopback import InProcessTransport
from trustfl.deploy.node import NodeRuntime
from trustfl.deploy.server import run_deployment
from trustfl.deploy.wire import Hello, TrainReply, TrainRequest, read_reply, unpack_directory
from trustfl.errors import ConfigError, MessageError
from trustfl.experiment import run_experiment
from trustfl.privacy.correlated import simulation_keys
from trustfl.privacy.keys import pair_seed

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
SMALL = ["rounds=3", 'data.dataset="digits"', "data.num_clients=4"]
FEDAVG_DP_ROBUST = (ROOT / "configs/dp/dpsgd_digits.toml", SMALL + ['aggregator={name="cwtm", f=1}'])
HETEROGENEOUS_EPS = (ROOT / "configs/dp/heterogeneous_eps_digits.toml", SMALL)  # each node calibrates its own ε
CAFCOR = (ROOT / "configs/cafcor/expA_cafcor_secldp.toml",
          SMALL + ['attack.name="none"', "attack.num_byzantine=0", 'recipe.noise_path="exact"', "recipe.ind_to_cor=1.0",
                   'model={name="mlp", hidden=[16]}', "client.batch_size=16"])


def _config(spec, *more, secrets="run_seed"):
    path, overrides = spec
    return load_config(path, list(overrides) + list(more) + [f'deploy.secrets="{secrets}"'])


def _deploy(cfg, tmp_path, name="dep", fails=None, transport=None):
    nodes = [NodeRuntime(cfg, i) for i in range(cfg.data.num_clients)]
    transport = transport or InProcessTransport(nodes, fails)
    return run_deployment(cfg, transport, tmp_path / name, progress=False, plots=False), transport


@pytest.mark.parametrize("spec", [FEDAVG_DP_ROBUST, HETEROGENEOUS_EPS, CAFCOR],
                         ids=["fedavg_dp_cwtm", "heterogeneous_eps", "cafcor_exact"])
def test_deployment_equals_the_simulation(spec, tmp_path):
    cfg = _config(spec)
    sim = run_experiment(cfg, tmp_path / "sim", progress=False, plots=False)
    dep, transport = _deploy(cfg, tmp_path)
    assert torch.allclose(dep.params, sim.params, atol=1e-5, rtol=0)
    assert not torch.equal(dep.params, torch.zeros_like(dep.params))
    for s, d in zip(sim.rows, dep.rows):
        assert d["dropped"] == 0 and d["bytes_up"] == s["bytes_up"] and d["bytes_down"] == s["bytes_down"]
        assert d["epsilon_max"] == pytest.approx(s["epsilon_max"], rel=1e-9)
        assert d["accuracy"] == pytest.approx(s["accuracy"], abs=1e-3)
    down, up = transport.bytes_sent  # what the wire carried: the float32 model down, the message up
    assert up == sum(r["bytes_up"] for r in dep.rows) and down == sum(r["bytes_down"] for r in dep.rows)
    # The run directory of a deployment is that of a simulation, plus the journal of what was sent.
    assert sorted(p.name for p in dep.run_dir.iterdir()) == sorted([p.name for p in sim.run_dir.iterdir()]
                                                                   + ["deployment.jsonl"])


def test_correlated_noise_is_real_in_the_deployment(tmp_path):
    """With secrets from the nodes the messages differ from the simulation's, but the model still trains."""
    cfg = _config(CAFCOR, secrets="node")
    sim = run_experiment(cfg, tmp_path / "sim", progress=False, plots=False)
    dep, _ = _deploy(cfg, tmp_path)
    assert not torch.allclose(dep.params, sim.params, atol=1e-3)
    assert torch.isfinite(dep.params).all()
    assert dep.rows[-1]["epsilon_max"] == pytest.approx(sim.rows[-1]["epsilon_max"], rel=1e-9)


def test_a_dropout_is_counted_charged_and_reported_honestly(tmp_path):
    cfg = _config(CAFCOR)
    dep, _ = _deploy(cfg, tmp_path, fails=lambda r, c: r == 1 and c == 2)
    rows = dep.rows
    assert [r["dropped"] for r in rows] == [0, 1, 0] and rows[1]["dropped_clients"] == [2]
    assert rows[1]["cohort_size"] == 3 and rows[0]["cohort_size"] == 4
    # The pair terms with the absent node do not cancel: the sum keeps √(m(n−m)σ_cor² + mσ_ind²) of noise.
    noise = [k for k in rows[0] if k.endswith("/sum_noise_std")]
    assert noise and rows[1][noise[0]] > rows[0][noise[0]]
    info = json.loads((dep.run_dir / "summary.json").read_text())
    assert info  # written
    # The dropped node is charged its planned round: every client has spent the same ε.
    assert rows[-1]["epsilon_min"] == pytest.approx(rows[-1]["epsilon_max"], rel=1e-12)
    assert torch.isfinite(dep.params).all()


def test_a_round_with_too_few_answers_is_skipped_not_crashed(tmp_path):
    cfg = _config(FEDAVG_DP_ROBUST)  # cwtm with f = 1 needs at least 3 messages
    dep, _ = _deploy(cfg, tmp_path, fails=lambda r, c: r == 1 and c != 0)
    assert dep.rows[1]["skipped"] == 1 and dep.rows[1]["dropped"] == 3
    assert "skipped" not in dep.rows[2] and dep.rows[2]["cohort_size"] == 4


def test_a_round_no_node_answers_is_skipped_and_said(tmp_path, capsys):
    """It was neither marked nor said (``skipped`` absent, ``rounds_skipped`` 0): the rule of 1-3 answers of 4."""
    cfg = _config(FEDAVG_DP_ROBUST)
    dep, _ = _deploy(cfg, tmp_path, fails=lambda r, c: r == 1)
    assert dep.rows[1]["skipped"] == 1 and dep.rows[1]["dropped"] == 4 and dep.rows[1]["cohort_size"] == 0
    assert "round 2 skipped: 4 node(s) dropped, 0 reply(ies) rejected, and none is left" in capsys.readouterr().err
    assert dep.summary["rounds_skipped"] == 1 and "skipped" not in dep.rows[2]


class Corrupting(InProcessTransport):
    """Replaces the replies of nodes ``which`` (node 1 by default) by something malformed."""

    def __init__(self, nodes, bad, which=(1,)):
        super().__init__(nodes)
        self.bad, self.which = bad, which

    def train(self, requests, timeout):
        replies = super().train(requests, timeout)
        for node in self.which:
            replies[node] = self.bad(replies[node])
        return replies


def _nan(wire):
    arrays, config = wire
    return {**arrays, "message": np.full_like(arrays["message"], np.nan)}, config


BAD_REPLIES = {
    "nan": _nan,
    "huge": lambda w: ({**w[0], "message": np.full_like(w[0]["message"], 3e38)}, w[1]),
    "short": lambda w: ({**w[0], "message": w[0]["message"][:-1]}, w[1]),
    "float64": lambda w: ({**w[0], "message": w[0]["message"].astype(np.float64)}, w[1]),
    "garbage": lambda w: ("junk", 3),
    "no_message": lambda w: ({}, w[1]),
}


@pytest.mark.parametrize("bad", sorted(BAD_REPLIES))
def test_a_malformed_reply_is_screened_as_in_simulation(bad, tmp_path):
    cfg = _config(FEDAVG_DP_ROBUST)
    nodes = [NodeRuntime(cfg, i) for i in range(cfg.data.num_clients)]
    dep, _ = _deploy(cfg, tmp_path, transport=Corrupting(nodes, BAD_REPLIES[bad]))
    assert torch.isfinite(dep.params).all()
    if bad == "huge":  # finite: out-voted by the trimmed mean, not screened
        assert all(r["rejected"] == 0 for r in dep.rows)
    elif bad == "garbage":  # no client id: the node counts as dropped
        assert all(r["dropped"] == 1 for r in dep.rows)
    else:
        assert all(r["rejected"] == 1 for r in dep.rows)
    assert dep.rows[-1]["accuracy"] > 0.5


def test_malformed_replies_that_leave_the_rule_too_few_skip_the_round_not_the_server(tmp_path, capsys):
    """Two NaN replies of 4 leave 2, under cwtm's 3 (f = 1), with no node dropped: the server used to stop there."""
    cfg = _config(FEDAVG_DP_ROBUST)
    nodes = [NodeRuntime(cfg, i) for i in range(cfg.data.num_clients)]
    dep, _ = _deploy(cfg, tmp_path, transport=Corrupting(nodes, _nan, which=(1, 2)))
    assert all(r["skipped"] == 1 and r["rejected"] == 2 and r["dropped"] == 0 for r in dep.rows)
    assert torch.equal(dep.params, build_federation(cfg, quiet=True).initial_params)  # never moved
    assert "round 1 skipped: 0 node(s) dropped, 2 reply(ies) rejected" in capsys.readouterr().err


def test_the_mean_of_finite_losses_near_the_float32_limit_is_finite(tmp_path):
    """Each node's loss is a finite float32 (the wire refuses more); their mean was taken in float32, so two near
    3e38 summed to inf and the round's ``train_loss`` said inf."""
    def near_limit(wire):
        arrays, config = wire
        return arrays, {**config, "train_loss": 3e38}

    cfg = _config(FEDAVG_DP_ROBUST)
    nodes = [NodeRuntime(cfg, i) for i in range(cfg.data.num_clients)]
    dep, _ = _deploy(cfg, tmp_path, transport=Corrupting(nodes, near_limit, which=(0, 1, 2, 3)))
    assert [r["train_loss"] for r in dep.rows] == [3e38] * cfg.rounds


@pytest.mark.parametrize("override,key", [
    ('attack={name="sign_flip", num_byzantine=1}', "attack.name"),
    ('recipe.noise_path="fast"', "recipe.noise_path"),
])
def test_settings_a_deployment_cannot_honour_are_refused_before_start(override, key, tmp_path):
    spec = CAFCOR if "noise_path" in override else FEDAVG_DP_ROBUST
    cfg = _config(spec, override)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _deploy(cfg, tmp_path)
    assert not (tmp_path / "dep" / "metrics.jsonl").exists() or not (tmp_path / "dep" / "metrics.jsonl").read_text()


def test_a_node_count_that_does_not_match_is_refused(tmp_path):
    cfg = _config(FEDAVG_DP_ROBUST)
    nodes = [NodeRuntime(cfg, i) for i in range(3)]  # 4 clients configured
    with pytest.raises(ConfigError, match="data.num_clients"):
        run_deployment(cfg, InProcessTransport(nodes), tmp_path / "dep", progress=False, plots=False)
    with pytest.raises(ConfigError, match="partition-id"):
        NodeRuntime(cfg, 4)


def test_the_server_cannot_compute_a_pair_seed(tmp_path):
    """Everything the server holds or relays: the hellos, the requests, the replies, the run directory. None of
    it contains a node's private key, and the keys the run seed gives (the simulation's) are not the nodes'."""
    cfg = _config(CAFCOR, secrets="node")
    nodes = [NodeRuntime(cfg, i) for i in range(cfg.data.num_clients)]
    seen: list[bytes] = []

    class Recording(InProcessTransport):
        def hello(self, num_nodes, timeout, run_id=""):
            out = super().hello(num_nodes, timeout, run_id)
            seen.extend(_blobs(out))
            return out

        def train(self, requests, timeout):
            replies = super().train(requests, timeout)
            seen.extend(_blobs(requests) + _blobs(replies))
            return replies

    transport = Recording(nodes)
    dep, _ = _deploy(cfg, tmp_path, transport=transport)
    seen.extend(p.read_bytes() for p in dep.run_dir.rglob("*") if p.is_file())
    private = {cid: NodeRuntime.load_state(s)["private_key"] for cid, s in transport.states.items()}
    assert all(len(k) == 32 for k in private.values())
    for key in private.values():
        assert not any(key in blob for blob in seen)
    # The directory the server relays is the nodes' public keys, and the simulation keys (which the server could
    # derive from the run seed) give other pair seeds than the nodes'. (A new run: the nodes start afresh.)
    request = TrainRequest.from_wire(next(w for w in _requests(transport, cfg)))
    node_keys = {cid: nodes[cid].keys(NodeRuntime.load_state(s)) for cid, s in transport.states.items()}
    assert not set(private.values()) & {NodeRuntime.load_state(s)["private_key"] for s in transport.states.values()}
    directory = unpack_directory(request.directory)
    assert {c: directory[c] for c in directory.ids} == {c: k.public_bytes for c, k in node_keys.items()}
    sim_keys, sim_directory = simulation_keys(cfg.seed, cfg.data.num_clients)
    real = pair_seed(node_keys[0], directory[1], 0, 1, "correlated_noise", 0)
    assert real == pair_seed(node_keys[1], directory[0], 1, 0, "correlated_noise", 0)
    assert real != pair_seed(sim_keys[0], sim_directory[1], 0, 1, "correlated_noise", 0)


def _blobs(wires) -> list[bytes]:
    out = []
    for w in wires.values():
        if isinstance(w, tuple):
            out += [a.tobytes() for a in w[0].values()]
            out += [v for v in w[1].values() if isinstance(v, bytes)]
    return out


def _requests(transport, cfg):
    from trustfl.deploy.server import RemoteEngine

    engine = RemoteEngine(transport, 10.0, 10.0)
    fed = transport.nodes[0].fed
    engine.connect(fed)
    from trustfl.deploy.wire import pack_directory

    yield TrainRequest(0, {"model": fed.initial_params}, {"model": "float32"},
                       pack_directory(engine.directory)).to_wire()


def test_wire_readers_never_crash_on_junk():
    rng = np.random.default_rng(0)
    junk = [None, 3, "x", ({}, {}), ({"message": "x"}, {"dtype/message": "float32"}),
            ({"message": rng.normal(size=3).astype(np.float32)}, {"dtype/message": "int8", "client_id": -1}),
            ({"message": np.zeros(2, np.float32)}, {"dtype/message": "float32", "client_id": True, "num_steps": -3,
                                                      "train_loss": math.nan, "metric/a": "b"})]
    junk += [({"coded/codes": "x"}, {"dtype/coded/codes": "uint8"}),  # encoded payloads (compress.uplink)
             ({"coded/codes": np.zeros((1, 3), np.uint8)}, {"dtype/coded/codes": "bool"}),
             ({"coded/codes": np.zeros((1, 3), np.int32)}, {"dtype/coded/codes": "uint8"}),
             ({"coded/codes": np.zeros((1, 3), np.uint8), 7: np.zeros(1)}, {})]
    for wire in junk:
        reply = read_reply(wire)
        assert isinstance(reply, TrainReply) and reply.num_steps is None and reply.train_loss is None
        assert reply.coded is None
    # a loss or metric beyond float32 (10**400 raised OverflowError out of read_reply; 1e308 made the mean inf)
    for huge in (10 ** 400, 1e308, -1e39, np.float64(1e300)):
        reply = read_reply(({"message": np.zeros(2, np.float32)}, {"dtype/message": "float32", "client_id": 1,
                                                                     "train_loss": huge, "metric/a": huge}))
        assert reply.client_id == 1 and reply.train_loss is None and reply.metrics == {}
    coded = read_reply(({"coded/codes": np.arange(3, dtype=np.uint8)[None]}, {"dtype/coded/codes": "uint8"}))
    assert coded.coded["codes"].dtype == torch.uint8 and coded.coded["codes"].tolist() == [[0, 1, 2]]
    ok = read_reply(({"message": np.ones(2, np.float32)}, {"dtype/message": "float32", "client_id": 1,
                                                             "num_steps": 4, "train_loss": 0.5, "metric/a": 2.0}))
    assert ok.client_id == 1 and ok.num_steps == 4 and ok.metrics == {"a": 2.0} and ok.message.tolist() == [1, 1]
    GOOD = {"round": 0, "wire_dtype/model": "float32", "dtype/model": "float32"}
    assert TrainRequest.from_wire(({"payload/model": np.zeros(3, np.float32)}, GOOD)).round == 0
    for bad in [({}, {}), ({}, {"round": -1}), ({"payload/model": np.zeros(2)}, {"round": 0}),
                ({"coded/codes": np.zeros((1, 2), np.uint8)}, {"round": 0, "dtype/coded/codes": "complex64"}),
                ({7: np.zeros(2, np.float32)}, {"round": 0}),
                # a string or a list as the directory, a round past 64 bits: TypeError, ValueError, struct.error
                ({"payload/model": np.zeros(3, np.float32)}, {**GOOD, "directory": "abc"}),
                ({"payload/model": np.zeros(3, np.float32)}, {**GOOD, "directory": [300]}),
                ({"payload/model": np.zeros(3, np.float32)}, {**GOOD, "round": 2 ** 70})]:
        with pytest.raises(MessageError):
            TrainRequest.from_wire(bad)
    with pytest.raises(MessageError):
        Hello.from_wire(({}, {"client_id": 0, "public_key": b"short", "num_samples": 3}))
    with pytest.raises(MessageError):
        unpack_directory(b"\x00" * 41)
    bf = TrainRequest(2, {"model": torch.randn(5).to(torch.bfloat16)}, {"model": "float32"}).to_wire()
    back = TrainRequest.from_wire(bf)
    assert back.payload["model"].dtype == torch.bfloat16 and back.torch_dtypes() == {"model": torch.float32}


def test_cafcor_with_a_declared_byzantine_bound_deploys(tmp_path):
    """No simulated adversary, but a declared f: CAF's f and the threat model's f, every client with a ledger."""
    from trustfl.config.build import build_federation

    cfg = _config(CAFCOR, "recipe.num_byzantine=1", "recipe.ind_to_cor=0.0")
    fed = build_federation(cfg, quiet=True)
    assert fed.aggregator.f == 1 and not fed.byzantine and len(fed.ledger) == cfg.data.num_clients
    sim = run_experiment(cfg, tmp_path / "sim", progress=False, plots=False)
    dep, _ = _deploy(cfg, tmp_path)
    assert torch.allclose(dep.params, sim.params, atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match="recipe.num_byzantine"):
        build_federation(_config(CAFCOR, "recipe.num_byzantine=4"), quiet=True)


def test_a_node_answers_each_round_once_in_order_and_never_past_the_run():
    """A node's noise comes from (its seed, the round): a server asking round 1 again with another model would get
    the same noise and cancel it in the difference of the two replies (it did, before nodes kept their last
    round: the difference was the noise-free one). Refused requests leave the node's state as it was."""
    cfg = _config(FEDAVG_DP_ROBUST, secrets="node")
    node = NodeRuntime(cfg, 0)
    model = node.fed.initial_params

    def ask(r, state, m=model):
        return node.train(TrainRequest.from_wire(TrainRequest(r, {"model": m}, {"model": "float32"}).to_wire()), state)

    start = node.new_state()
    first, after = ask(0, start)
    assert after["last_round"] == 0
    for r, why in [(0, "this node has already trained round 1; each round is answered once, in order"),
                   (3, "the run has rounds 1-3")]:
        with pytest.raises(MessageError, match=f"^node 0 refuses to train round {r + 1}: {why} \\(a replayed round"):
            ask(r, after, model + 0.01)
    second, _ = ask(2, after)  # a round skipped (not in the cohort) is fine
    with pytest.raises(MessageError, match="already trained round 3"):
        ask(1, _)
    # The state of a node that never kept its last round (saved before) trains, once.
    legacy = {k: v for k, v in start.items() if k != "last_round"}
    again, _ = ask(0, legacy)
    assert torch.equal(again.message, first.message) and not torch.equal(second.message, first.message)


def test_a_server_that_asks_a_round_again_gets_the_same_reply_or_a_refusal():
    """A resumed server asks again the round it was interrupted in: the same request gets the node's kept reply
    (no new release), marked replayed; the same round with another model is refused (the same noise would cancel
    in the difference), never a crash."""
    cfg = _config(FEDAVG_DP_ROBUST)
    transport = InProcessTransport([NodeRuntime(cfg, i) for i in range(cfg.data.num_clients)])
    wire = next(_requests(transport, cfg))
    first = transport.train({0: wire, 1: wire}, 10.0)
    assert all(isinstance(v, tuple) for v in first.values())
    states = dict(transport.states)
    again = transport.train({0: wire, 1: wire}, 10.0)
    for cid in (0, 1):
        was, now = read_reply(first[cid]), read_reply(again[cid])
        assert now.replayed and not was.replayed and torch.equal(now.message, was.message)
        assert (now.num_steps, now.train_loss, now.metrics) == (was.num_steps, was.train_loss, was.metrics)
    assert transport.states == states
    other = TrainRequest.from_wire(wire)
    other = TrainRequest(other.round, {"model": other.payload["model"] + 0.01}, other.dtypes, other.directory)
    refused = transport.train({0: other.to_wire(), 1: other.to_wire()}, 10.0)
    assert all(isinstance(v, str) and v.startswith("node refused: node ") and "already trained round 1" in v
               for v in refused.values())


def test_a_node_cannot_write_keys_of_the_servers_metrics_rows(tmp_path):
    """A node's reply carries its client stages' metrics; one naming ``round`` once replaced the server's round
    number and made the run's own metrics.jsonl unreadable. Only keys of the configured client stages that most
    answering nodes report reach the row: the rows equal an honest deployment's."""
    cfg = _config(CAFCOR)

    class Injecting(InProcessTransport):
        def train(self, requests, timeout):
            replies = super().train(requests, timeout)
            if isinstance(replies.get(0), tuple):
                stage = next(k for k in replies[0][1] if k.startswith("metric/")).split("/")[1]
                replies[0][1].update({"metric/round": 99.0, "metric/accuracy": 1.0, "metric/epsilon_max": 0.0,
                                      "metric/rejected": 0.0, "metric/unknown/x": 5.0,
                                      f"metric/{stage}/only_mine": 7.0, f"metric/{stage}/" + "y" * 300: 1.0})
            return replies

    honest, _ = _deploy(cfg, tmp_path, "honest")
    nodes = [NodeRuntime(cfg, i) for i in range(cfg.data.num_clients)]
    injected, _ = _deploy(cfg, tmp_path, "injected", transport=Injecting(nodes))
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_time_s"} for r in rows]  # noqa: E731
    assert strip(injected.rows) == strip(honest.rows)
    assert any("/" in k and not k.startswith(("aggregator/", "eval/")) for k in honest.rows[0])  # stage metrics


@pytest.mark.parametrize("payload, found", [
    (lambda p: {"model": p[:-1]}, r"a float32 tensor of shape \(649,\) on cpu as 'model', this run's is a float32 "
                                     r"tensor of shape \(650,\) on cpu"),
    (lambda p: {"model": p.view(2, -1)}, r"a float32 tensor of shape \(2, 325\) on cpu as 'model'"),
    (lambda p: {"model": p.double()}, r"a float64 tensor of shape \(650,\) on cpu as 'model'"),
    (lambda p: {"model": p, "scaffold/c": p[:3]},
     r"a float32 tensor of shape \(3,\) on cpu as 'scaffold/c', this run's is a float32 tensor of shape \(650,\)"),
    (lambda p: {"model": p}, r"nothing as 'scaffold/c'"),
])
def test_a_node_refuses_a_downlink_of_other_shapes_in_one_line(payload, found):
    """A model of another size or dtype, or a SCAFFOLD request without the server's control variate, failed deep in
    local training (a traceback in the node's log)."""
    cfg = _config(FEDAVG_DP_ROBUST, 'client.transforms=[{name="scaffold"}]', 'client.dp={mode="off"}')
    node = NodeRuntime(cfg, 1)
    sent = payload(node.fed.initial_params)
    request = TrainRequest(0, sent, {k: str(v.dtype).removeprefix("torch.") for k, v in sent.items()})
    with pytest.raises(MessageError, match=f"^node 1 refuses the request: the server sent {found}"):
        node.train(TrainRequest.from_wire(request.to_wire()), node.new_state())


class EditedHello(InProcessTransport):
    """Sets ``field`` of node 2's hello to ``value`` (a malformed or lying node)."""

    def __init__(self, nodes, field, value):
        super().__init__(nodes)
        self.field, self.value = field, value

    def hello(self, num_nodes, timeout, run_id=""):
        hellos = super().hello(num_nodes, timeout, run_id)
        hellos[2][1][self.field] = self.value
        return hellos


@pytest.mark.parametrize("field, value", [("num_samples", 2**70), ("num_samples", -1), ("num_samples", "12"),
                                          ("public_key", b"\x01" * 31), ("client_id", 2**64)])
def test_a_malformed_hello_stops_the_start_in_one_line_naming_the_node(field, value, tmp_path):
    """A sample count past int64 ended the server in a ValueError traceback (Overflow when unpacking long)."""
    cfg = _config(FEDAVG_DP_ROBUST)

    transport = EditedHello([NodeRuntime(cfg, i) for i in range(cfg.data.num_clients)], field, value)
    with pytest.raises(MessageError, match=r"^the node announcing partition-id 2 sent a malformed hello: a hello "
                                           r"needs an int client_id in \[0, 2\^63\)"):
        _deploy(cfg, tmp_path, transport=transport)
    assert not (tmp_path / "dep" / "metrics.jsonl").exists()


@pytest.mark.parametrize("announced", [2**62, 1, 0])
def test_a_node_announcing_another_example_count_stops_the_start_naming_it(announced, tmp_path):
    """A node's count was taken as its weight: one announcing 2**62 examples made a weighted robust rule (the
    geometric median) follow its message. The server built the same partition; its counts are the weights."""
    cfg = _config(FEDAVG_DP_ROBUST)
    own = int(build_federation(cfg, quiet=True).reports["num_samples"][2])

    transport = EditedHello([NodeRuntime(cfg, i) for i in range(cfg.data.num_clients)], "num_samples", announced)
    with pytest.raises(MessageError, match=rf"^the node of client 2 announced {announced} training examples, but its "
                                           rf"partition of the run's data holds {own}: "):
        _deploy(cfg, tmp_path, transport=transport)
    assert not (tmp_path / "dep" / "metrics.jsonl").exists()


@pytest.mark.parametrize("rule", ["mean", "median"])
def test_one_node_with_huge_scaffold_deltas_stops_training_unless_extras_take_the_median(rule, tmp_path):
    """SCAFFOLD's server control variate averages the clients' deltas: one node sending 3e38 per coordinate (finite)
    moved it so far that every later message was non-finite and rejected. ``server.extras = "median"`` replaces
    the deltas by their coordinate-wise median first."""
    cfg = _config(FEDAVG_DP_ROBUST, 'client.transforms=[{name="scaffold"}]', 'client.dp={mode="off"}', "rounds=4",
                  f'server.extras="{rule}"')

    class Huge(InProcessTransport):
        def train(self, requests, timeout):
            replies = super().train(requests, timeout)
            if isinstance(replies.get(0), tuple):
                arrays = replies[0][0]
                key = next(k for k in arrays if k.startswith("extra/"))
                arrays[key] = np.full_like(arrays[key], 3e38)
            return replies

    attacked, _ = _deploy(cfg, tmp_path, "attacked", transport=Huge([NodeRuntime(cfg, i) for i in range(4)]))
    honest = run_experiment(cfg, tmp_path / "sim", progress=False, plots=False)
    rejected = [r["rejected"] for r in attacked.rows]
    if rule == "mean":
        assert rejected == [0, 4, 4, 4] and attacked.rows[-1]["accuracy"] == attacked.rows[0]["accuracy"]
    else:
        assert rejected == [0, 0, 0, 0] and torch.isfinite(attacked.params).all()
        assert attacked.rows[-1]["accuracy"] > attacked.rows[0]["accuracy"] - 0.02
        assert attacked.rows[-1]["accuracy"] == pytest.approx(honest.rows[-1]["accuracy"], abs=0.03)


def test_server_extras_without_a_transform_sending_any_is_refused(tmp_path):
    cfg = _config(FEDAVG_DP_ROBUST, 'server.extras="median"')
    with pytest.raises(ConfigError, match=r"^`server.extras` = 'median' does nothing: no gradient transform"):
        run_experiment(cfg, tmp_path / "run", progress=False, plots=False)


def test_a_flower_hello_with_a_client_id_that_is_no_int_stops_the_start_in_one_line(monkeypatch):
    """A ConfigRecord may carry a list: ``client_id = [0, 1]`` ended the ServerApp in TypeError: unhashable type."""
    flwr = pytest.importorskip("flwr.app")
    from types import SimpleNamespace

    from flwr.supercore.task_identity import TaskIdentity
    for key in ("run_id", "node_id", "task_id"):  # what a running ServerApp has set (its messages need them)
        monkeypatch.setattr(TaskIdentity, f"_{key}", 1)

    from trustfl.deploy.flower import FlowerTransport

    class Grid:
        """Two nodes; node 11 announces a list as its client id."""

        def get_node_ids(self):
            return [10, 11]

        def push_messages(self, messages):
            self.sent = messages
            for i, m in enumerate(messages):
                m.metadata.__dict__["_message_id"] = f"m{i}"  # what the SuperLink assigns
            return [m.metadata.message_id for m in messages]

        def pull_messages(self, ids):
            hellos = {10: {"client_id": 0, "public_key": b"\x01" * 32, "num_samples": 5},
                      11: {"client_id": [0, 1], "public_key": b"\x01" * 32, "num_samples": 5}}
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=m.metadata.message_id),
                                    has_error=lambda: False,
                                    content=flwr.RecordDict({"config": flwr.ConfigRecord(
                                        hellos[m.metadata.dst_node_id])}))
                    for m in self.sent if m.metadata.message_id in ids]

    transport = FlowerTransport(Grid())
    with pytest.raises(MessageError, match=r"^node 11 sent a malformed hello: its client_id is list '\[0, 1\]', not "
                                           r"an int\.$"):
        transport.hello(2, 5.0, "0" * 32)


def test_the_servers_central_noise_is_not_drawn_from_the_run_seed_every_node_holds(tmp_path, monkeypatch):
    """Every node holds the run's TOML, seed included: central noise drawn from (seed, round) could be computed by
    any node and subtracted from the model it receives, leaving the exact mean of the others' clipped updates. With
    secrets from the nodes, the server's draws come from its own secret seed (with ``run_seed``, for testing, the
    deployment equals the simulation)."""
    from trustfl.core.rng import SERVER, make_generator
    from trustfl.privacy.noise import CentralGaussianNoise

    seeds = []
    apply = CentralGaussianNoise.apply

    def spy(self, x, state, ctx):
        seeds.append((ctx.round, ctx.generator("central_gaussian_noise").initial_seed()))
        return apply(self, x, state, ctx)

    monkeypatch.setattr(CentralGaussianNoise, "apply", spy)
    cfg = _config((ROOT / "configs/dp/cdp_digits.toml", SMALL), secrets="node")
    _deploy(cfg, tmp_path)
    assert len(seeds) == 3
    public = {r: make_generator(cfg.seed, r, SERVER, "central_gaussian_noise").initial_seed() for r, _ in seeds}
    assert all(s != public[r] for r, s in seeds)
