"""The recipe interface."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trustfl.config.schema import ExperimentConfig
    from trustfl.engine.federation import Federation


class AbstractRecipe:
    """A paper's composition: ``configure`` adjusts the config, ``finalize`` completes the built federation."""

    def configure(self, cfg: "ExperimentConfig") -> "ExperimentConfig":
        return cfg

    def finalize(self, fed: "Federation", cfg: "ExperimentConfig") -> None:
        return None
