"""TOML → :class:`ExperimentConfig`, with errors that name the key path, the value found and what is allowed."""
from __future__ import annotations

import dataclasses
import json
import math
import tomllib
import typing
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import tomli_w

from trustfl.config.schema import Component, ExperimentConfig, FieldError
from trustfl.core.paths import looked_up
from trustfl.errors import ConfigError

_MISSING = object()
MAX_TOML_BYTES = 16 * 2 ** 20
"""The largest TOML file :func:`read_toml` reads (configs and sweep files are a few KB)."""
_INT64 = (-(2 ** 63), 2 ** 63 - 1)
"""TOML integers are signed 64-bit (TOML 1.0 §Integer); larger literals are refused, not wrapped or truncated."""


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin in (Union, UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (list, tuple):
        item = get_args(tp)[0]
        plural = {int: "integers", float: "numbers", str: "strings", bool: "booleans",
                  Component: "components (names or tables)"}
        if item in plural:
            return f"a list of {plural[item]}"
        return "a list of tables" if dataclasses.is_dataclass(item) else f"a list, each item {_type_name(item)}"
    if origin is dict:
        return "a table"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def is_non_finite_word(value: Any) -> bool:
    """``value`` is ``nan`` or ``inf`` written as a word (``--set`` takes those as strings)."""
    return isinstance(value, str) and value.lstrip("+-") in ("nan", "inf")


def _coerce(value: Any, tp: Any, path: str) -> Any:
    origin = get_origin(tp)
    why = " (TOML's nan and inf are not accepted)" if is_non_finite_word(value) else ""
    bad = ConfigError(f"`{path}` must be {_type_name(tp)}, found {value!r}{why}.")
    if tp is Component:
        return _component(value, path)
    if origin in (Union, UnionType):  # the first alternative that takes the value
        for alternative in get_args(tp):
            try:
                return _coerce(value, alternative, path)
            except ConfigError:
                continue
        raise bad
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad
        return _dataclass(tp, value, path)
    if origin is Literal:
        if value not in get_args(tp):
            raise bad
        return value
    if origin is list:
        if not isinstance(value, list):
            raise bad
        (item,) = get_args(tp)
        return [_coerce(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise bad
        return value
    return value


def _component(value: Any, path: str) -> Component:
    if isinstance(value, str):
        return Component(value)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise ConfigError(f"`{path}` must be a name or a table with a string `name` and the component's "
                          f"parameters, found {value!r}.")
    params = {k: v for k, v in value.items() if k != "name"}
    return Component(value["name"], params)


def _dataclass(cls: type, data: dict[str, Any], path: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    prefix = f"{path}." if path else ""
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            raise ConfigError(f"Unknown key `{prefix}{_key(key)}`; allowed keys here: {', '.join(sorted(fields))}.")
        kwargs[key] = _coerce(value, hints[key], prefix + key)
    try:
        return cls(**kwargs)
    except FieldError as err:
        raise ConfigError(f"`{prefix}{err.name}` must be {err.allowed}, found {err.value!r}.") from None


def _check_numbers(value: Any, path: str) -> None:
    """Refuse non-finite floats and integers beyond 64 bits anywhere in the config, naming the key path.

    TOML has ``nan`` and ``inf`` literals (and ``1e999`` parses to ``inf``), but no trustfl setting means
    anything by them: "unlimited" is spelled ``0`` where a field allows it (``client.dp.epsilon``,
    ``engine.time_limit``). Checking every depth also covers component tables and ``[recipe]``, whose keys the
    schema does not type.
    """
    if isinstance(value, bool):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"`{path}` must be a finite number, found {value!r} (TOML's nan and inf are not "
                          f"accepted).")
    if isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
        raise ConfigError(f"`{path}` must be an integer in [-2**63, 2**63 - 1] (TOML integers are 64-bit), "
                          f"found {value}.")
    if isinstance(value, dict):
        for k, v in value.items():
            _check_numbers(v, f"{path}.{_key(k)}" if path else _key(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_numbers(v, f"{path}[{i}]")


def config_from_dict(data: dict[str, Any]) -> ExperimentConfig:
    """Validate a plain mapping (as parsed from TOML) into an :class:`ExperimentConfig`.

    Raises:
      ConfigError: naming the key path of the first unknown key, wrong type, non-finite or out-of-range value.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"A config must be a table of keys, found {type(data).__name__}.")
    _check_numbers(data, "")
    return _dataclass(ExperimentConfig, data, "")


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b=value`` (value in TOML syntax, bare words taken as strings, ``nan`` and ``inf`` too) into
    (key path, value).

    Raises:
      ConfigError: no ``=``, an empty key part, no value, or a value that starts like a TOML array, table or
        quoted string but does not parse (``--set model.hidden=[64,``).
    """
    if "=" not in text:
        raise ConfigError(f"--set takes KEY=VALUE (e.g. client.lr=0.1), found {text!r}.")
    key, raw = text.split("=", 1)
    keys = [k.strip() for k in key.strip().split(".")]
    if not all(keys):
        raise ConfigError(f"--set key {key.strip()!r} has an empty part; write KEY=VALUE with KEY like client.lr.")
    raw = raw.strip()
    if not raw:
        raise ConfigError(f"--set {'.'.join(keys)}= has no value; write KEY=VALUE (e.g. client.lr=0.1, "
                          f"name=\"run\").")
    if is_non_finite_word(raw):  # TOML's non-finite floats, refused as numbers: a bare word, a string
        return keys, raw  # (--set attack.name=nan, the attack that sends NaN)
    try:
        parsed = tomllib.loads(f"v = {raw}")
        if set(parsed) != {"v"}:  # "1\nb = 2": a second key smuggled in after a newline
            raise ConfigError(f"--set {'.'.join(keys)}: {raw!r} is more than one TOML value.")
        value = parsed["v"]
    except tomllib.TOMLDecodeError as err:
        if raw[0] in "[{\"'":
            raise ConfigError(f"--set {'.'.join(keys)}: {raw!r} is not a valid TOML value ({err}).") from None
        value = raw  # a bare word: a string (--set aggregator.name=krum)
    except RecursionError:
        raise ConfigError(f"--set {'.'.join(keys)}: the value is nested too deeply.") from None
    return keys, value


def apply_override(data: dict[str, Any], keys: list[str], value: Any) -> None:
    """Set ``data[k1][k2]...[kn] = value``, creating tables on the way (a component name becomes a table)."""
    node = data
    for i, k in enumerate(keys[:-1]):
        child = node.setdefault(k, {})
        if isinstance(child, str):  # a component given by name only: promote to a table
            child = node[k] = {"name": child}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {'.'.join(keys)}: `{'.'.join(keys[:i + 1])}` is not a table (it holds "
                              f"{child!r}).")
        node = child
    node[keys[-1]] = value


def read_toml(path: str | Path, what: str = "Config file") -> dict[str, Any]:
    """Parse a UTF-8 TOML file; every failure is a ConfigError naming the file (never an OSError or a traceback).

    Raises:
      ConfigError: the file is missing, a directory, unreadable, binary, not UTF-8, or not valid TOML (including
        a key or table defined twice).
    """
    path = looked_up(path, what)
    name = repr(str(path))
    if path.is_dir():
        raise ConfigError(f"{what} {name} is a directory; give the path of a TOML file.")
    if not path.exists():
        raise ConfigError(f"{what} {name} does not exist.")
    if path.is_fifo() or path.is_socket():  # opening a pipe without a writer waits for ever
        raise ConfigError(f"{what} {name} is a {'named pipe' if path.is_fifo() else 'socket'}, not a file; "
                          f"give the path of a TOML file.")
    try:
        with path.open("rb") as f:  # bounded: a device such as /dev/zero would be read until memory runs out
            raw = f.read(MAX_TOML_BYTES + 1)
    except OSError as err:  # permissions, a FIFO that fails, an I/O error
        raise ConfigError(f"Cannot read {what.lower()} {name}: {err.strerror or err}.") from None
    except ValueError as err:  # an embedded NUL in the path
        raise ConfigError(f"Cannot read {what.lower()} {name}: {err}.") from None
    if len(raw) > MAX_TOML_BYTES:
        raise ConfigError(f"{what} {name} is larger than {MAX_TOML_BYTES // 2 ** 20} MiB: not a TOML file trustfl "
                          f"writes or reads.")
    if b"\x00" in raw:
        raise ConfigError(f"{what} {name} is a binary file (it holds NUL bytes), not TOML text.")
    try:
        text = raw.decode("utf-8-sig")  # a leading byte-order mark (some Windows editors) is dropped
    except UnicodeDecodeError as err:
        line = raw.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{what} {name} is not UTF-8 text (byte 0x{raw[err.start]:02x} on line {line}); TOML "
                          f"files must be UTF-8 (re-save it as UTF-8).") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        twice = any(w in str(err) for w in ("overwrite", "declare", "mutate"))
        hint = " (a key or table is defined twice)" if twice else ""
        raise ConfigError(f"{what} {name} is not valid TOML: {err}{hint}.") from None
    except RecursionError:
        raise ConfigError(f"{what} {name} is not usable TOML: arrays or tables are nested too deeply.") from None


def load_config(path: str | Path, overrides: list[str] = ()) -> ExperimentConfig:
    """Read a TOML experiment file, apply ``--set`` overrides and validate it.

    Raises:
      ConfigError: the file cannot be read or parsed (the message names it), an override is malformed, or a
        value is invalid (the message names its key path).
    """
    data = read_toml(path)
    for text in overrides:
        apply_override(data, *parse_override(text))
    return config_from_dict(data)


def config_to_dict(cfg: Any) -> Any:
    """The inverse of :func:`config_from_dict` (components become tables with ``name``)."""
    if isinstance(cfg, Component):
        return {"name": cfg.name, **cfg.params}
    if dataclasses.is_dataclass(cfg):
        return {f.name: config_to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, list):
        return [config_to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: config_to_dict(v) for k, v in cfg.items()}
    return cfg


def _key(k: str) -> str:
    """``k`` as a TOML key: bare when it can be, else quoted (``"my key"``, ``""``)."""
    bare = k.replace("_", "").replace("-", "").isalnum() and k.isascii()
    return k if bare else json.dumps(k, ensure_ascii=False)


def _unwritable(value: Any, path: str) -> str | None:
    """The key path of the first value in ``value`` that tomli-w cannot write (``None``, an object), if any."""
    if isinstance(value, dict):
        items = [(f"{path}.{_key(k)}" if path else _key(k), v) for k, v in value.items() if isinstance(k, str)]
    elif isinstance(value, (list, tuple)):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    else:
        try:
            tomli_w.dumps({"v": value})
        except (TypeError, ValueError):
            return path
        return None
    return next((p for p in (_unwritable(v, sub) for sub, v in items) if p is not None), None)


def dump_toml(data: dict[str, Any]) -> str:
    """Write a config mapping as TOML (tomli-w): scalars first, then one ``[table]`` per nested mapping.

    Raises:
      ConfigError: a value TOML cannot hold (``None``, an object), named by its key path.
    """
    try:
        return tomli_w.dumps(data)
    except (TypeError, ValueError) as err:
        where = _unwritable(data, "")
        reason = str(err).rstrip(".")
        raise ConfigError(f"cannot write `{where}` to TOML: {reason}." if where else
                          f"cannot write the config to TOML: {reason}.") from None
