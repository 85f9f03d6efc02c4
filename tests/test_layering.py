"""docs/architecture.md "Layering": every package of trustfl sits in one layer and imports
only from its own layer and the layers below it.

The layers, lowest first (docs/architecture.md, "Layering (tested by tests/test_layering.py)"):

  base     errors, types, core             import nothing else from trustfl (``trustfl/__init__.py`` is here too:
                                            it runs on every import of any trustfl module)
  parts    models, data, objectives, …     the base layer and each other
  engine   engine                          the parts
  recipes  recipes                         the parts, the engine, and the config schema's plain dataclasses
  top      config, experiment, report,     everything
           cli (cli_privacy, __main__)

Every import of ``trustfl.…`` (module level, inside functions, under ``TYPE_CHECKING``; ``from trustfl import x``
and relative imports resolved) is checked per package, so a failure names the package, the file and line, and the
forbidden module. A package nobody placed in a layer fails :func:`test_every_package_is_in_a_layer`.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "trustfl"
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("base", frozenset({"errors", "types", "core", "__init__"})),
    ("parts", frozenset({"models", "data", "objectives", "evaluate", "aggregate", "attacks", "privacy", "compress",
                         "simtime", "client", "server", "selfsup"})),
    ("engine", frozenset({"engine", "vertical"})),
    ("recipes", frozenset({"recipes"})),
    ("top", frozenset({"config", "experiment", "report", "cli", "cli_privacy", "deploy", "__main__"})),
)
LAYER_OF = {pkg: i for i, (_, pkgs) in enumerate(LAYERS) for pkg in pkgs}
ALLOWED_UPWARD: dict[str, frozenset[str]] = {
    # docs/architecture.md: a recipe edits a config, through the schema's plain dataclasses.
    "recipes": frozenset({"trustfl.config.schema"}),
}
"""Modules of a higher layer that a package may import by design (documented)."""
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {
}
"""Imports that break the documented layering today, listed so that the rule itself stays strict (and reported in
issue #16); each entry must still occur, see :func:`test_known_violations_still_occur`."""


def _packages() -> list[str]:
    """Top-level packages and modules of trustfl (``engine``, ``cli``, ``__init__`` for trustfl/__init__.py)."""
    out = [p.stem for p in ROOT.glob("*.py")]
    out += [p.name for p in ROOT.iterdir()
            if p.is_dir() and not p.name.startswith(("__", ".")) and any(p.rglob("*.py"))]
    return sorted(out)


def _package_of(module: str) -> str:
    """``trustfl.engine.loop`` → ``engine``; ``trustfl`` (the package's own namespace) → ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _is_module(dotted: str, repo: Path) -> bool:
    path = repo.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path, repo: Path = REPO) -> list[tuple[int, str]]:
    """``(line, module)`` for every trustfl module ``path`` (a file under ``repo``) imports."""
    here = list(path.relative_to(repo).parts[:-1])  # the file's package, e.g. ["trustfl", "engine"]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "trustfl"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = here[:len(here) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "trustfl":
                continue
            for alias in node.names:  # `from trustfl.engine import loop` imports the submodule when there is one
                sub = f"{module}.{alias.name}"
                found.append((node.lineno, sub if _is_module(sub, repo) else module))
    return sorted(set(found))  # `from m import a, b` is one import of m


def _files(package: str) -> list[Path]:
    single = ROOT / f"{package}.py"
    return [single] if single.is_file() else sorted((ROOT / package).rglob("*.py"))


def _violations(package: str) -> list[tuple[str, int, str]]:
    """``(file, line, module)`` of every import of ``package`` from a higher layer, documented exceptions aside."""
    out = []
    for path in _files(package):
        for line, module in _imports(path):
            dep = _package_of(module)
            if dep == package or LAYER_OF.get(dep, len(LAYERS)) <= LAYER_OF[package]:
                continue
            if module in ALLOWED_UPWARD.get(package, ()):
                continue
            out.append((path.relative_to(REPO).as_posix(), line, module))
    return out


def test_every_package_is_in_a_layer():
    """A new package must be placed in LAYERS (and in docs/architecture.md); a layer may not name a lost one."""
    placed = set(LAYER_OF)
    found = set(_packages())
    assert not found - placed, f"packages in no layer (add them to LAYERS and the docs): {sorted(found - placed)}"
    assert not placed - found, f"LAYERS names packages that do not exist: {sorted(placed - found)}"
    assert sum(len(pkgs) for _, pkgs in LAYERS) == len(LAYER_OF), "a package is in two layers"


def test_layers_match_the_architecture_doc():
    """The fenced block under "## Layering" in docs/architecture.md lists the same layers in the same order."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = re.search(r"## Layering[^\n]*\n+```\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no fenced layering block under '## Layering'"
    documented, pending = [], ""
    for line in block.group(1).splitlines():
        left, arrow, _ = line.partition("←")
        pending += " " + left
        if arrow:
            documented.append(set(re.findall(r"[a-z_]+", pending)))
            pending = ""
    # The doc's "cli" is the command line as a whole; trustfl/__init__.py is not a package the doc names.
    aliases = {"cli_privacy": "cli", "__main__": "cli"}
    ours = [{aliases.get(p, p) for p in pkgs if p != "__init__"} for _, pkgs in LAYERS]
    assert documented == ours


@pytest.mark.parametrize("package", _packages())
def test_package_imports_only_its_layer_and_below(package):
    assert package in LAYER_OF, f"{package} is in no layer; see test_every_package_is_in_a_layer"
    layer = LAYERS[LAYER_OF[package]][0]
    bad = [v for v in _violations(package) if v[::2] not in KNOWN_VIOLATIONS]
    assert not bad, f"{package} (layer {layer!r}) imports from higher layers:\n" + "\n".join(
        f"  {file}:{line}: {module} (layer {_layer_name(_package_of(module))!r})" for file, line, module in bad)


def _layer_name(package: str) -> str:
    return LAYERS[LAYER_OF[package]][0] if package in LAYER_OF else "none: not placed"


def test_known_violations_still_occur():
    """An entry of KNOWN_VIOLATIONS that no longer occurs must be removed, so the exception does not outlive it."""
    occurring = {(file, module) for package in _packages() if package in LAYER_OF
                 for file, _, module in _violations(package)}
    assert set(KNOWN_VIOLATIONS) <= occurring, sorted(set(KNOWN_VIOLATIONS) - occurring)


def test_the_scanner_sees_every_form_of_import(tmp_path):
    """Absolute, `from trustfl import x` (module or attribute), relative, nested and TYPE_CHECKING imports."""
    for name in ("trustfl/__init__.py", "trustfl/cli_privacy.py", "trustfl/engine/__init__.py",
                 "trustfl/engine/loop.py", "trustfl/report/__init__.py", "trustfl/report/table.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    sample = tmp_path / "trustfl" / "engine" / "sample.py"
    sample.write_text(
        "from __future__ import annotations\n"
        "import os, trustfl.report.files\n"
        "from typing import TYPE_CHECKING\n"
        "from trustfl import cli_privacy, build\n"
        "from . import loop, helper\n"
        "from ..report import table\n"
        "if TYPE_CHECKING:\n"
        "    from trustfl.config.schema import ExperimentConfig\n"
        "def f():\n"
        "    from trustfl.experiment import run_experiment\n")
    assert sorted(_imports(sample, tmp_path)) == [
        (2, "trustfl.report.files"), (4, "trustfl"), (4, "trustfl.cli_privacy"), (5, "trustfl.engine"),
        (5, "trustfl.engine.loop"), (6, "trustfl.report.table"), (8, "trustfl.config.schema"),
        (10, "trustfl.experiment")]
    assert [_package_of(m) for m in ("trustfl", "trustfl.cli_privacy", "trustfl.engine.loop")] == [
        "__init__", "cli_privacy", "engine"]
