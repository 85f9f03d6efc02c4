"""Name → factory registries, so TOML names and one-line Python calls build any component.

Example:
  >>> import torch, trustfl
  >>> agg = trustfl.build("aggregator", "mean")
  >>> agg(torch.ones(3, 2)).tolist()
  [1.0, 1.0]
"""
from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import pkgutil
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, TypeVar

import numpy as np

from trustfl.errors import ConfigError, RegistryError, TrustFLError

F = TypeVar("F", bound=Callable[..., Any])

_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {}
# Packages whose modules register components; imported on first look-up so that registration
# never depends on what the caller happened to import.
_PLUGIN_PACKAGES = ("models", "data", "objectives", "evaluate", "aggregate", "attacks", "privacy", "compress",
                    "simtime", "client", "server", "selfsup", "engine", "vertical", "recipes")
_loaded = False
_ADAPTERS: dict[str, Callable[[Any, str], Callable[..., Any]]] = {}


KINDS = ("aggregator", "algorithm", "attack", "augmentation", "batch_sampler", "client_stage", "client_statistic",
         "compressor", "dataset", "downlink_stage", "engine", "evaluator", "executor", "gradient_method",
         "gradient_transform", "model", "objective", "partitioner", "pre_aggregator", "schedule", "server_optimizer",
         "server_stage", "speed_model", "step_budget")
"""The kinds of component a run builds: a registration under another kind would never be read."""


def register(kind: str, name: str) -> Callable[[F], F]:
    """Class or function decorator: make ``factory`` buildable as ``build(kind, name, **params)``.

    Raises:
      RegistryError: an empty or non-string kind or name, a kind outside :data:`KINDS` (a typo nothing would read),
        or a name registered twice with another factory.
    """

    for what, value in (("kind", kind), ("name", name)):
        if not isinstance(value, str) or not value.strip():
            raise RegistryError(f"register(): the {what} must be a non-empty string, found {value!r}.")
    if kind not in KINDS:
        close = difflib.get_close_matches(kind, KINDS, n=1)
        raise RegistryError(f"register(): no part of a run is of kind {kind!r}"
                            f"{f' (did you mean {close[0]!r}?)' if close else ''}; the kinds: {', '.join(KINDS)}.")

    def deco(factory: F) -> F:
        table = _REGISTRY.setdefault(kind, {})
        if name in table and table[name] is not factory:
            raise RegistryError(f"{kind} {name!r} is registered twice ({table[name]!r} and {factory!r}).")
        table[name] = factory
        return factory

    return deco


def register_adapter(kind: str, adapter: Callable[[Any, str], Callable[..., Any]]) -> None:
    """How an object named by import path (``"pkg.mod:Obj"``) becomes a factory of ``kind`` (e.g. a loss function
    → an objective); without an adapter the object itself is the factory."""
    _ADAPTERS[kind] = adapter


def import_module_or_file(target: str) -> Any:
    """Import a module by name (the working directory on ``sys.path``) or a ``.py`` file by path (relative to the
    working directory; imported once per file, as ``trustfl_plugin_<stem>_<hash of its path>``).

    Raises:
      ImportError / SyntaxError: the module cannot be found or parsed, or its own code raised while it was imported
        (then an ImportError naming that exception and the file and line where it was raised).
      TrustFLError: raised by a registration in the module (e.g. a name registered twice).
    """
    try:
        return _import(target)
    except (ImportError, SyntaxError, TrustFLError):
        raise
    except (Exception, SystemExit) as err:  # the module's own code (sys.exit too): say what and where, in one line
        where = traceback.extract_tb(err.__traceback__)[-1]
        raise ImportError(f"its code raised {type(err).__name__}: {err} (at {where.filename}, line "
                          f"{where.lineno})") from err


def _import(target: str) -> Any:
    if target.endswith(".py"):
        path = Path(target).expanduser().resolve()
        if not path.is_file():
            raise ImportError(f"no file {str(path)!r}")
        # one module per file: two files of one name (a.py in two folders) must not resolve to the first imported
        name = f"trustfl_plugin_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        return sys.modules[name]
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    return importlib.import_module(target)


