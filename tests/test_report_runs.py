"""What `trustfl report`, `compare` and the other commands make of run directories that are damaged or not finished,
and of arguments that name no path: an empty path argument is refused naming its flag (it stood for the working
directory, whose run `--out ''` wrote over); rows missing from metrics.jsonl, an unfinished run and a metric no row
records are said, not hidden; a plot is drawn only for the axes the rows record; a closed stdout ends a command
quietly."""
import json
import subprocess
import sys

import pytest

from trustfl.cli import EXIT_BROKEN_PIPE, main
from trustfl.core.runfiles import check_out_dir, read_metrics, truncate_metrics
from trustfl.errors import UsageError
from trustfl.report.compare import compare_runs
from trustfl.report.table import report_run

SMALL = 'name = "cli"\nrounds = 1\n[data]\nnum_clients = 4\n[model]\nname = "logreg"\n'


def _run(path, rows, rounds=None, summary=True, **more):
    """A run directory: config.toml (``rounds`` planned: the last row's by default), metrics.jsonl holding ``rows``
    and, when ``summary``, the summary.json of a run that finished ``rounds`` (``more``: other summary keys)."""
    last = rounds or rows[-1]["round"]
    path.mkdir(parents=True)
    (path / "config.toml").write_text(f'rounds = {last}\nname = "r"\nseed = 0\n')
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary:
        (path / "summary.json").write_text(json.dumps({"rounds": last, "rounds_planned": last, **more}))
    return path


def _rows(rounds, **extra):
    return [{"round": r, "accuracy": 0.5 + r / 100, "loss": 1.0 - r / 100, **extra} for r in rounds]


def _refused(capsys, args):
    """The one stderr line of a command that must fail with a user error."""
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trustfl: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------------------------------------ empty paths
@pytest.mark.parametrize("args, flag", [
    (["run", "c.toml", "--quiet", "--out", ""], "--out"),  # it ran, writing over the run in the working directory
    (["run", "--resume", ""], "--resume"),  # taken as no --resume
    (["run", "c.toml", "--quiet", "--data-dir", "", "--out", "new"], "--data-dir"),
    (["sweep", "c.toml", "--out", ""], "--out"),
    (["deploy", "app", "c.toml", "--out", ""], "--out"),
    (["deploy", "keys", "--clients", "2", "--out", ""], "--out"),
    (["report", ""], "RUN_DIR"),  # reported the working directory's run
    (["compare", ""], "RUN_DIR"),
    (["compare", "held", "--out", ""], "--out"),
    (["validate", ""], "CONFIG"),
])
def test_an_empty_path_argument_is_refused_naming_its_flag(tmp_path, capsys, monkeypatch, args, flag):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.toml").write_text(SMALL)
    _run(tmp_path / "held", _rows((1,)))
    _run(tmp_path / "cwd", _rows((1,)))
    for name in ("config.toml", "metrics.jsonl", "summary.json"):  # the working directory holds a run too
        (tmp_path / name).write_bytes((tmp_path / "cwd" / name).read_bytes())
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    err = _refused(capsys, args)
    assert f"{flag} is an empty path" in err, err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    assert not (tmp_path / "new").exists()


def test_the_library_refuses_an_empty_path_too(tmp_path):
    for call in (lambda: check_out_dir(""), lambda: report_run(""), lambda: read_metrics(""),
                 lambda: compare_runs([""]), lambda: compare_runs([str(_run(tmp_path / "r", _rows((1,))))], out="")):
        with pytest.raises(UsageError, match="is an empty path"):
            call()
    from trustfl.config.load import config_from_dict
    from trustfl.errors import ConfigError
    from trustfl.experiment import run_experiment
    with pytest.raises(ConfigError, match=r"`out` must be a path \(`.` for the working directory\) or None, not the "
                                          r"empty string"):
        run_experiment(config_from_dict({"rounds": 1}), "")


