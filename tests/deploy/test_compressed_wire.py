"""Compressed messages on a deployment's wire (``compress.uplink`` / ``compress.downlink`` with real nodes).

A node encodes its own message with its own generator, the server decodes what arrives (a lattice against 0, as
in the simulation); the server encodes the model once and every node decodes it. With ``deploy.secrets =
"run_seed"`` a deployment equals the simulation, and the bytes the transport carried are the bytes the rows
report. An encoded reply of other shapes or dtypes, or one decoding to NaN, is screened out like any malformed
message; a node refuses an encoded model it cannot decode.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.deploy.test_protocol import FEDAVG_DP_ROBUST, Corrupting, _config, _deploy
from trustfl.core.rng import SERVER
from trustfl.deploy.node import NodeRuntime
from trustfl.deploy.wire import TrainRequest
from trustfl.errors import MessageError
from trustfl.experiment import run_experiment

QSGD_BOTH = ['compress.uplink={name="qsgd_minmax", levels=16}', 'compress.downlink={name="qsgd", levels=127}']
LATTICE_UP = ['compress.uplink={name="lattice", bits=16, step=1e-3}']


@pytest.mark.parametrize("links", [QSGD_BOTH, LATTICE_UP], ids=["qsgd_both_ways", "lattice_up"])
def test_a_compressed_deployment_equals_the_simulation_and_its_bytes_are_the_wires(links, tmp_path):
    cfg = _config(FEDAVG_DP_ROBUST, *links)
    sim = run_experiment(cfg, tmp_path / "sim", progress=False, plots=False)
    dep, transport = _deploy(cfg, tmp_path)
    plain = run_experiment(_config(FEDAVG_DP_ROBUST), tmp_path / "plain", progress=False, plots=False)
    assert torch.allclose(dep.params, sim.params, atol=1e-5, rtol=0)
    assert not torch.allclose(dep.params, plain.params, atol=1e-4)  # the compressor acted
    for s, d, p in zip(sim.rows, dep.rows, plain.rows):
        assert d["dropped"] == d["rejected"] == 0
        assert (d["bytes_up"], d["bytes_down"], d["decode_failures"]) == \
            (s["bytes_up"], s["bytes_down"], s["decode_failures"])
        assert d["bytes_up"] < 0.6 * p["bytes_up"]  # 16 bits or fewer a coordinate (padded to 768), against 32
    down, up = transport.bytes_sent  # the payload arrays on the wire: exactly what the rows count
    assert up == sum(r["bytes_up"] for r in dep.rows) and down == sum(r["bytes_down"] for r in dep.rows)
    assert dep.rows[-1]["accuracy"] > 0.5


def _coded(change):
    """A reply whose encoded message ``change(arrays, config)`` altered."""
    def bad(wire):
        arrays, config = dict(wire[0]), dict(wire[1])
        change(arrays, config)
        return arrays, config
    return bad


def _set(key, value):
    return lambda a, c: a.__setitem__(key, value(a[key]))


BAD_CODED = {
    "codes_int32": _coded(lambda a, c: (a.__setitem__("coded/codes", a["coded/codes"].astype(np.int32)),
                                        c.__setitem__("dtype/coded/codes", "int32"))),
    "codes_short": _coded(_set("coded/codes", lambda v: v[:, :-1])),
    "codes_missing": _coded(lambda a, c: a.pop("coded/codes")),
    "dtype_lies": _coded(lambda a, c: c.__setitem__("dtype/coded/codes", "float32")),
    "extra_array": _coded(lambda a, c: (a.__setitem__("coded/spare", np.zeros((1, 3), np.float32)),
                                        c.__setitem__("dtype/coded/spare", "float32"))),
    "nan_scale": _coded(_set("coded/fmax", lambda v: np.full_like(v, np.nan))),
    "raw_instead": _coded(lambda a, c: (a.__setitem__("message", np.zeros(650, np.float32)),
                                        c.__setitem__("dtype/message", "float32"),
                                        [a.pop(k) for k in [k for k in a if k.startswith("coded/")]])),
}


@pytest.mark.parametrize("bad", sorted(BAD_CODED))
def test_a_malformed_encoded_reply_is_screened_not_a_crash(bad, tmp_path):
    cfg = _config(FEDAVG_DP_ROBUST, *QSGD_BOTH)
    nodes = [NodeRuntime(cfg, i) for i in range(cfg.data.num_clients)]
    dep, _ = _deploy(cfg, tmp_path, transport=Corrupting(nodes, BAD_CODED[bad]))
    assert torch.isfinite(dep.params).all()
    assert all(r["rejected"] == 1 and r["dropped"] == 0 for r in dep.rows)
    assert dep.rows[-1]["accuracy"] > 0.5


def _request(node, r, coded=None, model=False):
    fed = node.fed
    if coded is None:
        links = fed.links
        coded = links.encode(fed.initial_params.unsqueeze(0), r, [SERVER], "down").payload
    payload = {"model": fed.initial_params} if model else {}
    return TrainRequest(r, payload, {"model": "float32"}, b"", coded)


@pytest.mark.parametrize("change, found", [
    (lambda c: {**c, "codes": c["codes"][:, :-2]},
     r"holds 'codes' as a uint8 tensor of shape \(1, \d+\) on cpu, not a uint8 tensor of shape \(1, \d+\)"),
    (lambda c: {"codes": c["codes"]}, r"holds \['codes'\], not the compressor's \['codes', 'norm'\]"),
    (lambda c: {**c, "norm": c["norm"].double()}, r"holds 'norm' as a float64 tensor .*, not a float32 tensor"),
])
def test_a_node_refuses_an_encoded_model_it_cannot_decode(change, found):
    cfg = _config(FEDAVG_DP_ROBUST, *QSGD_BOTH)
    node = NodeRuntime(cfg, 2)
    good = _request(node, 0)
    request = _request(node, 0, change(dict(good.coded)))
    with pytest.raises(MessageError, match=f"^node 2 refuses the request: its encoded model {found}"):
        node.train(TrainRequest.from_wire(request.to_wire()), node.new_state())
    reply, _ = node.train(TrainRequest.from_wire(good.to_wire()), node.new_state())  # the good one trains
    assert reply.message is None and sorted(reply.coded) == ["codes", "fmax", "fmin"]


def test_a_request_must_carry_the_model_once_and_as_the_run_sends_it():
    cfg = _config(FEDAVG_DP_ROBUST, *QSGD_BOTH)
    node = NodeRuntime(cfg, 0)
    with pytest.raises(MessageError, match="not both"):
        TrainRequest.from_wire(_request(node, 0, model=True).to_wire())
    plain = TrainRequest(0, {"model": node.fed.initial_params}, {"model": "float32"})
    with pytest.raises(MessageError, match=r"^node 0 refuses the request: its encoded model holds \[\]"):
        node.train(TrainRequest.from_wire(plain.to_wire()), node.new_state())
    uncompressed = NodeRuntime(_config(FEDAVG_DP_ROBUST), 0)
    with pytest.raises(MessageError, match="`compress.downlink` is \"none\""):
        uncompressed.train(TrainRequest.from_wire(_request(node, 0).to_wire()), uncompressed.new_state())


def test_an_encoded_model_that_fails_to_decode_is_refused_not_a_traceback(monkeypatch):
    cfg = _config(FEDAVG_DP_ROBUST, *QSGD_BOTH)
    node = NodeRuntime(cfg, 1)
    request = _request(node, 0)

    def broken(self, enc, key, shared_seed):
        raise RuntimeError("shape '[1, 650]' is invalid")
    monkeypatch.setattr(type(node.fed.links.downlink), "decode", broken)
    with pytest.raises(MessageError, match=r"^node 1 refuses the request: its encoded model cannot be decoded"):
        node.train(TrainRequest.from_wire(request.to_wire()), node.new_state())


def test_a_non_finite_message_is_sent_unencoded_and_screened_out():
    """The lattice's integer cast turned a diverged node's NaN update into finite codes, which the server decoded and
    accepted; the node now sends an empty payload, which the server's decoding screens out (None: malformed)."""
    from trustfl.config.build import build_federation
    from trustfl.deploy.node import uplink_message
    from trustfl.deploy.server import decoded_uplink
    fed = build_federation(_config(FEDAVG_DP_ROBUST, *LATTICE_UP), quiet=True)
    like = fed.initial_params
    x = torch.full((1, like.numel()), 0.01)
    _, good = uplink_message(fed.links, x, 0, 1, 7)
    x[0, 3] = float("nan")
    message, bad = uplink_message(fed.links, x, 0, 2, 7)
    assert message is None and bad == {}
    rows, _, _ = decoded_uplink(fed, 0, {1: good, 2: bad}, like)
    assert rows[1] is not None and torch.isfinite(rows[1]).all() and rows[2] is None
