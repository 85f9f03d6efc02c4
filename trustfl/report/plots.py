"""Plots of a run: one ``<metric>.png`` per evaluation metric against rounds (``accuracy.png``, ``loss.png``,
``mse.png``, ``r2.png``, ...); an asynchronous run adds ``<metric>_vs_sim_time.png`` and ``<metric>_vs_bits.png``.

``metrics.jsonl`` has a row per round and the evaluation metrics only in evaluated rounds: a metric's curve is
drawn through the rows that carry it. A value matplotlib cannot draw (NaN, ±inf, or beyond ±1e300, where it cannot
lay out the axis) is left out, and the plot and a notice say how many and in which rounds. A metric's file name is
the metric with ``/``, ``\\`` and control characters (a NUL) as ``_``. A plot is drawn only where some row records
both its metric and its x axis (a vertical run with a simulated clock records ``sim_time`` but no bits): no empty
plot is written."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Sequence


def _pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend, imported on the first plot (a run with
    ``plots=False`` never imports matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


_AXES = {"round": "round", "sim_time": "simulated time", "bits": "bits sent (up + down)"}


LIMIT = 1e300
"""The largest magnitude drawn: matplotlib cannot lay out an axis that spans values near ±1.8e308."""


def drawable(value: Any) -> bool:
    """Whether ``value`` is a number a plot can draw: finite and within ±:data:`LIMIT`."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and \
        abs(value) <= LIMIT


def file_stem(metric: str) -> str:
    """``metric`` as (part of) a file name: ``/``, ``\\`` and control characters become ``_``; at most 150
    bytes."""
    return re.sub(r"[/\\\x00-\x1f\x7f]", "_", metric).encode()[:150].decode(errors="ignore") or "_"


def _text(text: str) -> str:
    """``text`` as a plot shows it: control characters (which no font draws) as ``_``."""
    return re.sub(r"[\x00-\x1f\x7f]", "_", text)


def _x(row: dict[str, Any], axis: str) -> float | None:
    """The row's value on ``axis`` (``bits``: up + down, those it records); ``None`` where it records none."""
    present = [row[k] for k in (("bits_up_total", "bits_down_total") if axis == "bits" else (axis,)) if k in row]
    if not present:
        return None
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return math.nan
    return float(sum(present))


def _plot(rows: list[dict[str, Any]], key: str, label: str, title: str, path: Path, axis: str = "round") -> list[int]:
    """``key`` against ``axis`` over the rows that carry ``key`` (the evaluated rounds); returns the rounds whose
    value could not be drawn (:func:`drawable`), which the plot also counts."""
    carrying = [(r["round"], _x(r, axis), r[key]) for r in rows if key in r and _x(r, axis) is not None]
    pts = [(x, y) for _, x, y in carrying if drawable(x) and drawable(y)]
    left = [rnd for rnd, x, y in carrying if not (drawable(x) and drawable(y))]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3)
    if left:
        ax.text(0.01, 0.01, f"{len(left)} value(s) not drawn: NaN, ±inf or beyond ±{LIMIT:.0e}",
                transform=ax.transAxes, fontsize=7)
    ax.set_xlabel(_AXES[axis])
    ax.set_ylabel(_text(label))
    ax.set_title(_text(title))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return left


_LABELS = {"accuracy": "test accuracy", "loss": "test loss", "mse": "test MSE", "mae": "test MAE",
           "r2": "test R²"}


def plot_files(metrics: Sequence[str]) -> list[str]:
    """The names of the files :func:`plot_run` may write for ``metrics`` (those of an asynchronous run too)."""
    return [f"{file_stem(m)}{end}.png" for m in metrics for end in ("", "_vs_sim_time", "_vs_bits")]


def plot_run(run_dir: str | Path, rows: list[dict[str, Any]], name: str = "",
             metrics: Sequence[str] = ("accuracy", "loss"), notices: list[str] | None = None) -> list[Path]:
    """Write ``<metric>.png`` (and ``<metric>_vs_sim_time.png``, ``<metric>_vs_bits.png`` where rows record
    ``sim_time``, bits) for every metric of the run that its ``metrics.jsonl`` rows record; return the paths.
    ``notices`` gets a line for every plot that leaves values out and every metric that no row records."""
    run_dir = Path(run_dir)
    paths = []
    for metric in metrics:
        label = _LABELS.get(metric, f"test {metric}")
        if not any(metric in r for r in rows):
            if notices is not None:
                notices.append(f"no row of metrics.jsonl has {metric!r}: {file_stem(metric)}.png is not drawn.")
            continue
        for axis in ("round", "sim_time", "bits"):  # those the metric's rows record (async: all three)
            if not any(metric in r and _x(r, axis) is not None for r in rows):
                continue
            path = run_dir / (f"{file_stem(metric)}.png" if axis == "round" else f"{file_stem(metric)}_vs_{axis}.png")
            left = _plot(rows, metric, label, f"{name} — {label}", path, axis)
            paths.append(path)
            if left and notices is not None:
                rounds = ", ".join(map(str, left[:5])) + (", ..." if len(left) > 5 else "")
                notices.append(f"{path.name} leaves out {len(left)} value(s) it cannot draw (NaN, ±inf or beyond "
                               f"±{LIMIT:.0e}), in round(s) {rounds}.")
    return paths


def plot_comparison(series: dict[str, list[tuple[float, float]]], ylabel: str, title: str, path: str | Path,
                    xlabel: str = "round", log_x: bool = False) -> None:
    """One line per labelled series of (x, y) points (used by benchmark reproductions)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=100)
    for i, (label, pts) in enumerate(series.items()):  # beyond the 10 default colours, dashed lines
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=_text(label),
                linestyle="-" if i < 10 else "--")
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(_text(xlabel))
    ax.set_ylabel(_text(ylabel))
    ax.set_title(_text(title))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
