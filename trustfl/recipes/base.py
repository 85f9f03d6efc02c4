"""The recipe interface."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

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
    """``cfg.recipe`` after checking that it holds only ``allowed`` keys (a ConfigError names the first other)."""
    rec = dict(cfg.recipe)
    unknown = sorted(set(rec) - set(allowed))
    if unknown:
        raise ConfigError(f"Unknown key `recipe.{unknown[0]}` for algorithm {algorithm!r}; allowed: "
                          f"{', '.join(allowed) or '(none)'}.")
    return rec
