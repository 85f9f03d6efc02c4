"""A deployed node's build (``build_federation(..., for_client=i)``): client ``i``'s privacy alone.

A Flower node builds the federation at every message, so calibrating every client's noise multiplier there cost
each node time in proportion to the federation. The node's build calibrates and checks its own client only; its
noise multiplier is the server's, bit for bit, and it cannot plan another client.
"""
from __future__ import annotations

import math

import pytest

import trustfl.config.privacy as privacy
from trustfl.config.build import build_federation
from trustfl.config.load import load_config
from trustfl.deploy.node import NodeRuntime
from trustfl.engine.round_parts import make_plan
from trustfl.errors import BudgetExceededError, ConfigError, MessageError

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
HETEROGENEOUS = ROOT / "configs/dp/heterogeneous_eps_digits.toml"  # ε from dist5, one per client
SMALL = ["rounds=3", "data.num_clients=5"]


@pytest.fixture
def calibrated(monkeypatch):
    """The ε lists handed to the calibration, one list per build."""
    seen: list[list[float]] = []
    real = privacy.calibrate_clients

    def counting(epsilons, *args, **kwargs):
        seen.append(list(epsilons))
        return real(epsilons, *args, **kwargs)
    monkeypatch.setattr(privacy, "calibrate_clients", counting)
    return seen


def test_a_nodes_build_calibrates_its_own_client_alone_to_the_servers_bits(calibrated):
    cfg = load_config(HETEROGENEOUS, SMALL)
    full = build_federation(cfg, quiet=True)
    assert len(calibrated[0]) == 5 and len(set(calibrated[0])) == 5  # five budgets, five calibrations
    for cid in (0, 3):
        node = build_federation(cfg, quiet=True, for_client=cid)
        assert calibrated[-1] == [calibrated[0][cid]]
        assert node.noise_multipliers[cid].hex() == full.noise_multipliers[cid].hex()
        assert full.noise_multipliers[cid] > 0
        assert all(math.isnan(z) for i, z in enumerate(node.noise_multipliers) if i != cid)
        mine = make_plan(node, cid, 0)
        assert mine.noise_multiplier == full.noise_multipliers[cid]
        assert mine.batch_size == make_plan(full, cid, 0).batch_size
        other = (cid + 1) % 5
        with pytest.raises(ConfigError, match=f"client {other}'s noise multiplier was not calibrated"):
            make_plan(node, other, 0)


def test_a_node_checks_its_own_budget_and_refuses_only_when_it_is_exceeded():
    # z = 1.2 for everyone: the clients of batch 64 (odd ids) would spend more than ε = 2, those of batch 8 not
    cfg = load_config(HETEROGENEOUS, SMALL + ["client.batch_sizes=[8, 64]", 'client.dp.epsilon_distribution=""',
                                             "client.dp.epsilon=2.0", "client.dp.noise_multiplier=1.2"])
    with pytest.raises(BudgetExceededError, match="client 1: the schedule would spend"):
        build_federation(cfg, quiet=True)
    with pytest.raises(BudgetExceededError, match="client 3: the schedule would spend"):
        NodeRuntime(cfg, 3)
    node = NodeRuntime(cfg, 2)  # its own schedule fits: it builds (the server's build refuses the run)
    assert make_plan(node.fed, 2, 0).noise_multiplier == 1.2


def test_robust_hdps_recipe_builds_for_one_node_with_that_clients_reports():
    cfg = load_config(ROOT / "configs/robust_hdp/digits_quick.toml",
                      ["rounds=2", "data.num_clients=4", "client.dp={epsilons=[0.5, 1.0, 2.0, 4.0]}"])
    full = build_federation(cfg, quiet=True)
    node = build_federation(cfg, quiet=True, for_client=1)
    for key in ("oracle_noise_variance", "reported_epsilon", "num_samples"):
        assert node.reports[key][1].item() == full.reports[key][1].item()
    assert full.reports["oracle_noise_variance"][1].item() > 0


def test_a_node_calibrates_and_checks_once_at_its_hello_then_uses_the_multiplier_it_kept(calibrated):
    """Its hello keeps its multiplier in its state; a train message's build takes it as it is: no calibration, no
    schedule check, and, for DP-SGD, no import of dp_accounting (about 1.5 s of each Flower message's start)."""
    import subprocess
    import sys

    cfg = load_config(HETEROGENEOUS, SMALL)
    hello = NodeRuntime(cfg, 3)
    kept = hello.new_state()["noise_multiplier"]
    assert kept == hello.fed.noise_multipliers[3] > 0 and len(calibrated) == 1
    again = NodeRuntime(cfg, 3, checked_noise=kept)
    assert len(calibrated) == 1 and again.fed.noise_multipliers[3].hex() == kept.hex()
    assert make_plan(again.fed, 3, 0).noise_multiplier == kept
    with pytest.raises(ConfigError, match="client 2's noise multiplier was not calibrated"):
        make_plan(again.fed, 2, 0)
    code = ("import sys; from trustfl.config.load import load_config; from trustfl.deploy.node import NodeRuntime; "
            f"cfg = load_config({str(HETEROGENEOUS)!r}, {SMALL!r}); NodeRuntime(cfg, 3, checked_noise={kept!r}); "
            "print('dp_accounting' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_a_flower_train_message_builds_its_node_with_the_multiplier_its_hello_kept(calibrated):
    pytest.importorskip("flwr")
    from flwr.app import Context, RecordDict

    from trustfl.config.load import config_to_dict, dump_toml
    from trustfl.deploy import flower

    cfg = load_config(HETEROGENEOUS, SMALL)
    context = Context(run_id=1, node_id=2, node_config={"partition-id": 3}, state=RecordDict(),
                      run_config={"trustfl-config": dump_toml(config_to_dict(cfg))})
    flower._NODES.clear()  # each message of a Flower node runs in a fresh process
    hello = flower._node(context)
    flower._keep(flower._state(hello, context), context)
    assert len(calibrated) == 1
    flower._NODES.clear()
    node, state = flower._trainer(context)
    assert len(calibrated) == 1 and node.fed.noise_multipliers[3] == state["noise_multiplier"] > 0
    flower._NODES.clear()
    with pytest.raises(MessageError, match="before it introduced itself"):
        flower._trainer(Context(run_id=1, node_id=2, node_config={"partition-id": 3}, state=RecordDict(),
                                run_config=context.run_config))
