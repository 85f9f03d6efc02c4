"""Run an experiment end to end: build, train round by round, evaluate, checkpoint, save and plot.

A run directory holds ``config.toml`` (the resolved config), ``run_info.json`` (partition summary, per-client
budgets and noise), ``metrics.jsonl``, ``summary.json``, ``accuracy.png``, ``loss.png`` and ``checkpoint.pt``.
``resume`` continues from the checkpoint; every draw is keyed by (seed, round, client, stage), so a resumed run
ends with the same model as an uninterrupted one.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from trustfl.config.build import build_federation
from trustfl.config.load import config_to_dict, dump_toml, load_config
from trustfl.config.schema import ExperimentConfig
from trustfl.engine.allocator import tune_allocator
from trustfl.engine.federation import EngineState, Federation
from trustfl.engine.sync import evaluate, initial_state, run_round
from trustfl.errors import CheckpointError
from trustfl.report.files import append_metrics, read_metrics, truncate_metrics, write_json
from trustfl.report.plots import plot_run

CHECKPOINT = "checkpoint.pt"


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    params: torch.Tensor


def _config_hash(cfg: ExperimentConfig) -> str:
    return hashlib.sha256(dump_toml(config_to_dict(cfg)).encode()).hexdigest()[:12]


def default_run_dir(cfg: ExperimentConfig, root: str | Path = "runs") -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(root) / f"{cfg.name}-{cfg.data.dataset}-seed{cfg.seed}-{stamp}"
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    return path


def save_checkpoint(run_dir: Path, state: EngineState, cfg_hash: str) -> None:
    tmp = run_dir / (CHECKPOINT + ".tmp")
    torch.save({"config_hash": cfg_hash, "state": dataclasses.asdict(state)}, tmp)
    tmp.replace(run_dir / CHECKPOINT)


def load_checkpoint(run_dir: Path, cfg_hash: str) -> EngineState:
    path = run_dir / CHECKPOINT
    if not path.is_file():
        raise CheckpointError(f"{run_dir} has no {CHECKPOINT}: nothing to resume (was checkpoint_every 0?).")
    try:
        data = torch.load(path, weights_only=False)
    except Exception as err:  # a truncated or foreign file
        raise CheckpointError(f"{path} cannot be read: {err}") from None
    if data.get("config_hash") != cfg_hash:
        raise CheckpointError(f"{path} belongs to another configuration than {run_dir / 'config.toml'}.")
    return EngineState(**data["state"])


def _privacy_row(fed: Federation) -> dict[str, float]:
    if fed.ledger is None or len(fed.ledger) == 0:
        return {}
    eps = list(fed.ledger.epsilons().values())
    return {"epsilon_min": min(eps), "epsilon_median": statistics.median(eps), "epsilon_max": max(eps)}


class _Progress:
    """A tqdm bar on a terminal; plain log lines otherwise."""

    def __init__(self, total: int, start: int, enabled: bool, name: str) -> None:
        self.enabled, self.name, self.total = enabled, name, total
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=start, desc=name, unit="round", dynamic_ncols=True)

    def update(self, row: dict[str, Any] | None, round_: int) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if row is not None:
                self.bar.set_postfix(acc=f"{row['accuracy']:.4f}", loss=f"{row['loss']:.3f}")
        elif self.enabled and row is not None:
            print(f"[{self.name}] round {round_}/{self.total} accuracy={row['accuracy']:.4f} "
                  f"loss={row['loss']:.4f} time={row['wall_time_s']:.1f}s", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_experiment(cfg: ExperimentConfig, out: str | Path | None = None, *, resume: str | Path | None = None,
                   data_dir: str | None = None, progress: bool = True, checkpoint_every: int | None = None,
                   stop_after: int | None = None,
                   on_eval: Callable[[dict[str, Any]], None] | None = None) -> RunResult:
    """Run ``cfg`` (or resume the run in ``resume``) and return the run directory, summary, rows and model.

    Args:
      stop_after: stop after this many rounds in total (simulates an interruption; tests use it).
    """
    tune_allocator()
    if resume is not None:
        run_dir = Path(resume)
        cfg = load_config(run_dir / "config.toml")
    else:
        run_dir = Path(out) if out is not None else default_run_dir(cfg)
        run_dir.mkdir(parents=True, exist_ok=True)
    fed = build_federation(cfg, data_dir=data_dir, quiet=not progress)
    cfg_hash = _config_hash(cfg)
    metrics_path = run_dir / "metrics.jsonl"
    every = cfg.engine.checkpoint_every if checkpoint_every is None else checkpoint_every
    if resume is not None:
        state = load_checkpoint(run_dir, cfg_hash)
        if fed.ledger is not None and state.ledger is not None:
            fed.ledger.load_state_dict(state.ledger)
        truncate_metrics(metrics_path, state.round)
    else:
        (run_dir / "config.toml").write_text(dump_toml(config_to_dict(cfg)))
        write_json(run_dir / "run_info.json", fed.info)
        metrics_path.write_text("")
        state = initial_state(fed)
    last = cfg.rounds if stop_after is None else min(cfg.rounds, stop_after)
    bar = _Progress(cfg.rounds, state.round, progress, cfg.name)
    try:
        while state.round < last:
            state, round_metrics = run_round(fed, state)
            row = None
            if state.round % fed.eval_every == 0 or state.round == cfg.rounds:
                row = {**round_metrics, **evaluate(fed, state.params), "wall_time_s": state.wall_time_s,
                       "rejected_total": state.rejected_total, **_privacy_row(fed)}
                row = {"round": row.pop("round"), "accuracy": row.pop("accuracy"), "loss": row.pop("loss"), **row}
                append_metrics(metrics_path, row)
                if on_eval is not None:
                    on_eval(row)
            bar.update(row, state.round)
            if every and (state.round % every == 0 or state.round == last):
                save_checkpoint(run_dir, state, cfg_hash)
    finally:
        bar.close()
    rows = read_metrics(run_dir)
    summary = _summary(cfg, fed, state, rows)
    write_json(run_dir / "summary.json", summary)
    plot_run(run_dir, rows, cfg.name)
    return RunResult(run_dir, summary, rows, state.params)


def _summary(cfg: ExperimentConfig, fed: Federation, state: EngineState, rows: list[dict[str, Any]]) -> dict:
    accs = [r["accuracy"] for r in rows]
    out: dict[str, Any] = {
        "name": cfg.name, "algorithm": cfg.algorithm, "dataset": fed.info.get("dataset"),
        "final_accuracy": accs[-1] if accs else math.nan, "best_accuracy": max(accs) if accs else math.nan,
        "final_loss": rows[-1]["loss"] if rows else math.nan, "rounds": state.round,
        "rounds_planned": cfg.rounds, "wall_time_s": state.wall_time_s, "seed": cfg.seed,
        "bytes_up_total": state.bytes_up_total, "bytes_down_total": state.bytes_down_total,
        "rejected_total": state.rejected_total, "num_parameters": fed.layout.numel,
    }
    if "notice" in fed.info:
        out["notice"] = fed.info["notice"]
    if fed.ledger is not None:
        out["epsilon"] = {str(k): v for k, v in fed.ledger.epsilons().items()}
        deltas = {fed.ledger[c].budget.delta for c in fed.ledger.client_ids}
        out["delta"] = deltas.pop() if len(deltas) == 1 else sorted(deltas)  # a recipe may set δ itself
    return out


def run_config_file(path: str | Path, overrides: list[str] = (), **kwargs: Any) -> RunResult:
    return run_experiment(load_config(path, overrides), **kwargs)
