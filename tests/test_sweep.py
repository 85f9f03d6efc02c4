"""Sweeps and comparisons (issue #18 item 3): `trustfl sweep` / `trustfl compare`, run_sweep and compare."""
from __future__ import annotations

import csv
import json
import re
import shutil
import statistics
from pathlib import Path

import pytest

import trustfl.experiment
from trustfl.cli import main
from trustfl.config.load import config_from_dict
from trustfl.errors import ConfigError, DataError, UsageError
from trustfl.report.compare import compare, compare_runs
from trustfl.report.sweep import run_finished, run_sweep
from trustfl.report.sweep_points import parse_grid, parse_seeds, point_name

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = {
    "name": "tiny", "rounds": 2,
    "data": {"dataset": "digits", "num_clients": 4, "options": {"max_train": 400, "max_test": 200}},
    "model": {"name": "logreg"},
    "client": {"lr": 0.1, "batch_size": 32},
    "engine": {"checkpoint_every": 1, "executor": "sequential"},  # sequential: a fresh worker starts faster
}
TINY_TOML = """name = "tiny"
rounds = 2
[data]
num_clients = 4
options = { max_train = 400, max_test = 200 }
[model]
name = "logreg"
[engine]
checkpoint_every = 1
executor = "sequential"
"""
NAMES = ["client.lr=0.05__seed=0", "client.lr=0.05__seed=1", "client.lr=0.2__seed=0", "client.lr=0.2__seed=1"]


def _rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the wall-clock column (the only one that is not seeded)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "wall_time_s"} for line in lines if line]


def _mtimes(run_dir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory, one_torch_thread):
    """2 learning rates × 2 seeds, run once in this process (jobs = 1)."""
    out = tmp_path_factory.mktemp("sweep") / "sw"
    lines: list[str] = []
    result = run_sweep(TINY, ["client.lr=0.05,0.2"], "0-1", out=out, log=lines.append)
    assert result.ok and [p.status for p in result.points] == ["done"] * 4
    assert sum(line.startswith("[") and " done " in line and "accuracy" in line for line in lines) == 4
    return out


@pytest.fixture
def calls(monkeypatch):
    """Every run_experiment call a sweep makes in this process: ("resume" | "fresh", run directory name)."""
    seen: list[tuple[str, str]] = []
    real = trustfl.experiment.run_experiment

    def spy(cfg, out=None, **kwargs):
        seen.append(("resume", Path(kwargs["resume"]).name) if kwargs.get("resume") else ("fresh", Path(out).name))
        return real(cfg, out, **kwargs)

    monkeypatch.setattr(trustfl.experiment, "run_experiment", spy)
    return seen


def test_sweep_makes_one_run_dir_per_point_and_a_manifest(sweep_dir):
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == NAMES
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    assert manifest["grids"] == {"client.lr": [0.05, 0.2]} and manifest["seeds"] == [0, 1]
    assert manifest["base_config"]["name"] == "tiny" and manifest["config"] is None
    assert [p["dir"] for p in manifest["points"]] == NAMES
    assert all(p["status"] == "done" and p["primary_metric"] == "accuracy" for p in manifest["points"])
    assert manifest["points"][2]["overrides"] == {"client.lr": 0.2, "seed": 0}
    for name in NAMES:  # each a normal run directory of its point's config
        run = sweep_dir / name
        assert run_finished(run)
        summary = json.loads((run / "summary.json").read_text())
        assert summary["seed"] == int(name[-1]) and summary["final_accuracy"] == _rows(run)[-1]["accuracy"]
        assert f"lr = {name.split('=')[1].split('__')[0]}" in (run / "config.toml").read_text()


