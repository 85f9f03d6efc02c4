"""Text tables of run metrics (``trustfl report RUN_DIR``): one line per evaluated round."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from trustfl.errors import TrustFLError, UsageError
from trustfl.core.runfiles import SUMMARY_TYPES, metric_rows, read_json_object, read_metrics, writing
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
    evaluated yet), summary and the plots' notices (values they cannot draw) as text.

    Raises:
      UsageError: ``run_dir`` is not a path, or holds unreadable run files (naming the file).
    """
    if not isinstance(run_dir, (str, os.PathLike)):
        raise UsageError(f"report_run: `run_dir` must be a path (a string or os.PathLike), found {repr(run_dir)[:60]}.")
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir)
    if not rows:
        raise TrustFLError(f"{run_dir} holds no metrics.jsonl rows: is it a trustfl run directory?")
    summary = read_json_object(run_dir / "summary.json", SUMMARY_TYPES)
    metrics = summary.get("metrics") or [m for m in ("accuracy", "loss") if any(m in r for r in rows)]
    notices: list[str] = []
    with writing(run_dir):
        plot_run(run_dir, rows, summary.get("name", run_dir.name), metrics, notices)
    text = format_table(metric_rows(rows, metrics) or rows, ("round", *metrics, *_TAIL))
    if summary:
        primary = summary.get("primary_metric", "accuracy")
        keys = (f"final_{primary}", f"best_{primary}", "rounds", "wall_time_s", "seed")
        said = ("rounds_all_rejected", "rounds_skipped", "rounds_diverged")
        keys += tuple(k for k in said if summary.get(k))  # said when any
        text += "\n\n" + "  ".join(f"{k}={_fmt(summary.get(k))}" for k in keys if k in summary)
    return text + "".join(f"\nnotice: {n}" for n in notices)
