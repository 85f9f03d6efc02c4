"""The recipe interface."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from trustfl.core.checks import check_number
from trustfl.errors import ConfigError

if TYPE_CHECKING:
    from trustfl.config.schema import ExperimentConfig
    from trustfl.engine.federation import Federation


class AbstractRecipe:
    """A paper's composition: ``configure`` adjusts the config, ``finalize`` completes the built federation."""

    def configure(self, cfg: "ExperimentConfig") -> "ExperimentConfig":
        return cfg

    def finalize(self, fed: "Federation", cfg: "ExperimentConfig") -> None:
        return None


def recipe_keys(cfg: "ExperimentConfig", algorithm: str, allowed: Sequence[str]) -> dict[str, Any]:
    """``cfg.recipe`` after checking that it holds only ``allowed`` keys (a ConfigError names the first other).

    Every recipe calls this (an algorithm without settings passes ``()``), so a key meant for another algorithm
    (``recipe.mu`` with ``algorithm = "fedavg"``) is refused instead of silently ignored.
    """
    return check_recipe_table(cfg.recipe, algorithm, allowed)


def check_recipe_table(table: Mapping[str, Any], algorithm: str, allowed: Sequence[str]) -> dict[str, Any]:
    """:func:`recipe_keys` for a bare ``[recipe]`` table.

    Raises:
      ConfigError: "Unknown key `recipe.mu` for algorithm 'fedavg'; allowed: (none)."
    """
    rec = dict(table)
    unknown = sorted(set(rec) - set(allowed))
    if unknown:
        raise ConfigError(f"Unknown key `recipe.{unknown[0]}` for algorithm {algorithm!r}; allowed: "
                          f"{', '.join(allowed) or '(none)'}. The [recipe] table holds the settings of the "
                          f"algorithm named in `algorithm` only.")
    return rec


def recipe_choice(rec: dict[str, Any], key: str, default: str, allowed: Sequence[str]) -> str:
    """``rec[key]`` (or ``default``) after checking that it is one of ``allowed`` (a ConfigError names the key)."""
    value = rec.get(key, default)
    if value not in allowed:
        raise ConfigError(f"`recipe.{key}` must be one of {', '.join(map(repr, allowed))}, found {value!r}.")
    return value


def recipe_number(rec: dict[str, Any], key: str, default: Any, **bounds: Any) -> Any:
    """``rec[key]`` (or ``default``) checked by :func:`trustfl.core.checks.check_number` (``bounds``), naming
    ``recipe.<key>``."""
    return check_number(f"recipe.{key}", rec.get(key, default), **bounds)
