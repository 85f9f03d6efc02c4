"""Run an experiment end to end: build, train round by round, evaluate, checkpoint, save and plot.

A run directory holds ``config.toml`` (the resolved config), ``run_info.json`` (partition summary, per-client
budgets and noise), ``metrics.jsonl`` (one row per round; evaluation metrics in the rows of evaluated rounds),
``summary.json``, ``model.pt`` (the final model's ``state_dict()``), one ``<metric>.png`` per evaluation metric
(``accuracy.png`` and ``loss.png`` for classification; ``mse.png``, ``mae.png``, ``r2.png`` for regression),
``checkpoint.pt`` and, with ``report.tensorboard``, ``tensorboard/`` (every row's scalars). The engine is
resolved from ``engine.kind`` through the registry; the run loop (``engine/loop.py``) is the same for every
engine.
``resume`` continues from the checkpoint (without one, runs again from round 1 in the run's directory); every draw
is keyed by (seed, round, client, stage), so a resumed run ends with the same model as an uninterrupted one.
Under torchrun the ranks split each cohort's local training (:mod:`trustfl.engine.distributed`) and rank 0 alone
writes the run directory (docs/scaling_torchrun.md).
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import math
import os
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trustfl.core.heap import import_torch

import_torch()  # first, so that a run's start-up freezes torch's objects out of every later full collection

import torch

from trustfl.config.build import build_federation, resolve_engine
from trustfl.config.device import refuse_meta_default
from trustfl.config.load import config_to_dict, dump_toml, load_config
from trustfl.config.schema import ExperimentConfig, FieldError
from trustfl.engine.allocator import tune_allocator
from trustfl.engine.base import AbstractEngine
from trustfl.engine.distributed import DistributedExecutor, Ranks, check_same, from_main, ranks_from_env, session
from trustfl.engine.federation import EngineState, Federation
from trustfl.engine.checkpoint import CHECKPOINT, data_digest, load_checkpoint, save_checkpoint
from trustfl.engine.loop import (MODEL, Progress, all_rejected, diverged, evaluate, metric_names, run_rounds,
                                 save_model, skipped)
from trustfl.errors import ConfigError, UsageError
from trustfl.evaluate.base import higher_is_better
from trustfl.core.runfiles import (DEPLOYMENT_JOURNAL, hold_run_dir, metric_rows, read_json_object, read_metrics,
                                   truncate_metrics, write_json, writing)
from trustfl.report.plots import plot_run
from trustfl.report.sweep_points import flatten_config

__all__ = ["CHECKPOINT", "MODEL", "RunResult", "default_run_dir", "load_checkpoint", "run_config_file",
           "run_experiment", "save_checkpoint"]


@dataclass
class RunResult:
    """What a run leaves: its directory, ``summary.json``, the ``metrics.jsonl`` rows and the final flat model.

    ``rows`` holds one row per round (of the whole run, resumed or not); the evaluation metrics are only in the
    rows of evaluated rounds, so a metric's curve is :meth:`curve` (or ``[r for r in rows if metric in r]``).
    """

    run_dir: Path
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    params: torch.Tensor

    def curve(self, metric: str, x: str = "round") -> list[tuple[Any, Any]]:
        """``(x, metric)`` for every row that carries ``metric`` (the evaluated rounds), in round order."""
        return [(r.get(x), r[metric]) for r in metric_rows(self.rows, metric)]

    @property
    def model_path(self) -> Path:
        """``model.pt``: the final model's ``state_dict()`` (``torch.load`` + ``model.load_state_dict``)."""
        return self.run_dir / MODEL


def with_device(cfg: ExperimentConfig, device: str) -> ExperimentConfig:
    """``cfg`` with ``engine.device = device``.

    Raises:
      ConfigError: naming ``engine.device`` when ``device`` is not a device name.
    """
    try:
        return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, device=device))
    except FieldError as err:
        raise ConfigError(f"`engine.{err.name}` must be {err.allowed}, found {err.value!r}.") from None


