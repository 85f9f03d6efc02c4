"""Sweeps: one experiment config run over the Cartesian product of value grids × seeds (``trustfl sweep``).

Every point of the sweep is a normal run directory (made by :func:`trustfl.experiment.run_experiment`) named
after the varied keys and the seed, ``<out>/client.lr=0.01__aggregator.name=caf__seed=0``; ``<out>/sweep.json``
records the config, the grids, the seeds and every point (its overrides, directory, status and final metric).

Resumable: a point whose run finished (``summary.json`` written at the end of the run, for all planned rounds or
up to the engine's own stop, e.g. ``engine.time_limit``) is skipped; an unfinished one is resumed from its
``checkpoint.pt`` (``trustfl run --resume``: bitwise equal to an uninterrupted run) or, without one, restarted; a
checkpoint that cannot be resumed (damaged, or written on other data) fails the point, naming the file, as
``--resume`` does. A run directory that holds a run of another config is refused before anything runs.

Every point's config is validated (schema, then built like ``trustfl validate``) before any point runs; an error
is a :class:`~trustfl.errors.ConfigError` naming the point and the key. A point that fails while running is
reported and the sweep goes on. ``jobs > 1`` runs points in that many spawned processes, each with ``threads``
torch threads (a script that calls :func:`run_sweep` with ``jobs > 1`` needs the ``if __name__ == "__main__":``
guard, as every spawning program does).

The API lives here, under ``trustfl.report`` (a top-layer package, tests/test_layering.py); :func:`run_sweep`
is the entry point; parsing ``--grid``/``--seeds`` and naming points live in :mod:`trustfl.report.sweep_points`
(:func:`~trustfl.report.sweep_points.parse_grid`).
"""
from __future__ import annotations

import copy
import itertools
import json
import math
import re
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from trustfl.config.load import (apply_override, config_from_dict, config_to_dict, dump_toml, load_config,
                                 parse_override, read_toml)
from trustfl.config.schema import ExperimentConfig
from trustfl.core.runfiles import (check_out_dir, hold_run_dir, load_json, read_metrics, read_summary, writing)
from trustfl.errors import CheckpointError, ConfigError, TrustFLError, UsageError
from trustfl.report.sweep_points import (_MAX_NAME, MAX_POINTS, _digest, _grids, flatten_config, parse_seeds,
                                        point_name)

__all__ = ["MANIFEST", "SweepPoint", "SweepResult", "finished", "load_manifest", "run_finished", "run_sweep"]

MANIFEST = "sweep.json"


