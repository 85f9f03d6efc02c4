"""A generated population (``data.dataset = "synthetic"``) in a config: its size, its partition and what it refuses.

The population's clients are the partition (client ``k`` is device ``k``), so ``data.partition`` must be
``"natural"`` (any other partitioner would have to see every example) and the population's size is
``data.num_clients``. Parts that read the whole training set at once are refused before anything runs, with the
key to change: representation evaluators (``evaluators``), client statistics (``client.statistics``), the vertical
engine (``engine.kind``). Byzantine clients hold their generated data like everyone else
(``attack.byzantine_hold_data = false`` is refused).
"""
from __future__ import annotations

import inspect
from typing import Any, Sequence

from trustfl.config.schema import ExperimentConfig
from trustfl.core.registry import lookup
from trustfl.data.datasets import Dataset
from trustfl.engine.federation import ClientRows
from trustfl.errors import ConfigError, RegistryError


def population_options(cfg: ExperimentConfig, name: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with ``num_clients = data.num_clients`` when the loader of ``name`` generates a population (it
    takes ``num_clients``); the option itself is refused, so the size is stated once."""
    try:
        loader = lookup("dataset", name)
    except RegistryError:
        return options  # reported by the loading itself, with the key
    if "num_clients" not in inspect.signature(loader).parameters:
        return options
    if "num_clients" in options:
        raise ConfigError(f"`data.options.num_clients`: data set {name!r} generates `data.num_clients` clients; set "
                          f"`data.num_clients` instead (found data.options.num_clients = {options['num_clients']!r}).")
    return {**options, "num_clients": cfg.data.num_clients}


def population_partition(cfg: ExperimentConfig, dataset: Dataset,
                         evaluators: Sequence[Any]) -> tuple[ClientRows, dict[str, Any]]:
    """The population's own partition (virtual rows) and its run-info summary (size quantiles, no per-client
    lists), after refusing what cannot run on a population.

    Raises:
      ConfigError: naming ``data.partition``, ``data.num_clients``, ``engine.kind``, ``client.statistics``,
        ``evaluators`` or ``attack.byzantine_hold_data``.
    """
    population, name = dataset.population, cfg.data.dataset
    if cfg.data.partition.name != "natural":
        raise ConfigError(f"`data.partition`: data set {name!r} is its own partition (client k holds the examples "
                          f"generated for client k); set `data.partition = {{ name = \"natural\" }}` (found "
                          f"{cfg.data.partition.name!r}).")
    if population.num_clients != cfg.data.num_clients:
        raise ConfigError(f"`data.num_clients` is {cfg.data.num_clients} but data set {name!r} generated "
                          f"{population.num_clients} clients.")
    why = "it reads the whole training set, which a generated population never builds"
    if cfg.engine.kind == "vertical":
        raise ConfigError(f"`engine.kind` = \"vertical\" cannot run on `data.dataset` = {name!r}: {why}.")
    if cfg.client.statistics:
        raise ConfigError(f"`client.statistics` cannot run on `data.dataset` = {name!r}: {why}.")
    wide = [type(e).__name__ for e in evaluators if e.needs_train_features]
    if wide:
        raise ConfigError(f"`evaluators`: {', '.join(wide)} cannot run on `data.dataset` = {name!r}: {why}.")
    if cfg.attack.name != "none" and not cfg.attack.byzantine_hold_data:
        raise ConfigError(f"`attack.byzantine_hold_data` = false: every client of `data.dataset` = {name!r} holds "
                          f"its own generated data, Byzantine ones included; remove the key.")
    sizes = population.offsets.diff()
    summary = {"partitioner": "natural", "params": {}, "num_clients": population.num_clients,
               "num_samples": int(population.offsets[-1]), "num_classes": dataset.num_classes,
               "generated": "on demand, per cohort", "size_quantiles": population.size_summary(),
               "mean_size": float(sizes.double().mean())}
    return ClientRows.contiguous(population.offsets), summary
