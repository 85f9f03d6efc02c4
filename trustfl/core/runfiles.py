"""Run-directory files: ``metrics.jsonl``, ``summary.json``, ``run_info.json``.

``metrics.jsonl`` holds one JSON object per round, in round order. Every row has ``round``, ``wall_time_s``, the
round's bytes, ``rejected_total``, the privacy columns and whatever the engine reports for the round (e.g.
``train_loss``); the evaluation metrics (``accuracy``, ``loss``, ...) are present only in the rows of evaluated
rounds (every ``engine.eval_every`` rounds and the last one). A metric's curve is the rows that carry it:
:func:`metric_rows`. Every value of a row is a number, or a list of numbers (a deployment's ``dropped_clients``):
JSON has no NaN or infinity, so NaN is written ``null`` and ±inf ``"inf"`` / ``"-inf"`` (read back as floats); the
writer and the reader refuse anything else.
"""
from __future__ import annotations

import errno
import json
import math
import os
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from trustfl.core.paths import looked_up
from trustfl.errors import ConfigError, UsageError


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


LOCK = ".trustfl.lock"
"""The file in a run directory that the process writing the run holds locked (:func:`hold_run_dir`)."""


@contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for this process while it writes the run: a second trustfl process that would write the
    same directory (a second ``--resume``, or ``--overwrite`` of a running run) is refused (UsageError), where it
    would interleave its rows and checkpoints with this one's. The lock (``flock`` on :data:`LOCK`) goes with the
    process, so a killed run leaves nothing to clean up; a file system without locks is not locked."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    with open(run_dir / LOCK, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise UsageError(f"{run_dir} is in use: another trustfl process (pid {holder}) is writing there. Wait "
                             f"for it to end, or stop it first.") from None
        except OSError:  # a file system without locks
            pass
        else:
            handle.truncate(0)
            handle.write(f"{os.getpid()}\n")
            handle.flush()
        yield


WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM})
"""Errors of writing a file that name no file (a full disk, a quota, a read-only file system)."""


@contextmanager
def writing(run_dir: Path) -> Iterator[None]:
    """An OSError of writing into ``run_dir`` (a run, sweep or comparison directory: read-only, a full disk, a
    folder where a file goes) as a UsageError naming the file, instead of a traceback; errors about other files
    pass through."""
    try:
        yield
    except OSError as err:
        name = err.filename
        inside = name is not None and Path(os.path.abspath(name)).is_relative_to(Path(os.path.abspath(run_dir)))
        if not inside and not (name is None and err.errno in WRITE_ERRNOS):
            raise
        where = name or f"in {run_dir}"
        raise UsageError(f"cannot write or read {where}: {err.strerror or err} (the directory must be writable, and "
                         f"its disk have room).") from None


def named(path: str | Path, what: str) -> Path:
    """``path`` looked up (:func:`~trustfl.core.paths.looked_up`), refused (UsageError naming ``what``) when it is
    the empty string, which ``Path`` would take for the working directory: a run there would be written over, or
    read, without being named."""
    if isinstance(path, (str, bytes)) and not path:
        raise UsageError(f"{what} is an empty path: name the directory (`.` for the working directory).")
    return looked_up(path, what, UsageError)


def not_a_run_dir(path: Path) -> UsageError:
    """The error for a run directory argument that names a file, or nothing."""
    return UsageError(f"run directory {str(path)!r} "
                      f"{'is a file, not a directory' if path.exists() else 'does not exist'}.")


def check_out_dir(out: str | Path) -> Path:
    """``out`` as a path for a command's ``--out`` directory, refused (UsageError) when it is empty or names a
    file."""
    path = named(out, "--out")
    if path.exists() and not path.is_dir():
        raise UsageError(f"--out {str(out)!r} is a file, not a directory.")
    return path


RUN_FILES = ("config.toml", "metrics.jsonl", "checkpoint.pt", "summary.json")
"""Files whose presence marks a directory as holding a run (``--out`` does not write over them by default)."""


DEPLOYMENT_JOURNAL = "deployment.jsonl"
"""A deployment's journal (:class:`trustfl.deploy.server.SendJournal`): its presence marks a deployment's run
directory, which only a deployment resumes."""

