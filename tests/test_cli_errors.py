"""One error hierarchy at the command line: a TrustFLError is one line on stderr and exit code 2; Ctrl-C is one
line and 130 (SIGTERM: 143); anything else is a bug and keeps its traceback (issue #16)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import trustfl.cli as cli
from trustfl.cli import main
from trustfl.errors import ConfigError

SMALL = 'name = "cli"\nrounds = 1\n[data]\nnum_clients = 4\n[model]\nname = "logreg"\n'


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trustfl"), err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(SMALL)
    return path


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("content, fragment", [
    (b'name = "caf\xe9"\n', "not UTF-8"),
    (b"\x00\x01\x02binary", "binary"),
    (b"rounds = 1\nrounds = 2\n", "defined twice"),
    (b"rounds = [\n", "not valid TOML"),
])
def test_unreadable_config_is_one_line(tmp_path, capsys, command, content, fragment):
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    assert main([command, str(path)]) == 2
    line = _one_line(capsys)
    assert line.startswith("trustfl: error: ") and fragment in line and str(path) in line


@pytest.mark.parametrize("command", ["validate", "run"])
def test_directory_and_missing_config(tmp_path, capsys, command):
    assert main([command, str(tmp_path)]) == 2
    assert "is a directory" in _one_line(capsys)
    assert main([command, str(tmp_path / "nope.toml")]) == 2
    assert "does not exist" in _one_line(capsys)


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("override, fragment", [
    ("client.lr", "KEY=VALUE"),
    ("model.hidden=[8,", "model.hidden"),
    ("client.lr=nan", "`client.lr`"),
    ("client.dp.clip=inf", "`client.dp.clip`"),
    ("recipe.mu=0.1", "`recipe.mu`"),
    ("zz.top=1", "`zz`"),
])
def test_bad_override_is_one_line(small, tmp_path, capsys, command, override, fragment):
    extra = ["--quiet", "--out", str(tmp_path / "run")] if command == "run" else []
    assert main([command, str(small), "--set", override, *extra]) == 2
    assert fragment in _one_line(capsys)


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("hidden", ["10", "[true]"])
def test_mlp_hidden_of_the_wrong_type_is_one_line_naming_the_key(small, tmp_path, capsys, command, hidden):
    """It said "`model` ('mlp'): 'int' object is not iterable" or quoted torch's ``empty()`` argument error."""
    extra = ["--quiet", "--out", str(tmp_path / "run")] if command == "run" else []
    assert main([command, str(small), "--set", "model.name=mlp", "--set", f"model.hidden={hidden}", *extra]) == 2
    assert "`model.hidden` must be a non-empty list of positive integers" in _one_line(capsys)


def test_recipe_key_names_the_algorithm(small, capsys):
    assert main(["validate", str(small), "--set", "recipe.mu=0.1"]) == 2
    line = _one_line(capsys)
    assert "`recipe.mu`" in line and "'fedavg'" in line


def test_argparse_errors_are_one_line(capsys):
    for argv in (["validate"], ["nonsense"], ["run", "--bogus"], []):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        assert "error:" in _one_line(capsys)


