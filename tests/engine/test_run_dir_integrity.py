"""A run directory read back is checked, never trusted: a damaged checkpoint, a checkpoint of a run on other data,
a metrics history with rows lost, damaged summaries and a second process writing the same directory are refused
with one line naming the file, instead of continuing a run that is no longer the one the directory records."""
import dataclasses
import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from trustfl.config.load import config_from_dict
from trustfl.core.runfiles import LOCK, hold_run_dir, read_metrics
from trustfl.data.datasets import load_dataset
from trustfl.engine.checkpoint import CHECKPOINT, data_digest, load_checkpoint, save_checkpoint
from trustfl.errors import CheckpointError, UsageError
from trustfl.experiment import run_experiment
from trustfl.report.compare import compare_runs
from trustfl.report.table import report_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cfg(rounds=4, **data):
    return config_from_dict({"name": "integrity", "seed": 3, "rounds": rounds,
                             "data": {"dataset": "digits", "num_clients": 3, **data},
                             "model": {"name": "mlp", "hidden": [8]},
                             "client": {"steps": 2, "batch_size": 16, "lr": 0.1},
                             "engine": {"checkpoint_every": 1, "eval_every": 2}})


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    return run_experiment(_cfg(), tmp_path_factory.mktemp("full") / "run", progress=False, plots=False)


@pytest.fixture
def half(tmp_path):
    """The same run interrupted after round 2 (checkpointed there)."""
    return run_experiment(_cfg(), tmp_path / "half", progress=False, plots=False, stop_after=2).run_dir


def _resume(run_dir):
    return run_experiment(None, resume=run_dir, progress=False, plots=False)


def _record_offset(path, name):
    """Where the bytes of zip record ``name`` start in ``path``."""
    raw = path.read_bytes()
    info = zipfile.ZipFile(io.BytesIO(raw)).getinfo(name)
    name_len, extra_len = np.frombuffer(raw[info.header_offset + 26:info.header_offset + 30], dtype="<u2")
    return info.header_offset + 30 + int(name_len) + int(extra_len)


# ---------------------------------------------------------------------------------------------------- checkpoint
def test_a_flipped_bit_in_the_checkpoints_tensors_is_refused(half, full):
    path = half / CHECKPOINT
    names = zipfile.ZipFile(path).namelist()
    tensor = max((n for n in names if "/data/" in n), key=lambda n: zipfile.ZipFile(path).getinfo(n).file_size)
    raw = bytearray(path.read_bytes())
    raw[_record_offset(path, tensor) + 17] ^= 0x04  # one bit of the largest tensor: torch.load alone takes it
    path.write_bytes(bytes(raw))
    assert isinstance(torch.load(path, weights_only=True), dict)
    with pytest.raises(CheckpointError, match=f"is damaged: its record '{tensor}' fails its CRC-32 check"):
        _resume(half)


@pytest.mark.parametrize("replace", ["directory", "dangling_link"])
def test_a_checkpoint_that_is_no_file_is_refused_not_taken_for_none(half, replace):
    """Taken for "no checkpoint": the run started again from round 1 and failed at its first save."""
    path = half / CHECKPOINT
    path.unlink()
    path.mkdir() if replace == "directory" else path.symlink_to(half / "nowhere")
    what = "is a directory, not a checkpoint file" if replace == "directory" else "is a link to nothing"
    with pytest.raises(CheckpointError, match=f"checkpoint.pt {what}: nothing to resume from; remove it"):
        _resume(half)
    assert [r["round"] for r in read_metrics(half)] == [1, 2]  # nothing rewritten


def test_a_checkpoint_cut_short_is_refused(half):
    path = half / CHECKPOINT
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(CheckpointError, match="cannot be read: it is not a whole checkpoint"):
        _resume(half)


def _extra_field(saved):
    saved["state"]["momentum"] = torch.zeros(1)


def _other_shape(saved):
    saved["state"]["params"] = saved["state"]["params"][:-1].clone()


@pytest.mark.parametrize("change, fragment", [
    (_extra_field, "its state has fields an engine state lacks ('momentum')"),  # TypeError in EngineState()
    (_other_shape, "its parameters are ("),  # RuntimeError: shape invalid, deep in the first round
    (lambda saved: saved.pop("state"), "it holds no engine state"),  # KeyError
    (lambda saved: saved["state"].pop("aggregator"), "its state lacks aggregator"),
    (lambda saved: saved["state"].update(round=-1), "its round is -1"),
    (lambda saved: saved["state"].update(params=[1.0]), "its parameters are a list"),
])
def test_a_checkpoint_of_this_config_with_wrong_contents_is_refused_in_one_line(half, change, fragment):
    saved = torch.load(half / CHECKPOINT, weights_only=True)
    change(saved)
    torch.save(saved, half / CHECKPOINT)
    with pytest.raises(CheckpointError) as err:
        _resume(half)
    message = str(err.value)
    assert message.startswith(f"{half / CHECKPOINT} is not a checkpoint of this run, or was written by another "
                              f"trustfl version: ") and fragment in message and "\n" not in message


