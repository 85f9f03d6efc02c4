"""Lazy package namespaces (PEP 562): a package's public names are imported on first access.

``import trustfl`` (and the ``trustfl`` command's argument parsing) must stay fast, so package ``__init__`` modules
re-export names without importing the modules that define them (and torch, dp_accounting, scipy behind those):

  __getattr__, __dir__ = lazy_exports(__name__, {"trustfl.privacy.accountant": ("Budget", "LedgerBook")})

Static type checkers see the same names through ``if TYPE_CHECKING:`` imports next to the call.

Example:
  >>> import sys, types
  >>> pkg = types.ModuleType("demo_pkg"); sys.modules["demo_pkg"] = pkg
  >>> pkg.__getattr__, pkg.__dir__ = lazy_exports("demo_pkg", {"math": ("pi",)})
  >>> pkg.pi
  3.141592653589793
  >>> del sys.modules["demo_pkg"]
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping, Sequence

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, Sequence[str]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module ``__getattr__`` and ``__dir__`` for ``package`` that import each name's module on first access.

    Args:
      package: the package's ``__name__``.
      exports: defining module (absolute name) → the public names it provides.
    """
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # later look-ups are plain attribute reads
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__
