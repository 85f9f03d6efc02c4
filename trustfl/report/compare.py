"""Comparisons of runs (``trustfl compare``): runs grouped by the config keys that differ between them, every
metric's final and best value as mean ± std over the seeds of each group, and overlay plots.

Groups: every key of the runs' ``config.toml`` (flattened: ``client.lr``, ``aggregator.name``) whose value differs
between the runs is a varied key, except ``seed`` (what a group averages over), ``name`` (a label, not a setting)
and ``data.data_dir`` (where the data lives); runs with equal varied keys form one group. The std is the sample
std (n − 1); a group of one run has none ("–"). Only finished runs are compared (``summary.json`` for all planned
rounds, or up to ``engine.time_limit``): an unfinished one is left out and listed (:attr:`Comparison.unfinished`);
so is a finished one whose ``metrics.jsonl`` lacks rounds its ``summary.json`` counts (:attr:`Comparison.incomplete`:
its final values would be those of an earlier round).
A group that holds a seed twice (copies of one run) and a curve cut to the rounds all its runs evaluated are said
in :attr:`Comparison.notices` (printed, and listed under the table in ``compare.md``).

Outputs, into ``out``: ``compare.md`` (the Markdown table), ``compare.csv`` (one row per group: the varied keys,
``n``, ``seeds``, ``final_<metric>_mean`` / ``_std``, ``best_<metric>_mean`` / ``_std``) and
``compare_<metric>_vs_<axis>.png``: the primary metric (``report.primary_metric``, else ``accuracy`` when recorded,
else the first evaluator metric), mean over seeds at each evaluation, against ``round``, ``wall_time_s``,
``bytes_up_total``, ``epsilon_max`` and ``sim_time`` (those in metrics.jsonl), one line per group.
"""
from __future__ import annotations

import csv
import difflib
import io
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from trustfl.config.load import read_toml
from trustfl.config.schema import ExperimentConfig
from trustfl.core.runfiles import (check_out_dir, lacking_rows, named, not_a_run_dir, read_json_object, read_summary,
                                   writing)
from trustfl.errors import TrustFLError, UsageError
from trustfl.evaluate.base import higher_is_better
from trustfl.report import read_metrics  # re-exported wherever the reader lives (report.files, core.runfiles)
from trustfl.report.plots import drawable
from trustfl.report.sweep import MANIFEST, finished, load_manifest
from trustfl.report.sweep_points import flatten_config

__all__ = ["AXES", "Comparison", "IGNORED_KEYS", "RunRecord", "compare", "compare_runs", "expand_runs",
           "format_markdown", "load_run"]

IGNORED_KEYS = frozenset({"seed", "name", "data.data_dir"})
"""Config keys that never define a group."""
EXTRA_FINAL = ("wall_time_s", "bytes_up_total", "epsilon_max")
"""Columns of metrics.jsonl whose final value is also tabulated (mean ± std), when the runs record them."""
AXES = {"round": "round", "wall_time_s": "wall time (s)", "bytes_up_total": "bytes sent up (cumulative)",
        "epsilon_max": "ε spent (max over clients)", "sim_time": "simulated time"}
"""x axes of the overlay plots (metrics.jsonl column → label); a plot is drawn where the runs have the column."""
DASH = "–"


@dataclass
class RunRecord:
    """One run directory read back: flattened config, metrics.jsonl rows, summary (when it finished)."""

    path: Path
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    summary: dict[str, Any]
    metrics: list[str]

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    def final(self, metric: str) -> float:
        """The value at the last row that carries ``metric`` (the last evaluation, for an evaluation metric)."""
        carrying = [r for r in self.rows if metric in r]
        return _num(carrying[-1].get(metric)) if carrying else math.nan

    def best(self, metric: str) -> float:
        """The best value over the rows; the run's own summary decides the direction of a metric trustfl does
        not know (a plugin's), when it has one."""
        values = [v for v in (_num(r.get(metric)) for r in self.rows) if not math.isnan(v)]
        if not values:
            return math.nan
        done = self.summary.get("rounds") == self.rows[-1].get("round")
        recorded = _num(self.summary.get(f"best_{metric}")) if done else math.nan
        if not math.isnan(recorded) and recorded in values:
            return recorded
        return max(values) if higher_is_better(metric) else min(values)