def test_a_checkpoint_is_written_with_crcs_even_where_the_process_turned_them_off(tmp_path):
    state = run_experiment(_cfg(rounds=1), tmp_path / "one", progress=False, plots=False)
    loaded = load_checkpoint(state.run_dir, _hash(state.run_dir))
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        save_checkpoint(tmp_path, loaded, "h", None)
    finally:
        torch.serialization.set_crc32_options(before)
    assert torch.serialization.get_crc32_options() == before
    assert all(i.CRC for i in zipfile.ZipFile(tmp_path / CHECKPOINT).infolist() if i.file_size)
    assert torch.equal(load_checkpoint(tmp_path, "h").params, loaded.params)


def _hash(run_dir):
    return torch.load(run_dir / CHECKPOINT, weights_only=True)["config_hash"]


# ---------------------------------------------------------------------------------------------------------- data
def _write_csv(path, x, y):
    path.write_text("a,b,c,label\n" + "".join(",".join(map(repr, map(float, r))) + f",{t}\n" for r, t in zip(x, y)))


def test_resuming_on_an_edited_data_file_is_refused_and_on_the_same_data_equals_the_whole_run(tmp_path,
                                                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 3))
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    _write_csv(tmp_path / "rows.csv", x, y)
    cfg = config_from_dict({"name": "csv", "seed": 1, "rounds": 4,
                            "data": {"dataset": "csv", "path": "rows.csv", "num_clients": 2},
                            "model": {"name": "logreg"}, "client": {"steps": 2, "batch_size": 8, "lr": 0.1},
                            "engine": {"checkpoint_every": 1}})
    whole = run_experiment(cfg, "whole", progress=False, plots=False)
    half = run_experiment(cfg, "half", progress=False, plots=False, stop_after=2).run_dir
    edited = x.copy()
    edited[7, 2] += 0.5
    _write_csv(tmp_path / "rows.csv", edited, y)
    with pytest.raises(CheckpointError, match="was written by a run on other data than this configuration loads"):
        _resume(half)
    assert [r["round"] for r in read_metrics(half)] == [1, 2]  # refused before anything was written
    _write_csv(tmp_path / "rows.csv", x, y)
    resumed = _resume(half)
    assert torch.equal(resumed.params, whole.params)


def test_the_data_digest_sees_every_split_and_nothing_else():
    data = load_dataset("digits", None, seed=0)
    reference = data_digest(data)
    assert len(reference) == 64 and data_digest(load_dataset("digits", None, seed=0)) == reference
    for name in ("train_x", "train_y", "test_x", "test_y"):
        changed = dataclasses.replace(data, **{name: getattr(data, name).clone()})
        getattr(changed, name).view(-1)[-1] += 1
        assert data_digest(changed) != reference, name
    reshaped = dataclasses.replace(data, train_x=data.train_x.reshape(-1, 8, 8), test_x=data.test_x.reshape(-1, 8, 8),
                                   input_shape=(8, 8))
    assert data_digest(reshaped) != reference  # the same bytes in another shape are other data
    owners = dataclasses.replace(data, train_groups=torch.zeros(len(data.train_y), dtype=torch.int64))
    assert data_digest(owners) != reference
    assert data_digest(dataclasses.replace(data, source="elsewhere", metadata={"path": "x"})) == reference


def test_a_checkpoint_from_before_data_digests_still_resumes(half, full):
    saved = torch.load(half / CHECKPOINT, weights_only=True)
    del saved["data_digest"]
    torch.save(saved, half / CHECKPOINT)
    assert torch.equal(_resume(half).params, full.params)


def test_an_eval_initial_run_without_its_initial_evaluation_is_not_resumed(tmp_path):
    # the resumed summary silently lost initial_accuracy / initial_loss
    cfg = dataclasses.replace(_cfg(), engine=dataclasses.replace(_cfg().engine, eval_initial=True))
    run_dir = run_experiment(cfg, tmp_path / "run", progress=False, plots=False, stop_after=2).run_dir
    info = run_dir / "run_info.json"
    saved = json.loads(info.read_text())
    rows = (run_dir / "metrics.jsonl").read_text()
    info.unlink()
    with pytest.raises(UsageError, match="run_info.json is missing: the run evaluated its initial model"):
        _resume(run_dir)
    info.write_text(json.dumps({k: v for k, v in saved.items() if k != "initial_evaluation"}))
    with pytest.raises(UsageError, match="run_info.json holds no `initial_evaluation`"):
        _resume(run_dir)
    assert (run_dir / "metrics.jsonl").read_text() == rows
    info.write_text(json.dumps(saved))
    whole = run_experiment(cfg, tmp_path / "whole", progress=False, plots=False).summary
    resumed = _resume(run_dir).summary
    assert resumed["initial_accuracy"] == whole["initial_accuracy"] and resumed["initial_loss"] == whole[
        "initial_loss"]


