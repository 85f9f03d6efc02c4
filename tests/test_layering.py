"""STYLE.md rule 21: core and types import nothing above them; stage packages never import engines or config."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "trustfl"
BASE = {"core", "types", "errors"}
STAGES = {"aggregate", "attacks", "privacy", "compress", "simtime", "client", "server", "models", "data", "objectives",
          "evaluate"}
TOP = {"engine", "config", "cli", "cli_privacy", "report", "experiment", "recipes"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trustfl"):
            found.add(node.module.split(".")[1] if "." in node.module else "")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("trustfl."):
                    found.add(alias.name.split(".")[1])
    return found - {""}


def _package(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0].removesuffix(".py")


def test_layering():
    violations = []
    for path in ROOT.rglob("*.py"):
        pkg = _package(path)
        deps = _imports(path) - {pkg}
        if pkg in BASE and deps - BASE:
            violations.append(f"{path}: base layer imports {sorted(deps - BASE)}")
        if pkg in STAGES and deps & TOP:
            violations.append(f"{path}: stage package imports {sorted(deps & TOP)}")
    assert not violations, "\n".join(violations)
