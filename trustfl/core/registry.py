"""Name → factory registries, so TOML names and one-line Python calls build any component.

Example:
  >>> import torch, trustfl
  >>> agg = trustfl.build("aggregator", "mean")
  >>> agg(torch.ones(3, 2)).tolist()
  [1.0, 1.0]
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, TypeVar

from trustfl.errors import RegistryError

F = TypeVar("F", bound=Callable[..., Any])

_REGISTRY: dict[str, dict[str, Callable[..., Any]]] = {}
# Packages whose modules register components; imported on first look-up so that registration
# never depends on what the caller happened to import.
_PLUGIN_PACKAGES = ("models", "data", "objectives", "evaluate", "aggregate", "attacks", "privacy", "compress",
                    "simtime", "client", "server", "engine", "recipes")
_loaded = False


def register(kind: str, name: str) -> Callable[[F], F]:
    """Class or function decorator: make ``factory`` buildable as ``build(kind, name, **params)``."""

    def deco(factory: F) -> F:
        table = _REGISTRY.setdefault(kind, {})
        if name in table and table[name] is not factory:
            raise RegistryError(f"{kind} {name!r} is registered twice ({table[name]!r} and {factory!r}).")
        table[name] = factory
        return factory

    return deco


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
    """The factory registered as ``name`` under ``kind``; an unknown name lists the valid ones."""
    valid = names(kind)
    if name not in _REGISTRY[kind]:
        raise RegistryError(f"Unknown {kind} {name!r}; valid names: {', '.join(valid)}.")
    return _REGISTRY[kind][name]


def build(kind: str, name: str, **params: Any) -> Any:
    """Build the component registered as ``name`` under ``kind`` with its parameters."""
    return lookup(kind, name)(**params)
