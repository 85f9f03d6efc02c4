"""Plots of a run: one ``<metric>.png`` per evaluation metric against rounds (``accuracy.png``, ``loss.png``,
``mse.png``, ``r2.png``, ...); an asynchronous run adds ``<metric>_vs_sim_time.png`` and ``<metric>_vs_bits.png``.

``metrics.jsonl`` has a row per round and the evaluation metrics only in evaluated rounds: a metric's curve is
drawn through the rows that carry it."""
from __future__ import annotations

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


def _x(row: dict[str, Any], axis: str) -> float | None:
    if axis == "bits":
        return row["bits_up_total"] + row["bits_down_total"] if "bits_up_total" in row else None
    return row.get(axis)


def _plot(rows: list[dict[str, Any]], key: str, label: str, title: str, path: Path, axis: str = "round") -> None:
    """``key`` against ``axis`` over the rows that carry a number under ``key`` (the evaluated rounds)."""
    pts = [(_x(r, axis), r[key]) for r in rows if isinstance(r.get(key), (int, float)) and _x(r, axis) is not None]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3)
    ax.set_xlabel(_AXES[axis])
    ax.set_ylabel(label)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


_LABELS = {"accuracy": "test accuracy", "loss": "test loss", "mse": "test MSE", "mae": "test MAE",
           "r2": "test R²"}


def plot_run(run_dir: str | Path, rows: list[dict[str, Any]], name: str = "",
             metrics: Sequence[str] = ("accuracy", "loss")) -> list[Path]:
    """Write ``<metric>.png`` for every metric of the run from its ``metrics.jsonl`` rows; return the paths."""
    run_dir = Path(run_dir)
    paths = []
    for metric in metrics:
        label = _LABELS.get(metric, f"test {metric}")
        path = run_dir / f"{metric.replace('/', '_')}.png"
        _plot(rows, metric, label, f"{name} — {label}", path)
        paths.append(path)
        if any("sim_time" in r for r in rows):  # an asynchronous run: also against simulated time and bits
            for axis in ("sim_time", "bits"):
                path = run_dir / f"{metric.replace('/', '_')}_vs_{axis}.png"
                _plot(rows, metric, label, f"{name} — {label}", path, axis)
                paths.append(path)
    return paths


def plot_comparison(series: dict[str, list[tuple[float, float]]], ylabel: str, title: str, path: str | Path,
                    xlabel: str = "round", log_x: bool = False) -> None:
    """One line per labelled series of (x, y) points (used by benchmark reproductions)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=100)
    for i, (label, pts) in enumerate(series.items()):  # beyond the 10 default colours, dashed lines
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=label,
                linestyle="-" if i < 10 else "--")
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