@dataclass
class Comparison:
    rows: list[dict[str, Any]]
    """One per group: ``group`` (label), the varied keys, ``n``, ``seeds``, ``runs`` and, per metric ``m`` of
    :attr:`columns`, ``m_mean`` (``None`` where no run of the group records it) and ``m_std`` (``None`` for one
    seed), e.g. ``final_accuracy_mean``."""
    varied: list[str]
    metrics: list[str]
    columns: list[str]
    """Tabulated quantities: ``final_<metric>`` and ``best_<metric>`` per evaluator metric, then ``final_`` of the
    recorded :data:`EXTRA_FINAL` columns."""
    primary: str
    markdown: str
    files: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Run directories (of a sweep) with no metrics yet, left out."""
    unfinished: list[str] = field(default_factory=list)
    """Runs left out because they have not finished: ``<dir> (round k of N)``."""
    incomplete: list[str] = field(default_factory=list)
    """Finished runs left out because their metrics.jsonl lacks rounds: ``<dir>/metrics.jsonl lacks round(s) ...``."""
    notices: list[str] = field(default_factory=list)
    """What the table and plots alone would hide: a group repeating a seed, a curve cut short."""


def _num(value: Any) -> float:
    """``value`` as a float: NaN when it is not a number; ±inf for an integer beyond the floats (a summary.json
    value: metrics rows hold none)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


# ------------------------------------------------------------------------------------------------ reading
def expand_runs(paths: Sequence[str | Path]) -> tuple[list[Path], list[str]]:
    """Run directories from ``paths``: a sweep directory (``sweep.json``) stands for its points, in order.

    Returns (run directories with metrics, sweep points left out because they have no metrics yet).

    Raises:
      UsageError: a path that is neither a run directory nor a sweep directory; no runs at all.
    """
    runs, skipped, seen = [], [], set()
    for raw in paths:
        path = named(raw, "run directory")
        if (path / MANIFEST).is_file() and not (path / "metrics.jsonl").is_file():
            found = [path / p["dir"] for p in load_manifest(path)["points"]]
        elif (path / "metrics.jsonl").is_file() or (path / "config.toml").is_file():
            found = [path]
        elif path.is_dir():
            raise UsageError(f"{str(path)!r} is neither a run directory (metrics.jsonl) nor a sweep directory "
                             f"({MANIFEST}).")
        else:
            raise not_a_run_dir(path)
        for run in found:
            key = run.resolve()
            if key in seen:
                continue
            seen.add(key)
            if read_metrics(run) if run.is_dir() else []:
                runs.append(run)
            else:
                skipped.append(str(run))
    if not runs:
        raise UsageError("nothing to compare: no run directory with metrics among "
                         f"{', '.join(repr(str(p)) for p in paths) or 'the arguments'}.")
    return runs, skipped


def load_run(path: str | Path) -> RunRecord:
    """Read a run directory's config.toml, metrics.jsonl, summary.json and run_info.json."""
    path = Path(path)
    if not (path / "config.toml").is_file():
        raise UsageError(f"{path} has no config.toml: is it a trustfl run directory?")
    config = flatten_config(read_toml(path / "config.toml", "Run config"))
    rows = read_metrics(path)
    summary = read_summary(path / "summary.json")
    info = read_json_object(path / "run_info.json", {"evaluators": list})
    metrics = summary.get("metrics") or info.get("evaluators") or [
        m for m in ("accuracy", "loss") if any(m in r for r in rows)]
    return RunRecord(path, config, rows, summary, [str(m) for m in metrics])


