"""Schema → runnable federation: load data, partition, build the model, stages, aggregator and accountant.

Every component table is checked against its factory's signature, so an unknown or invalid parameter is a
ConfigError naming its key path before any training starts.
"""
from __future__ import annotations

import inspect
import sys
from typing import Any

import numpy as np
import torch

from trustfl.aggregate.base import PreAggregated
from trustfl.config.privacy import setup_privacy
from trustfl.config.schema import Component, ExperimentConfig
from trustfl.core.registry import lookup
from trustfl.core.rng import derive_seed, numpy_rng
from trustfl.core.stage import chain
from trustfl.data.datasets import dataset_available, load_dataset
from trustfl.engine.executors import SequentialExecutor, TrainData, VectorizedExecutor
from trustfl.engine.federation import CohortSampler, Federation
from trustfl.engine.local import LocalTraining
from trustfl.errors import BudgetExceededError, ConfigError, PrivacyError, RegistryError, TrustFLError
from trustfl.models.zoo import build_model
from trustfl.types import ParamLayout


def build_component(kind: str, comp: Component, path: str, **extra: Any) -> Any:
    """Build ``comp`` from the ``kind`` registry; errors carry the TOML key path."""
    try:
        factory = lookup(kind, comp.name)
    except RegistryError as err:
        raise ConfigError(f"`{path}.name`: {err}") from None
    sig = inspect.signature(factory)
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    allowed = [n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
               and n not in extra and n != "self"]
    for key in comp.params:
        if key not in allowed and not accepts_any:
            raise ConfigError(f"Unknown key `{path}.{key}` for {kind} {comp.name!r}; allowed: "
                              f"{', '.join(allowed) or '(none)'}.")
    try:
        return factory(**extra, **comp.params)
    except (TrustFLError, TypeError, ValueError) as err:
        raise ConfigError(f"`{path}` ({kind} {comp.name!r}): {err}") from None


def _stage_chain(kind: str, comps: list[Component], path: str):
    named, used = [], set()
    for i, comp in enumerate(comps):
        name = comp.name if comp.name not in used else f"{comp.name}_{i}"
        used.add(name)
        named.append((name, build_component(kind, comp, f"{path}[{i}]")))
    return chain(*named)


def resolve_dataset(cfg: ExperimentConfig) -> tuple[str, str | None]:
    """The data set to load, and a notice when the configured one is absent and a fallback is used."""
    name = cfg.data.dataset
    if cfg.data.fallback and not dataset_available(name, cfg.data.data_dir or None):
        notice = (f"NOTICE: data set {name!r} is not on this machine (run `make data`); using the fallback "
                  f"{cfg.data.fallback!r} instead.")
        return cfg.data.fallback, notice
    return name, None


