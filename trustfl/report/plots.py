"""Plots of a run: one ``<metric>.png`` per evaluation metric against rounds (``accuracy.png``, ``loss.png``,
``mse.png``, ``r2.png``, ...)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _plot(rows: list[dict[str, Any]], key: str, label: str, title: str, path: Path) -> None:
    pts = [(r["round"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3)
    ax.set_xlabel("round")
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
    """Write ``<metric>.png`` for every metric of the run; return the paths."""
    run_dir = Path(run_dir)
    paths = []
    for metric in metrics:
        label = _LABELS.get(metric, f"test {metric}")
        path = run_dir / f"{metric.replace('/', '_')}.png"
        _plot(rows, metric, label, f"{name} — {label}", path)
        paths.append(path)
    return paths


def plot_comparison(series: dict[str, list[tuple[float, float]]], ylabel: str, title: str, path: str | Path,
                    xlabel: str = "round") -> None:
    """One line per labelled series of (x, y) points (used by benchmark reproductions)."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=100)
    for label, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
