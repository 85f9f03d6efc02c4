"""What a deployment cannot honour, refused before anything starts, with the key to change."""
from __future__ import annotations

from trustfl.config.schema import ExperimentConfig
from trustfl.engine.federation import Federation
from trustfl.errors import ConfigError
from trustfl.privacy.correlated import CorrelatedNoise


def check_deployable(cfg: ExperimentConfig, fed: Federation) -> None:
    """Raise :class:`ConfigError` naming the key of the first setting a real deployment cannot run.

    A deployment runs the synchronous schedule with real nodes: simulated adversaries, simulated clocks,
    feature-partitioned parties, statistics exchanged before training and the fast correlated-noise sampler (a
    simulation shortcut no node could compute its own row of) are simulation-only.
    """
    kind = fed.info.get("engine", cfg.engine.kind)
    refusals = [
        (kind != "sync", "engine.kind", kind, '"sync" (the asynchronous and vertical engines are simulation-only)'),
        (cfg.attack.name != "none", "attack.name", cfg.attack.name,
         '"none": attacks are simulated; in a deployment a Byzantine node is a real node'),
        (fed.attack is not None or bool(fed.byzantine), "attack.num_byzantine", cfg.attack.num_byzantine, "0"),
        (bool(fed.statistics), "client.statistics", [c.name for c in cfg.client.statistics],
         "empty (statistics exchanged before training are simulation-only for now)"),
    ]
    for name, stage in fed.client_stages.stages:
        if isinstance(stage, CorrelatedNoise) and stage.path != "exact":
            refusals.append((True, "recipe.noise_path", stage.path,
                             f'"exact" (stage {name!r}: the fast sampler draws every row on the server; only '
                             f'pair seeds from key agreement let a node compute its own noise)'))
    for bad, key, value, allowed in refusals:
        if bad:
            raise ConfigError(f"`{key}` = {value!r} cannot be deployed; it must be {allowed}.")