WRITTEN = ("config.toml", "run_info.json", "metrics.jsonl", "summary.json", "model.pt", "checkpoint.pt", "error.log",
           DEPLOYMENT_JOURNAL, "run_info.json.tmp", "summary.json.tmp", "model.pt.tmp", "checkpoint.pt.tmp")
"""Every file of a run directory that trustfl writes, besides the plots (named after the run's metrics),
``tensorboard/`` and the lock: what ``--overwrite`` removes (``error.log``: a sweep's point that failed;
``deployment.jsonl``: a deployment's journal; ``*.tmp``: a write cut short)."""


def run_files_in(path: Path) -> list[str]:
    """The :data:`RUN_FILES` that ``path`` holds (none: it holds no run)."""
    return [name for name in RUN_FILES if (path / name).exists()]


def unused_run_dir(path: Path) -> Path:
    """``path`` if it holds no run, else the first of ``path-2``, ``path-3``, ... that holds none."""
    candidate, k = path, 1
    while run_files_in(candidate):
        k += 1
        candidate = path.with_name(f"{path.name}-{k}")
    return candidate


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON atomically: a reader (``trustfl compare`` beside a running sweep) sees the old file
    or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(data), indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


SUMMARY_TYPES = {"name": str, "primary_metric": str, "metrics": list, "rounds": int, "rounds_planned": int,
                 "seed": int, "rounds_all_rejected": int, "rounds_skipped": int, "rounds_diverged": int}
"""The ``summary.json`` keys trustfl's readers use, and the type each must have (``metrics``: a list of names)."""
SUMMARY_NUMBERS = ("final_", "best_", "initial_", "wall_time_s", "bytes_up_total", "bytes_down_total",
                   "rejected_total")
"""The ``summary.json`` keys (and key prefixes) whose value is a number (``null``: NaN; ``"inf"``/``"-inf"``)."""


def read_summary(path: Path) -> dict[str, Any]:
    """``path`` (a ``summary.json``; ``{}`` when there is none) as :func:`read_json_object` reads it with
    :data:`SUMMARY_TYPES`, its :data:`SUMMARY_NUMBERS` as numbers (``"inf"``/``"-inf"`` as floats).

    Raises:
      UsageError: naming the file and key: what :func:`read_json_object` refuses; a value of
        :data:`SUMMARY_NUMBERS` that is not a number; a ``primary_metric`` that is not one of its ``metrics``.
    """
    summary = read_json_object(path, SUMMARY_TYPES)
    for key, value in summary.items():
        if key.startswith(SUMMARY_NUMBERS):
            number = value if isinstance(value, int) and not isinstance(value, bool) else _number(value)
            if number is _NOT_A_NUMBER:  # (an integer beyond the floats is one: its readers take it as ±inf)
                raise UsageError(f"{path}: `{_key(key)}` must be a number (null for NaN, \"inf\" and \"-inf\" for "
                                 f"±inf), found {_describe(value)}.")
            summary[key] = number
    primary, metrics = summary.get("primary_metric"), summary.get("metrics")
    if primary is not None and metrics is not None and primary not in metrics:
        raise UsageError(f"{path}: `primary_metric` is {_describe(primary)}, which is not one of its `metrics` "
                         f"({', '.join(map(_key, metrics)) or 'none'}).")
    return summary


def read_json_object(path: Path, types: dict[str, type] | None = None) -> dict[str, Any]:
    """The JSON object in ``path`` (``{}`` when there is no such file), its keys in ``types`` of those types (a
    list: of strings).

    Raises:
      UsageError: the file cannot be read, is not a JSON object, or has a key of another type.
    """
    if not path.is_file():
        return {}
    try:
        data = load_json(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise UsageError(f"{path} cannot be read as JSON ({err}).") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} must hold a JSON object, found {type(data).__name__}.")
    for key, kind in (types or {}).items():
        value = data.get(key)
        good = value is None or (isinstance(value, kind) and not isinstance(value, bool) and (
            kind is not list or all(isinstance(v, str) for v in value)))
        if not good:
            raise UsageError(f"{path}: `{key}` must be {'a list of names' if kind is list else kind.__name__}, "
                             f"found {_describe(value)}.")
    return data


