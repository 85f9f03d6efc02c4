"""What `trustfl report` and `trustfl compare` make of run directories written by hand: a metrics row that trustfl
never writes (a huge integer, deep nesting, a value that is not a number, a round twice) and an `--ignore` key that
names nothing are one-line errors (exit 2) naming the file, line and key; what trustfl does write is read back.
Compare leaves out unfinished runs and says what it would otherwise hide (a seed twice, a curve cut short)."""
import json
import math
import re

import pytest

from trustfl.cli import main
from trustfl.core.runfiles import append_metrics, read_metrics, truncate_metrics
from trustfl.errors import ConfigError, UsageError
from trustfl.report.compare import compare_runs
from trustfl.report.sweep import MANIFEST, run_finished
from trustfl.report.table import report_run

CONFIG = 'name = "r"\nseed = {seed}\n[aggregator]\nname = "{rule}"\n[client]\nlr = 0.1\n'


def _run(path, lines, seed=0, rule="mean", rounds=None, done=True):
    """A run directory: config.toml (``rounds``: the last row's round), metrics.jsonl holding ``lines`` (rows, or
    text written as it is) and, when ``done``, the summary.json of a run that finished them."""
    last = max([line["round"] for line in lines if isinstance(line, dict)], default=1)
    path.mkdir(parents=True)
    (path / "config.toml").write_text(f"rounds = {rounds or last}\n" + CONFIG.format(seed=seed, rule=rule))
    (path / "metrics.jsonl").write_text("".join(line if isinstance(line, str) else json.dumps(line) + "\n"
                                                for line in lines))
    if done:
        (path / "summary.json").write_text(json.dumps({"rounds": last, "rounds_planned": rounds or last}))
    return path


def _refused(capsys, args):
    """The one stderr line of a command that must fail with a user error."""
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trustfl: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def _both_refuse(capsys, run, tmp_path, *fragments):
    for args in (["report", str(run)], ["compare", str(run), "--out", str(tmp_path / "cmp")]):
        err = _refused(capsys, args)
        assert f"{run / 'metrics.jsonl'}" in err and all(f in err for f in fragments), err


def test_a_huge_integer_is_refused_naming_the_line_and_key(tmp_path, capsys):
    # report crashed in matplotlib and compare in its own float(value): OverflowError
    run = _run(tmp_path / "run", [{"round": 1, "accuracy": 0.5}, '{"round": 2, "accuracy": 1' + "0" * 400 + "}\n"])
    _both_refuse(capsys, run, tmp_path, "line 2", "`accuracy`", "401 digits")
    run = _run(tmp_path / "round", ['{"round": 1' + "0" * 400 + ', "accuracy": 0.5}\n'])
    _both_refuse(capsys, run, tmp_path, "line 1", "`round`")


@pytest.mark.parametrize("end", ["\n", ""])  # also as a last line without its newline (not a row cut short)
def test_a_row_nested_too_deeply_is_refused_naming_the_line(tmp_path, capsys, end):
    # RecursionError inside json
    deep = '{"round": 2, "x": ' + "[" * 100_000 + "]" * 100_000 + "}" + end
    run = _run(tmp_path / "run", [{"round": 1, "accuracy": 0.5}, deep])
    _both_refuse(capsys, run, tmp_path, "line 2", "nested too deeply")


@pytest.mark.parametrize("value, shown", [('"x"', "'x'"), ("true", "True"), ('{"a": 1}', "a JSON object"),
                                          ("[[0.5]]", "a JSON array"), ('["a"]', "a JSON array"),
                                          ('"nan"', "'nan'"), ('""', "''")])
def test_a_value_that_is_not_a_number_is_refused_naming_the_line_and_key(tmp_path, capsys, value, shown):
    # report printed it as it is; compare made it `nan ± –` and exited 0
    run = _run(tmp_path / "run", [{"round": 1, "accuracy": 0.5}, '{"round": 2, "accuracy": %s}\n' % value])
    _both_refuse(capsys, run, tmp_path, "line 2", f"`accuracy` is {shown}")


