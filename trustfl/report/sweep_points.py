"""Sweep points: grid and seed parsing, point names and config flattening (used by :mod:`trustfl.report.sweep`).

:func:`parse_grid` parses ``--grid KEY=V1,V2,...``, :func:`parse_seeds` parses ``--seeds 0-2``, :func:`point_name`
names a point's run directory after its varied keys and seed, and :func:`flatten_config` turns a nested config
into dotted keys.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import re
from typing import Any, Mapping, Sequence

from trustfl.config.load import parse_override
from trustfl.errors import ConfigError

__all__ = ["flatten_config", "parse_grid", "parse_seeds", "point_name"]

_SAFE = re.compile(r"[^A-Za-z0-9._,+=-]")
_MAX_NAME = 150
MAX_POINTS = 10_000
"""The most points (grid values × seeds) one sweep runs: a larger request is a typo (``--seeds 0-100000``), refused
before anything is built rather than filling the disk with run directories."""


# ------------------------------------------------------------------------------------------------ parsing
def _split_values(raw: str) -> list[str]:
    """Split ``0.01,0.05`` at the commas outside brackets, braces and quotes (``[64],[32,32]`` is two values)."""
    parts, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(raw):
        ch = raw[i]
        if quote:
            if ch == "\\" and quote == '"':
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(raw[start:i])
            start = i + 1
        i += 1
    parts.append(raw[start:])
    return [p.strip() for p in parts]


def parse_grid(text: str) -> tuple[str, list[Any]]:
    """Parse ``--grid KEY=V1,V2,...`` into (dotted key, values); each value parses like a ``--set`` value.

    Commas inside TOML arrays, tables and strings do not split (``model.hidden=[64],[32,32]``).

    Raises:
      ConfigError: no ``=``, an empty key part, an empty value, a value that is not TOML, a repeated value, or
        the key ``seed`` (use ``--seeds``).
    """
    if "=" not in text:
        raise ConfigError(f"--grid takes KEY=VALUE1,VALUE2,... (e.g. client.lr=0.01,0.05), found {text!r}.")
    key, raw = text.split("=", 1)
    key = key.strip()
    values: list[Any] = []
    for part in _split_values(raw):
        if not part:
            raise ConfigError(f"--grid {key}: empty value in {raw.strip()!r}; write KEY=VALUE1,VALUE2,...")
        try:
            keys, value = parse_override(f"{key}={part}")
        except ConfigError as err:
            raise ConfigError(str(err).replace("--set", "--grid", 1)) from None
        if any(type(v) is type(value) and v == value for v in values):
            raise ConfigError(f"--grid {'.'.join(keys)}: value {part!r} is given twice.")
        values.append(value)
    dotted = ".".join(keys)
    if dotted == "seed":
        raise ConfigError("--grid seed=...: give seeds with --seeds (e.g. --seeds 0-2), not as a grid.")
    return dotted, values


def parse_seeds(text: str | int | Sequence[int]) -> list[int]:
    """``"0-2"`` → [0, 1, 2]; ``"0,3,5"``, ``"0-2,7"``; an int or a list of ints as they are.

    Raises:
      ConfigError: a malformed range or number, a reversed range, a negative or repeated seed, more than
        :data:`MAX_POINTS` seeds.
    """
    if isinstance(text, bool):
        raise ConfigError(f"--seeds takes integers, found {text!r}.")
    if isinstance(text, int):
        seeds = [text]
    elif isinstance(text, str):
        seeds = []
        for part in text.split(","):
            part = part.strip()
            m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
            if not m:
                raise ConfigError(f"--seeds takes integers and ranges like 0-2 or 0,3,5, found {text!r} "
                                  f"(bad part {part!r}).")
            lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
            if hi < lo:
                raise ConfigError(f"--seeds: range {part!r} is reversed; write {hi}-{lo}.")
            if len(seeds) + hi - lo + 1 > MAX_POINTS:
                raise ConfigError(f"--seeds {text!r} names more than {MAX_POINTS:,} seeds; a sweep runs at most "
                                  f"{MAX_POINTS:,} points.")
            seeds += range(lo, hi + 1)
    else:
        if not isinstance(text, (list, tuple, range)):
            raise ConfigError(f"seeds must be integers, found {text!r}.")
        seeds = list(text)
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
            raise ConfigError(f"seeds must be integers, found {seeds!r}.")
    if not seeds:
        raise ConfigError("--seeds names no seed.")
    if any(s < 0 for s in seeds):
        raise ConfigError(f"seeds must be >= 0, found {min(seeds)}.")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds repeats a seed: {seeds}.")
    return seeds


def _grids(grid: Sequence[str] | Mapping[str, Sequence[Any]]) -> list[tuple[str, list[Any]]]:
    if isinstance(grid, Mapping):
        out = []
        for key, values in grid.items():
            values = list(values) if isinstance(values, (list, tuple)) else [values]
            if not values:
                raise ConfigError(f"--grid {key}: no values.")
            out.append((str(key), values))
            if key == "seed":
                raise ConfigError("--grid seed=...: give seeds with --seeds (e.g. --seeds 0-2), not as a grid.")
    else:
        out = [parse_grid(text) for text in grid]
    keys = [k for k, _ in out]
    for key in keys:
        if keys.count(key) > 1:
            raise ConfigError(f"--grid {key} is given twice; list all its values in one --grid.")
    for a, b in itertools.permutations(keys, 2):
        if b.startswith(a + "."):
            raise ConfigError(f"--grid {a} and --grid {b} overlap (one is inside the other).")
    return out


# ------------------------------------------------------------------------------------------------ names
def _token(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, dict):  # a component table: its name first, then its parameters (cwtm,f=1)
        items = ([_token(value["name"])] if "name" in value else []) + [
            f"{k}={_token(v)}" for k, v in value.items() if k != "name"]
        return ",".join(items)
    if isinstance(value, list):
        return ",".join(_token(v) for v in value)
    return str(value)


def _digest(overrides: Mapping[str, Any]) -> str:
    return hashlib.sha1(json.dumps(overrides, sort_keys=True, default=str).encode()).hexdigest()[:8]


def point_name(overrides: Mapping[str, Any]) -> str:
    """``client.lr=0.01__aggregator.name=caf__seed=0``: the varied keys and values in order, filesystem-safe
    (characters outside ``A-Z a-z 0-9 . _ , + = -`` become ``_``; a very long name is cut and hashed)."""
    name = "__".join(f"{k}={_SAFE.sub('_', _token(v))}" for k, v in overrides.items())
    if len(name) > _MAX_NAME:
        name = f"{name[:_MAX_NAME - 10]}__{_digest(overrides)}"
    return name


# ------------------------------------------------------------------------------------------------ config
def flatten_config(data: Any, prefix: str = "") -> dict[str, Any]:
    """``{"client": {"lr": 0.1}}`` → ``{"client.lr": 0.1}`` (an empty table stays a value)."""
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(flatten_config(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: data}