def test_a_file_given_as_a_run_directory_is_said_to_be_a_file(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for args in (["compare", str(afile)], ["report", str(afile)]):  # "does not exist" / "holds no rows"
        assert f"run directory {str(afile)!r} is a file, not a directory." in _refused(capsys, args)


# ------------------------------------------------------------------------------------------------ missing rows
@pytest.mark.parametrize("rounds, lacking", [((1, 2), "3"), ((1, 3), "2"), ((1,), "2-3")])
def test_compare_leaves_out_a_run_whose_metrics_lack_rounds_its_summary_counts(tmp_path, capsys, rounds, lacking):
    # its last present round's accuracy was averaged as the run's final one
    whole = _run(tmp_path / "whole", _rows((1, 2, 3)))
    cut = _run(tmp_path / "cut", _rows(rounds), rounds=3)
    said = f"{cut / 'metrics.jsonl'} lacks round(s) {lacking} of the 3 summary.json counts"
    assert main(["compare", str(whole), str(cut), "--out", str(tmp_path / "cmp"), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert f"left out (rows missing): {said}" in out and "| all runs | 1 |" in out, out
    assert f"left out, rows missing: {said}" in (tmp_path / "cmp" / "compare.md").read_text()
    assert f"no run has finished with all its rows ({said})" in _refused(capsys, ["compare", str(cut)])


def test_report_warns_of_rounds_missing_from_metrics(tmp_path, capsys):
    # the table ended at round 2 under a summary line of round 3's values, without a word
    run = _run(tmp_path / "run", _rows((1, 2)), rounds=3, final_accuracy=0.53, primary_metric="accuracy",
               metrics=["accuracy", "loss"])
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert (f"warning: {run / 'metrics.jsonl'} lacks round(s) 3 of the 3 summary.json counts: the table and plots "
            f"end at round 2, and the summary's final values are summary.json's.") in out, out
    gap = _run(tmp_path / "gap", _rows((1, 2, 4)), rounds=9, summary=False)
    text = report_run(gap)
    assert f"warning: {gap / 'metrics.jsonl'} lacks round(s) 3 of rounds 1-4" in text, text


# ------------------------------------------------------------------------------------------------ unfinished runs
def test_report_of_an_unfinished_run_reads_its_evaluators_and_says_how_far_it_got(tmp_path, capsys):
    # without summary.json, report showed accuracy and loss only: a regression run's table and plots were empty
    rows = [{"round": r, "mse": 1.0 / r, "mae": 0.9 / r, "r2": 0.1 * r, "loss": 1.0 / r, "train_loss": 1.2}
            for r in (1, 2)]
    run = _run(tmp_path / "run", rows, rounds=100, summary=False)
    (run / "run_info.json").write_text(json.dumps({"evaluators": ["mse", "mae", "r2", "loss"]}))
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:5] == ["round", "mse", "mae", "r2", "loss"], out
    assert "unfinished: round 2 of 100, no summary.json" in out
    assert {p.name for p in run.glob("*.png")} == {"mse.png", "mae.png", "r2.png", "loss.png"}
    stopped = _run(tmp_path / "stopped", _rows((1, 2)), rounds=2)  # summary.json of 2 rounds out of 4 planned
    (stopped / "summary.json").write_text(json.dumps({"rounds": 2, "rounds_planned": 4}))
    assert "unfinished: round 2 of 4" in report_run(stopped)
    assert "unfinished" not in report_run(_run(tmp_path / "done", _rows((1, 2))))
    (run / "run_info.json").write_text(json.dumps({"evaluators": "mse"}))
    assert "run_info.json: `evaluators` must be a list of names" in _refused(capsys, ["report", str(run)])


# ------------------------------------------------------------------------------------------------ plots
def test_a_plot_is_drawn_only_for_the_axes_and_metrics_the_rows_record(tmp_path, capsys):
    # a vertical run on a simulated clock (sim_time, no bits) got empty *_vs_bits.png; a summary naming a metric no
    # row has got an empty png of it
    run = _run(tmp_path / "run", _rows((1, 2), sim_time=1.5), metrics=["accuracy", "nosuch"])
    text = report_run(run)
    assert {p.name for p in run.glob("*.png")} == {"accuracy.png", "accuracy_vs_sim_time.png"}
    assert "notice: no row of metrics.jsonl has 'nosuch': nosuch.png is not drawn." in text, text
    both = _run(tmp_path / "both", _rows((1, 2), sim_time=1.5, bits_up_total=10, bits_down_total=5))
    report_run(both)
    assert {p.name for p in both.glob("*_vs_*.png")} == {f"{m}_vs_{a}.png" for m in ("accuracy", "loss")
                                                          for a in ("sim_time", "bits")}


# ------------------------------------------------------------------------------------------------ summary.json
@pytest.mark.parametrize("summary, fragment", [
    ({"final_accuracy": "x"}, "`final_accuracy` must be a number (null for NaN, \"inf\" and \"-inf\" for ±inf), "
                              "found 'x'"),
    ({"best_loss": [1]}, "`best_loss` must be a number"),
    ({"wall_time_s": True}, "`wall_time_s` must be a number"),
    ({"rounds_skipped": "2"}, "`rounds_skipped` must be int"),
    ({"primary_metric": "nosuch", "metrics": ["accuracy", "loss"]},
     "`primary_metric` is 'nosuch', which is not one of its `metrics` (accuracy, loss)"),
])
def test_summary_values_of_the_wrong_type_are_refused_naming_the_key(tmp_path, capsys, summary, fragment):
    # report printed final_accuracy=x, or dropped the primary metric's fields without a word
    run = _run(tmp_path / "run", _rows((1, 2)), **summary)
    for args in (["report", str(run)], ["compare", str(run), "--out", str(tmp_path / "cmp")]):
        err = _refused(capsys, args)
        assert f"{run / 'summary.json'}: {fragment}" in err, err


def test_what_trustfl_writes_in_a_summary_is_read_back(tmp_path):
    run = _run(tmp_path / "run", _rows((1, 2)), final_accuracy=None, best_accuracy="inf", final_loss="-inf",
               primary_metric="accuracy", metrics=["accuracy", "loss"], rounds_skipped=0, seed=3)
    text = report_run(run)
    assert "final_accuracy=nan  best_accuracy=inf  rounds=2" in text and "seed=3" in text, text


# ------------------------------------------------------------------------------------------------ line numbers
def test_a_byte_that_is_not_utf8_is_reported_on_its_line(tmp_path, capsys):
    # "line 0": the file was decoded whole before it was split into lines
    run = _run(tmp_path / "run", _rows((1, 2, 3)))
    lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    (run / "metrics.jsonl").write_bytes(lines[0] + lines[1].replace(b"round", b"r\xffound") + lines[2])
    for args in (["report", str(run)], ["compare", str(run), "--out", str(tmp_path / "cmp")]):
        assert "(line 2: byte 0xff is not UTF-8 text: invalid start byte)" in _refused(capsys, args)
    with pytest.raises(UsageError, match="line 2: byte 0xff"):  # as --resume reads it
        truncate_metrics(run / "metrics.jsonl", 3)


# ------------------------------------------------------------------------------------------------ closed stdout
@pytest.mark.parametrize("command", [["report", "{run}"], ["list"]])
def test_a_closed_stdout_ends_the_command_quietly(tmp_path, command):
    # `trustfl report RUN | head -1`: a BrokenPipeError traceback, exit code 1
    run = _run(tmp_path / "run", _rows(range(1, 301)))
    args = [a.format(run=run) for a in command]
    child = subprocess.Popen([sys.executable, "-m", "trustfl", *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    child.stdout.close()  # before the command writes: the reader has gone
    err = child.stderr.read().decode()
    assert child.wait(timeout=120) == EXIT_BROKEN_PIPE and err == "", err


def test_a_sweep_point_whose_summary_has_a_value_of_the_wrong_type_is_not_finished(tmp_path):
    """The sweep read summaries without the number checks, so a bad `final_` value reached sweep.json; such a
    point now counts as unfinished (it runs again)."""
    from trustfl.report.sweep import run_finished
    run = tmp_path / "p"
    run.mkdir()
    good = {"name": "p", "rounds": 3, "rounds_planned": 3, "metrics": ["accuracy"], "primary_metric": "accuracy",
            "final_accuracy": 0.9}
    (run / "summary.json").write_text(json.dumps(good))
    assert run_finished(run)
    (run / "summary.json").write_text(json.dumps({**good, "final_accuracy": "x"}))
    assert not run_finished(run)


def test_a_column_no_run_of_a_group_records_is_a_dash_not_nan(tmp_path):
    """A private and a non-private run compared: the non-private group's `final epsilon_max` read `nan ± –`."""
    private = _run(tmp_path / "a", [{"round": r, "accuracy": 0.5, "epsilon_max": 0.1 * r} for r in (1, 2, 3)])
    plain = _run(tmp_path / "b", _rows((1, 2, 3)))
    (plain / "config.toml").write_text('rounds = 3\nname = "r"\nseed = 0\n[client]\nlr = 0.2\n')
    result = compare_runs([private, plain], write=False)
    by_lr = {r["client.lr"]: r for r in result.rows}
    assert by_lr[None]["final_epsilon_max_mean"] == pytest.approx(0.3)
    assert by_lr[0.2]["final_epsilon_max_mean"] is None and by_lr[0.2]["final_epsilon_max_std"] is None
    line = next(row for row in result.markdown.splitlines() if row.startswith("| 0.2 "))
    assert "nan" not in line and line.rstrip(" |").endswith("–")
