"""The run loop every engine shares: rounds, metrics rows, evaluation, checkpoints, resume and progress.

An engine only implements its round (:class:`trustfl.engine.base.AbstractEngine`); this module runs rounds until
the planned number and appends one row per round to ``metrics.jsonl``: the round's own metrics (bytes,
``train_loss``, rejections, stage metrics), ``wall_time_s``, ``rejected_total`` and the ε spent, plus the global
model's evaluation with the federation's evaluators on evaluated rounds (every ``eval_every`` rounds, the last
round, and the round an engine finishes early). It saves ``checkpoint.pt`` (the whole :class:`EngineState`,
client state store included) and shows progress. ``resume`` restores the state bitwise, so a resumed run ends
with the same model.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from trustfl.core.memory import out_of_memory_as_error
from trustfl.core.runfiles import append_metrics
from trustfl.engine.base import AbstractEngine
from trustfl.engine.checkpoint import save_atomically, save_checkpoint
from trustfl.engine.federation import EngineState, Federation
from trustfl.errors import ConfigError
from trustfl.evaluate.base import evaluate_model

MODEL = "model.pt"
ROUND_SIZES = ("`cohort.size` or `engine.max_clients_per_batch`, `client.batch_size`, the model, the number of "
               "views")
"""What sizes a round's memory (named when an allocation inside a round fails)."""
EVAL_SIZES = "the model's outputs, the test and training sets or `engine.eval_batch_size`"
"""What sizes an evaluation's memory (representation evaluators hold the features of both sets)."""


def model_state_dict(fed: Federation, params: torch.Tensor) -> dict[str, torch.Tensor]:
    """``fed.model.state_dict()`` with the flat global model ``params`` in place of the parameters: CPU tensors
    that ``model.load_state_dict`` takes for the model class ``fed.model`` is (buffers as the model holds them)."""
    flat = fed.layout.unflatten(params.detach())
    return {k: (flat[k] if k in flat else v).detach().to("cpu", copy=True).contiguous()
            for k, v in fed.model.state_dict().items()}


def save_model(run_dir: Path, fed: Federation, params: torch.Tensor) -> Path:
    """Write ``model.pt``: :func:`model_state_dict` of ``params``, loadable with ``torch.load`` alone."""
    save_atomically(model_state_dict(fed, params), run_dir / MODEL)
    return run_dir / MODEL


@torch.no_grad()
def evaluate(fed: Federation, params: torch.Tensor, when: str) -> dict[str, float]:
    """The federation's evaluators on the held-out test set, for the flat global model ``params``; a failed
    allocation is a ResourceError "the evaluation ``when`` needs more memory ..." naming :data:`EVAL_SIZES`."""
    with out_of_memory_as_error(f"the evaluation {when}", EVAL_SIZES):
        return evaluate_model(fed.model, fed.objective, fed.evaluators, fed.layout.unflatten(params), fed.test_data,
                              fed.eval_batch_size, fed.train_data.tensors)


def metric_names(fed: Federation) -> list[str]:
    """The evaluation metrics a run of ``fed`` records, in evaluator order."""
    return [name for e in fed.evaluators for name in e.metrics]


ROW_COLUMNS = ("round", "wall_time_s", "rejected_total", "cohort_size", "rejected", "skipped", "diverged",
               "attack_idle", "train_loss", "bytes_up", "bytes_down", "bytes_up_total", "bytes_down_total",
               "epsilon_min", "epsilon_median", "epsilon_max", "sim_time", "bits_up", "bits_down", "bits_up_total",
               "bits_down_total", "local_steps", "local_steps_total", "decode_failures", "decode_failures_total")
"""Columns the engines write in ``metrics.jsonl`` rows: no evaluator metric may take one's name (an engine's
other round metrics are checked against the evaluated ones as each row is made)."""


def _privacy_row(fed: Federation) -> dict[str, float]:
    if fed.ledger is None or len(fed.ledger) == 0:
        return {}
    eps = list(fed.ledger.epsilons().values())
    return {"epsilon_min": min(eps), "epsilon_median": statistics.median(eps), "epsilon_max": max(eps)}