def load_json(text: str) -> Any:
    """``json.loads(text)``, with arrays or objects nested too deeply for Python's parser (its RecursionError) a
    ValueError, like any other text that is not JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("arrays or objects nested too deeply") from None


INFINITIES = {"inf": math.inf, "-inf": -math.inf}
"""How a metrics row spells ±inf (JSON has none; NaN is ``null``)."""


def append_metrics(path: Path, row: dict[str, Any]) -> None:
    """Append ``row`` to ``path`` (``metrics.jsonl``).

    Raises:
      ConfigError: a value is not a number (a part of your own that reports, e.g., a string as a metric): the
        readers would refuse the row, so it is not written.
    """
    row = _clean(row)
    try:
        _checked_row(row)
    except ValueError as err:
        raise ConfigError(f"the metrics row of round {row.get('round')!r}: {err}; every metric a part reports (an "
                          f"evaluator's, a stage's, an aggregator's, an engine's) must be one number.") from None
    with path.open("a") as fh:
        fh.write(json.dumps(row) + "\n")


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of ``run_dir/metrics.jsonl`` (``[]`` without one), ``"inf"`` / ``"-inf"`` read as floats. A last
    line without its newline that is not JSON is a row being written (a running run) or cut short by a crash; it is
    left out.

    Raises:
      UsageError: naming the file and line: a line that is not a JSON object with a whole ``round`` >= 0 and
        values that are numbers (or ``null``, ``"inf"``, ``"-inf"``) or lists of them; a round that repeats or
        goes back.
    """
    path = named(run_dir, "run directory") / "metrics.jsonl"
    rows = _numbered_rows(path)
    for (before, last), (number, row) in zip(rows, rows[1:]):
        if row["round"] <= last["round"]:
            what = (f"repeats round {row['round']} (lines {before} and {number})" if row["round"] == last["round"]
                    else f"goes back to round {row['round']} on line {number}, after round {last['round']} on line "
                         f"{before}")
            raise UsageError(f"{path} {what}: a run has one row per round, in round order. Remove the rows that do "
                             f"not belong, or restore the file.")
    return [row for _, row in rows]