def test_what_trustfl_writes_for_nan_and_inf_is_read_back(tmp_path, capsys):
    """The writer spells NaN null and ±inf "inf"/"-inf" (JSON has neither); compare took "inf" for NaN."""
    run = _run(tmp_path / "run", [{"round": 2}])
    (run / "metrics.jsonl").unlink()
    for row in ({"round": 1, "train_loss": 2.0, "loss": 1.0, "accuracy": 0.5},
                {"round": 2, "train_loss": math.inf, "loss": math.inf, "accuracy": math.nan, "x": -math.inf}):
        append_metrics(run / "metrics.jsonl", row)
    assert '"loss": "inf"' in (run / "metrics.jsonl").read_text()
    rows = read_metrics(run)
    assert rows[1]["loss"] == math.inf and rows[1]["x"] == -math.inf and rows[1]["accuracy"] is None
    (row,) = compare_runs([run], write=False).rows
    assert row["final_loss_mean"] == math.inf and math.isnan(row["final_accuracy_mean"])
    assert main(["report", str(run)]) == 0
    last = capsys.readouterr().out.split("\n\n")[0].splitlines()[-1].split()  # the table's, above the summary
    assert last[:4] == ["2", "nan", "inf", "inf"]  # round, accuracy (NaN, not blank), loss, train_loss
    # a deployment's row lists the clients that dropped out
    (run / "metrics.jsonl").write_text('{"round": 1, "dropped": 2, "dropped_clients": [2, 5]}\n')
    assert read_metrics(run)[0]["dropped_clients"] == [2, 5]
    # JSON's NaN / Infinity, which Python's json writes, are numbers too
    (run / "metrics.jsonl").write_text('{"round": 1, "loss": NaN}\n{"round": 2, "loss": -Infinity}\n')
    assert [r["loss"] for r in read_metrics(run)][1] == -math.inf


def test_the_writer_refuses_what_the_readers_would(tmp_path):
    # a part of your own reporting a string was written, and the run's own metrics.jsonl was then unreadable
    path = tmp_path / "metrics.jsonl"
    for value, shown in (("ok", "'ok'"), (True, "True"), ([[1.0]], "a JSON array of 1 item(s)"),
                         (10**400, "an integer of 401 digits")):
        with pytest.raises(ConfigError, match=re.escape(f"metrics row of round 3: `clip/note` is {shown},")):
            append_metrics(path, {"round": 3, "clip/note": value})
    assert not path.exists()
    append_metrics(path, {"round": 3, "dropped_clients": [2], "loss": math.nan, "n": 4})  # what trustfl writes
    assert path.read_text() == '{"round": 3, "dropped_clients": [2], "loss": null, "n": 4}\n'


@pytest.mark.parametrize("rounds, fragment", [((1, 1), "repeats round 1 (lines 1 and 2)"),
                                              ((1, 2, 2), "repeats round 2 (lines 2 and 3)"),
                                              ((1, 3, 2), "goes back to round 2 on line 3, after round 3 on line 2")])
def test_a_round_twice_or_out_of_order_is_refused_naming_the_lines(tmp_path, capsys, rounds, fragment):
    # report printed both rows; compare silently took the last
    run = _run(tmp_path / "run", [{"round": r, "accuracy": 0.5 + i / 10} for i, r in enumerate(rounds)])
    _both_refuse(capsys, run, tmp_path, fragment)


def _two_runs(tmp_path):
    return [str(_run(tmp_path / f"r{seed}", [{"round": 1, "accuracy": 0.5 + seed / 10}], seed=seed, rule=rule))
            for seed, rule in ((0, "mean"), (1, "cwmed"))]


@pytest.mark.parametrize("key, fragment", [("aggregatr", "did you mean aggregator.name"),
                                           ("aggregator", "it is a table: name its keys, e.g. aggregator.name"),
                                           ("zzz", "keys are dotted")])
def test_an_ignore_key_that_matches_nothing_is_refused(tmp_path, capsys, key, fragment):
    # it silently changed nothing
    err = _refused(capsys, ["compare", *_two_runs(tmp_path), "--ignore", key, "--out", str(tmp_path / "cmp")])
    assert f"--ignore {key!r}" in err and fragment in err, err


def test_an_ignore_key_that_a_run_holds_merges_its_groups(tmp_path, capsys):
    runs = _two_runs(tmp_path)
    assert len(compare_runs(runs, write=False).rows) == 2
    assert main(["compare", *runs, "--ignore", "aggregator.name", "--no-plots", "--out", str(tmp_path / "c")]) == 0
    assert "| all runs | 2 |" in capsys.readouterr().out


def test_a_summary_with_a_huge_integer_is_no_crash(tmp_path, capsys):
    run = _run(tmp_path / "run", [{"round": 1, "accuracy": 0.5}])
    (run / "summary.json").write_text('{"rounds": 1, "best_accuracy": 1' + "0" * 400 + "}")
    (row,) = compare_runs([run], write=False).rows  # OverflowError: the summary's best is not a row's value
    assert row["best_accuracy_mean"] == 0.5


def test_deeply_nested_summary_and_manifest_are_one_line_errors(tmp_path, capsys):
    deep = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    run = _run(tmp_path / "run", [{"round": 1, "accuracy": 0.5}])
    (run / "summary.json").write_text(deep)
    for args in (["report", str(run)], ["compare", str(run), "--out", str(tmp_path / "cmp")]):
        err = _refused(capsys, args)
        assert "summary.json cannot be read as JSON (arrays or objects nested too deeply)" in err, err
    assert not run_finished(run)  # RecursionError: a sweep's check of its points
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / MANIFEST).write_text(deep)
    err = _refused(capsys, ["compare", str(sweep), "--out", str(tmp_path / "cmp")])
    assert f"{sweep / MANIFEST} is not a sweep manifest (arrays or objects nested too deeply)" in err, err