def config_identity(cfg: ExperimentConfig) -> str:
    """The TOML text a checkpoint is resumed under. ``engine.device`` is not part of it (a run checkpointed on a
    GPU may resume on the CPU), nor is ``engine.dtype`` at its default (checkpoints written before the key
    existed keep their hash)."""
    data = config_to_dict(cfg)
    data["engine"].pop("device", None)
    if data["engine"].get("dtype") == "float32":
        data["engine"].pop("dtype")
    return dump_toml(data)


def config_hash(cfg: ExperimentConfig | str) -> str:
    """The hash of :func:`config_identity` (of ``cfg``, or the identity text itself), which a checkpoint is
    stamped with."""
    identity = cfg if isinstance(cfg, str) else config_identity(cfg)
    return hashlib.sha256(identity.encode()).hexdigest()[:12]


def default_run_dir(cfg: ExperimentConfig, root: str | Path = "runs") -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{cfg.name}-{cfg.data.dataset}-seed{cfg.seed}-{stamp}"
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    return path


def run_experiment(cfg: ExperimentConfig, out: str | Path | None = None, *, resume: str | Path | None = None,
                   data_dir: str | None = None, progress: bool = True, checkpoint_every: int | None = None,
                   stop_after: int | None = None,
                   on_eval: Callable[[dict[str, Any]], None] | None = None, plots: bool = True,
                   engine: Callable[[Federation], AbstractEngine] | None = None,
                   device: str | None = None) -> RunResult:
    """Run ``cfg`` (or resume the run in ``resume``) and return the run directory, summary, rows and model.

    Args:
      cfg: the run's config; with ``resume``, ``None`` or the run's own (its ``config.toml``), which it goes on with.
      stop_after: stop after this many rounds in total (simulates an interruption; tests use it).
      on_eval: called with the row of every evaluated round.
      plots: write the ``<metric>.png`` plots (False: skip them, e.g. in sweeps).
      engine: builds the engine from the federation instead of ``engine.kind`` (a deployment's remote engine).
      device: overrides ``engine.device`` (e.g. resume on the CPU a run checkpointed on a GPU; the run
        directory's ``config.toml`` is not rewritten, and the checkpoint's tensors are mapped to the new device).

    Under torchrun (``WORLD_SIZE`` > 1) every process calls this with the same arguments: each trains its slice
    of every cohort (:mod:`trustfl.engine.distributed`), rank 0 alone evaluates, writes the run directory, shows
    progress and calls ``on_eval``, and every rank returns rank 0's result.

    Raises:
      ConfigError: ``out``, or a ``cfg`` other than the run's own config, given with ``resume``; under torchrun,
        a vertical engine (it does not split across processes).
      CheckpointError, UsageError: with ``resume``, a run directory that cannot be resumed as it is (a damaged or
        foreign checkpoint, rows lost from ``metrics.jsonl``, an ``engine.eval_initial`` run without its
        ``run_info.json``).
      DistributedError: a malformed torchrun environment, or ranks that diverged.
    """
    _check_arguments(cfg, out, resume, data_dir, checkpoint_every, stop_after, on_eval, engine)
    tune_allocator()
    ranks = ranks_from_env()
    with session(ranks):
        return _run(cfg, out, ranks, resume=resume, data_dir=data_dir, progress=progress,
                    checkpoint_every=checkpoint_every, stop_after=stop_after, on_eval=on_eval, plots=plots,
                    engine=engine, device=device)


