"""Results a user can use (issue #18 item 5): a metrics row per round, model.pt, model.init_from, plots=False and
optional TensorBoard scalars."""
import json
import sys
import types

import pytest
import torch

import trustfl
from trustfl.config.build import build_federation, resolve_engine
from trustfl.config.load import config_from_dict, config_to_dict
from trustfl.core.runfiles import metric_rows, read_metrics
from trustfl.errors import ConfigError, DataError, TrustFLError
from trustfl.experiment import run_experiment
from trustfl.report.table import report_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EVERY_ROW = ("round", "wall_time_s", "bytes_up", "bytes_down", "bytes_up_total", "bytes_down_total", "rejected",
             "rejected_total", "train_loss", "cohort_size")


def _cfg(**over):
    """Digits, 4 clients, a small MLP, 4 rounds evaluated every 2."""
    data = {"name": "results", "seed": 2, "rounds": 4,
            "data": {"dataset": "digits", "num_clients": 4},
            "model": {"name": "mlp", "hidden": [16]},
            "client": {"steps": 3, "batch_size": 16, "lr": 0.1},
            "engine": {"checkpoint_every": 0, "eval_every": 2}}
    for key, value in over.items():
        node = data
        *parents, last = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return config_from_dict(data)


def _timeless(rows):
    return [{k: v for k, v in r.items() if k != "wall_time_s"} for r in rows]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 4-round run with sample-level DP (so that every row carries the privacy columns)."""
    out = tmp_path_factory.mktemp("results") / "run"
    cfg = _cfg(client__dp={"mode": "per_example", "clip": 1.0, "noise_multiplier": 1.0})
    return cfg, run_experiment(cfg, out, progress=False)


# ---------------------------------------------------------------- one row per round
def test_a_row_per_round_with_evaluation_metrics_on_evaluated_rounds_only(finished):
    cfg, res = finished
    assert [r["round"] for r in res.rows] == [1, 2, 3, 4]
    assert read_metrics(res.run_dir) == res.rows
    for r in res.rows:
        missing = [k for k in (*EVERY_ROW, "epsilon_min", "epsilon_median", "epsilon_max") if k not in r]
        assert not missing, (r["round"], missing)
    assert [r["round"] for r in res.rows if "accuracy" in r] == [2, 4]
    assert [r["round"] for r in res.rows if "loss" in r] == [2, 4]     # every evaluation metric, or none
    assert [r["round"] for r in metric_rows(res.rows, ["accuracy", "loss"])] == [2, 4]
    eps = [r["epsilon_max"] for r in res.rows]
    assert eps == sorted(eps) and eps[0] > 0
    assert [r["bytes_up_total"] for r in res.rows] == [res.rows[0]["bytes_up"] * k for k in (1, 2, 3, 4)]
    assert res.rows[-1]["rejected_total"] == res.summary["rejected_total"] == 0
    walls = [r["wall_time_s"] for r in res.rows]
    assert walls == sorted(walls)


def test_summary_final_and_best_are_over_the_evaluated_rounds(finished):
    _, res = finished
    accuracies = [r["accuracy"] for r in res.rows if "accuracy" in r]
    assert res.summary["final_accuracy"] == accuracies[-1] == res.rows[-1]["accuracy"]
    assert res.summary["best_accuracy"] == max(accuracies)
    assert res.summary["best_loss"] == min(r["loss"] for r in res.rows if "loss" in r)
    assert res.curve("accuracy") == [(2, accuracies[0]), (4, accuracies[1])]


def test_final_metric_is_the_last_evaluation_when_the_last_round_is_not_evaluated(tmp_path):
    res = run_experiment(_cfg(rounds=5), tmp_path / "run", progress=False, stop_after=3, plots=False)
    assert [r["round"] for r in res.rows] == [1, 2, 3]
    assert [r["round"] for r in res.rows if "accuracy" in r] == [2]
    assert res.summary["final_accuracy"] == res.rows[1]["accuracy"]


def test_a_resumed_run_has_exactly_one_row_per_round(tmp_path):
    cfg = _cfg(rounds=5, engine={"eval_every": 2, "checkpoint_every": 2})
    full = run_experiment(cfg, tmp_path / "full", progress=False, plots=False)

    def crash(row):  # after round 4's row is written, before its checkpoint: rows 3 and 4 come after round 2's
        if row["round"] == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "part", progress=False, plots=False, on_eval=crash)
    assert [r["round"] for r in read_metrics(tmp_path / "part")] == [1, 2, 3, 4]
    resumed = run_experiment(None, resume=tmp_path / "part", progress=False, plots=False)
    assert [r["round"] for r in resumed.rows] == [1, 2, 3, 4, 5]
    assert _timeless(resumed.rows) == _timeless(full.rows)
    assert torch.equal(resumed.params, full.params)



def test_a_run_interrupted_before_its_first_checkpoint_resumes_from_round_one(tmp_path):
    # `trustfl run` told the user "resume with `trustfl run --resume DIR`", and the resume was refused: no checkpoint
    cfg = _cfg(rounds=5, engine={"eval_every": 2, "checkpoint_every": 3})
    full = run_experiment(cfg, tmp_path / "full", progress=False, plots=False)

    def crash(row):  # after round 2's row, before round 3's checkpoint, the first
        if row["round"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_experiment(cfg, tmp_path / "part", progress=False, plots=False, on_eval=crash)
    assert not (tmp_path / "part" / "checkpoint.pt").exists()
    resumed = run_experiment(None, resume=tmp_path / "part", progress=False, plots=False)
    assert [r["round"] for r in resumed.rows] == [1, 2, 3, 4, 5]
    assert _timeless(resumed.rows) == _timeless(full.rows)
    assert torch.equal(resumed.params, full.params)
    assert {k: v for k, v in resumed.summary.items() if k != "wall_time_s"} == \
        {k: v for k, v in full.summary.items() if k != "wall_time_s"}


def test_progress_log_lines_only_on_evaluated_rounds(tmp_path, capsys):
    run_experiment(_cfg(), tmp_path / "run", progress=True, plots=False)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[results] round")]
    assert [line.split()[2] for line in lines] == ["2/4", "4/4"]


def test_report_table_lists_the_evaluated_rounds(finished):
    _, res = finished
    table = report_run(res.run_dir).split("\n\n")[0].splitlines()
    assert table[0].split()[:3] == ["round", "accuracy", "loss"] and "train_loss" in table[0].split()
    assert [line.split()[0] for line in table[1:]] == ["2", "4"]


# ---------------------------------------------------------------- model.pt
def _accuracy(model, test):
    with torch.no_grad():
        return (model(test["x"]).argmax(1) == test["y"]).double().mean().item()


def test_model_pt_loads_into_a_fresh_model_and_reproduces_the_final_evaluation(finished):
    cfg, res = finished
    state = torch.load(res.run_dir / "model.pt")                       # weights_only: plain tensors
    assert res.model_path == res.run_dir / "model.pt"
    assert all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in state.values())
    fed = build_federation(cfg, quiet=True)
    fresh = trustfl.build("model", "mlp", input_shape=fed.dataset.input_shape, num_classes=10, hidden=[16])
    assert list(state) == list(fresh.state_dict())
    fresh.load_state_dict(state)
    assert _accuracy(fresh, fed.test_data) == pytest.approx(res.summary["final_accuracy"], abs=1e-12)
    expected = torch.func.functional_call(fed.model, fed.layout.unflatten(res.params), (fed.test_data["x"],))
    assert torch.equal(fresh(fed.test_data["x"]).detach(), expected.detach())
    fed.model.load_state_dict(state)                                    # build_federation(cfg).model too
    assert _accuracy(fed.model, fed.test_data) == pytest.approx(res.summary["final_accuracy"], abs=1e-12)


# ---------------------------------------------------------------- model.init_from
def test_init_from_a_model_pt_or_a_flat_tensor_is_the_initial_state(finished, tmp_path):
    _, res = finished
    flat = tmp_path / "flat.pt"
    torch.save(res.params.clone(), flat)
    for source in (res.run_dir / "model.pt", flat):
        cfg = _cfg(model={"name": "mlp", "hidden": [16], "init_from": str(source)})
        fed = build_federation(cfg, quiet=True)
        assert torch.equal(fed.initial_params, res.params)
        assert torch.equal(resolve_engine(cfg).initial_state(fed).params, res.params)
    # The asynchronous engine starts from the same weights (QuAFL's clients too: their base is the initial model).
    cfg = _cfg(algorithm="quafl", model={"name": "mlp", "hidden": [16], "init_from": str(flat)},
               cohort={"sampler": "uniform", "size": 2},
               engine={"kind": "async", "checkpoint_every": 0, "eval_every": 2})
    fed = build_federation(cfg, quiet=True)
    assert torch.equal(resolve_engine(cfg).initial_state(fed).params, res.params)


def test_a_run_continues_from_init_from(finished, tmp_path):
    _, res = finished
    cfg = _cfg(rounds=1, model={"name": "mlp", "hidden": [16], "init_from": str(res.run_dir / "model.pt")})
    again = run_experiment(cfg, tmp_path / "next", progress=False, plots=False)
    fresh = run_experiment(_cfg(rounds=1), tmp_path / "fresh", progress=False, plots=False)
    assert [r["round"] for r in again.rows] == [1] and not torch.equal(again.params, fresh.params)
    assert f'init_from = "{res.run_dir / "model.pt"}"' in (tmp_path / "next" / "config.toml").read_text()
    assert json.loads((tmp_path / "next" / "summary.json").read_text())["rounds"] == 1


def _one_line(err):
    assert "\n" not in str(err.value), str(err.value)
    return str(err.value)


def test_init_from_errors_are_one_liners(finished, tmp_path):
    _, res = finished

    def build(source, hidden=(16,)):
        return build_federation(_cfg(model={"name": "mlp", "hidden": list(hidden), "init_from": str(source)}),
                                quiet=True)

    with pytest.raises(ConfigError, match=r"`model.init_from`: no file .*nope\.pt") as err:
        build(tmp_path / "nope.pt")
    _one_line(err)
    with pytest.raises(DataError, match=r"'net.0.weight' has shape \(16, 64\) in .*model\.pt, model 'mlp' "
                                        r"expects \(32, 64\)") as err:
        build(res.run_dir / "model.pt", hidden=(32,))
    _one_line(err)
    state = torch.load(res.run_dir / "model.pt")
    renamed = {("layer." + k if k == "net.2.bias" else k): v for k, v in state.items()}
    torch.save(renamed, tmp_path / "renamed.pt")
    with pytest.raises(DataError, match=r"has no tensor 'net.2.bias'") as err:
        build(tmp_path / "renamed.pt")
    _one_line(err)
    torch.save({**state, "extra": torch.zeros(1)}, tmp_path / "extra.pt")
    with pytest.raises(DataError, match=r"has a tensor 'extra', which model 'mlp' does not have") as err:
        build(tmp_path / "extra.pt")
    _one_line(err)
    torch.save(torch.zeros(7), tmp_path / "short.pt")
    with pytest.raises(DataError, match=rf"shape \(7,\); model 'mlp' takes a flat tensor of shape "
                                        rf"\({res.params.numel()},\)") as err:
        build(tmp_path / "short.pt")
    _one_line(err)
    torch.save({**state, "net.0.bias": torch.full_like(state["net.0.bias"], float("nan"))}, tmp_path / "nan.pt")
    with pytest.raises(DataError, match=r"'net.0.bias' .* non-finite") as err:
        build(tmp_path / "nan.pt")
    _one_line(err)
    (tmp_path / "text.pt").write_text("not a tensor file")
    with pytest.raises(DataError, match=r"text\.pt is not a tensor file written by torch\.save") as err:
        build(tmp_path / "text.pt")
    _one_line(err)
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")
    with pytest.raises(DataError, match=r"module\.pt holds objects other than tensors .* state_dict\(\)") as err:
        build(tmp_path / "module.pt")
    _one_line(err)
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(DataError, match=r"holds a list, not a state_dict"):
        build(tmp_path / "list.pt")
    with pytest.raises(ConfigError, match=r"`model.init_from` must be the path of a .pt file"):
        _cfg(model={"name": "mlp", "init_from": 3})


# ---------------------------------------------------------------- plots=False, TensorBoard
def test_plots_false_skips_the_plots(tmp_path):
    res = run_experiment(_cfg(rounds=2), tmp_path / "run", progress=False, plots=False)
    assert not list(res.run_dir.glob("*.png"))
    assert (res.run_dir / "model.pt").is_file() and (res.run_dir / "summary.json").is_file()


def test_tensorboard_missing_is_a_one_line_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)   # what an absent package looks like
    with pytest.raises(ConfigError, match=r"`report.tensorboard`.*pip install tensorboard") as err:
        run_experiment(_cfg(report={"tensorboard": True}), tmp_path / "run", progress=False)
    _one_line(err)
    assert isinstance(err.value, TrustFLError) and not (tmp_path / "run").exists()


class _FakeWriter:
    made: list["_FakeWriter"] = []

    def __init__(self, log_dir=None, purge_step=None):
        self.log_dir, self.purge_step, self.scalars, self.closed = log_dir, purge_step, [], False
        _FakeWriter.made.append(self)

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def flush(self):
        pass

    def close(self):
        self.closed = True


def test_tensorboard_writes_every_rows_scalars(tmp_path, monkeypatch):
    fake = types.ModuleType("torch.utils.tensorboard")
    fake.SummaryWriter = _FakeWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", fake)
    _FakeWriter.made.clear()
    cfg = _cfg(rounds=3, report={"tensorboard": True}, engine={"eval_every": 2, "checkpoint_every": 1})
    res = run_experiment(cfg, tmp_path / "run", progress=False, plots=False, stop_after=2)
    (writer,) = _FakeWriter.made
    assert writer.log_dir == str(res.run_dir / "tensorboard") and writer.purge_step is None and writer.closed
    expected = [(k, float(v), r["round"]) for r in res.rows for k, v in r.items()
                if k != "round" and isinstance(v, (int, float))]
    assert writer.scalars == expected
    assert {t for t, _, s in writer.scalars if s == 2} >= {"accuracy", "loss", "train_loss", "bytes_up"}
    assert "accuracy" not in {t for t, _, s in writer.scalars if s == 1}
    # A resumed run hides what the interrupted one logged after its checkpoint and logs the rest.
    resumed = run_experiment(None, resume=res.run_dir, progress=False, plots=False)
    assert _FakeWriter.made[-1].purge_step == 3
    assert {s for _, _, s in _FakeWriter.made[-1].scalars} == {3} and len(resumed.rows) == 3


class _RunsCode:
    def __reduce__(self):
        return (open, ("ran-on-load.txt", "w"))


def test_a_checkpoint_that_would_run_code_is_refused_unread(tmp_path, monkeypatch):
    # resuming a run directory from elsewhere must not unpickle arbitrary objects (torch.load weights_only)
    from trustfl.engine.checkpoint import load_checkpoint
    from trustfl.errors import CheckpointError

    monkeypatch.chdir(tmp_path)
    torch.save({"config_hash": "abc", "state": {"round": 1, "payload": _RunsCode()}}, tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(tmp_path, "abc")
    assert not (tmp_path / "ran-on-load.txt").exists()


@pytest.mark.parametrize("kwargs, fragment", [
    ({"out": 123}, "`out` must be a path"),
    ({"checkpoint_every": -1}, "`checkpoint_every` must be an integer >= 0"),  # -1 checkpointed every round
    ({"checkpoint_every": "x"}, "`checkpoint_every` must be an integer >= 0"),
    ({"stop_after": -2}, "`stop_after` must be an integer >= 0"),
    ({"data_dir": 5}, "`data_dir` must be a path"),
    ({"on_eval": 5}, "`on_eval` must be a function"),
    ({"engine": 5}, "`engine` must be a function"),
    ({"cfg": None}, "`cfg` must be an ExperimentConfig"),
    # with `resume` it was silently ignored: the run goes on in its own directory
    ({"resume": "old"}, "`resume` continues the run in its own directory 'old'; pass `out` as None with it"),
    ({"resume": "old", "out": None, "cfg": 5}, "`cfg` must be None or the run's own config with `resume`"),
])
def test_run_experiment_refuses_arguments_of_the_wrong_kind_before_writing(kwargs, fragment, tmp_path):
    args = {"cfg": _cfg(), "out": tmp_path / "run", **kwargs}
    with pytest.raises(ConfigError, match=f"^run_experiment: {fragment}"):
        run_experiment(args.pop("cfg"), args.pop("out"), progress=False, plots=False, **args)
    assert not (tmp_path / "run").exists()


def test_a_config_given_with_resume_must_be_the_runs_own(tmp_path):
    """A config other than the run's config.toml was silently ignored; the same config (or None) resumes."""
    cfg = _cfg(engine={"checkpoint_every": 1, "eval_every": 2})
    run_experiment(cfg, tmp_path / "run", progress=False, plots=False, stop_after=1)
    other = config_from_dict({**config_to_dict(cfg), "seed": cfg.seed + 1})
    with pytest.raises(ConfigError, match=r"^run_experiment: `cfg` differs from the config.toml of the run it resumes "
                                          r"in '.*run' \(at `seed`\); pass None, or that config, with `resume`\.$"):
        run_experiment(other, resume=tmp_path / "run", progress=False, plots=False)
    resumed = run_experiment(cfg, resume=tmp_path / "run", progress=False, plots=False)
    assert resumed.summary["rounds"] == cfg.rounds


def test_run_experiment_under_the_meta_default_device_is_refused_before_writing(tmp_path):
    """Inside ``with torch.device("meta")`` it made the run directory, then failed with a raw TypeError (a meta
    tensor cannot become a numpy array)."""
    with torch.device("meta"), pytest.raises(ConfigError, match=r"^run_experiment: torch's default device is 'meta' "
                                                                 r"\(a `with torch.device\(\"meta\"\)` block"):
        run_experiment(_cfg(), tmp_path / "run", progress=False, plots=False)
    assert not (tmp_path / "run").exists()
