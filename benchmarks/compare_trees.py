"""Before/after timings of the engine: the same rounds run from two checkouts, interleaved, in fresh processes.

Used to hold the engine generalisation (issue #10) to "within 5 % of before". Each measurement runs alternately
from ``--base`` (a checkout of the older commit, e.g. ``git worktree add /tmp/base <commit>``) and from this tree,
``--repeats`` times, one torch thread, CPU-time clock, allocator setting on; the median of each side and their
ratio are reported. Measurements:

- ``engine``: ``benchmarks/engine_throughput.py``'s worker (FedAvg round, 100 clients × 600 synthetic samples of
  784 features, MLP 784-200-200-10, batch 32, one epoch), vectorized at 10 and 100 clients per round and
  sequential at 10;
- ``host``: the engine's own host work for large cohorts: a FedAvg round of a near-empty model (8 features, MLP
  8-4-10) on 1,000 clients × 600 and 10,000 clients × 32 synthetic examples held in memory, so that the per-client
  bookkeeping (plans, batch schedules, message stacking) is what is timed; median of 5 rounds after a warm-up;
- ``dpsgd``: a DP-SGD round through the engine (digits, 10 clients per round, MLP 64-200-200-10, per-example
  clipping with ghost norms, z = 1, batch 32, one epoch), and the same with ``batch_clip``; median of 12 rounds
  after a warm-up round (the rounds are short);
- ``fedsc``: a FedSC round of ``configs/fedsc/digits_canvas_1class.toml`` (10 clients, augmented views, DP-CalR);
  median of 7 rounds after a warm-up round;
- ``quafl``: QuAFL's polling round of ``benchmarks/quafl_speed.py`` (n = 100, s = 10, K = 5, MLP 784-200-200-10,
  MNIST where ``make data`` fetched it), the mean of 40 rounds after two.

Run: ``.venv/bin/python benchmarks/compare_trees.py --base /tmp/base [--repeats 5]``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

TIMED_ROUNDS = r"""
state = initial_state(fed)
times = []
for r in range(ROUNDS):  # the first round warms up
    t = time.process_time()
    state, _ = run_round(fed, state)
    if r:
        times.append(time.process_time() - t)