def test_resume_still_names_the_rounds_it_lacks_or_repeats(tmp_path):
    """The resumed run's check (truncate_metrics) reads rows in any order and says what is wrong as a whole."""
    run = _run(tmp_path / "run", [{"round": 1}, {"round": 1}, {"round": 3, "loss": "inf"}])
    with pytest.raises(UsageError, match=r"the 2 round\(s\) .*\(it lacks round\(s\) 2; it repeats round\(s\) 1\)"):
        truncate_metrics(run / "metrics.jsonl", 2)
    (run / "metrics.jsonl").write_text('{"round": 1, "loss": "inf"}\n{"round": 2, "x": 1}\n')
    truncate_metrics(run / "metrics.jsonl", 1)
    assert (run / "metrics.jsonl").read_text() == '{"round": 1, "loss": "inf"}\n'  # kept as the writer spells it


def _rows(rounds, accuracy=0.5):
    return [{"round": r, "accuracy": accuracy + r / 100, "sim_time": float(r)} for r in rounds]


def test_unfinished_runs_are_left_out_of_compare_and_listed(tmp_path, capsys):
    # round 2 of 4 was averaged with round 4 of 4 as a finished seed
    runs = [_run(tmp_path / "s0", _rows(range(1, 5)), seed=0),
            _run(tmp_path / "s1", _rows((1, 2)), seed=1, rounds=4, done=False),  # running, or killed
            _run(tmp_path / "s2", _rows((1, 2)), seed=2, rounds=4),  # stopped early (stop_after)
            _run(tmp_path / "s3", _rows(range(1, 5), 0.7), seed=3)]
    result = compare_runs(runs, write=False)
    (row,) = result.rows
    assert row["n"] == 2 and row["seeds"] == [0, 3] and row["final_accuracy_mean"] == pytest.approx(0.64)
    assert result.unfinished == [f"{runs[1]} (round 2 of 4, no summary.json)", f"{runs[2]} (round 2 of 4)"]
    assert main(["compare", *map(str, runs), "--out", str(tmp_path / "cmp"), "--no-plots"]) == 0
    assert f"left out (unfinished): {runs[1]} (round 2 of 4, no summary.json); {runs[2]}" in capsys.readouterr().out
    assert f"- left out, unfinished: {runs[2]} (round 2 of 4)" in (tmp_path / "cmp" / "compare.md").read_text()
    err = _refused(capsys, ["compare", str(runs[1]), str(runs[2]), "--out", str(tmp_path / "cmp")])
    assert f"nothing to compare: no run has finished ({runs[1]} (round 2 of 4" in err
    # a run that stopped at its engine.time_limit (the last row's sim_time) has finished
    timed = _run(tmp_path / "timed", _rows((1, 2)), seed=5, rounds=4)
    (timed / "config.toml").write_text((timed / "config.toml").read_text() + "[engine]\ntime_limit = 2.0\n")
    assert compare_runs([runs[0], timed], write=False, ignore=["engine.time_limit"]).rows[0]["n"] == 2


def test_a_group_repeating_a_seed_and_a_curve_cut_short_are_said(tmp_path, capsys):
    # copies of one run counted as independent seeds (n = 2, std 0); the plot silently drew shared rounds only
    first = _run(tmp_path / "a", _rows(range(1, 5)))
    copy = _run(tmp_path / "copy", _rows(range(1, 5)))
    evaluated_every_2 = [{k: v for k, v in row.items() if k != "accuracy" or row["round"] % 2 == 0}
                         for row in _rows(range(1, 5), 0.6)]  # a row per round, accuracy in rounds 2 and 4
    other = _run(tmp_path / "b", evaluated_every_2, seed=1, rounds=4)
    assert main(["compare", str(first), str(copy), "--out", str(tmp_path / "cmp"), "--no-plots"]) == 0
    err = capsys.readouterr().err
    assert f"warning: group 'all runs' holds seed 0 more than once ({first}, {copy}): copies of one run" in err
    assert "holds seed 0 more than once" in (tmp_path / "cmp" / "compare.md").read_text()
    result = compare_runs([first, other], out=tmp_path / "cmp2", metric="accuracy")
    assert not any("more than once" in n for n in result.notices)
    assert ("compare_accuracy_vs_round.png: group 'all runs' is drawn at the 2 round(s) where all its runs have "
            "accuracy and round (finite, within ±1e300); 2 other round(s) are left out.") in result.notices
    assert (tmp_path / "cmp2" / "compare_accuracy_vs_round.png").is_file()
    assert "2 other round(s) are left out" in (tmp_path / "cmp2" / "compare.md").read_text()