def test_run_dir_problems(small, tmp_path, capsys):
    assert main(["run", str(small), "--quiet", "--out", str(small)]) == 2
    assert "is a file" in _one_line(capsys)
    assert main(["run", "--resume", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in _one_line(capsys)
    assert main(["run", "--resume", str(small)]) == 2  # it said "does not exist"
    assert f"--resume: run directory {str(small)!r} is a file, not a directory." in _one_line(capsys)
    assert main(["run", str(small), "--resume", str(tmp_path)]) == 2
    assert "--resume" in _one_line(capsys)
    # --import was ignored (rc 0), even a file that does not exist: the run's plugins are in its config.toml
    assert main(["run", "--resume", str(tmp_path), "--import", str(tmp_path / "nowhere.py")]) == 2
    assert "--resume takes its config (and the plugins it imports) from RUN_DIR/config.toml" in _one_line(capsys)
    assert main(["run"]) == 2
    assert "needs a CONFIG" in _one_line(capsys)


def test_out_holding_a_run_is_kept_unless_overwrite(small, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(small), "--quiet", "--out", str(out), "--set", "engine.checkpoint_every=1"]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert {"config.toml", "metrics.jsonl", "checkpoint.pt", "summary.json"} <= set(before)
    assert main(["run", str(small), "--quiet", "--out", str(out), "--set", "rounds=2"]) == 2
    line = _one_line(capsys)
    assert "already holds a run (config.toml, metrics.jsonl, checkpoint.pt, summary.json)" in line
    assert f"--resume {out}" in line and "--overwrite" in line
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # nothing written
    assert main(["run", str(out), "--resume", str(out), "--overwrite"]) == 2 and "--overwrite" in _one_line(capsys)
    # --overwrite starts afresh: the new run's rows, and no checkpoint of the replaced run left to resume
    assert main(["run", str(small), "--quiet", "--out", str(out), "--set", "rounds=2", "--set",
                 "engine.checkpoint_every=0", "--overwrite"]) == 0
    rows = (out / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2 and not (out / "checkpoint.pt").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["run", str(small), "--quiet", "--out", str(empty)]) == 0  # an empty directory is no run


def test_overwrite_removes_every_file_the_old_run_wrote_and_no_other(small, tmp_path, capsys):
    # only checkpoint.pt went: a regression run's mse.png and its tensorboard/ stayed beside the new run's files
    out = tmp_path / "run"
    assert main(["run", str(small), "--quiet", "--out", str(out), "--set", "engine.checkpoint_every=1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (out / "summary.json").write_text(json.dumps({**summary, "metrics": ["mse", "probe/r2"]}))  # the old run's
    old = ["mse.png", "mse_vs_sim_time.png", "probe_r2_vs_bits.png", "error.log", "checkpoint.pt.tmp",
           "deployment.jsonl"]
    for name in old + ["notes.txt", "figure.png"]:
        (out / name).write_text("x")
    (out / "tensorboard" / "sub").mkdir(parents=True)
    (out / "tensorboard" / "sub" / "events.out").write_text("x")
    assert main(["run", str(small), "--quiet", "--out", str(out), "--set", "rounds=2", "--overwrite"]) == 0
    left = sorted(p.name for p in out.iterdir())
    assert not set(old) & set(left) and "tensorboard" not in left
    assert {"notes.txt", "figure.png", "accuracy.png", "loss.png", "model.pt", "summary.json"} <= set(left)
    assert json.loads((out / "summary.json").read_text())["rounds"] == 2


def test_multi_line_message_is_printed_on_one_line(monkeypatch, capsys):
    def fail(args):
        raise ConfigError("first line\n  second line")

    monkeypatch.setattr(cli, "_cmd_list", fail)
    assert main(["list"]) == 2
    assert _one_line(capsys) == "trustfl: error: first line second line"


def test_keyboard_interrupt_exits_130(monkeypatch, capsys, tmp_path):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_cmd_run", interrupted)
    monkeypatch.setattr(cli, "_cmd_list", interrupted)
    assert main(["run", "x.toml"]) == 130
    line = _one_line(capsys)
    assert "interrupted" in line and "--resume RUN_DIR" in line
    assert main(["run", "x.toml", "--out", "runs/mine"]) == 130  # not written yet: --resume would be refused
    assert _one_line(capsys) == ("trustfl: interrupted before the run wrote its config.toml (run the same command "
                                 "again to start it)")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.toml").write_text('name = "x"\n')
    assert main(["run", "x.toml", "--out", str(tmp_path / "mine")]) == 130
    assert f"--resume {tmp_path / 'mine'}`" in _one_line(capsys)
    assert main(["list"]) == 130
    line = _one_line(capsys)
    assert line == "trustfl: interrupted"


def test_sigterm_stops_a_run_as_ctrl_c_does_with_exit_143_and_the_resume_hint(tmp_path):
    """A scheduler's SIGTERM: the run unwinds (its lock is released), says how to resume in one line, exits 143,
    and the run resumes to its end with one row per round (resume's bitwise equality is tested elsewhere)."""
    import signal
    import subprocess
    import sys

    from trustfl.experiment import run_experiment

    config = tmp_path / "run.toml"
    config.write_text('name = "term"\nseed = 4\nrounds = 300\n[data]\ndataset = "digits"\nnum_clients = 4\n'
                      '[model]\nname = "logreg"\n[client]\nsteps = 1\nbatch_size = 8\n'
                      '[engine]\ncheckpoint_every = 1\neval_every = 100\n')
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "trustfl", "run", str(config), "--out", str(run), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not ((run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").read_text().count("\n") >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert err.strip().splitlines() == [f"trustfl: terminated (resume with `trustfl run --resume {run}`)"]
    resumed = run_experiment(None, resume=run, progress=False, plots=False)
    assert [r["round"] for r in resumed.rows] == list(range(1, 301))


def test_keyboard_interrupt_in_privacy_command(monkeypatch, capsys):
    import trustfl.cli_privacy as cli_privacy

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_privacy, "run", interrupted)
    assert main(["privacy", "epsilon", "--noise-multiplier", "1", "--sample-rate", "1", "--steps", "1",
                 "--delta", "1e-5"]) == 130
    assert "interrupted" in _one_line(capsys)


def test_a_bug_keeps_its_traceback(monkeypatch):
    def bug(args):
        raise RuntimeError("a bug, not a user error")

    monkeypatch.setattr(cli, "_cmd_list", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["list"])


@pytest.mark.parametrize("setting, fragment", [
    ("client.epochs=1000000000", "`client.epochs` = 1000000000 gives a client"),
    ("client.steps=1000001", "`client.steps` = 1000001 gives a client 1,000,001 local steps per round"),
])
def test_a_local_schedule_too_long_to_draw_is_refused_before_training(small, tmp_path, capsys, setting, fragment):
    """client.epochs = 10^9 asked torch for hundreds of GB for the round's batch schedule and crashed with a
    traceback; it is one line naming the key, at validation and before any round."""
    for command in (["validate", str(small)], ["run", str(small), "--out", str(tmp_path / "run"), "--quiet"]):
        assert main([*command, "--set", setting]) == 2
        line = _one_line(capsys)
        assert fragment in line and "at most 1,000,000" in line
    assert main(["validate", str(small), "--set", "client.steps=1000000"]) == 0  # the limit itself is allowed


def test_an_allocation_that_fails_inside_a_round_is_one_line_saying_how_much(small, tmp_path, capsys, monkeypatch):
    """torch's allocator failing in a round (recipe.views = 10^9 asked for 1 TB) was a traceback; it is one line
    (ResourceError) naming the round, the amount and the settings that size a round. Other RuntimeErrors stay bugs."""
    from trustfl.config.load import load_config
    from trustfl.engine.sync import SyncEngine
    from trustfl.errors import ResourceError
    from trustfl.experiment import run_experiment

    def fails(self, fed, state):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 1024000000000 bytes. Error code 12")
    monkeypatch.setattr(SyncEngine, "run_round", fails)
    assert main(["run", str(small), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    line = _one_line(capsys)
    assert "round 1 needs more memory than this machine has (1,024.0 GB asked for)" in line and "cohort.size" in line

    monkeypatch.setattr(SyncEngine, "run_round", lambda self, fed, state: (_ for _ in ()).throw(MemoryError()))
    with pytest.raises(ResourceError, match="round 1 needs more memory"):
        run_experiment(load_config(small), tmp_path / "run2", progress=False, plots=False)

    monkeypatch.setattr(SyncEngine, "run_round", lambda self, fed, state: (_ for _ in ()).throw(
        RuntimeError("mat1 and mat2 shapes cannot be multiplied")))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as caught:
        run_experiment(load_config(small), tmp_path / "run3", progress=False, plots=False)
    assert not isinstance(caught.value, ResourceError)


def test_a_model_larger_than_the_machine_is_a_resource_error_naming_its_keys(capsys, monkeypatch):
    """A model whose weights cannot be allocated (an MLP layer of 2·10^9 units asks for 512 GB; the allocator's
    failure is stood in for, so no machine tries) is a ResourceError like every failed allocation, not a config
    mistake; another error of torch's while building stays a ConfigError naming `model`."""
    import trustfl.config.model as model_module

    def fails(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 512000000000 bytes. Error code 12")
    monkeypatch.setattr(model_module, "build_model", fails)
    config = "configs/quickstart.toml"
    assert main(["validate", config, "--set", "model.hidden=[2000000000]"]) == 2
    line = _one_line(capsys)
    assert "the model 'mlp' needs more memory than this machine has (512.0 GB asked for)" in line
    assert "`[model]`" in line
    monkeypatch.setattr(model_module, "build_model", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("bad")))
    assert main(["validate", config]) == 2
    assert "`model` ('mlp') cannot be built: bad" in _one_line(capsys)


def test_a_model_larger_than_the_free_memory_is_refused_before_it_is_allocated(capsys, monkeypatch):
    """The model's size is known from its meta-device skeleton: one larger than the free memory is refused before
    any weight is allocated, so the outcome does not hang on whether the machine overcommits memory (a machine
    that does would hand out the pages and stall or kill the run when the weights are first drawn). The free
    memory is stood in for (10 MB) against an MLP on digits of 64·50000 + 50000 + 50000·10 + 10 float32 weights
    (15.0 MB)."""
    import trustfl.core.memory as memory

    config = "configs/quickstart.toml"
    assert main(["validate", config, "--set", "model.hidden=[50000]"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(memory, "free_memory", lambda device: 10_000_000)
    assert main(["validate", config, "--set", "model.hidden=[50000]"]) == 2
    line = _one_line(capsys)
    assert "the model 'mlp' needs more memory than this machine has (15.0 MB asked for)" in line
    assert "`[model]`" in line
    from trustfl.models.zoo import build_model  # the model alone: the cohort's messages (60 MB) would not fit
    assert build_model("mlp", (64,), 10, 0, hidden=[20000]).get_parameter("net.0.weight").shape == (20000, 64)  # 6.0 MB


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
@pytest.mark.parametrize("args, fragment", [
    (["validate", "/dev/zero"], "Config file '/dev/zero' is larger than 16 MiB"),
    (["validate", "configs/quickstart.toml", "--set", 'data.dataset="csv"', "--set", 'data.path="/dev/zero"'],
     "CSV file '/dev/zero' is a device, not a file"),
    (["validate", "configs/quickstart.toml", "--set", 'data.dataset="npz"', "--set", 'data.path="/dev/zero"'],
     "npz file '/dev/zero' is a device, not a file"),
    (["validate", "configs/quafl/quafl.toml", "--set", 'data.dataset="digits"', "--set",
      'engine.speed={name="trace", path="/dev/zero"}'],
     "'/dev/zero' is a device, not a CSV file"),
])
def test_an_endless_device_as_a_file_is_one_line_not_a_read_without_end(args, fragment):
    """/dev/zero as the config, a data file or a speed trace was read until memory ran out. Run in a child
    process whose data memory is capped, so that a regression fails here instead of exhausting the machine. The
    cap is on the heap and anonymous mappings (RLIMIT_DATA), not the address space: a CUDA build of torch maps
    about 3 GB of libraries at import, which an address-space cap of this size refused."""
    import resource
    import subprocess
    import sys

    from tests.child_run import ROOT, child_env

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (3 * 2 ** 30, 3 * 2 ** 30))
    proc = subprocess.run([sys.executable, "-m", "trustfl", *args], cwd=ROOT, env=child_env(OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=120, preexec_fn=cap)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and fragment in lines[0], proc.stderr[-500:]


def test_a_views_shift_of_an_image_s_side_or_on_non_images_is_refused_at_validation(tmp_path, capsys):
    config = "configs/fedsc/digits_canvas_1class.toml"
    assert main(["validate", config, "--set", 'recipe.augment={shift_mode="keep", shift=10}']) == 2
    assert "`client.augment.shift` (`recipe.augment.shift` in the self-supervised recipes) = 10 moves an image by " \
           "its side (10 pixels) or more; at most 9" in _one_line(capsys)
    assert main(["validate", config, "--set", 'recipe.augment={shift_mode="keep", shift=9}']) == 0
    capsys.readouterr()
    assert main(["validate", config, "--set", 'data.dataset="breast_cancer"', "--set",
                 "data.partition={name=\"iid\"}"]) == 2
    assert "augmentation 'views' needs image examples (C, H, W)" in _one_line(capsys)


def test_a_representation_evaluator_on_a_model_without_named_outputs_is_refused_at_validation(capsys):
    """knn / linear_probe read the model's "projector" or "backbone" output: on a plain MLP this was a TypeError
    traceback at the first evaluation; it is one line naming the evaluator's key, and output = "model" runs."""
    for evaluator, index in (('{name="knn", k=5}', 1), ('{name="linear_probe", output="backbone"}', 1)):
        assert main(["validate", "configs/quickstart.toml", "--set",
                     f'evaluators=[{{name="accuracy"}},{evaluator}]']) == 2
        assert f"`evaluators[{index}].output` = " in _one_line(capsys)
    assert main(["validate", "configs/quickstart.toml", "--set",
                 'evaluators=[{name="accuracy"},{name="knn", k=5, output="model"}]']) == 0


def test_a_data_set_too_large_to_load_is_one_line_naming_its_settings(small, tmp_path, capsys, monkeypatch):
    """data.num_clients = 10^12 (synthetic) asked NumPy for 7.28 TiB while the data set was built: a traceback; now
    one ResourceError line naming the data set and `data.num_clients`."""
    import numpy as np

    import trustfl.config.build as build

    def huge(name, *args, **kwargs):
        np.empty(10 ** 15)  # fails at once: more than any machine's address space allows

    monkeypatch.setattr(build, "load_dataset", huge)
    assert main(["validate", str(small)]) == 2
    line = _one_line(capsys)
    assert "loading data set 'digits' needs more memory than this machine has" in line
    assert "asked for" in line and "`data.num_clients`" in line


def test_a_population_larger_than_the_free_memory_is_refused_before_it_is_drawn(capsys, monkeypatch):
    """data.num_clients = 2·10⁹ (synthetic): each of the population's arrays (16 GB) fitted the machine on its own,
    so no allocation failed, and the kernel killed the process after two minutes; data.options.dim = 10⁸ held
    9.6 GB for 51 s before an allocation failed. The population's size, then its largest client's generation and
    its test set, are now checked against the free memory first (stood in for here: 2 MB, against 20,000 clients
    of 128 bytes)."""
    import trustfl.core.memory as memory

    config = "configs/scale/synthetic_million.toml"
    assert main(["validate", config, "--set", "data.options.dim=100000000"]) == 2
    line = _one_line(capsys)  # mostly the 1,000 test clients' shares of 10⁸ features
    assert "loading data set 'synthetic' needs more memory than this machine has (38,072.8 GB asked for)" in line
    monkeypatch.setattr(memory, "free_memory", lambda device: 2_000_000)
    few_tests = ["--set", "data.options.test_clients=10"]
    assert main(["validate", config, "--set", "data.num_clients=20000", *few_tests]) == 2
    line = _one_line(capsys)
    assert "loading data set 'synthetic' needs more memory than this machine has (2.6 MB asked for)" in line
    assert "`data.num_clients`" in line
    assert main(["validate", config, "--set", "data.num_clients=10000", *few_tests]) == 0  # 1.3 MB, then 0.8 MB
    assert main(["validate", config, "--set", "data.num_clients=10000"]) == 2  # 1,000 clients' test shares


@pytest.mark.parametrize("setting, fragment", [
    ('aggregator={name="cwtm", f=5}', "CoordinateWiseTrimmedMean needs at least 11 messages, found 10"),
    ('aggregator={name="krum", f=4}', "Krum needs at least 11 messages, found 10"),
    ('pre_aggregators=[{name="nnm", f=10}]', "NNM needs at least 11 messages, found 10"),
])
def test_a_rule_that_needs_more_messages_than_a_round_brings_is_refused_at_validation(capsys, setting, fragment):
    """cwtm with f = 100 on a cohort of 10 validated and then stopped in round 1; validation now names the rule,
    what it needs and what the cohort brings (a rule that fits exactly still validates)."""
    assert main(["validate", "configs/quickstart.toml", "--set", setting]) == 2
    line = _one_line(capsys)
    assert fragment in line and "(a round brings at most 10 messages: `cohort.size`)" in line
    assert main(["validate", "configs/quickstart.toml", "--set", 'aggregator={name="krum", f=4}', "--set",
                 'pre_aggregators=[{name="bucketing", bucket_size=2}]']) == 2
    assert "Krum needs at least 11 rows, and the pre-aggregators turn 10 messages into 5" in _one_line(capsys)
    for fits in (['aggregator={name="cwtm", f=4}'], ['aggregator={name="krum", f=3}'],
                 ['aggregator={name="cwtm", f=9}', 'cohort={sampler="all"}']):  # all 20 clients: 19 needed
        assert main(["validate", "configs/quickstart.toml", *[a for f in fits for a in ("--set", f)]]) == 0


@pytest.mark.parametrize("config", ["configs/quafl/quafl.toml", "configs/quafl/fedbuff.toml",
                                    "configs/quafl/fedavg.toml"])
def test_the_async_engine_also_refuses_a_rule_its_server_steps_cannot_feed(capsys, config):
    """Validated, then every server step was skipped (the model never moved) with a warning at the end only."""
    assert main(["validate", config, "--set", 'aggregator={name="cwtm", f=1}', "--set", "cohort.size=2"]) == 2
    line = _one_line(capsys)
    assert "needs at least 3 messages, found 2" in line and "(a round brings at most 2 messages: `cohort.size`)" in line


def test_fedsc_sizes_its_features_and_matrices_before_it_makes_them(capsys, monkeypatch, tmp_path):
    """model.dim = 2·10⁶ (FedSC): the initial evaluation's features of the training set (20 GB) were computed, and
    the kernel killed the run; the round's H×H matrices (800 GB at 2·10⁵) came from an allocation that failed only
    after 16 GB. Both are now sized from one example's representation first. Here H = 2,000 and the free memory is
    stood in for: 20 MB against 20.1 MB of training features, then 100 MB against 371 MB of the first share's
    matrices (every client's, four copies) and representations."""
    import trustfl.core.memory as memory

    args = ["run", "configs/fedsc/digits_canvas_2class.toml", "--set", "rounds=1", "--set", "model.dim=2000"]
    monkeypatch.setattr(memory, "free_memory", lambda device: 20_000_000)
    assert main([*args, "--out", str(tmp_path / "a")]) == 2
    assert "the evaluation of the initial model needs more memory than this machine has (20.1 MB asked for)" in \
        _one_line(capsys)
    monkeypatch.setattr(memory, "free_memory", lambda device: 100_000_000)
    assert main([*args, "--out", str(tmp_path / "b")]) == 2
    line = _one_line(capsys)
    assert "round 1 needs more memory than this machine has (370.8 MB asked for)" in line and "the model" in line


LONG = "a" * 300  # one path component longer than any file system's 255: stat() raises ENAMETOOLONG


@pytest.mark.parametrize("args, fragment", [
    (["validate", f"{LONG}.toml"], "Config file 'aaa"),
    (["run", "{small}", "--out", f"{{tmp}}/{LONG}"], "--out '"),
    (["run", "--resume", f"{{tmp}}/{LONG}"], "--resume: run directory '"),
    (["report", f"{{tmp}}/{LONG}"], "run directory '"),
    (["compare", f"{{tmp}}/{LONG}"], "run directory '"),
    (["validate", "{small}", "--set", 'data.dataset="csv"', "--set", f'data.path="{LONG}.csv"'],
     "`data.path` (data set 'csv') '"),
    (["validate", "{small}", "--set", f'model.init_from="{LONG}.pt"'], "`model.init_from` '"),
    (["validate", "a\0b.toml"], "Config file 'a\\x00b.toml' cannot be looked up: embedded null byte."),
], ids=["config", "out", "resume", "report", "compare", "data.path", "init_from", "nul"])
def test_a_path_the_file_system_cannot_look_up_is_one_line_naming_it(small, tmp_path, capsys, args, fragment):
    """A name longer than the file system takes made every command's first exists()/is_dir() raise OSError
    (ENAMETOOLONG) with a traceback; each path a user names is now looked up first (``trustfl.core.paths``)."""
    argv = [a.format(small=small, tmp=tmp_path) for a in args]
    assert main(argv) == 2
    line = _one_line(capsys)
    assert fragment in line and line.endswith(("cannot be looked up: File name too long.", "null byte.")), line


@pytest.mark.parametrize("args, fragment", [
    (["configs/quafl/quafl.toml", "--set", "cohort.size=21"], "`cohort.size` (s = 21) must not exceed"),
    (["configs/quickstart.toml", "--set", "client.dp={mode='per_example', epsilon_distribution='dist99'}"],
     "`client.dp.epsilon_distribution`: Unknown epsilon distribution 'dist99'"),
], ids=["async-cohort-notice", "epsilon-distribution-key"])
def test_the_error_is_the_only_line_and_names_its_key(capsys, args, fragment):
    """QuAFL's s > n printed a NOTICE that every round samples all clients, then refused the config; an unknown
    ε distribution did not name `client.dp.epsilon_distribution`."""
    from tests.child_run import ROOT
    assert main(["validate", str(ROOT / args[0]), *args[1:]]) == 2
    assert fragment in _one_line(capsys)


def test_validate_refuses_tensorboard_without_its_package(small, capsys, monkeypatch):
    """`validate` said "valid", then `run` refused `report.tensorboard = true` for want of the package."""
    import sys
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if not installed: the import fails
    assert main(["validate", str(small), "--set", "report.tensorboard=true"]) == 2
    assert "`report.tensorboard` is true but the tensorboard package is not installed" in _one_line(capsys)