def _check_arguments(cfg: Any, out: Any, resume: Any, data_dir: Any, checkpoint_every: Any, stop_after: Any,
                     on_eval: Any, engine: Any) -> None:
    """Refuse :func:`run_experiment` arguments of the wrong kind, or a call under torch's default device 'meta',
    before anything is built or written."""
    def fail(name: str, value: Any, allowed: str) -> None:
        raise ConfigError(f"run_experiment: `{name}` must be {allowed}, found {value!r}.")

    if resume is None and not isinstance(cfg, ExperimentConfig):
        fail("cfg", cfg, "an ExperimentConfig (e.g. from trustfl.config.load.load_config), or None with `resume`")
    if resume is not None and out is not None:  # it would be ignored: the run goes on in its own directory
        raise ConfigError(f"run_experiment: `resume` continues the run in its own directory {str(resume)!r}; pass "
                          f"`out` as None with it.")
    if resume is not None and cfg is not None and not isinstance(cfg, ExperimentConfig):
        fail("cfg", cfg, "None or the run's own config with `resume`")
    for name, value in (("out", out), ("resume", resume), ("data_dir", data_dir)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            fail(name, value, "a path (a string or os.PathLike) or None")
        if isinstance(value, str) and not value:  # Path('') is the working directory, whose run it would replace
            fail(name, value, "a path (`.` for the working directory) or None, not the empty string")
    for name, value in (("checkpoint_every", checkpoint_every), ("stop_after", stop_after)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            fail(name, value, "an integer >= 0 or None")
    for name, value in (("on_eval", on_eval), ("engine", engine)):
        if value is not None and not callable(value):
            fail(name, value, "a function or None")
    refuse_meta_default("run_experiment")


def _run(cfg: ExperimentConfig, out: str | Path | None, ranks: Ranks | None, *, resume: str | Path | None,
         data_dir: str | None, progress: bool, checkpoint_every: int | None, stop_after: int | None,
         on_eval: Callable[[dict[str, Any]], None] | None, plots: bool,
         engine: Callable[[Federation], AbstractEngine] | None, device: str | None) -> RunResult:
    """:func:`run_experiment` in one process, or as rank ``ranks.rank`` of a torchrun job: every rank builds and
    runs the federation (its executor trains the rank's slice of each cohort); rank 0 alone evaluates, writes the
    run directory and shows progress, and every rank returns rank 0's summary and rows."""
    main = ranks is None or ranks.main
    if resume is not None:  # under torchrun every rank reads the run directory: one machine or a shared file system
        run_dir = Path(resume)
        given, cfg = cfg, load_config(run_dir / "config.toml")
        if given is not None and given != cfg:  # it would be ignored: the run goes on with its own config
            mine, theirs = flatten_config(config_to_dict(given)), flatten_config(config_to_dict(cfg))
            differ = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k, None) != theirs.get(k, None))
            raise ConfigError(f"run_experiment: `cfg` differs from the config.toml of the run it resumes in "
                              f"{str(resume)!r} (at {', '.join(f'`{k}`' for k in differ[:5]) or 'a key it lacks'}); "
                              f"pass None, or that config, with `resume`.")
    if device is not None:
        cfg = with_device(cfg, device)
    if cfg.report.tensorboard and main:
        summary_writer()  # a missing package is refused before anything is built or written
    if resume is None:
        run_dir = Path(out) if out is not None else default_run_dir(cfg)
        if main:
            with writing(run_dir):
                run_dir.mkdir(parents=True, exist_ok=True)
        run_dir = from_main(ranks, run_dir)  # the default name holds rank 0's clock
    with writing(run_dir), hold_run_dir(run_dir) if main else nullcontext():
        return _train(cfg, run_dir, ranks, resume=resume is not None, data_dir=data_dir, progress=progress,
                      checkpoint_every=checkpoint_every, stop_after=stop_after, on_eval=on_eval, plots=plots,
                      engine=engine)