@pytest.mark.parametrize("points, found", [
    ("[1]", "found 1."), ('["a"]', 'found "a".'), ('[{"dir": "x\\u0000y"}]', 'found `dir` "x\\u0000y".'),
    ('[{"dir": ""}]', 'found `dir` "".'), ('[{"seed": 0}]', "found `dir` null."),
    ('[{"dir": "../elsewhere"}]', 'found `dir` "../elsewhere".'),
])
def test_a_manifest_with_a_malformed_point_is_refused_naming_it(tmp_path, capsys, points, found):
    # AttributeError ('int' object has no attribute 'get'), ValueError (embedded null byte), or the sweep directory
    # itself taken for a point
    sweep = tmp_path / "sweep"
    _run(sweep / "ok", [{"round": 1, "accuracy": 0.5}])
    (sweep / MANIFEST).write_text('{"points": [{"dir": "ok"}, %s]}' % points[1:-1])
    err = _refused(capsys, ["compare", str(sweep), "--out", str(tmp_path / "cmp")])
    assert err.endswith(f"{sweep / MANIFEST} is not a sweep manifest: `points[1]` must be an object whose `dir` names "
                        f"a directory inside {sweep}, {found}"), err


def test_report_plots_bits_of_rows_that_record_only_one_direction(tmp_path, capsys):
    # KeyError 'bits_down_total' in the plot of an asynchronous run
    rows = [{"round": r, "accuracy": 0.5, "sim_time": float(r), "bits_up_total": 100 * r} for r in (1, 2)]
    run = _run(tmp_path / "run", rows)
    assert main(["report", str(run)]) == 0
    assert (run / "accuracy_vs_bits.png").stat().st_size > 1000 and "notice" not in capsys.readouterr().out


def test_values_a_plot_cannot_draw_are_left_out_with_a_notice(tmp_path, capsys):
    # matplotlib's "arange: cannot compute length" failed report, compare and the run's own end
    rows = [{"round": 1, "accuracy": 0.5, "loss": 1.0}, {"round": 2, "accuracy": 0.6, "loss": 1.7e308},
            {"round": 3, "accuracy": 0.7, "loss": -1.7e308}, {"round": 4, "accuracy": None, "loss": 0.5}]
    run = _run(tmp_path / "run", rows)
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert ("notice: loss.png leaves out 2 value(s) it cannot draw (NaN, ±inf or beyond ±1e+300), in round(s) 2, 3."
            in out and "notice: accuracy.png leaves out 1 value(s)" in out)
    assert (run / "loss.png").stat().st_size > 1000
    result = compare_runs([run], out=tmp_path / "cmp", metric="loss")
    assert (tmp_path / "cmp" / "compare_loss_vs_round.png").is_file()
    assert any(n.startswith("compare_loss_vs_round.png: group 'all runs' is drawn at the 2 round(s)")
               for n in result.notices)


def test_a_metric_name_holding_a_nul_gets_a_file_name_it_can_have(tmp_path, capsys):
    # ValueError: embedded null byte, naming the png
    run = _run(tmp_path / "run", [{"round": 1, "acc\u0000uracy": 0.5}, {"round": 2, "acc\u0000uracy": 0.6}])
    (run / "summary.json").write_text(json.dumps({"rounds": 2, "rounds_planned": 2, "metrics": ["acc\u0000uracy"]}))
    assert main(["report", str(run)]) == 0
    assert (run / "acc_uracy.png").is_file()
    compare_runs([run], out=tmp_path / "cmp")
    assert (tmp_path / "cmp" / "compare_acc_uracy_vs_round.png").is_file()


@pytest.mark.parametrize("call, fragment", [
    (lambda run: compare_runs(str(run)), "`paths` must be a list of run or sweep directories, found the one path"),
    (lambda run: compare_runs(5), "`paths` must be a list of run or sweep directories (strings or os.PathLike)"),
    (lambda run: compare_runs([run, 3]), "`paths` must be a list"),
    (lambda run: compare_runs([run], out=3), "`out` must be a path"),
    (lambda run: compare_runs([run], out="x\x00y"), "--out 'x\\x00y' cannot be looked up: embedded null byte"),
    (lambda run: report_run(5), "report_run: `run_dir` must be a path (a string or os.PathLike), found 5."),
])
def test_api_arguments_of_the_wrong_kind_are_one_line_usage_errors(tmp_path, call, fragment):
    # a string was read a character at a time ("run directory 'b' does not exist"); bare ValueError / TypeError
    run = _run(tmp_path / "run", [{"round": 1, "accuracy": 0.5}])
    with pytest.raises(UsageError) as err:
        call(run)
    assert fragment in str(err.value) and "\n" not in str(err.value)
