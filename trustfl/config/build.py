"""Schema → runnable federation: load data, partition, build the model, stages, aggregator and accountant.

Every component table is checked against its factory's signature, so an unknown or invalid parameter is a
ConfigError naming its key path before any training starts.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import sys
from typing import Any, Sequence

import torch

from trustfl.aggregate.base import PreAggregated
from trustfl.client.gradients import AbstractGradientMethod, BatchClipped, PerExampleClipped, PlainGradient
from trustfl.client.transforms import SGD, DPNoise, LocalChain, Momentum, WeightDecay
from trustfl.config.device import device_info, on_device, refuse_meta_default, resolve_engine_device
from trustfl.config.fit import (check_batches_fit, check_data_attack, check_enough_messages, check_pair_noise,
                                check_reports, whole_data_batches)
from trustfl.config.inert import check_inert_settings, idle_settings
from trustfl.config.model import build_config_model, check_model_fits
from trustfl.config.partition import partition_clients
from trustfl.config.population import population_options, population_partition
from trustfl.config.privacy import setup_privacy
from trustfl.config.sensitivity import check_privacy_stages
from trustfl.config.vertical import check_horizontal_config, check_vertical_config, feature_blocks, vertical_setup
from trustfl.config.schema import Component, ExperimentConfig
from trustfl.core.memory import out_of_memory_as_error
from trustfl.core.registry import check_scalar_types, import_module_or_file, keyword_parameters, lookup
from trustfl.core.stage import chain
from trustfl.data.datasets import Dataset, dataset_available, load_dataset
from trustfl.engine import chunking
from trustfl.engine.base import AbstractEngine
from trustfl.engine.asynchronous import Timing
from trustfl.engine.executors import SequentialExecutor, VectorizedExecutor
from trustfl.engine.federation import CohortSampler, Federation
from trustfl.engine.links import Links
from trustfl.engine.local import LocalTraining, TrainData, check_local_steps
from trustfl.engine.loop import ROW_COLUMNS
from trustfl.errors import BudgetExceededError, ConfigError, PrivacyError, RegistryError, TrustFLError
from trustfl.evaluate.base import default_evaluators
from trustfl.evaluate.representation import check_model_outputs
from trustfl.objectives.base import AbstractObjective
from trustfl.server.downlink import Downlink
from trustfl.types import ParamLayout


def build_component(kind: str, comp: Component, path: str, params_path: str | None = None, **extra: Any) -> Any:
    """Build ``comp`` from the ``kind`` registry; errors carry the TOML key path (``params_path``: the table its
    parameters sit in, when not ``path`` itself: ``attack.params``)."""
    try:
        factory = lookup(kind, comp.name)
    except RegistryError as err:
        raise ConfigError(f"`{path}.name`: {err}") from None
    sig = inspect.signature(factory)
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    allowed = [n for n in keyword_parameters(sig) if n not in extra]
    where = params_path or path
    for key in comp.params:
        if key not in allowed and not accepts_any:
            raise ConfigError(f"Unknown key `{where}.{key}` for {kind} {comp.name!r}; allowed: "
                              f"{', '.join(allowed) or '(none)'}.")
    missing = [n for n in allowed if sig.parameters[n].default is sig.parameters[n].empty and n not in comp.params]
    if missing:  # said by key, not as the factory's TypeError ("__init__() missing 1 required positional argument")
        raise ConfigError(f"`{where}.{missing[0]}` is required by {kind} {comp.name!r} (it takes "
                          f"{', '.join(allowed)}).")
    extra = {k: v for k, v in extra.items() if accepts_any or k in sig.parameters}  # context it declares only
    try:
        check_scalar_types(kind, comp.name, sig, dict(comp.params))
        return factory(**extra, **comp.params)
    except (TrustFLError, TypeError, ValueError) as err:
        raise ConfigError(f"`{path}` ({kind} {comp.name!r}): {err}") from None


def _named(kind: str, comps: list[Component], path: str, taken: set[str] = frozenset()) -> list[tuple[str, Any]]:
    named, used = [], set(taken)
    for i, comp in enumerate(comps):
        name = comp.name if comp.name not in used else f"{comp.name}_{i}"
        used.add(name)
        named.append((name, build_component(kind, comp, f"{path}[{i}]")))
    return named


def _stage_chain(kind: str, comps: list[Component], path: str):
    return chain(*_named(kind, comps, path))


def import_plugins(cfg: ExperimentConfig) -> None:
    """Import the modules of ``plugins`` (module names, or ``.py`` paths relative to the working directory)."""
    for i, target in enumerate(cfg.plugins):
        if not target.strip():
            raise ConfigError(f"`plugins[{i}]` is empty; give a module name or the path of a .py file.")
        try:
            import_module_or_file(target)
        except (ImportError, SyntaxError) as err:
            raise ConfigError(f"`plugins[{i}]`: cannot import {target!r}: {err}") from None
        except TrustFLError as err:
            raise ConfigError(f"`plugins[{i}]` ({target!r}): {err}") from None


def resolve_engine(cfg: ExperimentConfig, kind: str | None = None) -> AbstractEngine:
    """The engine ``kind`` (default ``engine.kind``) names, from the registry."""
    try:
        return lookup("engine", kind or cfg.engine.kind)()
    except RegistryError as err:
        raise ConfigError(f"`engine.kind`: {err}") from None


def objective_name(cfg: ExperimentConfig, dataset: Dataset) -> str:
    """The registered objective ``objective.name`` stands for (``auto`` resolved from the data set's task)."""
    if cfg.objective.name != "auto":
        return cfg.objective.name
    return "cross_entropy" if dataset.task == "classification" else "mse"


def build_objective(cfg: ExperimentConfig, dataset: Dataset) -> AbstractObjective:
    """The objective (``auto``: cross-entropy for class labels, squared error for real targets), checked against
    the data set's targets."""
    comp = Component(objective_name(cfg, dataset), cfg.objective.params)
    objective = build_component("objective", comp, "objective")
    if not isinstance(objective, AbstractObjective):
        raise ConfigError(f"`objective.name`: {comp.name!r} is registered as an objective but builds a "
                          f"{type(objective).__name__}, not an AbstractObjective.")
    objective.check_data(dataset.train_y, dataset.num_classes)
    return objective


def build_evaluators(cfg: ExperimentConfig, objective: AbstractObjective) -> tuple[Any, ...]:
    comps = cfg.evaluators or [Component(n) for n in default_evaluators(objective.task)]
    path = "evaluators" if cfg.evaluators else f"evaluators (defaults of the {objective.task} task)"
    evaluators = tuple(build_component("evaluator", c, f"{path}[{i}]") for i, c in enumerate(comps))
    for i, evaluator in enumerate(evaluators):  # a name is a metrics.jsonl key and names a .png file
        task = getattr(evaluator, "task", None)
        if task is not None and objective.task in ("classification", "regression") and task != objective.task:
            raise ConfigError(f"`{path}[{i}]` ({comps[i].name!r}) measures a {task} task, but the data set "
                              f"and objective are {objective.task}; use "
                              f"{', '.join(repr(n) for n in default_evaluators(objective.task))}.")
        for m in evaluator.metrics:
            if not (isinstance(m, str) and m.isprintable() and 0 < len(m) <= 100):
                raise ConfigError(f"{path}[{i}] ({type(evaluator).__name__}): metric name {repr(m)[:60]} must be "
                                  f"printable text of 1 to 100 characters (no control character such as NUL).")
            if m in ROW_COLUMNS:
                raise ConfigError(f"{path}[{i}] ({type(evaluator).__name__}): metric name {m!r} is a column the "
                                  f"engine writes in metrics.jsonl rows; name it otherwise.")
    names = [m for e in evaluators for m in e.metrics]
    if len(set(names)) != len(names):
        raise ConfigError(f"`evaluators` report the same metric twice: {names}.")
    if cfg.report.primary_metric and cfg.report.primary_metric not in names:
        raise ConfigError(f"`report.primary_metric` is {cfg.report.primary_metric!r}, which no evaluator "
                          f"reports; evaluated metrics: {', '.join(names)}.")
    return evaluators


def build_local_chain(cfg: ExperimentConfig) -> LocalChain:
    """Gradient method from ``client.dp.mode``, DP noise, ``client.transforms``, weight decay, momentum, SGD."""
    c, dp = cfg.client, cfg.client.dp
    method: AbstractGradientMethod
    if dp.mode == "per_example":
        method = PerExampleClipped(dp.clip, dp.method)
    elif dp.mode == "batch_clip":
        method = BatchClipped(dp.clip)
    else:
        method = PlainGradient()
    reserved = {"dp_noise", "weight_decay", "momentum"}
    named: list[tuple[str, Any]] = []
    if dp.mode != "off":
        named.append(("dp_noise", DPNoise(dp.clip, divide_by_batch_size=dp.mode == "per_example")))
    named += _named("gradient_transform", c.transforms, "client.transforms", reserved)
    if c.weight_decay:
        named.append(("weight_decay", WeightDecay(c.weight_decay)))
    if c.momentum:
        named.append(("momentum", Momentum(c.momentum)))
    try:
        return LocalChain(method, tuple(named), SGD(c.lr))
    except ConfigError as err:
        raise ConfigError(f"`client.transforms`: {err}") from None


def resolve_dataset(cfg: ExperimentConfig) -> tuple[str, str | None]:
    """The data set to load, and a notice when the configured one is absent and a fallback is used."""
    name = cfg.data.dataset
    if cfg.data.fallback and not dataset_available(name, cfg.data.data_dir or None):
        notice = (f"NOTICE: data set {name!r} is not on this machine (run `make data`); using the fallback "
                  f"{cfg.data.fallback!r} instead.")
        return cfg.data.fallback, notice
    return name, None


def build_federation(cfg: ExperimentConfig, data_dir: str | None = None, quiet: bool = False,
                     for_client: int | None = None, checked_noise: float | None = None) -> Federation:
    """Build every object of the experiment ``cfg`` describes (deterministic for ``cfg.seed``).

    ``for_client``: what that client's deployed node needs. Its noise multiplier is calibrated and its privacy
    schedule checked, no other client's (that would take a node time in proportion to the federation at every
    message); a plan for another client is refused. ``checked_noise``: its multiplier as the node calibrated and
    checked it at an earlier message (see :func:`~trustfl.config.privacy.setup_privacy`).
    """
    refuse_meta_default("build_federation")
    import_plugins(cfg)
    check_inert_settings(cfg, as_written=True)
    recipe = _recipe(cfg.algorithm)
    if recipe is not None:
        cfg = recipe.configure(cfg)
    resolve_engine(cfg)
    vertical = cfg.engine.kind == "vertical"
    if vertical:
        check_vertical_config(cfg)
    else:
        check_horizontal_config(cfg)
    check_unused_tables(cfg)
    check_inert_settings(cfg)
    seed = cfg.seed
    device, device_notice = resolve_engine_device(cfg, vertical)
    info: dict[str, Any] = {"algorithm": cfg.algorithm, "engine": cfg.engine.kind,
                            **device_info(device, cfg.engine.dtype)}
    if device_notice and not quiet:
        print(device_notice, file=sys.stderr)
    name, notice = resolve_dataset(cfg)
    if notice:
        info["notice"] = notice
    options = {k: v for k, v in cfg.data.options.items()}
    if notice and {"max_train", "max_test"} & set(options):  # subset sizes are the configured data set's
        dropped = sorted({"max_train", "max_test"} & set(options))
        options = {k: v for k, v in options.items() if k not in dropped}
        info["notice"] += f" Its {' and '.join(dropped)} option(s) are ignored for the fallback (all its data)."
    if cfg.data.path:
        options["path"] = cfg.data.path
    try:
        options = population_options(cfg, name, options)
        with out_of_memory_as_error(f"loading data set {name!r}", "`data.num_clients` or `data.options`"):
            dataset = load_dataset(name, data_dir or cfg.data.data_dir or None, seed=seed, **options)
    except RegistryError as err:
        raise ConfigError(f"`data.dataset`: {err}") from None
    except (ConfigError, TypeError, ValueError) as err:
        raise ConfigError(f"`data`: {err}") from None
    info["dataset"] = name
    info["data_source"] = dataset.source
    objective = build_objective(cfg, dataset)
    evaluators = build_evaluators(cfg, objective)
    info["objective"] = objective_name(cfg, dataset)
    info["evaluators"] = [m for e in evaluators for m in e.metrics]

    n, f = cfg.data.num_clients, cfg.attack.num_byzantine
    # said, not silent (e.g. num_clients lowered by --set); the async engine refuses it instead (s per server step)
    if cfg.cohort.sampler == "uniform" and cfg.cohort.size > n and cfg.engine.kind != "async":
        extra = (f"NOTICE: `cohort.size` = {cfg.cohort.size} is more than the {n} clients of `data.num_clients`; "
                 f"every round samples all {n}.")
        add_notice(info, extra)
    if cfg.attack.name != "none" and not 0 < f < n:
        raise ConfigError(f"`attack.num_byzantine` must be in [1, {n - 1}] with attack {cfg.attack.name!r}, "
                          f"found {f}.")
    if cfg.attack.name == "none" and f:
        raise ConfigError(f"`attack.num_byzantine` is {f} but `attack.name` is \"none\"; name an attack.")
    byzantine = frozenset(range(n - f, n)) if cfg.attack.name != "none" else frozenset()
    holders = n if cfg.attack.byzantine_hold_data else n - len(byzantine)
    if dataset.population is not None:  # a generated population is its own partition (natural)
        client_rows, info["partition"] = population_partition(cfg, dataset, evaluators)
        build_component("partitioner", cfg.data.partition, "data.partition")  # its keys checked, as elsewhere
    else:
        partitioner = build_component("partitioner", cfg.data.partition, "data.partition")
        client_rows, info["partition"] = partition_clients(cfg, dataset, partitioner, holders, seed)
        if "notice" in info["partition"]:  # clients left without examples by the user's choice (min_size = 0)
            add_notice(info, info["partition"]["notice"])

    blocks = feature_blocks(cfg, dataset, seed, info) if vertical else None
    if "notice" in info and not quiet:
        print(info["notice"], file=sys.stderr)
    model = build_config_model(cfg, dataset, seed, objective.num_outputs(dataset.train_y, dataset.num_classes),
                         blocks=None if blocks is None else [b.tolist() for b in blocks])
    model.to(device)  # built and seeded on the CPU (the same values on every device), then moved once
    check_model_outputs(evaluators, model)
    if not vertical:
        check_model_fits(cfg, model, objective, dataset, info["objective"])
    params = {k: v.detach() for k, v in model.named_parameters()}
    layout = ParamLayout.of(params)
    info["num_parameters"] = layout.numel

    sizes = client_rows.sizes()
    batch_sizes = [cfg.client.batch_sizes[i % len(cfg.client.batch_sizes)] if cfg.client.batch_sizes
                   else cfg.client.batch_size for i in range(n)]
    sampler = build_component("batch_sampler", Component(cfg.client.batch_sampler), "client.batch_sampler")
    dp = cfg.client.dp
    training = LocalTraining(sampler=sampler, lr=cfg.client.lr, epochs=cfg.client.epochs, steps=cfg.client.steps,
                             momentum=cfg.client.momentum, weight_decay=cfg.client.weight_decay,
                             dp_mode=dp.mode, clip=dp.clip, dp_method=dp.method, lr_schedule=cfg.client.lr_schedule)
    check_local_steps(training, sizes, batch_sizes)
    if not vertical:
        check_batches_fit(sampler, sizes, batch_sizes, "client.batch_sizes" if cfg.client.batch_sizes
                          else "client.batch_size")
    batch_note = None if vertical else whole_data_batches(sizes, batch_sizes)
    if cfg.client.lr_schedule != "constant" and cfg.engine.kind != "sync":
        raise ConfigError(f"`client.lr_schedule` = {cfg.client.lr_schedule!r} runs in the synchronous engine only; "
                          f"`engine.kind` is {cfg.engine.kind!r}.")
    client_stages = _stage_chain("client_stage", cfg.client_stages, "client_stages")
    check_pair_noise(cfg)
    server_stages = _stage_chain("server_stage", cfg.server_stages, "server_stages")
    stage_events = client_stages.round_events() + server_stages.round_events()
    if stage_events:
        training = dataclasses.replace(training, noise_elsewhere=True)
    try:
        noise, ledger = setup_privacy(cfg, training, sizes, batch_sizes, byzantine, info, stage_events, for_client,
                                      checked_noise)
    except PrivacyError as err:
        if isinstance(err, BudgetExceededError):  # keep the class (callers tell budgets apart), name the key
            raise BudgetExceededError(f"`client.dp` / `rounds`: {err}") from None
        raise ConfigError(f"`client.dp`: {err}") from None

    attack = None
    if cfg.attack.name != "none":
        attack = build_component("attack", Component(cfg.attack.name, dict(cfg.attack.params)), "attack",
                                 "attack.params")
        check_data_attack(cfg, attack, dataset.task, objective, name)
    aggregator = build_component("aggregator", cfg.aggregator, "aggregator")
    if cfg.pre_aggregators:
        pre = tuple(build_component("pre_aggregator", c, f"pre_aggregators[{i}]")
                    for i, c in enumerate(cfg.pre_aggregators))
        aggregator = PreAggregated(pre, aggregator)
    if cfg.engine.kind in ("sync", "async"):  # the async engine's server step aggregates at most `cohort.size`
        check_enough_messages(cfg, aggregator)
    server_opt = build_component("server_optimizer", Component(cfg.server.optimizer, _server_params(cfg)),
                                 "server")
    executor = (VectorizedExecutor(cfg.engine.max_clients_per_batch) if cfg.engine.executor == "vectorized"
                else SequentialExecutor())
    if not vertical:  # the round's messages must fit on the device, however the clients' training is chunked
        key = {"all": "data.num_clients", "uniform": "cohort.size", "poisson": "cohort.rate"}[cfg.cohort.sampler]
        chunking.check_cohort_fits(chunking.expected_cohort(cfg.cohort.sampler, n, cfg.cohort.size, cfg.cohort.rate),
                                   layout.numel, next(iter(params.values())).device, key,
                                   pairwise=aggregator.pairwise)
    local_chain = build_local_chain(cfg)
    check_privacy_stages(cfg, client_stages, server_stages, bool(local_chain.extras_widths(layout)))
    noisy = [n for n, st in client_stages.stages if st.privacy_noise]
    if local_chain.extras_widths(layout) and noisy:
        raise ConfigError(f"`client.transforms` {local_chain.names} send values beside the message (e.g. SCAFFOLD's "
                          f"control variates) that the message's privacy stages {noisy} do not protect; use "
                          f"sample-level DP (`client.dp`) instead.")
    for key, value, default in [("server.extras", cfg.server.extras, "mean"),
                                ("attack.extras", cfg.attack.extras, "zero")]:
        if value != default and not local_chain.extras_widths(layout):
            raise ConfigError(f"`{key}` = {value!r} does nothing: no gradient transform of `client.transforms` "
                              f"sends values beside the message (SCAFFOLD does).")
    info["local_chain"] = [type(local_chain.method).__name__] + local_chain.names
    step_budget = build_component("step_budget", cfg.client.step_budget, "client.step_budget")
    augment, statistics = build_selfsup_parts(cfg, objective, sizes, dataset.input_shape)
    downlink = Downlink(tuple(_named("downlink_stage", cfg.downlink, "downlink")))
    fed = Federation(
        seed=seed, rounds=cfg.rounds, dataset=dataset, model=model, layout=layout,
        initial_params=layout.flatten(params).clone(),
        train_data=TrainData(on_device(dataset.tensors("train"), device), dataset.num_classes)
        if dataset.population is None else TrainData.lazy(dataset.population, dataset.num_classes, name),
        objective=objective, evaluators=evaluators, local_chain=local_chain, downlink=downlink,
        step_budget=step_budget, test_data=on_device(dataset.tensors("test"), device),
        client_rows=client_rows, batch_sizes=batch_sizes, noise_multipliers=noise, training=training,
        cohort=CohortSampler(cfg.cohort.sampler, cfg.cohort.size, cfg.cohort.rate), byzantine=byzantine,
        attack=attack, client_stages=client_stages,
        aggregator=aggregator, server_stages=server_stages,
        server_optimizer=server_opt, executor=executor, ledger=ledger, weighting=cfg.server.weighting,
        extras_rule=cfg.server.extras, attack_extras=cfg.attack.extras,
        attack_view=client_stages.without_privacy_noise() if attack is not None and cfg.attack.view == "noiseless"
        else None,
        reports={"num_samples": torch.tensor(sizes, dtype=torch.float64)},
        eval_every=cfg.engine.eval_every, eval_batch_size=cfg.engine.eval_batch_size, info=info,
        links=build_links(cfg, layout), augment=augment, statistics=statistics,
        eval_initial=cfg.engine.eval_initial, compute_dtype=cfg.engine.dtype, **build_timing(cfg, n))
    if vertical:
        fed.vertical = vertical_setup(cfg, dataset, blocks, info)
    if recipe is not None:
        recipe.finalize(fed, cfg)
    fed.reports = on_device(fed.reports, device)  # after the recipe, which may add its own (reported_epsilon, ...)
    check_reports(fed.aggregator, fed.reports)
    engine = resolve_engine(cfg)
    if hasattr(engine, "check"):
        engine.check(fed)
    for note in [batch_note, *idle_settings(cfg)]:  # said once the run is built, so that a refusal stays one line
        if note:
            add_notice(info, note)
            if not quiet:
                print(note, file=sys.stderr)
    return fed


def build_selfsup_parts(cfg: ExperimentConfig, objective: AbstractObjective, sizes: list[int],
                        input_shape: Sequence[int]) -> tuple[Any, tuple[tuple[str, Any], ...]]:
    """``client.augment`` and ``client.statistics``, checked against the objective, the data's example shape
    (an augmentation's optional ``check_input_shape``) and the engine."""
    augment = None
    if cfg.client.augment.name != "none":
        augment = build_component("augmentation", cfg.client.augment, "client.augment")
        check = getattr(augment, "check_input_shape", None)
        if check is not None:
            check(tuple(input_shape))
    elif cfg.client.augment.params:
        raise ConfigError(f"`client.augment.{sorted(cfg.client.augment.params)[0]}` is set but `client.augment` "
                          f"is not used (its name is \"none\").")
    if objective.input_key == "views" and augment is None:
        raise ConfigError(f"`client.augment`: the objective reads {objective.input_key!r}, which the data set does "
                          f"not hold; name an augmentation that makes them (e.g. {{ name = \"views\" }}).")
    if objective.batch_coupled and cfg.client.dp.mode != "off":
        raise ConfigError(f"`client.dp.mode` = {cfg.client.dp.mode!r}: objective {cfg.objective.name!r} is not a "
                          f"mean of per-example losses (its batch terms are coupled), so per-example or batch "
                          f"clipping DP-SGD does not apply; set `client.dp.mode` = \"off\".")
    statistics = []
    for i, comp in enumerate(cfg.client.statistics):
        statistics.append((comp.name, build_component("client_statistic", comp, f"client.statistics[{i}]",
                                                      sizes=tuple(sizes), rounds=cfg.rounds)))
    if len({n for n, _ in statistics}) != len(statistics):
        raise ConfigError(f"`client.statistics` names a statistic twice: {[n for n, _ in statistics]}.")
    if statistics and cfg.engine.kind != "sync":
        raise ConfigError(f"`client.statistics` run in the synchronous engine only; `engine.kind` is "
                          f"{cfg.engine.kind!r}.")
    return augment, tuple(statistics)


def add_notice(info: dict[str, Any], note: str) -> None:
    """Append ``note`` to the run's notice (``run_info.json``, the summary and the CLI's last lines)."""
    info["notice"] = f"{info['notice']} {note}" if "notice" in info else note


def check_unused_tables(cfg: ExperimentConfig) -> None:
    """Refuse parameters given to a component that will not run (a typo or a misplaced table changes nothing
    otherwise, and nobody is told)."""
    unused = [(f"compress.{d}", c) for d in ("uplink", "downlink") if (c := getattr(cfg.compress, d)).name == "none"]
    if cfg.engine.kind != "async":
        unused.append(("engine.schedule", cfg.engine.schedule))
    if cfg.engine.kind not in ("async", "vertical"):
        unused.append(("engine.speed", cfg.engine.speed))
    for path, comp in unused:
        if comp.params:
            key = sorted(comp.params)[0]
            why = f"the engine is {cfg.engine.kind!r}" if path.startswith("engine.") else "its name is \"none\""
            raise ConfigError(f"`{path}.{key}` is set but `{path}` is not used ({why}).")
    if cfg.attack.name == "none" and cfg.attack.params:
        raise ConfigError(f"`attack.params.{sorted(cfg.attack.params)[0]}` is set but `attack.name` is \"none\".")


def build_links(cfg: ExperimentConfig, layout: ParamLayout) -> Links | None:
    """The uplink and downlink compressors (``None`` when both are ``none``). QSGD's per-tensor scales follow
    the model's parameter tensors."""
    built = {}
    for direction in ("uplink", "downlink"):
        comp = getattr(cfg.compress, direction)
        if comp.name == "none":
            built[direction] = None
            continue
        compressor = build_component("compressor", comp, f"compress.{direction}")
        built[direction] = compressor.with_segments([math.prod(s) for s in layout.shapes])
    if built["uplink"] is None and built["downlink"] is None:
        return None
    if cfg.engine.kind == "sync" and built["downlink"] is not None and built["downlink"].needs_key:
        raise ConfigError(f"`compress.downlink`: {cfg.compress.downlink.name!r} decodes against a reference point "
                          "the clients of the synchronous engine do not hold; use it with the async engine's "
                          "polling schedule (QuAFL) or pick a compressor without a key (qsgd, qsgd_minmax).")
    return Links(built["uplink"], built["downlink"], cfg.seed)


def build_timing(cfg: ExperimentConfig, num_clients: int) -> dict[str, Any]:
    """The async engine's clock settings and schedule (nothing for the synchronous engine)."""
    if cfg.engine.kind != "async":
        return {}
    speed = build_component("speed_model", cfg.engine.speed, "engine.speed")
    try:
        speed = speed.bind(num_clients, seed=cfg.seed)
    except TrustFLError as err:
        raise ConfigError(f"`engine.speed` ({cfg.engine.speed.name!r}): {err}") from None
    timing = Timing(speed, cfg.engine.interaction_time, cfg.engine.wait_time, cfg.engine.time_limit)
    return {"timing": timing, "schedule": build_component("schedule", cfg.engine.schedule, "engine.schedule")}


def _server_params(cfg: ExperimentConfig) -> dict[str, Any]:
    s = cfg.server
    if s.optimizer == "sgd":
        return {"lr": s.lr, "momentum": s.momentum}
    return {"lr": s.lr, "beta1": s.beta1, "beta2": s.beta2, "tau": s.tau}


def _recipe(name: str):
    try:
        return lookup("algorithm", name)()
    except RegistryError as err:
        raise ConfigError(f"`algorithm`: {err}") from None
