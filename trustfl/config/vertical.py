"""Config → the vertical engine's setup: the feature split, what each party holds, the activation order.

Used by :func:`trustfl.config.build.build_federation` when ``engine.kind = "vertical"`` (set by the vertical
algorithms ``dpzv``, ``vafl``, ``zoo_vfl`` and ``czofo``); the recipe then adds the method and its privacy
(:mod:`trustfl.recipes.vertical`).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from trustfl.config.schema import ClientConfig, Component, ExperimentConfig, SampleDPConfig
from trustfl.core.memory import out_of_memory_as_error
from trustfl.core.rng import numpy_rng
from trustfl.data.datasets import Dataset
from trustfl.data.vertical import check_columns, split_features, unused_columns_notice
from trustfl.errors import ConfigError, TrustFLError
from trustfl.vertical.activation import activation_order
from trustfl.vertical.engine import VerticalSetup

VERTICAL_ALGORITHMS = ("dpzv", "vafl", "zoo_vfl", "czofo")
MAX_ITERATIONS = 10_000_000
"""The most server iterations (``rounds`` × iterations per round) a vertical run may ask for: its activation
schedule is drawn whole when the run is built (hours of DPZV's iterations on this project's CPU, a few hundred MB
of schedule)."""
SPLITS = {"contiguous": ("unit",), "shuffled": ("unit",), "columns": ("columns",)}
INSTEAD = {"client.batch_sampler": "every server iteration draws B = `client.batch_size` of the D sample IDs "
                                   "uniformly without replacement",
           "client.step_budget": "every server iteration is one step of the party `engine.activation` activates; "
                                 "slow parties: `engine.activation` = \"clock\" with `engine.speed`",
           "client.augment": "each party embeds its columns of the stored examples"}
"""What the vertical engine does instead of the horizontal setting named (the default reason: privacy is in
``[recipe]``)."""


def check_vertical_config(cfg: ExperimentConfig) -> None:
    """Refuse the horizontal parts a vertical run would silently ignore (the key path is named)."""
    if cfg.algorithm not in VERTICAL_ALGORITHMS:
        raise ConfigError(f"`engine.kind` = \"vertical\" runs the algorithms {', '.join(VERTICAL_ALGORITHMS)}; "
                          f"found `algorithm` = {cfg.algorithm!r}.")
    unused = {
        "attack": cfg.attack.name != "none", "aggregator": cfg.aggregator != Component("mean"),
        "pre_aggregators": bool(cfg.pre_aggregators), "client_stages": bool(cfg.client_stages),
        "server_stages": bool(cfg.server_stages), "downlink": bool(cfg.downlink),
        "compress.uplink": cfg.compress.uplink.name != "none",
        "compress.downlink": cfg.compress.downlink.name != "none",
        "client.dp": cfg.client.dp != SampleDPConfig(), "client.transforms": bool(cfg.client.transforms),
        "client.batch_sizes": bool(cfg.client.batch_sizes), "client.steps": cfg.client.steps != 0,
        "client.batch_sampler": cfg.client.batch_sampler != "shuffle",
        "client.step_budget": cfg.client.step_budget != Component("full"),
        "client.augment": cfg.client.augment != Component("none"),
        "client.epochs": cfg.client.epochs != 1, "client.weight_decay": cfg.client.weight_decay != 0,
        "cohort": cfg.cohort.sampler != "all", "server.optimizer": cfg.server.optimizer != "sgd",
        "data.partition": cfg.data.partition != Component("iid"), "engine.schedule": cfg.engine.schedule.params != {},
        "server.weighting": cfg.server.weighting != "num_samples",
        "engine.executor": cfg.engine.executor != "vectorized",
        "engine.max_clients_per_batch": cfg.engine.max_clients_per_batch != 0,
        "engine.dtype": cfg.engine.dtype != "float32",
    }
    components = {"aggregator": cfg.aggregator, "data.partition": cfg.data.partition,
                  "engine.schedule": cfg.engine.schedule, "client.step_budget": cfg.client.step_budget,
                  "client.augment": cfg.client.augment}
    for key, used in unused.items():
        if used:
            why = INSTEAD.get(key, "parties hold columns of every sample; the algorithm's privacy is set in "
                                   "`[recipe]`")
            comp = components.get(key)
            if comp is not None and comp.params:  # name the key itself (e.g. a misplaced or mistyped parameter)
                key = f"{key}.{sorted(comp.params)[0]}"
            raise ConfigError(f"`{key}` is set, but the vertical engine does not use it ({why}): remove it.")
    if cfg.engine.activation != "clock" and cfg.engine.speed.params:
        raise ConfigError(f"`engine.speed.{sorted(cfg.engine.speed.params)[0]}` is set but `engine.activation` is "
                          f"{cfg.engine.activation!r}; the speed model is used with `engine.activation` = \"clock\".")
    if cfg.model.name != "vertical":
        raise ConfigError(f"`model.name` must be \"vertical\" with the vertical engine (party models and a head), "
                          f"found {cfg.model.name!r}.")


def check_horizontal_config(cfg: ExperimentConfig) -> None:
    """Refuse the vertical-only settings in a horizontal run."""
    defaults = {"data.features": cfg.data.features != Component("contiguous"),
                "engine.activation": cfg.engine.activation != "shuffled",
                "engine.iterations_per_round": cfg.engine.iterations_per_round != 0}
    for key, used in defaults.items():
        if used:
            raise ConfigError(f"`{key}` is set but `engine.kind` is {cfg.engine.kind!r}; it is used by the vertical "
                              f"engine only.")
    if cfg.algorithm in VERTICAL_ALGORITHMS or cfg.model.name == "vertical":
        raise ConfigError(f"algorithm {cfg.algorithm!r} with model {cfg.model.name!r} needs `engine.kind` = "
                          f"\"vertical\".")


def feature_blocks(cfg: ExperimentConfig, dataset: Dataset, seed: int,
                   info: dict[str, Any] | None = None) -> list[np.ndarray]:
    """The parties' column sets of the flattened examples, from ``data.features``.

    When ``data.fallback`` replaced the configured data set (``info`` holds its notice) and the fallback's units
    (image rows) do not divide evenly among the parties, the parties are the largest divisor of the units not above
    ``data.num_clients`` (e.g. digits' 8 rows: 4 parties instead of 7), and the notice says so."""
    comp, parties = cfg.data.features, cfg.data.num_clients
    if comp.name not in SPLITS:
        raise ConfigError(f"`data.features.name` must be one of {', '.join(map(repr, SPLITS))}, found "
                          f"{comp.name!r}.")
    unknown = sorted(set(comp.params) - set(SPLITS[comp.name]))
    if unknown:
        raise ConfigError(f"Unknown key `data.features.{unknown[0]}` for split {comp.name!r}; allowed: "
                          f"{', '.join(SPLITS[comp.name])}.")
    num_features = int(math.prod(dataset.input_shape))
    try:
        if comp.name == "columns":
            if "columns" not in comp.params:
                raise ConfigError("needs `columns` = [[...], ...], one list of column indices per party.")
            blocks = check_columns(comp.params["columns"], num_features, parties)
            note = unused_columns_notice(blocks, num_features)
            if note is not None and info is not None:
                from trustfl.config.build import add_notice  # here: build imports this module
                add_notice(info, note)
            return blocks
        unit = comp.params.get("unit", 0)
        if unit == 0:
            unit = int(dataset.input_shape[-1]) if len(dataset.input_shape) >= 2 else 1
        units = num_features // unit if isinstance(unit, int) and unit > 0 else 0
        if info is not None and "notice" in info and units and units % parties:
            parties = max(k for k in range(1, min(parties, units) + 1) if units % k == 0)
            info["notice"] += (f" The {units} units of its features do not divide among {cfg.data.num_clients} "
                               f"parties: {parties} parties instead.")
        return split_features(num_features, parties, numpy_rng(seed, "features"),
                              shuffle=comp.name == "shuffled", unit=unit)
    except ConfigError as err:
        raise ConfigError(f"`data.features` with `data.num_clients` = {parties} parties: {err}") from None


def vertical_setup(cfg: ExperimentConfig, dataset: Dataset, blocks: list[np.ndarray],
                   info: dict[str, Any]) -> VerticalSetup:
    """Each party's columns of the training set, the labels, the batch size and the activation order."""
    client: ClientConfig = cfg.client
    train_x = dataset.train_x.flatten(1)
    n, parties, b = train_x.shape[0], len(blocks), client.batch_size
    if b > n:
        raise ConfigError(f"`client.batch_size` = {b} exceeds the {n} training samples.")
    per_round = cfg.engine.iterations_per_round or parties * math.ceil(n / b)
    speed = None
    if cfg.engine.activation == "clock":
        from trustfl.config.build import build_component

        speed = build_component("speed_model", cfg.engine.speed, "engine.speed")
        try:
            speed = speed.bind(parties, seed=cfg.seed)
        except TrustFLError as err:
            raise ConfigError(f"`engine.speed` ({cfg.engine.speed.name!r}): {err}") from None
    total = cfg.rounds * per_round
    if total > MAX_ITERATIONS:
        per = (f"`engine.iterations_per_round` = {per_round}" if cfg.engine.iterations_per_round else
               f"{per_round} iterations per round (`engine.iterations_per_round`, 0: {parties} parties × "
               f"{math.ceil(n / b)} batches)")
        raise ConfigError(f"`rounds` = {cfg.rounds} with {per} asks for {total:,} server iterations; "
                          f"at most {MAX_ITERATIONS:,} (the activation schedule is drawn whole when the run is built).")
    with out_of_memory_as_error("the vertical activation schedule", "`rounds` or `engine.iterations_per_round`"):
        order, times = activation_order(cfg.engine.activation, parties, cfg.rounds, per_round, cfg.seed, speed)
    blocks_t = [torch.as_tensor(b_, dtype=torch.long) for b_ in blocks]
    features = [train_x[:, cols].contiguous() for cols in blocks_t]
    info["vertical"] = {"parties": parties, "features_per_party": [len(c) for c in blocks], "samples": n,
                        "batch_size": b, "iterations_per_round": per_round,
                        "iterations": total, "activation": cfg.engine.activation,
                        "activations_per_party": torch.bincount(order, minlength=parties).tolist()}
    return VerticalSetup(blocks=blocks_t, features=features, labels=dataset.train_y, batch_size=b,
                         per_round=per_round, order=order, times=times, party_lr=client.lr,
                         party_momentum=client.momentum, server_lr=cfg.server.lr,
                         server_momentum=cfg.server.momentum)