# ------------------------------------------------------------------------------------------------------- metrics
@pytest.mark.parametrize("keep, fragment", [
    ([], "it lacks round\\(s\\) 1-2"),
    ([0], "it lacks round\\(s\\) 2"),
    ([0, 1, 1], "it repeats round\\(s\\) 2"),
    ([1, 0], "holds its rows out of round order"),
])
def test_a_metrics_history_with_rows_lost_or_pasted_in_is_refused(half, keep, fragment):
    path = half / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[i] for i in keep))
    with pytest.raises(UsageError, match=f"does not hold one row for each of the 2 round\\(s\\).*{fragment}"):
        _resume(half)


def test_a_row_cut_short_by_a_crash_is_left_out_and_the_resumed_run_equals_the_whole_run(half, full):
    path = half / "metrics.jsonl"
    path.write_text(path.read_text() + '{"round": 3, "accur')  # round 3 was being written when the process died
    assert [r["round"] for r in read_metrics(half)] == [1, 2]
    resumed = _resume(half)
    drop = ("wall_time_s",)
    assert [{k: v for k, v in r.items() if k not in drop} for r in resumed.rows] == \
        [{k: v for k, v in r.items() if k not in drop} for r in full.rows]
    assert torch.equal(resumed.params, full.params)


def test_a_cut_line_before_the_last_is_still_an_error(half):
    path = half / "metrics.jsonl"
    first, second = path.read_text().splitlines()
    path.write_text(first[:10] + "\n" + second + "\n")
    with pytest.raises(UsageError, match="is not a trustfl metrics file \\(line 1"):
        read_metrics(half)


# ------------------------------------------------------------------------------------------------------- summary
@pytest.mark.parametrize("text, fragment", [
    ("{half", "cannot be read as JSON"),
    ("[1, 2]", "must hold a JSON object, found list"),
    ('{"metrics": 5}', "`metrics` must be a list of names, found 5"),
    ('{"metrics": ["accuracy", 3]}', "`metrics` must be a list of names"),
    ('{"rounds": "4"}', "`rounds` must be int, found '4'"),
    ('{"rounds": true}', "`rounds` must be int, found True"),
])
def test_report_and_compare_refuse_a_damaged_summary_by_name(tmp_path, full, text, fragment):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(full.run_dir, run)
    (run / "summary.json").write_text(text)
    for read in (report_run, lambda d: compare_runs([d], out=tmp_path / "cmp", plots=False)):
        with pytest.raises(UsageError, match=f"summary.json.*{fragment}"):
            read(run)


