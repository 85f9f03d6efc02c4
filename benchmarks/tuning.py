"""The learning-rate grid the reproduction scripts tune every method on: half-decade steps (1-3-10), grown on a
side while some method's best value sits at that edge, so no reported optimum is at a grid edge."""
from __future__ import annotations

import statistics
from typing import Any, Callable, Mapping, Sequence


def next_lr(lr: float, up: bool) -> float:
    """The neighbour of ``lr`` on the 1-3-10 half-decade ladder."""
    mantissa, exponent = f"{lr:.0e}".split("e")
    e = int(exponent)
    if up:
        return float(f"3e{e}") if mantissa == "1" else float(f"1e{e + 1}")
    return float(f"3e{e - 1}") if mantissa == "1" else float(f"1e{e}")


def best_lrs(grid: Sequence[float], scores: Mapping[str, Mapping[str, list[float]]]) -> dict[str, float]:
    """Each method's lr of the highest mean score (``scores[method][f"{lr:g}"]``: one score per tuning seed)."""
    return {m: max(grid, key=lambda lr: statistics.mean(s[f"{lr:g}"])) for m, s in scores.items()}


def grow(grid: Sequence[float], best: Mapping[str, float], limits: tuple[float, float]) -> list[float]:
    """The lrs to add: one more half-decade beyond each edge where some method's best lr sits (within ``limits``)."""
    todo = []
    if any(b == min(grid) for b in best.values()) and next_lr(min(grid), False) >= limits[0]:
        todo.append(next_lr(min(grid), False))
    if any(b == max(grid) for b in best.values()) and next_lr(max(grid), True) <= limits[1]:
        todo.append(next_lr(max(grid), True))
    return todo


def search(grid: Sequence[float], limits: tuple[float, float],
           run: Callable[[list[float]], Mapping[str, Mapping[str, list[float]]]]) -> dict[str, Any]:
    """Tune every method on one common grid: ``run(lrs)`` runs every method at each of ``lrs`` and returns its
    scores ``{method: {f"{lr:g}": [one per seed]}}``; while some method's best lr sits at an edge of the grid, the
    grid grows by a half-decade on that side (within ``limits``) and every method runs at the new lr.

    Returns ``{"grid", "scores", "chosen", "at_edge"}``: the final grid, every score, each method's best lr and
    whether it is the grid's smallest or largest.
    """
    grid, todo = sorted(grid), sorted(grid)
    scores: dict[str, dict[str, list[float]]] = {}
    while todo:
        for method, by_lr in run(todo).items():
            scores.setdefault(method, {}).update(by_lr)
        best = best_lrs(grid, scores)
        todo = grow(grid, best, limits)  # the loop ends when no optimum sits at an edge it may still move
        grid = sorted(grid + todo)
    return {"grid": grid, "scores": scores, "chosen": best,
            "at_edge": {m: b in (min(grid), max(grid)) for m, b in best.items()}}