print(json.dumps({"seconds_per_round": sorted(times)[len(times) // 2]}))
"""
"""The end of a worker script: median process CPU time of rounds 1 .. ROUNDS-1 of ``fed``."""

DP_WORKER = r"""
import json, resource, sys, time
import torch
torch.set_num_threads(1)
from trustfl.engine.allocator import tune_allocator
tune_allocator()
from trustfl.config.load import config_from_dict
from trustfl.config.build import build_federation
from trustfl.engine.sync import initial_state, run_round
mode = sys.argv[1]
cfg = config_from_dict({"name": "b", "seed": 0, "rounds": 13, "data": {"dataset": "digits", "num_clients": 20},
    "model": {"name": "mlp", "hidden": [200, 200]}, "cohort": {"sampler": "uniform", "size": 10},
    "client": {"epochs": 1, "batch_size": 32, "lr": 0.05,
               "dp": {"mode": mode, "clip": 1.0, "noise_multiplier": 1.0}},
    "engine": {"checkpoint_every": 0}})
fed = build_federation(cfg, quiet=True)
ROUNDS = 13
""" + TIMED_ROUNDS

HOST_WORKER = r"""
import dataclasses, json, sys, time
import torch
torch.set_num_threads(1)
from trustfl.config.build import build_federation
from trustfl.config.load import config_from_dict
from trustfl.engine.local import TrainData
from trustfl.engine.sync import initial_state, run_round
cohort, samples = int(sys.argv[1]), int(sys.argv[2])
cfg = config_from_dict({"name": "h", "seed": 0, "rounds": 7,
    "data": {"dataset": "synthetic", "num_clients": cohort, "partition": {"name": "natural"},
             "options": {"dim": 8, "samples": samples * 5 // 4, "test_clients": 1}},
    "model": {"name": "mlp", "hidden": [4]}, "cohort": {"sampler": "all"},
    "client": {"epochs": 1, "batch_size": 32, "lr": 0.01}, "engine": {"checkpoint_every": 0, "eval_every": 7}})
fed = build_federation(cfg, quiet=True)
data = fed.train_data.population.materialise(range(cohort))  # held in memory: the round's host work alone
fed = dataclasses.replace(fed, train_data=TrainData(data, fed.train_data.num_classes))
ROUNDS = 6
""" + TIMED_ROUNDS

FEDSC_WORKER = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
from trustfl.engine.allocator import tune_allocator
tune_allocator()
from trustfl.config.build import build_federation
from trustfl.config.load import load_config
from trustfl.engine.sync import initial_state, run_round
fed = build_federation(load_config("configs/fedsc/digits_canvas_1class.toml"), quiet=True)
ROUNDS = 8
""" + TIMED_ROUNDS

QUAFL_WORKER = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
from trustfl.engine.allocator import tune_allocator
tune_allocator()
sys.path.insert(0, "benchmarks")
import quafl_speed as q
from trustfl.data.datasets import dataset_available
mnist = dataset_available("mnist")
fed, engine = q.build(q.trustfl_config(128, False, mnist), 128, mnist)
state = engine.initial_state(fed)
for _ in range(2):  # round 0 has no local steps; round 1 warms up
    state, _ = engine.run_round(fed, state)
t = time.process_time()
for _ in range(40):
    state, _ = engine.run_round(fed, state)
print(json.dumps({"seconds_per_round": (time.process_time() - t) / 40}))
"""
"""QuAFL's polling rounds as ``benchmarks/quafl_speed.py`` times them (its ``build``, identity links), one thread:
the mean CPU time of rounds 2-41 (both trees make the same draws, so the same steps)."""


def _env(tree: Path) -> dict[str, str]:
    """A minimal environment whose trustfl is ``tree``'s: the tree first on PYTHONPATH (the caller's entries after
    it, where an environment's dependencies may live)."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
            "PATH": "/usr/bin:/bin"}


ISOLATED = ("import runpy, sys\n"
            "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in getattr(f, '__module__', '')]\n")
"""Prefix of every worker: drops the import hook of an editable install of this checkout, which would otherwise
serve the other tree any ``trustfl.<module>`` it lacks (a plugin package added since) from this checkout."""


def _script(tree: Path, code: str, *args: object) -> float:
    """``seconds_per_round`` printed by a worker script run with ``tree`` as the only trustfl on the path."""
    out = subprocess.run([sys.executable, "-c", ISOLATED + code, *map(str, args)], check=True, capture_output=True,
                         text=True, cwd=tree, env=_env(tree))
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds_per_round"]


def _host(tree: Path, cohort: int, samples: int) -> float:
    return _script(tree, HOST_WORKER, cohort, samples)


def _engine(tree: Path, method: str, cohort: int) -> float:
    run = "sys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n"
    return _script(tree, run, tree / "benchmarks" / "engine_throughput.py", "--worker", method, "--cohort", cohort,
                   "--rounds", 3, "--threads", 1, "--clock", "cpu", "--mallopt", "--synthetic")


def _dpsgd(tree: Path, mode: str) -> float:
    return _script(tree, DP_WORKER, mode)


def _fedsc(tree: Path) -> float:
    return _script(tree, FEDSC_WORKER)


def _quafl(tree: Path) -> float:
    return _script(tree, QUAFL_WORKER)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, type=Path, help="checkout of the older commit")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", default="", help="run only the cases whose label contains this text")
    parser.add_argument("--out", type=Path, help="also write the table (with the command) to this Markdown file")
    args = parser.parse_args()
    cases = [("FedAvg vectorized, 10 clients", lambda t: _engine(t, "vectorized", 10)),
             ("FedAvg vectorized, 100 clients", lambda t: _engine(t, "vectorized", 100)),
             ("FedAvg sequential, 10 clients", lambda t: _engine(t, "sequential", 10)),
             ("DP-SGD per-example (ghost), 10 clients", lambda t: _dpsgd(t, "per_example")),
             ("DP-SGD batch_clip, 10 clients", lambda t: _dpsgd(t, "batch_clip")),
             ("FedSC, 10 clients (configs/fedsc/digits_canvas_1class.toml)", _fedsc),
             ("QuAFL, n = 100, s = 10, K = 5 (benchmarks/quafl_speed.py's rounds)", _quafl),
             ("host work, 1,000 clients x 600 examples", lambda t: _host(t, 1000, 600)),
             ("host work, 10,000 clients x 32 examples", lambda t: _host(t, 10000, 32))]
    lines = ["| round | before s (median) | after s (median) | after / before |", "|---|---|---|---|"]
    for label, fn in [c for c in cases if args.only in c[0]]:
        before, after = [], []
        try:
            for _ in range(args.repeats):
                before.append(fn(args.base.resolve()))
                after.append(fn(ROOT))
        except subprocess.CalledProcessError as err:  # e.g. a case the older tree cannot run: said, not fatal
            tree = "base" if len(before) == len(after) else "this tree"
            last = (err.stderr or "").strip().splitlines()[-1:] or [f"exit {err.returncode}"]
            lines.append(f"| {label} | — | — | failed on {tree}: {last[0][:120]} |")
            print(lines[-1], flush=True)
            continue
        b, a = statistics.median(before), statistics.median(after)
        lines.append(f"| {label} | {b:.4f} | {a:.4f} | {a / b:.3f} |")
        print(lines[-1], flush=True)
    print("\n".join(lines))
    if args.out is not None:
        command = "`.venv/bin/python benchmarks/compare_trees.py " + " ".join(sys.argv[1:]) + "`"
        commit = subprocess.run(["git", "-C", str(args.base), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or "?"
        args.out.write_text(f"Command: {command} (base: {args.base} at commit {commit}; one torch thread, process "
                            f"CPU time, medians of {args.repeats} alternating runs).\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
