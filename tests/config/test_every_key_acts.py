"""Every scalar key of the schema, set away from its value, either changes the run or is refused by name.

A key that does neither is silently ignored: ``client.dp.noise_multiplier`` without ``client.dp.mode`` trained
with no noise at all, and nothing said so. The schema is walked, so a key added later without being wired to
anything fails here. Two small runs are the bases: FedAvg in the synchronous engine and in the async engine
(the clock's keys act there). "Changes the run" means the final model or a metrics row (wall time aside)
differs; ``KEPT_APART`` lists the keys whose effect lies elsewhere, each with where.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import typing

import pytest
import torch

from trustfl.config import schema
from trustfl.config.load import config_from_dict, config_to_dict
from trustfl.errors import TrustFLError
from trustfl.experiment import run_experiment

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KEPT_APART = {
    "name": "the run directory's name",
    "data.data_dir": "where the data sets are read from",
    "engine.checkpoint_every": "checkpoint files",
    "engine.eval_batch_size": "evaluation memory (the same metrics)",
    "engine.eval_initial": "summary.json's initial_<metric>",
    "engine.executor": "how clients are computed (the same bits by design: tests/engine)",
    "engine.max_clients_per_batch": "how many clients one batched call holds (the same bits by design)",
    "engine.device": "where the run computes",
    "attack.view": "what an attack sees (no attack runs in the bases)",
    "attack.byzantine_hold_data": "who holds data when there are Byzantine clients (none in the bases)",
    "client.dp.method": "how per-example gradients are computed (the same sums)",
    "report.primary_metric": "which metric the CLI leads with",
    "report.tensorboard": "TensorBoard files",
}
SKIPPED_TABLES = ("deploy",)  # a deployment's settings; the simulator documents that it ignores them

SYNC = {"name": "keys", "seed": 3, "rounds": 2, "data": {"dataset": "digits", "num_clients": 6},
        "model": {"name": "logreg"}, "cohort": {"sampler": "uniform", "size": 4},
        "client": {"batch_size": 16, "lr": 0.2}, "engine": {"checkpoint_every": 0}}
ASYNC = {**SYNC, "engine": {"kind": "async", "checkpoint_every": 0, "interaction_time": 2.0,
                            "speed": {"name": "exponential_groups", "slow_share": 0.5}},
         "client": {"steps": 3, "batch_size": 16, "lr": 0.2}}
DP = {**SYNC, "client": {"batch_size": 16, "lr": 0.2, "dp": {"mode": "per_example", "epsilon": 4.0}}}


def _leaves(obj: typing.Any, prefix: str = ""):
    hints = typing.get_type_hints(type(obj), vars(schema))
    for f in dataclasses.fields(obj):
        value, path = getattr(obj, f.name), prefix + f.name
        if dataclasses.is_dataclass(value) and not isinstance(value, schema.Component):
            if f.name not in SKIPPED_TABLES:
                yield from _leaves(value, path + ".")
        elif isinstance(value, (bool, int, float, str)):
            yield path, value, hints[f.name]


def _alternatives(value: typing.Any, tp: typing.Any) -> list:
    if typing.get_origin(tp) is typing.Literal:
        return [c for c in typing.get_args(tp) if c != value]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1]
    if isinstance(value, float):
        return [value / 2 if value >= 0.4 else value * 2 + 0.1]
    return []  # free strings (data set, algorithm, ...) are names: their own tests check them


def _set(data: dict, path: str, value: typing.Any) -> dict:
    out = config_to_dict(config_from_dict(data))
    node = out
    *parents, last = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return out


def _run(data: dict, tmp_path) -> tuple[torch.Tensor, list]:
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        result = run_experiment(config_from_dict(data), tmp_path / "run", progress=False, plots=False)
    rows = [{k: v for k, v in row.items() if k != "wall_time_s"} for row in result.rows]
    return result.params, rows


@pytest.mark.parametrize("base", [SYNC, ASYNC, DP], ids=["sync", "async", "dp"])
def test_every_key_changes_the_run_or_is_refused(base, tmp_path):
    params, rows = _run(base, tmp_path / "base")
    silent = []
    for i, (path, value, tp) in enumerate(_leaves(config_from_dict(base))):
        if path in KEPT_APART:
            continue
        for alt in _alternatives(value, tp):
            try:
                other = _set(base, path, alt)
                other_params, other_rows = _run(other, tmp_path / f"k{i}-{alt}")
            except TrustFLError:
                continue  # refused, by name (the message itself: test_inert.py and the fuzzers)
            if other_params.shape == params.shape and torch.equal(other_params, params) and other_rows == rows:
                silent.append(f"{path} = {alt!r}")
    assert not silent, f"set, accepted and without any effect: {silent}"
