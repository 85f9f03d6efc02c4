"""A real Flower deployment on loopback: one SuperLink with TLS and node authentication, three registered
SuperNodes (an unregistered fourth is refused), ``flwr run`` of apps written by ``trustfl deploy app``.

1. FedAvg + DP-SGD + coordinate-wise trimmed mean, QSGD-compressed both ways (the encoded payloads in Flower's
   array records), 2 rounds: the final model equals the simulator's.
2. CafCor's pairwise-cancelling noise (pair seeds from X25519 keys relayed by the server), 2 rounds, the run
   stopped (``flwr stop``) as round 2 starts and resumed in a second ``flwr run``: each node finds its state (its
   momentum, its keys) in its ``state-dir``, and the final model equals the simulation's too.
3. A node killed as round 2 starts (the server has just sent its messages): the run completes and records the
   dropout.

Every node has pinned keys (node config ``key-file`` and ``public-keys``, holding the keys ``deploy.secrets =
"run_seed"`` derives, so that the runs still equal the simulation's): each checks every relayed directory.

Two rounds, not more: every message starts a `flwr-clientapp` process that imports torch and trustfl (about 15 s
a round for three nodes on a 2-core AMD EPYC), and the second round already runs on state the first one left.

Every process is stopped by PID (the harness's ``close`` in ``finally``/``__exit__``). Skipped only when flwr is
not installed (``make test`` installs the ``flower`` extra).
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")

from trustfl.config.load import config_to_dict, dump_toml, load_config  # noqa: E402
from trustfl.deploy.app_dir import write_app  # noqa: E402
from trustfl.deploy.pinned import PUBLIC_FILE, key_file, save_keys  # noqa: E402
from trustfl.experiment import run_experiment  # noqa: E402
from trustfl.privacy.correlated import simulation_keys  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from flower_harness import CONNECTION, LoopbackFederation  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["rounds=2", 'data.dataset="digits"', "data.num_clients=3", 'deploy.secrets="run_seed"',
          "deploy.startup_timeout_s=60", "deploy.round_timeout_s=90"]
FEDAVG = (ROOT / "configs/dp/dpsgd_digits.toml", COMMON + ['aggregator={name="cwtm", f=1}'])
CAFCOR = (ROOT / "configs/cafcor/expA_cafcor_secldp.toml",
          COMMON + ["seed=0", 'attack.name="none"', "attack.num_byzantine=0", 'recipe.noise_path="exact"',
                    "recipe.ind_to_cor=1.0", 'model={name="mlp", hidden=[16]}', "client.batch_size=16"])
FEDAVG_QSGD = (FEDAVG[0], FEDAVG[1] + ['compress.uplink={name="qsgd_minmax", levels=16}',
                                      'compress.downlink={name="qsgd", levels=127}'])
RUN_TIMEOUT = 240


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flower")
    app = write_app(FEDAVG[0], tmp / "app", FEDAVG[1])
    # Pinned keys: the simulation's (deploy.secrets = "run_seed" derives the same), so that the runs still equal
    # the simulator's, while every node checks each relayed directory against its public-keys file.
    save_keys(tmp / "keys", list(simulation_keys(0, 3)[0].values()))  # seed 0: every run's here
    nodes = [{"partition-id": k, "num-partitions": 3, "state-dir": str(tmp / f"state{k}"),
              "key-file": str(key_file(tmp / "keys", k)), "public-keys": str(tmp / "keys" / PUBLIC_FILE)}
             for k in range(3)]
    with LoopbackFederation(app, 3, nodes, tls=True, node_auth=True, tmp_dir=tmp / "procs") as fed:
        yield fed, tmp


def _run(fed, tmp, spec, name, resume=False):
    cfg = load_config(spec[0], list(spec[1]))
    run_dir = tmp / name
    res = fed.run({"trustfl-config": dump_toml(config_to_dict(cfg)), "run-dir": str(run_dir),
                   "resume": str(run_dir) if resume else ""}, timeout=RUN_TIMEOUT)
    assert res.ok, (res.status, res.status_details, res.stdout[-3000:], res.stderr[-2000:])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return cfg, run_dir, rows


def _once_round_1_is_recorded(run_dir, action):
    """A started thread that calls ``action`` once the run's first metrics row is written."""
    def watch():
        metrics = run_dir / "metrics.jsonl"
        while not (metrics.is_file() and metrics.read_text().strip()):
            time.sleep(0.1)
        action()
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def _final_model(run_dir):
    return torch.cat([v.flatten() for v in torch.load(run_dir / "model.pt").values()])