# ------------------------------------------------------------------------------------------------ run state
def run_finished(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a finished run: ``summary.json`` (written once the run ends) for all planned
    rounds, or for fewer when the engine stopped on its own (``engine.time_limit``: the last row's ``sim_time``)."""
    run_dir = Path(run_dir)
    try:
        summary = read_summary(run_dir / "summary.json")
    except TrustFLError:
        return False
    if not isinstance(summary.get("rounds"), int):
        return False
    if finished(summary, [], None):  # all planned rounds: no need to read further
        return True
    try:
        limit = load_config(run_dir / "config.toml").engine.time_limit
        rows = read_metrics(run_dir)
    except (TrustFLError, OSError):
        return False
    return finished(summary, rows, limit)


def finished(summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], time_limit: float | None) -> bool:
    """Whether a run whose ``summary.json`` is ``summary`` (``{}``: none) and whose last metrics row is
    ``rows[-1]`` finished: its summary covers all planned rounds, or the rounds up to ``engine.time_limit``."""
    rounds, planned = summary.get("rounds"), summary.get("rounds_planned")
    if isinstance(rounds, bool) or not isinstance(rounds, int):
        return False
    if rounds >= (math.inf if planned is None else planned):
        return True
    last = rows[-1] if rows else {}
    return bool(time_limit) and last.get("round") == rounds and (last.get("sim_time") or 0) >= time_limit


def _difference(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    a, b = flatten_config(ours), flatten_config(theirs)
    for key in list(a) + [k for k in b if k not in a]:
        if a.get(key, "(absent)") != b.get(key, "(absent)"):
            return f"`{key}` is {b.get(key, '(absent)')!r} there, {a.get(key, '(absent)')!r} in this sweep"
    return "the configs differ"


# ------------------------------------------------------------------------------------------------ results
@dataclass
class SweepPoint:
    """One point: its overrides (grid values and ``seed``), run directory and outcome."""

    name: str
    overrides: dict[str, Any]
    run_dir: Path
    config: ExperimentConfig
    status: str = "pending"
    """``pending``, ``done`` (ran in this call), ``skipped`` (had finished before) or ``failed``."""
    action: str = ""
    """What this call does with it: ``skip``, ``resume`` (from its checkpoint) or ``fresh``."""
    error: str = ""
    summary: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def seed(self) -> int:
        return self.config.seed

    def final(self) -> tuple[str, float | None, float | None]:
        """(primary metric, its final value, its best value) from the run's summary."""
        metric = self.summary.get("primary_metric", "")
        return metric, self.summary.get(f"final_{metric}"), self.summary.get(f"best_{metric}")

    def manifest(self) -> dict[str, Any]:
        metric, final, best = self.final()
        status = {"skipped": "done"}.get(self.status, self.status)
        out: dict[str, Any] = {"name": self.name, "dir": self.name, "overrides": self.overrides, "seed": self.seed,
                               "status": status}
        if metric:
            out.update({"primary_metric": metric, f"final_{metric}": final, f"best_{metric}": best,
                        "rounds": self.summary.get("rounds"), "wall_time_s": self.summary.get("wall_time_s")})
        if self.error:
            out["error"] = self.error
        return out


@dataclass
class SweepResult:
    out: Path
    points: list[SweepPoint]

    def _with(self, status: str) -> list[SweepPoint]:
        return [p for p in self.points if p.status == status]

    @property
    def done(self) -> list[SweepPoint]:
        return self._with("done")

    @property
    def skipped(self) -> list[SweepPoint]:
        return self._with("skipped")

    @property
    def failed(self) -> list[SweepPoint]:
        return self._with("failed")

    @property
    def ok(self) -> bool:
        return all(p.status in ("done", "skipped") for p in self.points)


# ------------------------------------------------------------------------------------------------ workers
def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", " ", text).strip()


def _execute(task: dict[str, Any]) -> dict[str, Any]:
    """Run one point (in this process or a worker): resume it from its checkpoint or run it afresh. A checkpoint
    that cannot be resumed (damaged, of other data) fails the point, naming the file, as ``--resume`` does.

    Returns ``{"status": "done", "summary": ...}`` or ``{"status": "failed", "error": one line}``; a failure
    that is not a :class:`TrustFLError` also writes its traceback to ``<run_dir>/error.log``.
    """
    import torch

    from trustfl.experiment import run_experiment

    run_dir, threads = Path(task["run_dir"]), task["threads"]
    before = torch.get_num_threads()
    start = time.perf_counter()
    try:
        if threads:
            torch.set_num_threads(threads)
        (run_dir / "summary.json").unlink(missing_ok=True)  # a stale summary must never mark it finished
        (run_dir / "error.log").unlink(missing_ok=True)
        if task["action"] == "resume":
            try:
                result = run_experiment(None, resume=run_dir, data_dir=task["data_dir"], progress=False)
            except (CheckpointError, UsageError) as err:  # as `trustfl run --resume`: never a silent restart over
                said = _one_line(str(err)).replace(", or start afresh with --overwrite", "")  # (not a sweep flag)
                raise CheckpointError(f"{said} The sweep does not restart a point it cannot resume: delete "
                                      f"{run_dir} to run it afresh.") from None
        else:
            result = run_experiment(task["config"], run_dir, data_dir=task["data_dir"], progress=False)
        return {"status": "done", "summary": json.loads(json.dumps(result.summary, default=str)),
                "seconds": time.perf_counter() - start}
    except TrustFLError as err:
        return {"status": "failed", "error": f"{type(err).__name__}: {_one_line(str(err))}",
                "seconds": time.perf_counter() - start}
    except Exception as err:  # a bug (in trustfl or a plugin): keep the traceback next to the run
        try:
            (run_dir / "error.log").write_text(traceback.format_exc())
        except OSError:
            pass
        return {"status": "failed", "error": f"{type(err).__name__}: {_one_line(str(err))} (traceback in "
                                             f"{run_dir / 'error.log'})", "seconds": time.perf_counter() - start}
    finally:
        torch.set_num_threads(before)


def _write_manifest(out: Path, header: dict[str, Any], points: list[SweepPoint]) -> None:
    data = {**header, "points": [p.manifest() for p in points]}
    tmp = out / (MANIFEST + ".tmp")
    with writing(out):
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
        tmp.replace(out / MANIFEST)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if math.isfinite(value) else str(value)
    return "nan" if value is None else str(value)


def _line(k: int, n: int, point: SweepPoint) -> str:
    head = f"[{k:>{len(str(n))}}/{n}] {point.status:<7} {point.name}"
    if point.status == "failed":
        return f"{head}: {point.error}"
    metric, final, best = point.final()
    text = f"{head}  {metric} {_fmt(final)} (best {_fmt(best)})" if metric else head
    if point.status != "done":
        return f"{text}  (finished earlier)"
    return f"{text}  {point.seconds:.1f} s" + ("  (resumed from its checkpoint)" if point.action == "resume" else "")


# ------------------------------------------------------------------------------------------------ the sweep
def run_sweep(config: str | Path | Mapping[str, Any], grid: Sequence[str] | Mapping[str, Sequence[Any]] = (),
              seeds: str | int | Sequence[int] | None = None, *, out: str | Path, overrides: Sequence[str] = (),
              jobs: int = 1, threads: int = 1, data_dir: str | None = None, validate: bool = True,
              log: Callable[[str], None] | None = print) -> SweepResult:
    """Run ``config`` at every point of the grids × seeds, one run directory per point under ``out``.

    Args:
      config: a TOML file, or a config mapping (as parsed from TOML).
      grid: ``["client.lr=0.01,0.05", "aggregator.name=caf,cwtm"]`` (values parse like ``--set`` values), or a
        mapping ``{"client.lr": [0.01, 0.05]}``. Grid values are applied after ``overrides``.
      seeds: ``"0-2"``, ``"0,3"``, an int or a list; default: the config's own seed.
      overrides: ``--set KEY=VALUE`` applied to every point.
      jobs: points run at once; above 1 in spawned worker processes (1: in this process).
      threads: torch threads per point while it runs (0: torch's default).
      validate: build every point to run (as ``trustfl validate`` does, once per config up to the seed) before
        any runs; the schema check of every point always runs.
      log: called with one line per point (done / skipped / failed); ``None``: silent.

    Raises:
      ConfigError: bad grid or seeds syntax, an unknown key or invalid value at any point (naming the point and
        the key), before anything runs.
      UsageError: ``jobs`` < 1, ``threads`` < 0, ``out`` unusable, or a point's directory holding a run of
        another config.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise UsageError(f"--jobs must be an integer >= 1, found {jobs!r}.")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise UsageError(f"--threads must be an integer >= 0 (0: torch's default), found {threads!r}.")
    grids = _grids(grid)
    if isinstance(config, Mapping):
        base, config_path = copy.deepcopy(dict(config)), None
    else:
        base, config_path = read_toml(config), str(config)
    for text in overrides:
        apply_override(base, *parse_override(text))
    if seeds is None:  # the config's own seed (validated with each point: --set may leave a partial table now)
        seed = base.get("seed", ExperimentConfig.seed)
        seed_list = [seed] if isinstance(seed, int) and not isinstance(seed, bool) else parse_seeds(seed)
    else:
        seed_list = parse_seeds(seeds)
    out = check_out_dir(out)
    count = math.prod(len(values) for _, values in grids) * len(seed_list)
    if count > MAX_POINTS:
        sizes = [f"{len(values)} values of {key}" for key, values in grids] + [f"{len(seed_list)} seeds"]
        raise ConfigError(f"the sweep has {count:,} points ({' × '.join(sizes)}); a sweep runs at most "
                          f"{MAX_POINTS:,}.")

    points: list[SweepPoint] = []
    for combo in itertools.product(*[values for _, values in grids]):
        for seed in seed_list:
            varied = {key: value for (key, _), value in zip(grids, combo)}
            varied["seed"] = seed
            name = point_name(varied)
            data = copy.deepcopy(base)
            try:
                for key, value in varied.items():
                    apply_override(data, key.split("."), copy.deepcopy(value))
                cfg = config_from_dict(data)
            except ConfigError as err:
                raise ConfigError(f"sweep point {name}: {str(err).replace('--set', '--grid', 1)}") from None
            points.append(SweepPoint(name, varied, out / name, cfg))
    _unique_names(points)

    for point in points:
        point.action = _plan(point)
    if validate:
        _validate([p for p in points if p.action != "skip"], data_dir)

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--out: cannot create sweep directory {str(out)!r}: {err.strerror or err}.") from None
    header = {"config": config_path, "config_resolved": str(Path(config_path).resolve()) if config_path else None,
              "base_config": None if config_path else base, "overrides": list(overrides),
              "grids": {key: values for key, values in grids}, "seeds": seed_list}
    with writing(out), hold_run_dir(out):  # a second sweep into `out` while this one runs is refused
        _run_points(points, out, header, jobs, threads, data_dir, log)
    return SweepResult(out, points)


def _run_points(points: list[SweepPoint], out: Path, header: dict[str, Any], jobs: int, threads: int,
                data_dir: str | None, log: Callable[[str], None] | None) -> None:
    """:func:`run_sweep`'s points in ``out`` (held by this process): the skipped ones recorded, the others run,
    the manifest rewritten after each."""
    say = log or (lambda line: None)
    n, k = len(points), 0
    for point in points:
        if point.action == "skip":
            point.status = "skipped"
            point.summary = read_summary(point.run_dir / "summary.json")
    _write_manifest(out, header, points)
    todo = [p for p in points if p.action != "skip"]
    workers = max(1, min(jobs, len(todo)))
    say(f"sweep: {n} points ({n - len(todo)} finished earlier, {len(todo)} to run) with {workers} "
        f"job{'s' if workers > 1 else ''} in {out}")
    for point in points:
        if point.status == "skipped":
            k += 1
            say(_line(k, n, point))

    def finish(point: SweepPoint, outcome: dict[str, Any]) -> None:
        nonlocal k
        point.status, point.seconds = outcome["status"], outcome.get("seconds", 0.0)
        point.summary, point.error = outcome.get("summary", {}), outcome.get("error", "")
        k += 1
        _write_manifest(out, header, points)
        say(_line(k, n, point))

    tasks = {id(p): {"run_dir": str(p.run_dir), "action": p.action, "config": p.config, "data_dir": data_dir,
                     "threads": threads} for p in todo}
    with writing(out):
        for p in todo:
            p.run_dir.mkdir(parents=True, exist_ok=True)
    if jobs == 1 or len(todo) <= 1:
        for point in todo:
            finish(point, _execute(tasks[id(point)]))
    else:
        _run_pool(todo, tasks, jobs, finish)
    if log is not None and any(p.status == "failed" for p in points):
        failed = [p for p in points if p.status == "failed"]
        stuck = [p for p in failed if p.error.startswith("CheckpointError")]  # a re-run refuses them again
        advice = "re-run the same command to retry them"
        if stuck:
            advice = (f"delete the directories of {', '.join(p.name for p in stuck)} (checkpoints it cannot "
                      f"resume), then " + advice)
        say(f"sweep: {len(failed)} of {n} points failed ({', '.join(p.name for p in failed)}); {advice}")


def _run_pool(todo: list[SweepPoint], tasks: dict[int, dict[str, Any]], jobs: int,
              finish: Callable[[SweepPoint, dict[str, Any]], None]) -> None:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    pool = ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.submit(_execute, tasks[id(p)]): p for p in todo}
        for future in as_completed(futures):
            try:
                outcome = future.result()
            except BrokenProcessPool:
                outcome = {"status": "failed", "error": "its worker process died (killed, out of memory, or a script "
                           "calling run_sweep with jobs > 1 outside `if __name__ == \"__main__\":`)"}
            finish(futures[future], outcome)
    except BaseException:  # Ctrl-C: stop the workers now (their runs resume from their checkpoints next time)
        workers = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in workers:
            process.terminate()
        raise
    pool.shutdown(wait=True)


def _unique_names(points: list[SweepPoint]) -> None:
    """Two points whose names sanitize to the same text get their overrides' hash appended."""
    seen: dict[str, int] = {}
    for p in points:
        seen[p.name] = seen.get(p.name, 0) + 1
    for p in points:
        if seen[p.name] > 1:
            p.name = f"{p.name[:_MAX_NAME - 10]}__{_digest(p.overrides)}"
            p.run_dir = p.run_dir.with_name(p.name)


def _plan(point: SweepPoint) -> str:
    """``skip`` a finished run of the same config, ``resume`` an unfinished one from its checkpoint, else
    ``fresh``; a directory holding a run of another config is refused."""
    config_file = point.run_dir / "config.toml"
    if not config_file.is_file():
        held = [f for f in ("metrics.jsonl", "checkpoint.pt", "summary.json") if (point.run_dir / f).exists()]
        if held:  # a run whose config.toml was lost: never started again over its rows
            raise UsageError(f"sweep point {point.name}: {point.run_dir} holds a run ({', '.join(held)}) without its "
                             f"config.toml; restore it, or delete that directory to run the point afresh.")
        return "fresh"
    ours = config_to_dict(point.config)
    try:
        theirs = config_to_dict(load_config(config_file))
    except ConfigError as err:
        raise UsageError(f"sweep point {point.name}: {point.run_dir} holds an unreadable config.toml ({err}); "
                         f"delete that directory or choose another --out.") from None
    if dump_toml(theirs) != dump_toml(ours):
        raise UsageError(f"sweep point {point.name}: {point.run_dir} holds a run of another config "
                         f"({_difference(ours, theirs)}); delete that directory or choose another --out.")
    if run_finished(point.run_dir):
        return "skip"
    return "resume" if (point.run_dir / "checkpoint.pt").is_file() else "fresh"


def _validate(points: list[SweepPoint], data_dir: str | None) -> None:
    """Build each distinct config (up to the seed) once, as ``trustfl validate`` does; errors name the point."""
    from trustfl.config.build import build_federation

    seen: set[str] = set()
    for point in points:
        key = dump_toml({**config_to_dict(point.config), "seed": 0})
        if key in seen:
            continue
        seen.add(key)
        try:
            build_federation(point.config, data_dir=data_dir, quiet=True)
        except TrustFLError as err:  # the same class (ConfigError, DataError, BudgetExceededError...), named point
            raise type(err)(f"sweep point {point.name}: {_one_line(str(err))}") from None


def load_manifest(sweep_dir: str | Path) -> dict[str, Any]:
    """``<sweep_dir>/sweep.json`` as a mapping; every point's ``dir`` (or, in older manifests, ``name``) is set
    and checked: a directory name inside ``sweep_dir``.

    Raises:
      UsageError: the file is missing or not a sweep manifest, naming the point whose entry is malformed.
    """
    path = Path(sweep_dir) / MANIFEST
    try:
        data = load_json(path.read_text())
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err.strerror or err}.") from None
    except ValueError as err:
        raise UsageError(f"{path} is not a sweep manifest ({err}).") from None
    if not isinstance(data, dict) or not isinstance(data.get("points"), list):
        raise UsageError(f"{path} is not a sweep manifest (no `points` list).")
    for i, point in enumerate(data["points"]):
        where = point.get("dir", point.get("name")) if isinstance(point, dict) else None
        if not (isinstance(where, str) and where.strip() and "\0" not in where and not Path(where).is_absolute()
                and ".." not in Path(where).parts):
            found = f"`dir` {json.dumps(where)[:40]}" if isinstance(point, dict) else json.dumps(point)[:40]
            raise UsageError(f"{path} is not a sweep manifest: `points[{i}]` must be an object whose `dir` names a "
                             f"directory inside {path.parent}, found {found}.")
        point["dir"] = where
    return data