def test_compare_is_mean_and_sample_std_over_seeds(sweep_dir):
    rows = compare([sweep_dir], plots=True)  # a sweep directory stands for its points; files go into it
    assert [r["group"] for r in rows] == ["client.lr=0.05", "client.lr=0.2"]
    for row, lr in zip(rows, ("0.05", "0.2")):
        runs = [_rows(sweep_dir / f"client.lr={lr}__seed={s}") for s in (0, 1)]
        assert row["n"] == 2 and row["seeds"] == [0, 1] and row["client.lr"] == float(lr)
        for metric, best in (("accuracy", max), ("loss", min)):
            finals = [r[-1][metric] for r in runs]
            bests = [best(x[metric] for x in r) for r in runs]
            assert row[f"final_{metric}_mean"] == pytest.approx(statistics.mean(finals), abs=1e-12)
            assert row[f"final_{metric}_std"] == pytest.approx(statistics.stdev(finals), abs=1e-12)
            assert row[f"best_{metric}_mean"] == pytest.approx(statistics.mean(bests), abs=1e-12)
            assert row[f"best_{metric}_std"] == pytest.approx(statistics.stdev(bests), abs=1e-12)
    table = list(csv.DictReader((sweep_dir / "compare.csv").open()))
    assert [float(t["final_accuracy_mean"]) for t in table] == [r["final_accuracy_mean"] for r in rows]
    assert [t["seeds"] for t in table] == ["0 1", "0 1"]
    md = (sweep_dir / "compare.md").read_text()
    assert md.startswith("| client.lr | n | final accuracy | best accuracy |") and " ± " in md
    for axis in ("round", "wall_time_s", "bytes_up_total"):
        assert (sweep_dir / f"compare_accuracy_vs_{axis}.png").stat().st_size > 1000
    assert not (sweep_dir / "compare_accuracy_vs_epsilon_max.png").exists()  # no DP: no ε column


