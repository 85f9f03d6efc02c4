"""TOML → :class:`ExperimentConfig`, with errors that name the key path, the value found and what is allowed."""
from __future__ import annotations

import dataclasses
import json
import tomllib
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from trustfl.config.schema import Component, ExperimentConfig, FieldError
from trustfl.errors import ConfigError

_MISSING = object()


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (list, tuple):
        return f"a list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return "a table"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any, path: str) -> Any:
    origin = get_origin(tp)
    bad = ConfigError(f"`{path}` must be {_type_name(tp)}, found {value!r}.")
    if tp is Component:
        return _component(value, path)
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
            raise ConfigError(f"Unknown key `{prefix}{key}`; allowed keys here: {', '.join(sorted(fields))}.")
        kwargs[key] = _coerce(value, hints[key], prefix + key)
    try:
        return cls(**kwargs)
    except FieldError as err:
        raise ConfigError(f"`{prefix}{err.name}` must be {err.allowed}, found {err.value!r}.") from None


def config_from_dict(data: dict[str, Any]) -> ExperimentConfig:
    """Validate a plain mapping (as parsed from TOML) into an :class:`ExperimentConfig`."""
    return _dataclass(ExperimentConfig, data, "")


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b=value`` (value in TOML syntax, bare words taken as strings) into (key path, value)."""
    if "=" not in text:
        raise ConfigError(f"--set takes KEY=VALUE (e.g. client.lr=0.1), found {text!r}.")
    key, raw = text.split("=", 1)
    keys = [k.strip() for k in key.strip().split(".")]
    if not all(keys):
        raise ConfigError(f"--set key {key!r} has an empty part.")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return keys, value


def apply_override(data: dict[str, Any], keys: list[str], value: Any) -> None:
    node = data
    for k in keys[:-1]:
        child = node.setdefault(k, {})
        if isinstance(child, str):  # a component given by name only: promote to a table
            child = node[k] = {"name": child}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {'.'.join(keys)}: `{k}` is not a table.")
        node = child
    node[keys[-1]] = value


def load_config(path: str | Path, overrides: list[str] = ()) -> ExperimentConfig:
    """Read a TOML experiment file, apply ``--set`` overrides and validate it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Config file {str(path)!r} does not exist.")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: invalid TOML: {err}") from None
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


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        if isinstance(v, float) and v != v:
            return "nan"
        if isinstance(v, float) and v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise ConfigError(f"cannot write {v!r} to TOML.")


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def dump_toml(data: dict[str, Any]) -> str:
    """Write a config mapping as TOML: scalars first, then one ``[table]`` per nested mapping."""
    lines: list[str] = []

    def emit(table: dict[str, Any], prefix: str) -> None:
        nested = {k: v for k, v in table.items() if isinstance(v, dict) and v}
        arrays = {k: v for k, v in table.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)}
        for k, v in table.items():
            if k not in nested and k not in arrays:
                lines.append(f"{_key(k)} = {_toml_value(v)}")
        for k, v in nested.items():
            lines.append("")
            lines.append(f"[{prefix}{_key(k)}]")
            emit(v, f"{prefix}{_key(k)}.")
        for k, v in arrays.items():
            for item in v:
                lines.append("")
                lines.append(f"[[{prefix}{_key(k)}]]")
                lines.extend(f"{_key(a)} = {_toml_value(b)}" for a, b in item.items())

    emit(data, "")
    return "\n".join(lines).strip() + "\n"