def test_the_cli_names_a_damaged_summary_in_one_line(tmp_path, full):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(full.run_dir, run)
    (run / "summary.json").write_text("[]")
    done = subprocess.run([sys.executable, "-m", "trustfl", "report", str(run)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [f"trustfl: error: {run / 'summary.json'} must hold a JSON object, "
                                                f"found list."]


def test_summaries_are_written_whole(full):
    assert json.loads((full.run_dir / "summary.json").read_text())["rounds"] == 4
    assert not list(full.run_dir.glob("*.tmp"))


# ---------------------------------------------------------------------------------------------------------- lock
def test_a_second_writer_of_a_run_directory_is_refused_and_the_run_left_whole(half, full):
    before = (half / CHECKPOINT).read_bytes(), (half / "metrics.jsonl").read_text()
    with hold_run_dir(half):
        assert (half / LOCK).read_text().strip().isdigit()
        with pytest.raises(UsageError, match=f"{half} is in use: another trustfl process \\(pid \\d+\\)"):
            _resume(half)
        cli = [sys.executable, "-m", "trustfl", "run", "--quiet"]
        for args in (["--resume", str(half)], ["--out", str(half), "--overwrite", str(half / "config.toml")]):
            done = subprocess.run(cli + args, capture_output=True, text=True)
            assert done.returncode == 2 and "is in use: another trustfl process" in done.stderr, args
            assert len(done.stderr.strip().splitlines()) == 1
        assert ((half / CHECKPOINT).read_bytes(), (half / "metrics.jsonl").read_text()) == before
    assert torch.equal(_resume(half).params, full.params)  # the lock goes with its holder


# -------------------------------------------------------------------------------------------------------- writes
@pytest.mark.parametrize("blocked", ["checkpoint.pt.tmp", "model.pt.tmp", "summary.json.tmp", "accuracy.png", LOCK])
def test_a_run_directory_that_cannot_be_written_is_named_in_one_error(tmp_path, blocked):
    (tmp_path / "run" / blocked).mkdir(parents=True)  # a folder where the run writes a file (root ignores modes)
    with pytest.raises(UsageError, match=f"cannot write or read {tmp_path / 'run' / blocked}: Is a directory"):
        run_experiment(_cfg(rounds=1), tmp_path / "run", progress=False)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full to simulate a full disk")
def test_a_full_disk_is_a_one_line_error(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").symlink_to("/dev/full")
    with pytest.raises(UsageError, match="cannot write or read in .*: No space left on device"):
        run_experiment(_cfg(rounds=1), tmp_path / "run", progress=False, plots=False)


def test_report_compare_and_sweep_name_what_they_cannot_write(tmp_path, full):
    import shutil

    from trustfl.report.sweep import run_sweep

    run = tmp_path / "run"
    shutil.copytree(full.run_dir, run)
    (run / "accuracy.png").unlink(missing_ok=True)
    (run / "accuracy.png").mkdir()
    with pytest.raises(UsageError, match="cannot write or read .*accuracy.png: Is a directory"):
        report_run(run)
    (tmp_path / "cmp" / "compare.md").mkdir(parents=True)
    with pytest.raises(UsageError, match="cannot write or read .*compare.md: Is a directory"):
        compare_runs([full.run_dir], out=tmp_path / "cmp", plots=False)
    (tmp_path / "sweep" / "sweep.json.tmp").mkdir(parents=True)
    config = tmp_path / "base.toml"
    config.write_text((full.run_dir / "config.toml").read_text())
    with pytest.raises(UsageError, match="cannot write or read .*sweep.json.tmp: Is a directory"):
        run_sweep(str(config), [], "0", out=tmp_path / "sweep", log=None)


def test_errors_about_other_files_pass_through(tmp_path):
    from trustfl.core.runfiles import writing

    with pytest.raises(FileNotFoundError):
        with writing(tmp_path / "run"):
            (tmp_path / "elsewhere" / "data.csv").read_text()
    with pytest.raises(ConnectionError):  # no file named: only the errors of writing files are the run's
        with writing(tmp_path / "run"):
            raise ConnectionError("peer went away")


def test_a_second_sweep_into_a_running_sweeps_directory_is_refused(tmp_path, full):
    from trustfl.report.sweep import run_sweep

    config = tmp_path / "base.toml"
    config.write_text((full.run_dir / "config.toml").read_text())
    (tmp_path / "sweep").mkdir()
    with hold_run_dir(tmp_path / "sweep"):  # as the first sweep holds it while its points run
        with pytest.raises(UsageError, match="sweep is in use: another trustfl process"):
            run_sweep(str(config), [], "0", out=tmp_path / "sweep", log=None)
        assert not (tmp_path / "sweep" / "sweep.json").exists()
    assert run_sweep(str(config), [], "0", out=tmp_path / "sweep", log=None).ok


# ------------------------------------------------------------------------------------------- config and run_info
def test_a_resume_under_an_edited_config_is_refused_naming_the_key(half):
    # it said only "belongs to another configuration", leaving the user to hunt for the edit
    path = half / "config.toml"
    path.write_text(path.read_text().replace("lr = 0.1", "lr = 0.2"))
    with pytest.raises(CheckpointError) as err:
        _resume(half)
    message = str(err.value)
    assert str(half / CHECKPOINT) in message and "`client.lr`" in message and "\n" not in message


@pytest.mark.parametrize("damage", ["{garbage", "[1, 2]", "{\"evaluators\": 3}", None])
def test_a_damaged_or_missing_run_info_is_refused_naming_the_file(half, damage):
    # the run went on and left a run_info.json that `trustfl report` refuses, unlike the uninterrupted run's
    info = half / "run_info.json"
    info.unlink() if damage is None else info.write_text(damage)
    with pytest.raises(UsageError) as err:
        _resume(half)
    assert str(info) in str(err.value) and "\n" not in str(err.value)


def test_a_checkpoint_of_pickled_objects_is_refused_in_one_line_without_torchs_advice(half):
    # the message was torch's own, over several lines with terminal escapes, advising to load with weights_only=False
    torch.save(torch.nn.Linear(2, 2), half / CHECKPOINT)
    with pytest.raises(CheckpointError) as err:
        _resume(half)
    message = str(err.value)
    assert message.startswith(f"{half / CHECKPOINT} ") and "objects other than tensors" in message
    assert "\n" not in message and "\x1b" not in message and "weights_only" not in message
