"""Pinned keys (``trustfl deploy keys``): a node refuses a server that relays another public key than the one
pinned for a client, which would let the server agree on that node's pair seeds and remove CafCor's correlated
noise. Without pinning the same substitution goes through: that is the attack pinning stops."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
import torch

from trustfl.deploy.loopback import InProcessTransport
from trustfl.deploy.node import NodeRuntime
from trustfl.deploy.pinned import PUBLIC_FILE, key_file, read_private_key, read_public_keys, write_keys
from trustfl.deploy.server import run_deployment
from trustfl.deploy.wire import TrainRequest, pack_directory, unpack_directory
from trustfl.errors import ConfigError, MessageError, UsageError
from trustfl.privacy.keys import ClientKeys, PublicKeyDirectory

sys.path.insert(0, os.path.dirname(__file__))
from test_protocol import CAFCOR, _config  # noqa: E402


class SubstitutingServer(InProcessTransport):
    """Relays its own public key in place of client 1's (an actively malicious server)."""

    attacker = ClientKeys.generate(1)

    def train(self, requests, timeout):
        forged = {}
        for cid, (arrays, config) in requests.items():
            keys = dict(unpack_directory(config["directory"]).entries)
            keys[1] = self.attacker.public_bytes
            forged[cid] = (arrays, {**config, "directory": pack_directory(PublicKeyDirectory.of(keys))})
        return super().train(forged, timeout)


def _pinned_nodes(cfg, keys_dir):
    pinned = read_public_keys(keys_dir / PUBLIC_FILE)
    return [NodeRuntime(cfg, i, key=read_private_key(key_file(keys_dir, i), i), pinned=pinned)
            for i in range(cfg.data.num_clients)]


def test_keys_are_written_owner_only_never_over_and_read_back(tmp_path):
    write_keys(tmp_path / "keys", 4)
    public = read_public_keys(tmp_path / "keys" / PUBLIC_FILE)
    assert public.ids == (0, 1, 2, 3)
    for i in range(4):
        path = key_file(tmp_path / "keys", i)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert read_private_key(path, i).public_bytes == public[i]
    with pytest.raises(UsageError, match="already holds keys .*: a node's key is never written over"):
        write_keys(tmp_path / "keys", 4)
    for bad in (0, 100_001, 10 ** 8):  # 10⁸ generated keys for minutes without a word
        with pytest.raises(UsageError, match="--clients must be an integer from 1 to 100,000"):
            write_keys(tmp_path / "other", bad)
    assert not (tmp_path / "other").exists()
    (tmp_path / "a_file").write_text("")
    with pytest.raises(UsageError, match="is a file, not a directory"):
        write_keys(tmp_path / "a_file", 2)
    (tmp_path / "read_only").mkdir(mode=0o500)
    if not os.access(tmp_path / "read_only", os.W_OK):  # root writes anyway
        with pytest.raises(UsageError, match="^--out: cannot write the keys into"):
            write_keys(tmp_path / "read_only" / "keys", 2)
    with pytest.raises(UsageError, match="^--out: cannot write the keys into '/proc/"):
        write_keys("/proc/no_such_dir/keys", 2)


@pytest.mark.parametrize("text, match", [("zz" * 32, "must be 32 bytes in hex"), ("ab" * 31, "must be 32 bytes"),
                                         (b"\xff\xfe", "cannot be read")])
def test_a_bad_key_file_is_refused_naming_the_node_config_key_and_file(text, match, tmp_path):
    path = tmp_path / "node0.key"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=f"^node config `key-file`: '{path}'.*{match}"):
        read_private_key(path, 0)
    with pytest.raises(ConfigError, match="`key-file`.*cannot be read"):
        read_private_key(tmp_path / "missing.key", 0)


@pytest.mark.parametrize("text, match", [("", "holds no \\[public_keys\\] table"), ("[public_keys", "cannot be read"),
                                         ('[public_keys]\nx = "00"', "entry 'x' must map a client id"),
                                         ('[public_keys]\n0 = "00"', "the key of client 0 must be 32 bytes")])
def test_a_bad_public_keys_file_is_refused_naming_the_node_config_key_and_file(text, match, tmp_path):
    path = tmp_path / PUBLIC_FILE
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"^node config `public-keys`: '{path}'.*{match}"):
        read_public_keys(path)


def test_pinned_nodes_run_cafcor_and_refuse_a_server_that_substitutes_a_key(tmp_path):
    cfg = _config(CAFCOR, secrets="node")
    write_keys(tmp_path / "keys", cfg.data.num_clients)
    honest = run_deployment(cfg, InProcessTransport(_pinned_nodes(cfg, tmp_path / "keys")), tmp_path / "honest",
                            progress=False, plots=False)
    assert all(r["dropped"] == 0 for r in honest.rows) and torch.isfinite(honest.params).all()
    attacked = run_deployment(cfg, SubstitutingServer(_pinned_nodes(cfg, tmp_path / "keys")), tmp_path / "attacked",
                              progress=False, plots=False)
    nodes = _pinned_nodes(cfg, tmp_path / "keys")
    assert all(r["dropped"] == 4 and r["cohort_size"] == 0 for r in attacked.rows)  # every node refused
    assert torch.equal(attacked.params, nodes[0].fed.initial_params)  # and the model never moved
    # Without pinned keys the nodes take the forged directory: the substitution goes through unnoticed.
    unpinned = run_deployment(cfg, SubstitutingServer([NodeRuntime(cfg, i) for i in range(4)]), tmp_path / "open",
                              progress=False, plots=False)
    assert all(r["dropped"] == 0 for r in unpinned.rows)