def _numbered_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) of every row of the metrics file ``path``, each checked on its own (:func:`read_metrics`
    also checks their order)."""
    if not path.is_file():
        return []
    rows, number = [], 0
    try:
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:  # its line, not 0: the text is decoded before it is split
            number = len((raw[:err.start].decode("utf-8") + "x").splitlines())  # as `lines` counts them
            raise ValueError(f"byte 0x{raw[err.start]:02x} is not UTF-8 text: {err.reason}") from None
        lines = text.splitlines()
        if lines and not text.endswith("\n") and _cut_short(lines[-1]):
            lines.pop()
        for number, line in enumerate(lines, 1):
            if line.strip():
                rows.append((number, _checked_row(load_json(line))))
    except ValueError as err:
        raise UsageError(f"{path} is not a trustfl metrics file (line {number}: {err}).") from None
    return rows


def _cut_short(line: str) -> bool:
    """Whether ``line`` is not JSON at all (a whole row, however wrong, is JSON: it is checked, not left out)."""
    try:
        load_json(line)
    except json.JSONDecodeError:
        return True
    except ValueError:  # too deep, too many digits: JSON, and refused as such
        pass
    return False


def _checked_row(row: Any) -> dict[str, Any]:
    """``row`` as trustfl writes it: a JSON object whose ``round`` is a whole number >= 0 (the key every reader
    sorts on) and whose values are numbers (``null``: NaN; ``"inf"`` / ``"-inf"``, returned as floats) or lists
    of numbers.

    Raises:
      ValueError: naming the key and its value.
    """
    if not isinstance(row, dict):
        raise ValueError(f"a row must be a JSON object, found {type(row).__name__}")
    r = row.get("round")
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        raise ValueError(f"`round` must be an integer >= 0, found {_describe(r)}")
    out = {}
    for key, value in row.items():
        number = [_number(v) for v in value] if isinstance(value, list) else _number(value)
        if number is _NOT_A_NUMBER or isinstance(number, list) and _NOT_A_NUMBER in number:
            raise ValueError(f"`{_key(key)}` is {_describe(value)}, where a row holds numbers (within ±1.8e308; null "
                             f"for NaN, \"inf\" and \"-inf\" for ±inf) or a list of them (a deployment's "
                             f"`dropped_clients`)")
        out[key] = number
    return out


_NOT_A_NUMBER = object()


def _number(value: Any) -> Any:
    """``value`` as a metrics row holds a number (``"inf"`` / ``"-inf"`` as floats), or :data:`_NOT_A_NUMBER`."""
    if isinstance(value, str):
        return INFINITIES.get(value, _NOT_A_NUMBER)
    if value is None or isinstance(value, float):
        return value
    return value if isinstance(value, int) and not isinstance(value, bool) and _fits_a_float(value) else _NOT_A_NUMBER


def _fits_a_float(value: int) -> bool:
    try:
        float(value)
    except OverflowError:
        return False
    return True


def _key(key: str) -> str:
    """``key`` as shown in a one-line message: as it is when short and printable, else quoted and cut."""
    return key if len(key) <= 60 and key.isprintable() else json.dumps(key[:60]) + ("…" if len(key) > 60 else "")


def _describe(value: Any) -> str:
    """``value`` (read from JSON, or given to the writer) in a few words, on one line."""
    if isinstance(value, int) and not isinstance(value, bool) and not _fits_a_float(value):
        return f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, (list, dict)):
        return f"a JSON {'array' if isinstance(value, list) else 'object'} of {len(value)} item(s)"
    if value is not None and not isinstance(value, (str, int, float)):
        return f"a {type(value).__name__}"  # what a part of your own gave the writer (a tensor, a numpy scalar)
    text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


def metric_rows(rows: Iterable[dict[str, Any]], metric: str | Sequence[str]) -> list[dict[str, Any]]:
    """The rows that carry ``metric`` (or any of several metrics): the evaluated rows of a run."""
    names = (metric,) if isinstance(metric, str) else tuple(metric)
    return [r for r in rows if any(m in r for m in names)]


def truncate_metrics(path: Path, last_round: int) -> None:
    """Keep only rows up to ``last_round`` (a resumed run rewrites what came after its checkpoint), refusing
    (UsageError) a file that lacks or repeats any of rounds 1..``last_round`` (rows lost or pasted in since the
    interrupted run wrote them)."""
    rows = [r for _, r in _numbered_rows(path) if r["round"] <= last_round]
    rounds = [r["round"] for r in rows]
    if rounds != list(range(1, last_round + 1)):
        missing = missing_rounds(rows, last_round)
        repeated = sorted(r for r, count in Counter(rounds).items() if count > 1)
        found = [f"{label} {spans(values)}" for label, values in
                 (("lacks round(s)", missing), ("repeats round(s)", repeated), ("has round", [0] * (0 in rounds)))
                 if values]
        what = "; it ".join(found) or "holds its rows out of round order"
        raise UsageError(f"{path} does not hold one row for each of the {last_round} round(s) the checkpoint has run "
                         f"(it {what}): the resumed run's history would not be the run's. Restore the file, or start "
                         f"afresh with --overwrite.")
    write_lines(path, rows)


def missing_rounds(rows: Iterable[dict[str, Any]], last_round: int) -> list[int]:
    """The rounds of 1..``last_round`` that no row holds (a run writes one row per round)."""
    return sorted(set(range(1, last_round + 1)) - {r["round"] for r in rows})


def lacking_rows(path: Path, rows: Sequence[dict[str, Any]], summary: dict[str, Any]) -> str | None:
    """What ``rows`` (of the metrics file ``path``) lack of the rounds the run went through: every round up to
    ``summary.json``'s ``rounds`` (with a summary) or to the last row's; ``None`` when they lack none."""
    rounds = summary.get("rounds")
    last = rounds if isinstance(rounds, int) else (rows[-1]["round"] if rows else 0)
    missing = missing_rounds(rows, last)
    if not missing:
        return None
    of = f"the {last} summary.json counts" if isinstance(rounds, int) else f"rounds 1-{last}"
    return f"{path} lacks round(s) {spans(missing)} of {of}"


def spans(numbers: Sequence[int]) -> str:
    """``[2, 3, 4, 7]`` as ``"2-4, 7"``."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def write_lines(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(_clean(r)) + "\n" for r in rows))