def test_an_unregistered_node_is_refused(federation):
    fed, _ = federation
    k = fed.add_node({"partition-id": 0, "num-partitions": 3}, register=False, wait=False)
    rc = fed.nodes[k].popen.wait(timeout=60)
    assert rc != 0 and "Failed to activate SuperNode" in fed.log_text(fed.nodes[k].name)


def test_a_deployment_equals_the_simulation(federation, tmp_path):
    fed, tmp = federation
    cfg, run_dir, rows = _run(fed, tmp, FEDAVG_QSGD, "fedavg_qsgd")
    sim = run_experiment(cfg, tmp_path / "sim", progress=False, plots=False)
    assert torch.allclose(_final_model(run_dir), sim.params, atol=1e-5, rtol=0)
    assert [r["round"] for r in rows] == [1, 2] and all(r["dropped"] == 0 for r in rows)
    for mine, theirs in zip(rows, sim.rows):
        assert (mine["bytes_up"], mine["bytes_down"]) == (theirs["bytes_up"], theirs["bytes_down"])
        assert mine["epsilon_max"] == pytest.approx(theirs["epsilon_max"])
        # The Flower array records carry the same bytes plus one .npy header per array (3 arrays a QSGD reply).
        assert 0 < mine["wire_bytes_up"] - mine["bytes_up"] <= 3 * 3 * 256
    assert {p.name for p in run_dir.iterdir()} >= {"config.toml", "metrics.jsonl", "summary.json", "model.pt",
                                                   "deployment.jsonl"}


def test_a_deployment_stopped_mid_run_resumes_to_the_simulations_model(federation, tmp_path):
    """``flwr stop`` once round 1 is recorded (round 2's requests may be out), then ``resume``: a new Flower
    run, whose nodes find their state (CafCor's momentum and keys) in their state-dir files. Whether or not round
    2's requests went out before the stop, the final model is the simulation's; requests that did are charged
    again (``resent``), so ε is at least the simulation's."""
    fed, tmp = federation
    run_dir = tmp / "cafcor"
    stopped = []
    watcher = _once_round_1_is_recorded(run_dir, lambda: stopped.append(
        fed.cli("stop", str(fed.current_run_id()), CONNECTION, timeout=60).returncode))
    cfg = load_config(CAFCOR[0], CAFCOR[1])
    first = fed.run({"trustfl-config": dump_toml(config_to_dict(cfg)), "run-dir": str(run_dir)}, timeout=RUN_TIMEOUT)
    watcher.join(timeout=60)
    assert stopped == [0] and first.status == "finished:stopped", (first.status, first.stderr[-2000:])
    assert not (run_dir / "model.pt").exists()
    _, _, rows = _run(fed, tmp, CAFCOR, "cafcor", resume=True)
    sim = run_experiment(cfg, tmp_path / "sim", progress=False, plots=False)
    assert torch.allclose(_final_model(run_dir), sim.params, atol=1e-5, rtol=0)
    assert [r["round"] for r in rows] == [1, 2] and all(r["dropped"] == 0 for r in rows)
    assert rows[1]["resent"] in (0, 3) and rows[1]["replayed"] <= rows[1]["resent"]
    assert rows[1]["epsilon_max"] >= sim.rows[1]["epsilon_max"] * (1 - 1e-9)
    run_id = json.loads((run_dir / "deployment.jsonl").read_text().splitlines()[0])["run_id"]
    for k in range(3):
        kept = tmp / f"state{k}" / f"trustfl-node-{k}-{run_id}.pt"
        assert kept.is_file() and kept.stat().st_mode & 0o077 == 0


def test_a_node_killed_mid_run_is_dropped_and_the_run_completes(federation):
    fed, tmp = federation
    run_dir = tmp / "killed"
    killed = []
    cfg = load_config(FEDAVG[0], list(FEDAVG[1]) + ['aggregator={name="mean"}', "deploy.round_timeout_s=30",
                                                    "rounds=2"])
    watcher = _once_round_1_is_recorded(run_dir, lambda: killed.append(fed.kill_node(2)))
    res = fed.run({"trustfl-config": dump_toml(config_to_dict(cfg)), "run-dir": str(run_dir)}, timeout=RUN_TIMEOUT)
    watcher.join(timeout=5)
    assert killed and res.ok, (res.status, res.stdout[-3000:])
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["dropped"] for r in rows] == [0, 1] and rows[1]["dropped_clients"] == [2]
    assert rows[-1]["cohort_size"] == 2 and (run_dir / "summary.json").is_file()
    assert torch.isfinite(_final_model(run_dir)).all()
    # The dropped node was charged its planned rounds: no client reports less ε than it may have spent.
    assert rows[-1]["epsilon_min"] == pytest.approx(rows[-1]["epsilon_max"])
