"""Run-directory files: ``metrics.jsonl``, ``summary.json``, ``run_info.json``.

``metrics.jsonl`` holds one JSON object per round, in round order. Every row has ``round``, ``wall_time_s``, the
round's bytes, ``rejected_total``, the privacy columns and whatever the engine reports for the round (e.g.
``train_loss``); the evaluation metrics (``accuracy``, ``loss``, ...) are present only in the rows of evaluated
rounds (every ``engine.eval_every`` rounds and the last one). A metric's curve is the rows that carry it:
:func:`metric_rows`.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

from trustfl.errors import UsageError


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def check_out_dir(out: str | Path) -> Path:
    """``out`` as a path for a command's ``--out`` directory, refused (UsageError) when it names a file."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {str(out)!r} is a file, not a directory.")
    return path


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(_clean(data), indent=2, sort_keys=False) + "\n")


def append_metrics(path: Path, row: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(_clean(row)) + "\n")


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows, number = [], 0
    try:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                rows.append(json.loads(line))
                _check_row(rows[-1])
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as err:
        raise UsageError(f"{path} is not a trustfl metrics file (line {number}: {err}).") from None
    return rows


def _check_row(row: Any) -> None:
    """A metrics row is a JSON object whose ``round`` is a whole number >= 0 (the key every reader sorts on)."""
    if not isinstance(row, dict):
        raise ValueError(f"a row must be a JSON object, found {type(row).__name__}")
    r = row.get("round")
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        raise ValueError(f"`round` must be an integer >= 0, found {r!r}")


def metric_rows(rows: Iterable[dict[str, Any]], metric: str | Sequence[str]) -> list[dict[str, Any]]:
    """The rows that carry ``metric`` (or any of several metrics): the evaluated rows of a run."""
    names = (metric,) if isinstance(metric, str) else tuple(metric)
    return [r for r in rows if any(m in r for m in names)]


def truncate_metrics(path: Path, last_round: int) -> None:
    """Keep only rows up to ``last_round`` (a resumed run rewrites what came after its checkpoint)."""
    rows = [r for r in read_metrics(path.parent) if r.get("round", 0) <= last_round]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_lines(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(_clean(r)) + "\n" for r in rows))