def build_federation(cfg: ExperimentConfig, data_dir: str | None = None, quiet: bool = False) -> Federation:
    """Build every object of the experiment ``cfg`` describes (deterministic for ``cfg.seed``)."""
    recipe = _recipe(cfg.algorithm)
    if recipe is not None:
        cfg = recipe.configure(cfg)
    seed = cfg.seed
    info: dict[str, Any] = {"algorithm": cfg.algorithm}
    name, notice = resolve_dataset(cfg)
    if notice:
        info["notice"] = notice
        if not quiet:
            print(notice, file=sys.stderr)
    options = {k: v for k, v in cfg.data.options.items()}
    try:
        dataset = load_dataset(name, data_dir or cfg.data.data_dir or None, seed=seed, **options)
    except ConfigError as err:
        raise ConfigError(f"`data`: {err}") from None
    info["dataset"] = name
    info["data_source"] = dataset.source

    n, f = cfg.data.num_clients, cfg.attack.num_byzantine
    if cfg.attack.name != "none" and not 0 < f < n:
        raise ConfigError(f"`attack.num_byzantine` must be in [1, {n - 1}] with attack {cfg.attack.name!r}, "
                          f"found {f}.")
    if cfg.attack.name == "none" and f:
        raise ConfigError(f"`attack.num_byzantine` is {f} but `attack.name` is \"none\"; name an attack.")
    byzantine = frozenset(range(n - f, n)) if cfg.attack.name != "none" else frozenset()
    holders = n if cfg.attack.byzantine_hold_data else n - len(byzantine)
    partitioner = build_component("partitioner", cfg.data.partition, "data.partition")
    labels = dataset.train_y.numpy()
    partition = partitioner(labels, holders, numpy_rng(seed, "partition"))
    client_rows = [torch.as_tensor(np.asarray(ix), dtype=torch.long) for ix in partition.indices]
    client_rows += [torch.zeros(0, dtype=torch.long)] * (n - holders)
    info["partition"] = partition.summary

    model = _build_model(cfg, dataset, seed)
    params = {k: v.detach() for k, v in model.named_parameters()}
    layout = ParamLayout.of(params)
    info["num_parameters"] = layout.numel

    sizes = [int(r.numel()) for r in client_rows]
    batch_sizes = [cfg.client.batch_sizes[i % len(cfg.client.batch_sizes)] if cfg.client.batch_sizes
                   else cfg.client.batch_size for i in range(n)]
    sampler = build_component("batch_sampler", Component(cfg.client.batch_sampler), "client.batch_sampler")
    dp = cfg.client.dp
    training = LocalTraining(sampler=sampler, lr=cfg.client.lr, epochs=cfg.client.epochs, steps=cfg.client.steps,
                             momentum=cfg.client.momentum, weight_decay=cfg.client.weight_decay,
                             dp_mode=dp.mode, clip=dp.clip, dp_method=dp.method)
    client_stages = _stage_chain("client_stage", cfg.client_stages, "client_stages")
    server_stages = _stage_chain("server_stage", cfg.server_stages, "server_stages")
    try:
        noise, ledger = setup_privacy(cfg, training, sizes, batch_sizes, byzantine, info,
                                      client_stages.round_events() + server_stages.round_events())
    except PrivacyError as err:
        if isinstance(err, BudgetExceededError):
            raise
        raise ConfigError(f"`client.dp`: {err}") from None

    attack = None
    if cfg.attack.name != "none":
        attack = build_component("attack", Component(cfg.attack.name, dict(cfg.attack.params)), "attack")
    aggregator = build_component("aggregator", cfg.aggregator, "aggregator")
    if cfg.pre_aggregators:
        pre = tuple(build_component("pre_aggregator", c, f"pre_aggregators[{i}]")
                    for i, c in enumerate(cfg.pre_aggregators))
        aggregator = PreAggregated(pre, aggregator)
    server_opt = build_component("server_optimizer", Component(cfg.server.optimizer, _server_params(cfg)),
                                 "server")
    executor = (VectorizedExecutor(cfg.engine.max_clients_per_batch) if cfg.engine.executor == "vectorized"
                else SequentialExecutor())
    fed = Federation(
        seed=seed, rounds=cfg.rounds, dataset=dataset, model=model, layout=layout,
        initial_params=layout.flatten(params).clone(),
        train_data=TrainData(dataset.train_x, dataset.train_y, dataset.num_classes),
        client_rows=client_rows, batch_sizes=batch_sizes, noise_multipliers=noise, training=training,
        cohort=CohortSampler(cfg.cohort.sampler, cfg.cohort.size, cfg.cohort.rate), byzantine=byzantine,
        attack=attack, client_stages=client_stages,
        aggregator=aggregator, server_stages=server_stages,
        server_optimizer=server_opt, executor=executor, ledger=ledger, weighting=cfg.server.weighting,
        attack_view=client_stages.without_privacy_noise() if attack is not None and cfg.attack.view == "noiseless"
        else None,
        reports={"num_samples": torch.tensor(sizes, dtype=torch.float64)},
        eval_every=cfg.engine.eval_every, eval_batch_size=cfg.engine.eval_batch_size, info=info)
    if recipe is not None:
        recipe.finalize(fed, cfg)
    return fed


def _server_params(cfg: ExperimentConfig) -> dict[str, Any]:
    s = cfg.server
    if s.optimizer == "sgd":
        return {"lr": s.lr, "momentum": s.momentum}
    return {"lr": s.lr, "beta1": s.beta1, "beta2": s.beta2, "tau": s.tau}


def _build_model(cfg: ExperimentConfig, dataset, seed: int):
    try:
        lookup("model", cfg.model.name)
    except RegistryError as err:
        raise ConfigError(f"`model.name`: {err}") from None
    try:
        return build_model(cfg.model.name, dataset.input_shape, dataset.num_classes, derive_seed(seed, "model"),
                           **cfg.model.params)
    except TypeError as err:
        raise ConfigError(f"`model` ({cfg.model.name!r}): {err}") from None
    except TrustFLError as err:
        raise ConfigError(f"`model`: {err}") from None



def _recipe(name: str):
    try:
        return lookup("algorithm", name)()
    except RegistryError as err:
        raise ConfigError(f"`algorithm`: {err}") from None
