"""torchrun execution (issue #14): a 2-rank gloo run equals the 1-process run, rank 0 alone writes the run
directory and prints, refusals are one line printed once; the all-gather of unequal (and empty) slices and the
divergence guard, on 2 spawned gloo processes.

Every process here rendezvous on the loopback interface (127.0.0.1) or a file store.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.child_run import child_env
from trustfl.config.load import load_config
from trustfl.engine.distributed import Ranks, gather_results, ranks_from_env, share
from trustfl.engine.executors import ClientResults
from trustfl.errors import DistributedError
from trustfl.experiment import run_experiment

REPO = Path(__file__).resolve().parents[2]

ROBUST_DP = """
name = "dist-robust-dp"
algorithm = "scaffold"
seed = 3
rounds = 2

[data]
dataset = "digits"
num_clients = 10
partition = { name = "dirichlet", alpha = 0.5 }

[model]
name = "logreg"

[cohort]
sampler = "uniform"
size = 7

[client]
epochs = 1
batch_size = 16
lr = 0.5
batch_sampler = "poisson"

[client.dp]
mode = "per_example"
clip = 1.0
epsilon = 8.0
delta = 1e-5

[attack]
name = "label_flip"
num_byzantine = 1

[aggregator]
name = "cwtm"
f = 1

[engine]
checkpoint_every = 1
"""
"""SCAFFOLD (client state and extras) + DP-SGD (per-example, Poisson) + a label-flipping client (it trains, so all
7 cohort clients train: slices of 3 and 4) + the coordinate-wise trimmed mean."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    return child_env(drop=("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"), OMP_NUM_THREADS="1")


def torchrun(*args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node=nproc -m trustfl ARGS`` on one machine, rendezvous on 127.0.0.1."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={nproc}",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", "-m", "trustfl", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=240, cwd=REPO)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def assert_same_run(one: Path, two: Path, rounds: int, model_atol: float = 1e-7) -> None:
    """The two run directories hold the same model (float tolerance), checkpoint and metrics rows."""
    a, b = torch.load(one / "model.pt"), torch.load(two / "model.pt")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-6, atol=model_atol)
    rows_a, rows_b = _rows(one), _rows(two)
    assert [r["round"] for r in rows_b] == list(range(1, rounds + 1))  # one row per round: one writer
    for ra, rb in zip(rows_a, rows_b):
        assert ra.keys() == rb.keys()
        for key, va in ra.items():
            if key == "wall_time_s":
                continue
            if isinstance(va, float):
                tol = 1 / 300 if key == "accuracy" else 1e-5  # accuracy: within one test example (360 digits)
                assert rb[key] == pytest.approx(va, rel=tol, abs=tol), key
            else:
                assert rb[key] == va, key
    sa = json.loads((one / "summary.json").read_text())
    sb = json.loads((two / "summary.json").read_text())
    assert sb["rounds"] == sa["rounds"] == rounds
    assert sb.get("epsilon", {}).keys() == sa.get("epsilon", {}).keys()


def _one_process(config: Path, out: Path, overrides: list[str] = ()) -> Path:
    run_experiment(load_config(config, list(overrides)), out, progress=False, plots=False)
    return out