def test_a_node_refuses_a_forged_directory_in_one_line_and_keys_that_are_not_its_own(tmp_path):
    cfg = _config(CAFCOR, secrets="node")
    write_keys(tmp_path / "keys", 4)
    node = _pinned_nodes(cfg, tmp_path / "keys")[0]
    state = node.new_state()
    assert node.keys(state).public_bytes == read_public_keys(tmp_path / "keys" / PUBLIC_FILE)[0]
    forged = dict(read_public_keys(tmp_path / "keys" / PUBLIC_FILE).entries)
    forged[2] = ClientKeys.generate(2).public_bytes
    request = TrainRequest(0, {"model": node.fed.initial_params}, {"model": "float32"},
                           pack_directory(PublicKeyDirectory.of(forged)))
    with pytest.raises(MessageError, match=r"^node 0 refuses the request: the server relays a public key for "
                                        r"client\(s\) \[2\] other than the one\(s\) pinned"):
        node.train(request, state)
    pinned = read_public_keys(tmp_path / "keys" / PUBLIC_FILE)
    with pytest.raises(ConfigError, match="node 1: node config `public-keys` pins another key for it than its "):
        NodeRuntime(cfg, 1, key=read_private_key(key_file(tmp_path / "keys", 0), 1), pinned=pinned)
    with pytest.raises(ConfigError, match="node 1: node config `public-keys` needs `key-file`"):
        NodeRuntime(cfg, 1, pinned=pinned)


def test_a_node_drawing_pair_noise_refuses_a_directory_without_its_peers_or_none(tmp_path):
    """A directory leaving the pinned peers out was accepted, and so was none at all (the pairs then came from the
    run's seed, which the server knows): either way the server got the message without its pair noise."""
    cfg = _config(CAFCOR, secrets="node")
    write_keys(tmp_path / "keys", 4)
    node = _pinned_nodes(cfg, tmp_path / "keys")[0]
    pinned = read_public_keys(tmp_path / "keys" / PUBLIC_FILE)

    def request(directory: bytes) -> TrainRequest:
        return TrainRequest(0, {"model": node.fed.initial_params}, {"model": "float32"}, directory)

    alone = pack_directory(PublicKeyDirectory.of({0: pinned[0]}))
    with pytest.raises(MessageError, match=r"^node 0 refuses the request: the server's directory leaves out "
                                        r"client\(s\) \[1, 2, 3\] pinned in its `public-keys` file"):
        node.train(request(alone), node.new_state())
    for runtime in (node, NodeRuntime(cfg, 0)):  # pinned or not
        with pytest.raises(MessageError, match=r"^node 0 refuses the request: it draws pair noise with every peer, "
                                            r"and the server relays no public-key directory"):
            runtime.train(request(b""), runtime.new_state())
    reply, _ = node.train(request(pack_directory(pinned)), node.new_state())  # the whole directory: it trains
    assert torch.isfinite(reply.message).all()


def test_the_keys_command_writes_them_and_refuses_to_write_over_them_in_one_line(tmp_path):
    cmd = [sys.executable, "-m", "trustfl", "deploy", "keys", "--clients", "3", "--out", str(tmp_path / "k")]
    first = subprocess.run(cmd, capture_output=True, text=True)
    assert first.returncode == 0 and "3 key pair(s) written" in first.stderr
    assert read_public_keys(tmp_path / "k" / PUBLIC_FILE).ids == (0, 1, 2)
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "already holds keys" in again.stderr


def test_a_flower_node_reads_its_pinned_keys_from_its_node_config(tmp_path):
    pytest.importorskip("flwr")
    from flwr.app import Context, RecordDict

    from trustfl.config.load import config_to_dict, dump_toml
    from trustfl.deploy import flower

    cfg = _config(CAFCOR, secrets="node")
    write_keys(tmp_path / "keys", 4)
    run_config = {"trustfl-config": dump_toml(config_to_dict(cfg))}

    def node(**node_config):
        flower._NODES.clear()
        return flower._node(Context(run_id=1, node_id=2, node_config={"partition-id": 2, **node_config},
                                    state=RecordDict(), run_config=run_config))

    public = str(tmp_path / "keys" / PUBLIC_FILE)
    pinned = node(**{"key-file": str(key_file(tmp_path / "keys", 2)), "public-keys": public})
    assert pinned.keys(pinned.new_state()).public_bytes == read_public_keys(tmp_path / "keys" / PUBLIC_FILE)[2]
    assert pinned.pinned is not None
    with pytest.raises(ConfigError, match="node 2: node config `public-keys` needs `key-file`"):
        node(**{"public-keys": public})
    with pytest.raises(ConfigError, match="node 2: node config `public-keys` pins another key for it"):
        node(**{"key-file": str(key_file(tmp_path / "keys", 0)), "public-keys": public})
    flower._NODES.clear()