def test_compare_cli_on_run_dirs_one_seed_has_no_std(sweep_dir, tmp_path, capsys):
    runs = [str(sweep_dir / "client.lr=0.05__seed=0"), str(sweep_dir / "client.lr=0.2__seed=0")]
    assert main(["compare", *runs, "--out", str(tmp_path / "cmp"), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert "| 0.05 | 1 |" in out and "± –" in out and "compare.md, compare.csv" in out
    assert sorted(p.name for p in (tmp_path / "cmp").iterdir()) == ["compare.csv", "compare.md"]
    only_seeds = compare_runs([sweep_dir / n for n in NAMES[:2]], write=False)  # same config, two seeds
    assert only_seeds.varied == [] and only_seeds.rows[0]["group"] == "all runs" and only_seeds.rows[0]["n"] == 2
    assert main(["compare", str(tmp_path / "nothing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_compare_of_a_diverged_run_gives_nan_and_inf_not_a_crash(sweep_dir, tmp_path):
    # a run whose last row holds NaN / Infinity (e.g. it diverged): statistics' exact sums raised AttributeError
    diverged = tmp_path / "diverged"
    shutil.copytree(sweep_dir / "client.lr=0.05__seed=0", diverged)
    rows = (diverged / "metrics.jsonl").read_text().splitlines()
    rows[-1] = rows[-1].replace('"loss": ', '"loss": Infinity, "was": ', 1)
    rows[-1] = rows[-1].replace('"accuracy": ', '"accuracy": NaN, "was_acc": ', 1)
    (diverged / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    result = compare_runs([diverged, sweep_dir / "client.lr=0.05__seed=1"], write=False)
    (row,) = result.rows
    assert row["n"] == 2 and row["final_loss_mean"] == float("inf") and row["final_accuracy_mean"] != row[
        "final_accuracy_mean"]  # NaN
    assert row["final_loss_std"] != row["final_loss_std"]  # NaN: no spread of an infinite value


def test_interrupted_sweep_reruns_only_what_is_missing(sweep_dir, tmp_path, calls):
    out = tmp_path / "sw"
    shutil.copytree(sweep_dir, out)
    before = {n: _mtimes(out / n) for n in NAMES}
    original = {n: _rows(out / n) for n in NAMES}

    # 1. A point without its completion marker is resumed from its checkpoint; the others are not touched.
    (out / NAMES[1] / "summary.json").unlink()
    result = run_sweep(TINY, ["client.lr=0.05,0.2"], "0-1", out=out, log=None)
    assert calls == [("resume", NAMES[1])]
    assert [p.status for p in result.points] == ["skipped", "done", "skipped", "skipped"]
    assert all(_mtimes(out / n) == before[n] for n in NAMES if n != NAMES[1])
    assert _rows(out / NAMES[1]) == original[NAMES[1]]

    # 2. A run interrupted after round 1 resumes (same metrics as uninterrupted); a deleted point runs afresh.
    shutil.rmtree(out / NAMES[2])
    shutil.rmtree(out / NAMES[3])
    point = config_from_dict({**TINY, "seed": 1, "client": {**TINY["client"], "lr": 0.2}})
    trustfl.experiment.run_experiment(point, out / NAMES[3], progress=False, stop_after=1)
    assert not run_finished(out / NAMES[3])
    calls.clear()
    untouched = {n: _mtimes(out / n) for n in NAMES[:2]}
    result = run_sweep(TINY, ["client.lr=0.05,0.2"], "0-1", out=out, log=None)
    assert sorted(calls) == [("fresh", NAMES[2]), ("resume", NAMES[3])]
    assert all(_mtimes(out / n) == untouched[n] for n in NAMES[:2])
    assert {n: _rows(out / n) for n in NAMES} == original
    assert all(p["status"] == "done" for p in json.loads((out / "sweep.json").read_text())["points"])


def test_a_point_whose_checkpoint_cannot_be_resumed_fails_naming_it(sweep_dir, tmp_path, calls):
    # it was rerun from scratch under "(resumed from its checkpoint)", its rows rewritten
    out = tmp_path / "sw"
    shutil.copytree(sweep_dir, out)
    point = out / NAMES[0]
    (point / "summary.json").unlink()
    (point / "checkpoint.pt").write_text("junk")
    rows = (point / "metrics.jsonl").read_text()
    lines: list[str] = []
    result = run_sweep(TINY, ["client.lr=0.05,0.2"], "0-1", out=out, log=lines.append)
    assert calls == [("resume", NAMES[0])]
    assert [p.status for p in result.points] == ["failed", "skipped", "skipped", "skipped"]
    error = result.points[0].error
    assert error.startswith("CheckpointError: ") and f"{point / 'checkpoint.pt'}" in error and "\n" not in error
    assert f"delete {point} to run it afresh" in error
    assert not any("resumed" in line for line in lines)
    assert lines[-1].endswith(f"delete the directories of {NAMES[0]} (checkpoints it cannot resume), then "
                              f"re-run the same command to retry them")  # a plain re-run would refuse it again
    assert (point / "metrics.jsonl").read_text() == rows and not (point / "summary.json").exists()
    assert json.loads((out / "sweep.json").read_text())["points"][0]["status"] == "failed"


def test_failed_point_is_reported_the_sweep_goes_on_and_a_rerun_retries_it(tmp_path, calls, monkeypatch, capsys):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY_TOML)
    spy = trustfl.experiment.run_experiment
    failures = {"client.lr=0.2__seed=0": DataError("disk on fire"), "client.lr=0.2__seed=1": RuntimeError("bug")}

    def flaky(cfg, out=None, **kwargs):
        error = failures.pop(Path(out).name, None) if out is not None else None
        if error is not None:
            raise error
        return spy(cfg, out, **kwargs)

    monkeypatch.setattr(trustfl.experiment, "run_experiment", flaky)
    argv = ["sweep", str(cfg), "--grid", "client.lr=0.05,0.2", "--seeds", "0-1", "--out", str(tmp_path / "sw")]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "failed  client.lr=0.2__seed=0: DataError: disk on fire" in out
    assert "failed  client.lr=0.2__seed=1: RuntimeError: bug (traceback in" in out
    assert "2 of 4 points failed" in out
    assert "RuntimeError: bug" in (tmp_path / "sw" / "client.lr=0.2__seed=1" / "error.log").read_text()
    manifest = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert [p["status"] for p in manifest["points"]] == ["done", "done", "failed", "failed"]
    assert manifest["points"][2]["error"] == "DataError: disk on fire" and manifest["config"] == str(cfg)

    calls.clear()
    assert main(argv) == 0
    assert sorted(name for _, name in calls) == ["client.lr=0.2__seed=0", "client.lr=0.2__seed=1"]
    assert "2 run, 2 finished earlier, 0 failed" in capsys.readouterr().out
    assert not (tmp_path / "sw" / "client.lr=0.2__seed=1" / "error.log").exists()


def test_bad_grid_and_unknown_keys_are_config_errors_before_anything_runs(tmp_path, calls, capsys):
    for grid, fragment in (("client.lr", "--grid takes KEY=VALUE1,VALUE2"), ("client.lr=0.1,,0.2", "empty value"),
                           ("model.hidden=[64,", "--grid model.hidden"), ("seed=1,2", "--seeds"),
                           ("client.lr=0.1,0.1", "given twice")):
        with pytest.raises(ConfigError, match=fragment):
            parse_grid(grid)
    with pytest.raises(ConfigError, match="given twice"):
        run_sweep(TINY, ["client.lr=0.1", "client.lr=0.2"], out=tmp_path / "x")
    for seeds in ("2-0", "a", "0,0", ""):
        with pytest.raises(ConfigError, match="seeds"):
            parse_seeds(seeds)
    assert parse_seeds("0-2,7") == [0, 1, 2, 7] and parse_grid("model.hidden=[64],[32,32]") == (
        "model.hidden", [[64], [32, 32]])
    with pytest.raises(ConfigError, match="client.lrr"):
        run_sweep(TINY, ["client.lr=0.1,0.2", "client.lrr=0.5"], out=tmp_path / "x")
    with pytest.raises(ConfigError, match=r"aggregator\.name.*nope"):  # found when the points are built
        run_sweep(TINY, ["aggregator.name=mean,nope"], out=tmp_path / "x")
    with pytest.raises(UsageError, match="jobs"):
        run_sweep(TINY, ["client.lr=0.1"], out=tmp_path / "x", jobs=0)
    assert calls == [] and not (tmp_path / "x").exists()

    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY_TOML)
    for grid, fragment in (("client.lrr=0.5", "`client.lrr`"), ("client.lr=[0.1,", "--grid client.lr")):
        assert main(["sweep", str(cfg), "--grid", grid, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("trustfl: error: ") and fragment in err
    assert calls == [] and not (tmp_path / "x").exists()


def test_a_sweep_of_more_than_max_points_is_refused_before_anything_is_built(tmp_path, calls, capsys, monkeypatch):
    """A typo such as --seeds 0-100000 is refused at once (no list of its seeds, no run directories), as is a grid
    whose product with the seeds exceeds the cap; exactly the cap is allowed."""
    from trustfl.report.sweep_points import MAX_POINTS

    # 10^18 seeds: a range materialised before the check would run out of memory instead
    with pytest.raises(ConfigError, match=r"--seeds '0-1000000000000000000' names more than 10,000 seeds"):
        parse_seeds("0-1000000000000000000")
    assert len(parse_seeds(f"0-{MAX_POINTS - 1}")) == MAX_POINTS
    with pytest.raises(ConfigError, match=r"10,000 seeds"):
        parse_seeds(f"0-{MAX_POINTS - 1},{MAX_POINTS}")
    monkeypatch.setattr("trustfl.report.sweep.MAX_POINTS", 6)  # the product of grids and seeds, on a small cap
    with pytest.raises(ConfigError, match=r"has 9 points \(3 values of client.lr × 3 seeds\); .* at most 6"):
        run_sweep(TINY, ["client.lr=0.1,0.2,0.3"], "0-2", out=tmp_path / "x")
    monkeypatch.undo()
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY_TOML)
    assert main(["sweep", str(cfg), "--seeds", "0-20000", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "10,000" in err
    assert calls == [] and not (tmp_path / "x").exists()


def test_a_directory_of_another_config_is_refused(sweep_dir, tmp_path, calls):
    out = tmp_path / "sw"
    shutil.copytree(sweep_dir, out)
    with pytest.raises(UsageError, match=r"client.lr=0.05__seed=0.*another config.*`client.batch_size`"):
        run_sweep(TINY, ["client.lr=0.05,0.2"], "0-1", out=out, overrides=["client.batch_size=16"])
    assert calls == []


def test_a_point_holding_a_run_without_its_config_is_refused_not_run_over(sweep_dir, tmp_path, calls):
    """It was started afresh over its files, even a finished one (summary, rows and checkpoint rewritten)."""
    out = tmp_path / "sw"
    shutil.copytree(sweep_dir, out)
    point = out / NAMES[0]
    (point / "config.toml").unlink()
    before = _mtimes(point)
    with pytest.raises(UsageError, match=rf"^sweep point {re.escape(NAMES[0])}: .* holds a run \(metrics.jsonl, "
                                         r"checkpoint.pt, summary.json\) without its config.toml; restore it, or "
                                         r"delete that directory"):
        run_sweep(TINY, ["client.lr=0.05,0.2"], "0-1", out=out)
    assert calls == [] and _mtimes(point) == before


def test_a_point_whose_rows_were_cut_is_said_to_be_deleted_not_retried(sweep_dir, tmp_path, calls):
    """The point's error advised `--overwrite`, which `trustfl sweep` lacks, and the summary line a re-run, which
    fails the same way every time."""
    out = tmp_path / "sw"
    shutil.copytree(sweep_dir, out)
    point = out / NAMES[0]
    (point / "summary.json").unlink()
    (point / "metrics.jsonl").write_text((point / "metrics.jsonl").read_text().splitlines()[0][:0])
    lines: list[str] = []
    result = run_sweep(TINY, ["client.lr=0.05,0.2"], "0-1", out=out, log=lines.append)
    error = result.points[0].error
    assert result.points[0].status == "failed" and "--overwrite" not in error
    assert f"delete {point} to run it afresh" in error
    assert lines[-1].startswith(f"sweep: 1 of 4 points failed ({NAMES[0]}); delete the directories of {NAMES[0]}")


def test_jobs_2_gives_the_results_of_jobs_1(sweep_dir, tmp_path):
    out = tmp_path / "sw"
    lines: list[str] = []
    result = run_sweep(TINY, {"client.lr": [0.05, 0.2]}, [0, 1], out=out, jobs=2, log=lines.append)
    assert result.ok and "with 2 jobs" in lines[0]
    assert sorted(lines[1:]) == sorted(line for line in lines[1:] if " done " in line) and len(lines) == 5
    assert {n: _rows(out / n) for n in NAMES} == {n: _rows(sweep_dir / n) for n in NAMES}


def test_point_names_are_filesystem_safe():
    assert point_name({"client.lr": 0.01, "aggregator.name": "caf", "seed": 0}) == (
        "client.lr=0.01__aggregator.name=caf__seed=0")
    assert point_name({"aggregator": {"name": "cwtm", "f": 1}, "model.hidden": [64, 32], "seed": 2}) == (
        "aggregator=cwtm,f=1__model.hidden=64,32__seed=2")
    assert point_name({"data.data_dir": "/tmp/my data", "flag": True, "seed": 0}) == (
        "data.data_dir=_tmp_my_data__flag=true__seed=0")
    long = point_name({"name": "x" * 400, "seed": 0})
    assert len(long) <= 150 and long.startswith("name=xxx") and long[-10:-8] == "__"