def test_two_gloo_ranks_equal_one_process_fedavg(tmp_path):
    config = REPO / "configs" / "quickstart.toml"
    overrides = ["rounds=3", "engine.checkpoint_every=3"]
    one = _one_process(config, tmp_path / "one", overrides)
    proc = torchrun("run", str(config), *[a for o in overrides for a in ("--set", o)], "--out",
                    str(tmp_path / "two"), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("run directory:") == 1 and proc.stdout.count("final accuracy") == 1, proc.stdout
    assert_same_run(one, tmp_path / "two", 3)
    assert {"config.toml", "run_info.json", "summary.json", "model.pt", "checkpoint.pt"} <= \
        {p.name for p in (tmp_path / "two").iterdir()}


def test_two_gloo_ranks_resume_a_one_process_checkpoint(tmp_path):
    """Every rank loads rank 0's checkpoint (one machine: the same path) and the run ends as an uninterrupted one."""
    config = REPO / "configs" / "quickstart.toml"
    overrides = ["rounds=3", "engine.checkpoint_every=1"]
    one = _one_process(config, tmp_path / "one", overrides)
    cut = tmp_path / "cut"
    run_experiment(load_config(config, overrides), cut, progress=False, plots=False, stop_after=2)
    assert len(_rows(cut)) == 2
    proc = torchrun("run", "--resume", str(cut), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_run(one, cut, 3)


def test_two_gloo_ranks_equal_one_process_robust_dp_scaffold_odd_cohort(tmp_path):
    config = tmp_path / "robust_dp.toml"
    config.write_text(ROBUST_DP)
    one = _one_process(config, tmp_path / "one")
    proc = torchrun("run", str(config), "--out", str(tmp_path / "two"), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_run(one, tmp_path / "two", 2)
    ca = torch.load(one / "checkpoint.pt", weights_only=False)["state"]
    cb = torch.load(tmp_path / "two" / "checkpoint.pt", weights_only=False)["state"]
    assert ca["clients"].keys() == cb["clients"].keys() and len(ca["clients"]) > 0  # SCAFFOLD's c_i, gathered
    for c, entry in ca["clients"].items():
        for k, v in entry.items():
            torch.testing.assert_close(cb["clients"][c][k], v, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(cb["shared"]["scaffold"]["c"], ca["shared"]["scaffold"]["c"], rtol=1e-6, atol=1e-7)
    assert cb["ledger"].keys() == ca["ledger"].keys()


def test_two_gloo_ranks_equal_one_process_async_quafl(tmp_path):
    """The asynchronous engine (QuAFL polling: stacked per-client starts, client models in the state store) splits
    its executor calls the same way. Its rotated lattice links can turn the ranks' last-bit differences (other
    group shapes, one thread) into a neighbouring lattice level: step/√block = 1e-4/16 a coordinate, scaled by
    the mixing weights, hence the model's tolerance."""
    config = REPO / "configs" / "quafl" / "quafl_n100.toml"
    overrides = ["rounds=3", "data.dataset=\"digits\""]
    one = _one_process(config, tmp_path / "one", overrides)
    proc = torchrun("run", str(config), *[a for o in overrides for a in ("--set", o)], "--out",
                    str(tmp_path / "two"), "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_run(one, tmp_path / "two", 3, model_atol=1e-5)


def test_vertical_engine_is_refused_in_one_line_printed_once(tmp_path):
    proc = torchrun("run", str(REPO / "configs" / "dpzv" / "breast_cancer_dpzv.toml"), "--set", "rounds=1",
                    "--out", str(tmp_path / "v"), "--quiet")
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("trustfl: error:")]
    assert len(lines) == 1 and "`engine.kind` = 'vertical'" in lines[0] and "torchrun" in lines[0], proc.stderr
    assert "exitcode  : 2" in proc.stderr  # rank 0 exits as the CLI does for a user error
    assert not (tmp_path / "v" / "metrics.jsonl").exists()


def test_sweep_is_refused_under_torchrun(monkeypatch, capsys, tmp_path):
    from trustfl import cli

    waits = []
    monkeypatch.setattr(cli.time, "sleep", waits.append)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert cli.main(["sweep", str(REPO / "configs" / "quickstart.toml"), "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "trustfl sweep does not run under torchrun" in err[0] and waits == []
    monkeypatch.setenv("RANK", "1")  # the other ranks exit with the same code, quietly, after rank 0 could report:
    assert cli.main(["sweep", str(REPO / "configs" / "quickstart.toml"), "--out", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err == "" and waits == [cli.RANK0_GRACE_S]  # torchrun stops all at the first exit
    assert not (tmp_path / "s").exists()


def test_a_rank_stopped_by_torchrun_while_it_waits_after_a_user_error_exits_quietly(monkeypatch, capsys, tmp_path):
    """torchrun's SIGTERM (rank 0 has exited) reached rank 1 in its wait inside the error handler: a traceback of
    the ConfigError and of `Terminated`, exit code 1, instead of the same quiet exit as rank 0's code."""
    from trustfl import cli

    def stopped(seconds):
        cli._on_sigterm(15, None)

    monkeypatch.setattr(cli.time, "sleep", stopped)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert cli.main(["run", str(REPO / "configs" / "quickstart.toml"), "--out", str(tmp_path / "r"),
                     "--set", "client.bogus=1"]) == 2
    assert capsys.readouterr().err == ""


def test_share_is_contiguous_and_balanced():
    for m in range(0, 12):
        for world in (1, 2, 3, 5):
            bounds = [share(m, k, world) for k in range(world)]
            assert bounds[0][0] == 0 and bounds[-1][1] == m
            assert all(bounds[k][1] == bounds[k + 1][0] for k in range(world - 1))
            sizes = [hi - lo for lo, hi in bounds]
            assert max(sizes) - min(sizes) <= 1


def test_ranks_from_env():
    assert ranks_from_env({}) is None and ranks_from_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    assert ranks_from_env({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"}) == Ranks(3, 4, 1)
    with pytest.raises(DistributedError, match="RANK"):
        ranks_from_env({"WORLD_SIZE": "2", "RANK": "x"})
    with pytest.raises(DistributedError, match="RANK=2"):
        ranks_from_env({"WORLD_SIZE": "2", "RANK": "2"})


def _results(rows: int, offset: float) -> ClientResults:
    u = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3) + offset
    return ClientResults(u, u[:, 0].clone(), [int(offset) + i for i in range(rows)],
                         {"c": u[:, :2].double()}, {"e": u[:, 2:] * 2})


def _gather_worker(rank: int, world: int, store: str, failures: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        # Rank 0 has an empty slice (its dicts have no keys), rank 1 three clients.
        local = _results(0, 0.0) if rank == 0 else _results(3, 100.0)
        if rank == 0:
            local = ClientResults(local.updates, local.train_loss, [], {}, {})
        got = gather_results(local, "same", torch.device("cpu"))
        want = _results(3, 100.0)
        assert torch.equal(got.updates, want.updates) and torch.equal(got.train_loss, want.train_loss)
        assert got.num_steps == want.num_steps
        assert torch.equal(got.client_state["c"], want.client_state["c"]) and got.client_state["c"].dtype == \
            torch.float64
        assert torch.equal(got.extras["e"], want.extras["e"])
        # Unequal non-empty slices (2 and 1 rows) come back in rank order.
        local = _results(2, 0.0) if rank == 0 else _results(1, 50.0)
        got = gather_results(local, "same", torch.device("cpu"))
        assert torch.equal(got.updates, torch.cat([_results(2, 0.0).updates, _results(1, 50.0).updates]))
        # Ranks that start a round from different states are stopped on every rank.
        try:
            gather_results(local, f"state-{rank}", torch.device("cpu"))
        except DistributedError as err:
            assert "diverged" in str(err)
        else:
            raise AssertionError("no DistributedError")
    except BaseException as err:  # noqa: BLE001 - reported to the parent through the file
        Path(failures, str(rank)).write_text(repr(err))
        raise
    finally:
        dist.destroy_process_group()


def test_gather_results_unequal_and_empty_slices_and_divergence_guard(tmp_path):
    import torch.multiprocessing as mp

    failures = tmp_path / "failures"
    failures.mkdir()
    mp.spawn(_gather_worker, args=(2, str(tmp_path / "store"), str(failures)), nprocs=2, join=True)
    assert not list(failures.iterdir())
