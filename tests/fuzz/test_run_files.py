"""Fuzzing the readers of a run directory (``trustfl report``, ``trustfl compare``, ``read_metrics``, resume): any
content of ``summary.json``, ``run_info.json`` or ``metrics.jsonl`` gives a result or a TrustFLError, never another
exception (the CLI shows a TrustFLError in one line and a traceback for anything else)."""
import json
import random
import shutil

import pytest

from trustfl.config.load import config_from_dict
from trustfl.core.runfiles import read_metrics
from trustfl.errors import TrustFLError
from trustfl.experiment import run_experiment
from trustfl.report.compare import compare_runs
from trustfl.report.table import report_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CASES = 60


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    cfg = config_from_dict({"name": "fuzz", "seed": 0, "rounds": 2, "data": {"dataset": "digits", "num_clients": 2},
                            "model": {"name": "logreg"}, "client": {"steps": 1, "batch_size": 16},
                            "engine": {"checkpoint_every": 1}})
    return run_experiment(cfg, tmp_path_factory.mktemp("fuzz") / "run", progress=False, plots=False).run_dir


def _value(rng: random.Random, depth: int = 0):
    kinds = ["int", "float", "str", "none", "bool", "nan"] + (["list", "dict"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "list":
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == "dict":
        return {rng.choice(["round", "accuracy", "metrics", "name", "x"]): _value(rng, depth + 1)
                for _ in range(rng.randrange(4))}
    return {"int": lambda: rng.randrange(-3, 10**6), "float": lambda: rng.uniform(-1e30, 1e30),
            "str": lambda: rng.choice(["", "accuracy", "loss", "é", "round"]), "none": lambda: None,
            "bool": lambda: rng.random() < 0.5, "nan": lambda: float("nan")}[kind]()


def _mutated(rng: random.Random, data: dict) -> str:
    """``data`` with a few keys set to random values (or removed), as JSON; sometimes a cut or foreign text."""
    data = dict(data)
    for _ in range(rng.randrange(1, 4)):
        key = rng.choice(list(data) + ["metrics", "rounds", "name", "primary_metric", "evaluators"])
        if rng.random() < 0.2:
            data.pop(key, None)
        else:
            data[key] = _value(rng)
    text = json.dumps(data)
    roll = rng.random()
    if roll < 0.1:
        return text[:rng.randrange(len(text))]
    if roll < 0.15:
        return json.dumps(_value(rng))
    return text


def _reads_or_refuses(read, *args):
    try:
        read(*args)
    except TrustFLError as err:
        assert "\n" not in str(err).strip(), str(err)


@pytest.mark.parametrize("name", ["summary.json", "run_info.json"])
def test_any_json_file_content_is_read_or_refused(tmp_path, finished, name):
    rng = random.Random(f"{name}-7")
    original = json.loads((finished / name).read_text())
    for case in range(CASES):
        run = tmp_path / f"run{case}"
        shutil.copytree(finished, run)
        (run / name).write_text(_mutated(rng, original))
        _reads_or_refuses(lambda d: compare_runs([d], out=tmp_path / f"cmp{case}", plots=False), run)
        if case % 10 == 0:  # report_run plots: a sixth of the cases
            _reads_or_refuses(report_run, run)


def test_any_metrics_rows_are_read_or_refused(tmp_path, finished):
    rng = random.Random(11)
    rows = [json.loads(line) for line in (finished / "metrics.jsonl").read_text().splitlines()]
    for case in range(CASES):
        run = tmp_path / f"run{case}"
        shutil.copytree(finished, run)
        lines = [_mutated(rng, row) if rng.random() < 0.5 else json.dumps(row) for row in rows]
        (run / "metrics.jsonl").write_text("\n".join(lines) + rng.choice(["\n", ""]))
        _reads_or_refuses(read_metrics, run)
        _reads_or_refuses(lambda d: compare_runs([d], out=tmp_path / f"cmp{case}", plots=False), run)
        if case % 10 == 0:
            _reads_or_refuses(report_run, run)
        if case % 6 == 0:
            _reads_or_refuses(lambda d: run_experiment(None, resume=d, progress=False, plots=False), run)
