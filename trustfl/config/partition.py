"""The clients' training examples: ``data.partition`` applied to a data set's labels (a generated population is
its own partition: :mod:`trustfl.config.population`)."""
from __future__ import annotations

from typing import Any

import numpy as np

from trustfl.config.schema import ExperimentConfig
from trustfl.core.rng import numpy_rng
from trustfl.data.datasets import Dataset
from trustfl.data.partition import Partition, check_cover
from trustfl.engine.federation import ClientRows
from trustfl.errors import ConfigError


def partition_clients(cfg: ExperimentConfig, dataset: Dataset, partitioner: Any, holders: int,
                      seed: int) -> tuple[ClientRows, dict[str, Any]]:
    """``data.partition`` (built as ``partitioner``) of the training examples among the first ``holders`` clients,
    and its summary."""
    n = cfg.data.num_clients
    if dataset.task != "classification" and getattr(partitioner, "splits_by_class", False):
        raise ConfigError(f"`data.partition` {cfg.data.partition.name!r} skews the clients' classes, but the "
                          f"{dataset.task} targets of {cfg.data.dataset!r} have none (it would be a random split); "
                          f"use 'iid' or 'quantity_skew'.")
    # Real-valued targets have no classes: the other partitioners see a single class.
    labels = dataset.train_y.numpy() if dataset.task == "classification" else np.zeros(len(dataset.train_y), np.int64)
    groups = None if dataset.train_groups is None else dataset.train_groups.numpy()
    try:
        partition = (partitioner(labels, holders, numpy_rng(seed, "partition"), groups=groups)
                     if partitioner.needs_groups else partitioner(labels, holders, numpy_rng(seed, "partition")))
    except ConfigError as err:
        raise ConfigError(f"`data.partition` with `data.num_clients` = {n}: {err}") from None
    if not isinstance(partition, Partition) or len(partition.indices) != holders:
        found = len(partition.indices) if isinstance(partition, Partition) else type(partition).__name__
        raise ConfigError(f"`data.partition`: the partitioner must return a Partition of {holders} clients' index "
                          f"arrays, found {found}.")
    bad = [i for i, part in enumerate(partition.indices)
           if not isinstance(part, np.ndarray) or part.ndim != 1 or not np.issubdtype(part.dtype, np.integer)]
    if bad:
        raise ConfigError(f"`data.partition`: the partitioner's index array of client {bad[0]} is not a 1-D integer "
                          f"numpy array, found {type(partition.indices[bad[0]]).__name__}.")
    try:  # checked here too: a partitioner of your own may override __call__, which runs the check otherwise
        check_cover(cfg.data.partition.name, list(partition.indices), len(labels))
    except ConfigError as err:
        raise ConfigError(f"`data.partition`: {err}") from None
    client_rows = ClientRows.from_arrays(partition.indices, n)
    return client_rows, partition.summary