def import_object(spec: str) -> Any:
    """The object ``"pkg.module:Name"`` or ``"path/to/file.py:Name"`` names (``Name`` may be dotted)."""
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise RegistryError(f"{spec!r} is not an import path of the form 'module:Name' or 'file.py:Name'.")
    try:
        obj = import_module_or_file(module_name)
    except (ImportError, SyntaxError) as err:
        raise RegistryError(f"cannot import {module_name!r} (from {spec!r}): {err}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RegistryError(f"{module_name!r} has no attribute {attr!r} (from {spec!r}).")
        obj = getattr(obj, part)
    return obj


def _load_plugins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for pkg_name in _PLUGIN_PACKAGES:
        try:
            pkg = importlib.import_module(f"trustfl.{pkg_name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"trustfl.{pkg_name}":
                continue
            raise
        for info in pkgutil.walk_packages(pkg.__path__, prefix=f"trustfl.{pkg_name}."):
            importlib.import_module(info.name)


def kinds() -> list[str]:
    """Every registered kind (``aggregator``, ``attack``, ``dataset``, ...)."""
    _load_plugins()
    return sorted(_REGISTRY)


def names(kind: str) -> list[str]:
    """The registered names of ``kind``, sorted."""
    _load_plugins()
    if kind not in _REGISTRY:
        raise RegistryError(f"Unknown kind {kind!r}; valid kinds: {', '.join(sorted(_REGISTRY))}.")
    return sorted(_REGISTRY[kind])


def lookup(kind: str, name: str) -> Callable[..., Any]:
    """The factory registered as ``name`` under ``kind``, or the object an import path ``"pkg.mod:Name"`` /
    ``"file.py:Name"`` names (adapted for ``kind``, see :func:`register_adapter`); an unknown name lists the valid
    ones."""
    valid = names(kind)
    if not isinstance(name, str):
        raise RegistryError(f"The {kind} name must be a string, found {name!r}; valid names: {', '.join(valid)}.")
    if name in _REGISTRY[kind]:
        return _REGISTRY[kind][name]
    if ":" in name:
        obj = import_object(name)
        adapter = _ADAPTERS.get(kind)
        return adapter(obj, name) if adapter is not None else obj
    raise RegistryError(f"Unknown {kind} {name!r}; valid names: {', '.join(valid)} (or an import path "
                        f"'module:Name').")


def component_name(kind: str, part: object) -> str:
    """``kind 'name'`` for error messages: the name ``part``'s class is registered under, else the class name."""
    cls = type(part)
    found = next((name for name in names(kind) if lookup(kind, name) is cls), cls.__name__)
    return f"{kind} {found!r}"


def of_trustfl(part: object) -> bool:
    """Whether ``part``'s class is one of trustfl's own (its contracts are tested in trustfl's suite), not a plugin's:
    the engine checks what a plugin's part returns where a check would cost time in every round or step."""
    return type(part).__module__.startswith("trustfl.")


def keyword_parameters(signature: inspect.Signature) -> list[str]:
    """The parameters a factory takes by keyword, in order (what a component table may set)."""
    return [n for n, p in signature.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n != "self"]


_SCALARS = {"bool": ((bool, np.bool_), "true or false"), "int": ((int, np.integer), "an integer"),
            "float": ((int, float, np.integer, np.floating), "a number")}
"""A parameter annotated with one of these names (or ``... | None``) takes only values of these types (never a
bool for a number), and what its error calls it."""


def check_scalar_types(kind: str, name: str, signature: inspect.Signature, params: dict[str, Any]) -> None:
    """Refuse a value of another type for a parameter annotated ``bool``, ``int`` or ``float`` (``"3"``, ``True``
    for a number, ``1`` for a flag): a factory that does not check a flag or a number itself would take it."""
    for key, value in params.items():
        parameter = signature.parameters.get(key)
        annotation = parameter.annotation if parameter is not None else None
        annotation = annotation.__name__ if isinstance(annotation, type) else annotation
        if not isinstance(annotation, str):
            continue
        optional = annotation.endswith(" | None")
        wanted = _SCALARS.get(annotation.removesuffix(" | None"))
        if wanted is None or (optional and value is None):
            continue
        types, what = wanted
        if not isinstance(value, types) or (isinstance(value, (bool, np.bool_)) and bool not in types):
            allowed = what + (" or None" if optional else "")
            raise ConfigError(f"{kind} {name!r}: `{key}` must be {allowed}, found {value!r}.")


def build(kind: str, name: str, **params: Any) -> Any:
    """Build the component registered as ``name`` under ``kind`` with its parameters (a parameter it does not take,
    or a required one left out, is a ConfigError that lists what it takes; so is a value of another type for a
    parameter annotated ``bool``, ``int`` or ``float``: :func:`check_scalar_types`)."""
    factory = lookup(kind, name)
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin or C callable without a signature: let the call check
        return factory(**params)
    try:
        signature.bind(**params)
    except TypeError as err:
        takes = keyword_parameters(signature)
        raise ConfigError(f"{kind} {name!r}: {err}; it takes {', '.join(takes) or 'no parameters'}.") from None
    check_scalar_types(kind, name, signature, params)
    try:
        return factory(**params)
    except (TypeError, ValueError) as err:  # a parameter of the wrong type: as a config's `[table]` reports it
        if isinstance(err, TrustFLError):
            raise
        raise ConfigError(f"{kind} {name!r} with {params!r}: {err}") from None