def _train(cfg: ExperimentConfig, run_dir: Path, ranks: Ranks | None, *, resume: bool, data_dir: str | None,
           progress: bool, checkpoint_every: int | None, stop_after: int | None,
           on_eval: Callable[[dict[str, Any]], None] | None, plots: bool,
           engine: Callable[[Federation], AbstractEngine] | None) -> RunResult:
    """:func:`_run` once the run directory is known (and held by rank 0): build, restore or start, run, save."""
    main = ranks is None or ranks.main
    if resume and engine is None and (run_dir / DEPLOYMENT_JOURNAL).is_file():
        raise ConfigError(f"resume: {run_dir} holds {DEPLOYMENT_JOURNAL}: it is the run directory of a deployment, "
                          f"whose nodes hold their own state (and secrets) of its rounds; resume it as a deployment "
                          f"(`resume` in the Flower app's run config, docs/deployment.md), not as a simulation.")
    fed = build_federation(cfg, data_dir=data_dir, quiet=not (progress and main))
    if ranks is not None:
        if fed.vertical is not None:
            raise ConfigError(f"`engine.kind` = {fed.info['engine']!r}: the vertical engine does not run under "
                              f"torchrun (WORLD_SIZE={ranks.world_size}); run it in one process.")
        fed.executor = DistributedExecutor(fed.executor, ranks)
    # no checkpoint at all (a directory or a dangling link in its place is refused by load_checkpoint, naming it)
    restart = resume and engine is None and not os.path.lexists(run_dir / CHECKPOINT)  # a deployment's was refused
    engine = resolve_engine(cfg, fed.info["engine"]) if engine is None else engine(fed)  # after the recipe
    identity = config_identity(cfg)
    cfg_hash = config_hash(identity)
    metrics_path = run_dir / "metrics.jsonl"
    every = cfg.engine.checkpoint_every if checkpoint_every is None else checkpoint_every
    files = fed.timing.speed.file_data() if fed.timing is not None else None  # a trace's step times
    digest = data_digest(fed.dataset, files) if main and (every or resume) else None
    if restart and progress and main:  # every draw is seeded: running it again gives the run it would have been
        print(f"notice: {run_dir} has no {CHECKPOINT} (interrupted before its first checkpoint, or "
              f"engine.checkpoint_every = 0): the run starts again from round 1.", file=sys.stderr)
    if resume and not restart:
        state = load_checkpoint(run_dir, cfg_hash, map_location=fed.initial_params.device, data=digest,
                                like=fed.initial_params, config=identity)
        saved_info = _saved_run_info(run_dir, fed.eval_initial)
        if fed.eval_initial:
            fed.info["initial_evaluation"] = saved_info["initial_evaluation"]
        if fed.ledger is not None and state.ledger is not None:
            fed.ledger.load_state_dict(state.ledger)
        if main:
            truncate_metrics(metrics_path, state.round)
    else:
        state = engine.initial_state(fed)
        if main:
            if not restart:  # a restarted run keeps its own config.toml (a --device given to resume is not in it)
                (run_dir / "config.toml").write_text(dump_toml(config_to_dict(cfg)))
            if fed.eval_initial:  # the untrained model's metrics (e.g. a random network's linear probe: the floor)
                fed.info["initial_evaluation"] = evaluate(fed, state.params, "of the initial model")
            write_json(run_dir / "run_info.json", fed.info)
            metrics_path.write_text("")
    last = cfg.rounds if stop_after is None else min(cfg.rounds, stop_after)
    primary = primary_metric(cfg, fed)
    bar = Progress(cfg.rounds, state.round, progress and main, cfg.name, primary)
    board = TensorBoard(run_dir / "tensorboard", state.round + 1) if cfg.report.tensorboard and main else None
    try:
        state = run_rounds(fed, engine, state, run_dir=run_dir, cfg_hash=cfg_hash, data_digest=digest,
                           rounds=cfg.rounds, last=last, checkpoint_every=every, progress=bar, on_eval=on_eval,
                           on_row=board, record=main, config=identity)
    finally:
        if board is not None:
            board.close()
    check_same(ranks, state.round, state.params)
    summary = rows = None
    if main:
        rows = read_metrics(run_dir)
        summary = _summary(cfg, fed, state, rows)
        write_json(run_dir / "summary.json", summary)
        save_model(run_dir, fed, state.params)
        if plots:
            notices: list[str] = []
            plot_run(run_dir, rows, cfg.name, metric_names(fed), notices)
            for notice in notices if progress else ():
                print(f"notice: {notice}", file=sys.stderr)
    summary, rows = from_main(ranks, (summary, rows))
    return RunResult(run_dir, summary, rows, state.params)