def progress(config: dict[str, Any], summary: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str | None:
    """``None`` for a finished run (its flattened ``config``, ``summary`` and rows), else how far it got:
    ``round 2 of 4, no summary.json``."""
    rounds = config.get("rounds", ExperimentConfig.rounds)
    planned = summary.get("rounds_planned", rounds if isinstance(rounds, int) else None)
    limit = config.get("engine.time_limit")
    limit = limit if isinstance(limit, (int, float)) and not isinstance(limit, bool) else None
    if finished({**summary, "rounds_planned": planned}, rows, limit):
        return None
    last = rows[-1]["round"] if rows else 0
    return f"round {last} of {planned if planned is not None else '?'}" + ("" if summary else ", no summary.json")


def _unfinished(run: RunRecord) -> str | None:
    """``None`` for a finished run, else how far it got: ``<dir> (round 2 of 4, no summary.json)``."""
    reason = progress(run.config, run.summary, run.rows)
    return None if reason is None else f"{run.path} ({reason})"


def _repeated_seeds(label: str, members: list[RunRecord]) -> str | None:
    """A notice when the group ``label`` holds a seed more than once (copies of one run), else ``None``."""
    seeds = [m.seed for m in members]
    twice = [m for m in members if seeds.count(m.seed) > 1]
    if not twice:
        return None
    return (f"group {label!r} holds seed {', '.join(sorted({str(m.seed) for m in twice}))} more than once "
            f"({', '.join(str(m.path) for m in twice)}): copies of one run, not independent seeds, yet its n, mean "
            f"and std count each.")


# ------------------------------------------------------------------------------------------------ grouping
def _value_text(value: Any) -> str:
    if value is _ABSENT:
        return DASH
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


_ABSENT = object()


def _varied_keys(runs: list[RunRecord], ignore: frozenset[str]) -> list[str]:
    keys: list[str] = []
    for run in runs:
        keys += [k for k in run.config if k not in keys]
    return [k for k in keys if k not in ignore and len({_value_text(r.config.get(k, _ABSENT)) for r in runs}) > 1]


def _check_ignored(runs: list[RunRecord], ignore: Sequence[str]) -> None:
    """Refuse (UsageError) an ``--ignore`` key that no run's flattened config holds: it would change nothing."""
    keys = sorted({k for run in runs for k in run.config})
    for key in ignore:
        if key in keys:
            continue
        leaves = [k for k in keys if k.startswith(f"{key}.")]
        if leaves:
            hint = f"it is a table: name its keys, e.g. {', '.join(leaves[:6])}" + (", ..." if len(leaves) > 6 else "")
        else:
            close = difflib.get_close_matches(key, keys, n=3)
            hint = f"did you mean {' or '.join(close)}?" if close else "keys are dotted, e.g. client.lr"
        raise UsageError(f"--ignore {key!r}: no compared run's config.toml has this key; {hint}")


def _stats(values: list[float]) -> tuple[float | None, float | None]:
    if not values:  # no run of the group records the column (a run without DP has no epsilon_max): none, not NaN
        return None, None
    if not all(math.isfinite(v) for v in values):  # a diverged run (NaN or ±inf): statistics' exact sums refuse inf
        mean = sum(values) / len(values)
        return mean, (None if len(values) < 2 else math.nan)
    mean = statistics.mean(values)
    if len(values) < 2:
        return mean, None
    return mean, statistics.stdev(values)


def _primary(runs: list[RunRecord], metrics: list[str], metric: str | None) -> str:
    if metric:
        if metric not in metrics:
            raise UsageError(f"--metric {metric!r} is not recorded by these runs; they record "
                             f"{', '.join(metrics)}.")
        return metric
    chosen = {r.config.get("report.primary_metric", "") for r in runs}
    if len(chosen) == 1 and (only := chosen.pop()) in metrics:
        return only
    return "accuracy" if "accuracy" in metrics else metrics[0]


def compare_runs(paths: Sequence[str | Path], *, out: str | Path | None = None, write: bool = True,
                 plots: bool = True, metric: str | None = None, ignore: Sequence[str] = ()) -> Comparison:
    """Compare run directories (or sweep directories, expanded to their points); see the module docstring.

    Args:
      out: where compare.md, compare.csv and the plots go; default: the sweep directory when ``paths`` is one,
        else the working directory.
      write: write the files (``False``: only compute the table).
      metric: the plotted metric (default: the runs' ``report.primary_metric``, else accuracy, else the first).
      ignore: more config keys that never define a group.

    Raises:
      UsageError: ``paths`` not a list of paths (a single string); no runs, or none finished with all its rows; a
        path that is not a run or sweep directory, an unusable ``out``, an unknown ``metric``, an ``ignore`` key
        that no run's config holds.
    """
    _check_paths(paths, out)
    run_dirs, skipped = expand_runs(paths)
    runs, unfinished, incomplete = [], [], []
    for run in map(load_run, run_dirs):
        reason = _unfinished(run)
        lacking = lacking_rows(run.path / "metrics.jsonl", run.rows, run.summary) if reason is None else None
        runs += [run] if reason is None and lacking is None else []
        unfinished += [] if reason is None else [reason]
        incomplete += [] if lacking is None else [lacking]
    if not runs:
        left = unfinished + incomplete
        shown = "; ".join(left[:5]) + ("; ..." if len(left) > 5 else "")
        raise UsageError(f"nothing to compare: no run has finished{' with all its rows' if incomplete else ''} "
                         f"({shown}).")
    _check_ignored(runs, ignore)
    varied = _varied_keys(runs, IGNORED_KEYS | frozenset(ignore))
    metrics: list[str] = []
    for run in runs:
        metrics += [m for m in run.metrics if m not in metrics]
    if not metrics:
        raise TrustFLError("these runs record no evaluation metric.")
    primary = _primary(runs, metrics, metric)
    extras = [c for c in EXTRA_FINAL if c not in metrics and any(c in r for run in runs for r in run.rows)]
    columns = [f"{kind}_{m}" for m in metrics for kind in ("final", "best")] + [f"final_{c}" for c in extras]

    groups: dict[tuple[str, ...], list[RunRecord]] = {}
    for run in runs:
        groups.setdefault(tuple(_value_text(run.config.get(k, _ABSENT)) for k in varied), []).append(run)
    rows, notices = [], []
    for key, members in groups.items():
        label = ", ".join(f"{k}={v}" for k, v in zip(varied, key) if v != DASH)  # absent keys left out
        row: dict[str, Any] = {"group": label or "all runs"}
        notices += filter(None, [_repeated_seeds(row["group"], members)])
        row.update({k: members[0].config.get(k) for k in varied})
        row.update({"n": len(members), "seeds": [m.seed for m in members], "runs": [str(m.path) for m in members]})
        for column in columns:
            kind, name = column.split("_", 1)
            values = [m.final(name) if kind == "final" else m.best(name) for m in members
                      if name in m.metrics or any(name in r for r in m.rows)]
            row[f"{column}_mean"], row[f"{column}_std"] = _stats(values)
        rows.append(row)

    markdown = format_markdown(rows, varied, columns)
    result = Comparison(rows, varied, metrics, columns, primary, markdown, skipped=skipped, unfinished=unfinished,
                        incomplete=incomplete, notices=notices)
    if write:
        target = check_out_dir(out) if out is not None else _default_out(paths)
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UsageError(f"--out: cannot create {str(target)!r}: {err.strerror or err}.") from None
        with writing(target):
            drawn = plot_groups(rows, groups, primary, target, result.notices) if plots else []
            notes = [f"left out, unfinished: {u}" for u in unfinished] + [
                f"left out, rows missing: {u}" for u in incomplete] + result.notices
            (target / "compare.md").write_text(markdown + "\n" + "".join(f"\n- {n}" for n in notes) +
                                               ("\n" if notes else ""))
            (target / "compare.csv").write_text(format_csv(rows, varied, columns))
            result.files = [target / "compare.md", target / "compare.csv", *drawn]
    return result


def _check_paths(paths: Any, out: Any) -> None:
    """Refuse (UsageError) ``paths`` that is not a list of paths (a string would be read a character at a time)
    and an ``out`` that is not a path."""
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise UsageError(f"compare_runs: `paths` must be a list of run or sweep directories, found the one path "
                         f"{repr(paths)[:60]}; write [{repr(paths)[:60]}].")
    if not isinstance(paths, Sequence) or not all(isinstance(p, (str, os.PathLike)) for p in paths):
        raise UsageError(f"compare_runs: `paths` must be a list of run or sweep directories (strings or "
                         f"os.PathLike), found {repr(paths)[:60]}.")
    if out is not None and not isinstance(out, (str, os.PathLike)):
        raise UsageError(f"compare_runs: `out` must be a path (a string or os.PathLike) or None, found "
                         f"{repr(out)[:60]}.")


def compare(paths: Sequence[str | Path], **kwargs: Any) -> list[dict[str, Any]]:
    """The table rows of :func:`compare_runs` (same arguments; files are written unless ``write=False``)."""
    return compare_runs(paths, **kwargs).rows


def _default_out(paths: Sequence[str | Path]) -> Path:
    if len(paths) == 1 and (Path(paths[0]) / MANIFEST).is_file():
        return Path(paths[0])
    return Path.cwd()


# ------------------------------------------------------------------------------------------------ output
def _fmt(value: float | None, scale: float | None = None) -> str:
    """4 decimals; 1 from 100 on; scientific from 1e5 on (``scale``: the magnitude that decides, e.g. the mean's
    for its std)."""
    if value is None:
        return DASH
    if math.isnan(value):
        return "nan"
    size = abs(value if scale is None or math.isnan(scale) else scale)
    if size >= 1e5:
        return f"{value:.3e}"
    return f"{value:.1f}" if size >= 100 else f"{value:.4f}"


def _cell(row: dict[str, Any], column: str) -> str:
    mean, std = row[f"{column}_mean"], row[f"{column}_std"]
    return DASH if mean is None else f"{_fmt(mean)} ± {_fmt(std, mean)}"


def format_markdown(rows: list[dict[str, Any]], varied: list[str], columns: list[str]) -> str:
    """A Markdown table: the varied keys (or ``group``), ``n``, then mean ± std of every column."""
    keys = varied or ["group"]
    head = [*keys, "n", *(c.replace("_", " ", 1) for c in columns)]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" if i < len(keys) else "--:"
                                                               for i in range(len(head))) + "|"]
    for row in rows:
        cells = [row["group"]] if not varied else [_value_text(row[k]) if row[k] is not None else DASH
                                                    for k in varied]
        cells += [str(row["n"]), *(_cell(row, c) for c in columns)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def format_csv(rows: list[dict[str, Any]], varied: list[str], columns: list[str]) -> str:
    """CSV: ``group``, the varied keys, ``n``, ``seeds`` (space-separated), ``<column>_mean``, ``<column>_std``."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["group", *varied, "n", "seeds", *(f"{c}_{s}" for c in columns for s in ("mean", "std"))])
    for row in rows:
        stats = [row[f"{c}_{s}"] for c in columns for s in ("mean", "std")]
        writer.writerow([row["group"], *(_value_text(row[k]) if row[k] is not None else "" for k in varied),
                         row["n"], " ".join(str(s) for s in row["seeds"]),
                         *("" if v is None else repr(float(v)) for v in stats)])
    return buf.getvalue()


def _curve(members: list[RunRecord], metric: str, axis: str) -> tuple[list[tuple[float, float]], int]:
    """(mean x, mean y) over the group's runs at each round every run evaluated with both values, and the number
    of rounds some run evaluated that are not drawn (not evaluated by all its runs, or a value a plot cannot draw:
    NaN, ±inf, beyond ±1e300)."""
    per_run = [{r["round"]: (_num(r.get(axis)) if axis != "round" else float(r["round"]), _num(r.get(metric)))
                for r in m.rows if "round" in r and metric in r} for m in members]
    every = set().union(*per_run)
    rounds = sorted(set.intersection(*(set(d) for d in per_run))) if per_run else []
    points = []
    for rnd in rounds:
        xs, ys = zip(*(d[rnd] for d in per_run))
        if all(map(drawable, xs + ys)):
            points.append((statistics.mean(xs), statistics.mean(ys)))
    return points, len(every) - len(points)


def plot_groups(rows: list[dict[str, Any]], groups: dict[tuple[str, ...], list[RunRecord]], metric: str,
                out: Path, notices: list[str] | None = None) -> list[Path]:
    """``compare_<metric>_vs_<axis>.png``: one line per group (mean over seeds) for every axis the runs record;
    a curve cut short is said in ``notices``."""
    from trustfl.report.plots import file_stem, plot_comparison  # matplotlib only when plotting

    paths = []
    members = list(groups.values())
    for axis, label in AXES.items():
        curves = {row["group"]: _curve(group, metric, axis) for row, group in zip(rows, members)}
        series = {group: points for group, (points, _) in curves.items()}
        if not any(series.values()):
            continue
        path = out / f"compare_{file_stem(metric)}_vs_{axis}.png"
        plot_comparison(series, f"test {metric} (mean over seeds)", f"{metric} vs {label}", path, xlabel=label)
        paths.append(path)
        for group, (points, cut) in curves.items():
            if cut and notices is not None:
                notices.append(f"{path.name}: group {group!r} is drawn at the {len(points)} round(s) where all its "
                               f"runs have {metric} and {axis} (finite, within ±1e300); {cut} other round(s) are "
                               f"left out.")
    return paths
