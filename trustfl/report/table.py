"""Text tables of run metrics (``trustfl report RUN_DIR``): one line per evaluated round."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from trustfl.errors import TrustFLError, UsageError
from trustfl.core.runfiles import (lacking_rows, metric_rows, named, not_a_run_dir, read_json_object, read_metrics,
                                   read_summary, writing)
from trustfl.report.plots import plot_run

_COLUMNS = ("round", "accuracy", "loss", "bytes_up_total", "bytes_down_total", "epsilon_max", "rejected",
            "skipped", "wall_time_s")
_TAIL = ("train_loss", "sim_time", "local_steps_total", "bits_up_total", "bits_down_total", "bytes_up_total",
         "bytes_down_total", "epsilon_max", "rejected", "skipped", "diverged", "wall_time_s")


def _fmt(v: Any) -> str:
    """A value of a row or of the summary: ``null`` (how a NaN is written) as ``nan``."""
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 1e5 else f"{v:.3e}"
    return "nan" if v is None else str(v)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] = _COLUMNS) -> str:
    """One line per row; a cell is empty where the row lacks the column (a metric of rounds not evaluated)."""
    cols = [c for c in columns if any(c in r for r in rows)]
    cells = [[_fmt(r[c]) if c in r else "" for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def report_run(run_dir: str | Path) -> str:
    """Re-plot a run directory and return its metrics table (the evaluated rounds; every round when none is
    evaluated yet), summary and, after them, what the table alone would hide: a run not finished (``unfinished:
    round 32 of 100, no summary.json``), rounds missing from ``metrics.jsonl`` (``warning: ...``), the plots'
    notices (values they cannot draw, a metric no row records). The metrics are ``summary.json``'s, else (a run
    not finished) ``run_info.json``'s evaluators, else ``accuracy`` and ``loss`` where the rows record them.

    Raises:
      UsageError: ``run_dir`` is not a path, is empty, is not a directory, or holds unreadable run files (naming
        the file and key).
    """
    if not isinstance(run_dir, (str, os.PathLike)):
        raise UsageError(f"report_run: `run_dir` must be a path (a string or os.PathLike), found {repr(run_dir)[:60]}.")
    run_dir = named(run_dir, "run directory")
    if not run_dir.is_dir():
        raise not_a_run_dir(run_dir)
    rows = read_metrics(run_dir)
    if not rows:
        raise TrustFLError(f"{run_dir} holds no metrics.jsonl rows: is it a trustfl run directory?")
    summary = read_summary(run_dir / "summary.json")
    named_metrics = summary.get("metrics") or read_json_object(run_dir / "run_info.json", {"evaluators": list}).get(
        "evaluators")
    metrics = list(dict.fromkeys(named_metrics or [m for m in ("accuracy", "loss") if any(m in r for r in rows)]))
    notices: list[str] = []
    with writing(run_dir):
        plot_run(run_dir, rows, summary.get("name", run_dir.name), metrics, notices)
    metrics = [m for m in metrics if any(m in r for r in rows)]  # those missing from every row: said by plot_run
    text = format_table(metric_rows(rows, metrics) or rows, ("round", *metrics, *_TAIL))
    if summary:
        primary = summary.get("primary_metric", "accuracy")
        keys = (f"final_{primary}", f"best_{primary}", "rounds", "wall_time_s", "seed")
        said = ("rounds_all_rejected", "rounds_skipped", "rounds_diverged")
        keys += tuple(k for k in said if summary.get(k))  # said when any
        text += "\n\n" + "  ".join(f"{k}={_fmt(summary.get(k))}" for k in keys if k in summary)
    unfinished = _progress(run_dir, summary, rows)
    if unfinished:
        text += ("\n" if summary else "\n\n") + f"unfinished: {unfinished}"
    lacking = lacking_rows(run_dir / "metrics.jsonl", rows, summary)
    if lacking:
        text += (f"\nwarning: {lacking}: the table and plots end at round {rows[-1]['round']}"
                 + (", and the summary's final values are summary.json's." if summary else "."))
    return text + "".join(f"\nnotice: {n}" for n in notices)


def _progress(run_dir: Path, summary: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str | None:
    """How far an unfinished run got (``round 32 of 100, no summary.json``; its ``config.toml`` plans the rounds),
    ``None`` for a finished one."""
    from trustfl.config.load import read_toml
    from trustfl.report.compare import progress  # not at import: compare imports this package
    from trustfl.report.sweep_points import flatten_config

    path = run_dir / "config.toml"
    config = flatten_config(read_toml(path, "Run config")) if path.is_file() else {}
    return progress(config, summary, rows)