def _saved_run_info(run_dir: Path, eval_initial: bool) -> dict[str, Any]:
    """The ``run_info.json`` the interrupted run wrote, which the resumed run keeps.

    Raises:
      UsageError: the file is missing, not a JSON object or with a key of another type (the resumed run would
        leave one ``trustfl report`` refuses), or, for an ``engine.eval_initial`` run, lacks the initial model's
        metrics (a resumed summary would drop ``initial_<metric>``).
    """
    path = run_dir / "run_info.json"
    saved = read_json_object(path, {"initial_evaluation": dict, "evaluators": list})  # as `trustfl report` reads it
    if eval_initial and not isinstance(saved.get("initial_evaluation"), dict):
        what = "holds no `initial_evaluation`" if path.is_file() else "is missing"
        raise UsageError(f"{path} {what}: the run evaluated its initial model there (`engine.eval_initial`), and "
                         f"its summary would lose initial_<metric>. Restore the file, or start afresh with "
                         f"--overwrite.")
    if not path.is_file():
        raise UsageError(f"{path} is missing: the run wrote it when it started, and the resumed run would leave a "
                         f"directory without it. Restore the file, or start afresh with --overwrite.")
    return saved


def summary_writer() -> type:
    """``torch.utils.tensorboard.SummaryWriter``; a ConfigError naming ``report.tensorboard`` when the optional
    ``tensorboard`` package is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("`report.tensorboard` is true but the tensorboard package is not installed (or too "
                          "old): run `pip install tensorboard` (or set `report.tensorboard = false`).") from None
    return SummaryWriter


class TensorBoard:
    """Writes every metrics row's numbers as TensorBoard scalars (tag = the row's key, step = its round).

    ``first_step`` is the first round this writer sees: a resumed (or restarted) run hides what an interrupted one
    logged from that round on (``SummaryWriter``'s ``purge_step``), so every round has one value per tag.
    """

    def __init__(self, log_dir: Path, first_step: int = 1) -> None:
        purge = first_step > 1 or log_dir.exists()  # also a run restarted from round 1 in its own directory
        self.writer = summary_writer()(log_dir=str(log_dir), purge_step=first_step if purge else None)

    def __call__(self, row: dict[str, Any]) -> None:
        step = int(row["round"])
        for key, value in row.items():
            if key != "round" and isinstance(value, (int, float)):
                self.writer.add_scalar(key, float(value), step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def primary_metric(cfg: ExperimentConfig, fed: Federation) -> str:
    """``report.primary_metric``, or the first metric of the first evaluator."""
    return cfg.report.primary_metric or metric_names(fed)[0]


def _best(values: list[float], metric: str) -> float:
    finite = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    if not finite:
        return math.nan
    return max(finite) if higher_is_better(metric) else min(finite)


def _summary(cfg: ExperimentConfig, fed: Federation, state: EngineState, rows: list[dict[str, Any]]) -> dict:
    primary = primary_metric(cfg, fed)
    out: dict[str, Any] = {"name": cfg.name, "algorithm": cfg.algorithm, "dataset": fed.info.get("dataset"),
                           "engine": fed.info["engine"], "objective": fed.info.get("objective"),
                           "primary_metric": primary, "metrics": metric_names(fed)}
    for metric in metric_names(fed):  # the values of the evaluated rounds; final = the last evaluation
        values = [r[metric] for r in metric_rows(rows, metric)]
        out[f"final_{metric}"] = values[-1] if values else math.nan
        out[f"best_{metric}"] = _best(values, metric)
    out.update({"rounds": state.round, "rounds_planned": cfg.rounds, "wall_time_s": state.wall_time_s,
                "seed": cfg.seed, "bytes_up_total": state.bytes_up_total,
                "bytes_down_total": state.bytes_down_total, "rejected_total": state.rejected_total,
                "rounds_all_rejected": sum(all_rejected(r) for r in rows), "rounds_skipped": sum(map(skipped, rows)),
                "rounds_diverged": sum(map(diverged, rows)),
                "num_parameters": fed.layout.numel})
    if "notice" in fed.info:
        out["notice"] = fed.info["notice"]
    for metric, value in fed.info.get("initial_evaluation", {}).items():
        out[f"initial_{metric}"] = value
    if fed.ledger is not None:
        out["epsilon"] = {str(k): v for k, v in fed.ledger.epsilons().items()}
        deltas = {fed.ledger[c].budget.delta for c in fed.ledger.client_ids}
        out["delta"] = deltas.pop() if len(deltas) == 1 else sorted(deltas)  # a recipe may set δ itself
    return out


def run_config_file(path: str | Path, overrides: list[str] = (), **kwargs: Any) -> RunResult:
    return run_experiment(load_config(path, overrides), **kwargs)