class Progress:
    """A tqdm bar on a terminal; plain log lines otherwise. Shows the primary metric and the loss of the last
    evaluated round (the bar advances every round; a log line is printed per evaluated round)."""

    def __init__(self, total: int, start: int, enabled: bool, name: str, primary: str) -> None:
        self.enabled, self.name, self.total, self.primary = enabled, name, total, primary
        self.warned: set[str] = set()  # the first round of each kind that left the model in place is said once
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=start, desc=name, unit="round", dynamic_ncols=True)

    def _shown(self, row: dict[str, Any]) -> dict[str, str]:
        keys = [self.primary] + (["loss"] if self.primary != "loss" and "loss" in row else [])
        return {k: f"{row[k]:.4f}" for k in keys if isinstance(row.get(k), (int, float))}

    def update(self, row: dict[str, Any] | None, round_: int, evaluated: bool = True) -> None:
        """Advance by one round; ``row`` is the round's metrics row, ``evaluated`` whether it holds an evaluation."""
        shown = row is not None and evaluated
        if self.enabled and row is not None and "rejected" not in self.warned and all_rejected(row):
            self.warned.add("rejected")
            self._say(f"[{self.name}] warning: round {round_} rejected all {row['cohort_size']} messages (NaN or Inf, "
                      f"malformed, or screened out), so the model did not move; a diverging local step (e.g. too "
                      f"large a `client.lr`) is the usual cause. `rejected` in metrics.jsonl counts them per round.")
        if self.enabled and row is not None and "skipped" not in self.warned and skipped(row):
            self.warned.add("skipped")
            self._say(f"[{self.name}] warning: round {round_} was skipped, so the model did not move: "
                      f"{row['cohort_size'] - row['rejected']} of {row['cohort_size']} messages passed screening, "
                      f"fewer than the aggregator needs. `skipped` and `rejected` in metrics.jsonl mark such rounds.")
        failures = row.get("decode_failures") if row is not None else None
        if self.enabled and "decode" not in self.warned and isinstance(failures, int) and failures > 0:
            self.warned.add("decode")
            self._say(f"[{self.name}] warning: round {round_}: {failures} coordinates fell outside the lattice "
                      f"quantizer's decoding radius and were decoded wrong (a model drifted more than 2**bits·step/2 "
                      f"from its key); raise `bits` or `step` of `compress.uplink` / `downlink`. `decode_failures` in "
                      f"metrics.jsonl counts them per round.")
        if self.enabled and row is not None and "diverged" not in self.warned and diverged(row):
            self.warned.add("diverged")
            self._say(f"[{self.name}] warning: round {round_}'s server step would have made the model non-finite "
                      f"(too large a server learning rate: `server.lr`, a recipe's `server_lr`), so the model did not "
                      f"move. `diverged` in metrics.jsonl marks such rounds.")
        if self.bar is not None:
            self.bar.update(1)
            if shown:
                self.bar.set_postfix(self._shown(row))
        elif self.enabled and shown:
            text = " ".join(f"{k}={v}" for k, v in self._shown(row).items())
            print(f"[{self.name}] round {round_}/{self.total} {text} time={row['wall_time_s']:.1f}s",
                  file=sys.stderr, flush=True)

    def _say(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def all_rejected(row: dict[str, Any]) -> bool:
    """Whether a round's metrics row says the server rejected every message of a non-empty cohort, some of them sent
    (idle Byzantine clients, ``attack_idle``, send nothing and count as rejected: a cohort of them alone was blamed on
    a diverging local step)."""
    size = row.get("cohort_size")
    idle = row.get("attack_idle", 0)
    return isinstance(size, int) and size > 0 and row.get("rejected") == size and \
        not (isinstance(idle, int) and idle >= size)


def diverged(row: dict[str, Any]) -> bool:
    """Whether a round's metrics row says the server's step would have made the model non-finite, so it was not
    taken (:func:`trustfl.engine.round_parts.conclude`)."""
    return bool(row.get("diverged"))


def skipped(row: dict[str, Any]) -> bool:
    """Whether a round's metrics row says the server skipped it: too few messages passed screening for the
    aggregator (:func:`trustfl.engine.round_parts.conclude`)."""
    return bool(row.get("skipped"))


def metrics_row(fed: Federation, state: EngineState, round_metrics: dict[str, Any],
                evaluated: dict[str, float] | None) -> dict[str, Any]:
    """The ``metrics.jsonl`` row of the round that led to ``state``: ``round``, the evaluation metrics (evaluated
    rounds only), the engine's round metrics, ``wall_time_s``, ``rejected_total`` and the ε spent."""
    names = metric_names(fed) if evaluated is not None else []
    metrics = dict(round_metrics)
    tail = {"wall_time_s": state.wall_time_s, "rejected_total": state.rejected_total, **_privacy_row(fed)}
    clash = next((k for k in names if k in metrics or k in tail), None)
    if clash is not None:  # one value would overwrite the other in the row
        raise ConfigError(f"`evaluators`: metric {clash!r} is also a column the engine writes in the round's row; an "
                          f"evaluator of your own must name its metrics otherwise.")
    return {"round": metrics.pop("round", state.round), **{k: evaluated[k] for k in names}, **metrics, **tail}


def run_rounds(fed: Federation, engine: AbstractEngine, state: EngineState, *, run_dir: Path, cfg_hash: str,
               data_digest: str | None, rounds: int, last: int, checkpoint_every: int, progress: Progress,
               on_eval: Callable[[dict[str, Any]], None] | None = None,
               on_row: Callable[[dict[str, Any]], None] | None = None, record: bool = True,
               config: str | None = None) -> EngineState:
    """Run ``engine`` from ``state`` up to round ``last`` (of ``rounds`` planned), writing one row per round and
    checkpoints (stamped with ``cfg_hash`` and ``config``, the TOML text it hashes). ``on_row`` sees every row,
    ``on_eval`` the rows of evaluated rounds.

    ``record=False`` (a torchrun rank other than 0) runs the rounds only: no evaluation, rows, callbacks or
    checkpoints."""
    metrics_path = run_dir / "metrics.jsonl"
    try:
        while state.round < last and not engine.finished(fed, state):
            with out_of_memory_as_error(f"round {state.round + 1}", ROUND_SIZES):
                state, round_metrics = engine.run_round(fed, state)
            done = engine.finished(fed, state)
            if not record:
                continue
            due = state.round % fed.eval_every == 0 or state.round == rounds or done
            evaluated = evaluate(fed, state.params, f"after round {state.round}") if due else None
            row = metrics_row(fed, state, round_metrics, evaluated)
            append_metrics(metrics_path, row)
            if on_row is not None:
                on_row(row)
            if due and on_eval is not None:
                on_eval(row)
            progress.update(row, state.round, evaluated=due)
            if checkpoint_every and (state.round % checkpoint_every == 0 or state.round == last or done):
                save_checkpoint(run_dir, state, cfg_hash, data_digest, config)
    finally:
        progress.close()
    return state
