"""Settings a run would silently ignore: a key set away from its default while the setting that governs it turns
its part off, e.g. ``client.dp.noise_multiplier`` with ``client.dp.mode = "off"`` (no DP-SGD, and nobody told) or
``engine.time_limit`` in the synchronous engine (it has no clock). Each is refused with its key path, as the
parameters of a component that does not run are (``check_unused_tables``). A sweep that turns a part off sets
its keys back to their defaults too, or gives the whole table (``--grid 'client.dp={mode="off"},{...}'``).

"Set" means "differs from the schema's default": a key given its default value changes nothing either way.
"""
from __future__ import annotations

import json
from typing import Any

from trustfl.config.schema import Component, ExperimentConfig, keys_set
from trustfl.data.datasets import EXPECTED_SHA256
from trustfl.errors import ConfigError

Rule = tuple[str, Any, tuple[str, ...], str]
"""``(table path, table, the table's keys that do nothing, why)``."""
NO_DEFAULT = object()
"""The "default" of a component parameter the default component does not set (it can only be removed)."""


def _rules(cfg: ExperimentConfig) -> list[Rule]:
    """Keys of a part that is off. A key whose part runs another way that needs no such key (``attack.view``
    without an attack, ``engine.max_clients_per_batch`` in the sequential executor) loses nothing and is not
    listed: a sweep that turns the part off keeps working."""
    dp, engine, cohort, server, client = cfg.client.dp, cfg.engine, cfg.cohort, cfg.server, cfg.client
    rules: list[Rule] = []
    if dp.mode == "off":
        rules.append(("client.dp", dp, ("clip", "noise_multiplier", "calibration", "method", "round_noise_to"),
                      '`client.dp.mode` is "off", so no DP-SGD runs (DP-SGD is `client.dp.mode` = "per_example" or '
                      '"batch_clip")'))
    if engine.kind != "async":
        rules.append(("engine", engine, ("interaction_time", "wait_time", "time_limit", "schedule"),
                      f'the {engine.kind!r} engine has no simulated clock (`engine.kind` = "async" has)'))
    if engine.kind == "vertical" and engine.activation != "clock":
        rules.append(("engine", engine, ("speed",), f'`engine.activation` is {engine.activation!r}; the speed model '
                                                     f'is used with `engine.activation` = "clock"'))
    elif engine.kind not in ("async", "vertical"):
        rules.append(("engine", engine, ("speed",), f'the {engine.kind!r} engine has no simulated clock '
                                                     f'(`engine.kind` = "async" has)'))
    polled = engine.kind == "async" and engine.schedule.name in ("polling", "buffered")
    if polled:
        rules.append(("client", client, ("step_budget",), f"the async engine's {engine.schedule.name!r} schedule "
                                                           "gives each client the steps its clock allows"))
        rules.append(("", cfg, ("downlink",), f"the async engine's {engine.schedule.name!r} schedule sends the model "
                                              "through `compress.downlink` alone (compress it there)"))
    if engine.kind == "async" and engine.schedule.name == "synchronous" and \
            _positive(engine.schedule.params.get("deadline")):
        rules.append(("client", client, ("step_budget",), "the synchronous schedule's `deadline` (FedNova) gives each "
                                                           "client the steps it completes before the deadline"))
    if not polled and cfg.compress.downlink.name != "none":
        rules.append(("", cfg, ("downlink",), "`compress.downlink` encodes the model, which the stages would not "
                                              "reach (only a gradient transform's shared statistics)"))
    if cohort.sampler != "uniform":
        rules.append(("cohort", cohort, ("size",), f'`cohort.sampler` is {cohort.sampler!r} (`size` is the '
                                                    f'"uniform" sampler\'s)'))
    if cohort.sampler != "poisson":
        rules.append(("cohort", cohort, ("rate",), f'`cohort.sampler` is {cohort.sampler!r} (`rate` is the '
                                                    f'"poisson" sampler\'s)'))
    if server.optimizer == "sgd":
        rules.append(("server", server, ("beta1", "beta2", "tau"),
                      '`server.optimizer` is "sgd" (beta1, beta2 and tau are "fedadam"\'s)'))
    else:
        rules.append(("server", server, ("momentum",), f'`server.optimizer` is {server.optimizer!r} '
                                                        f'(momentum is "sgd"\'s)'))
    if client.steps > 0:
        rules.append(("client", client, ("epochs",), "`client.steps` > 0 sets the local steps instead"))
    if cfg.data.path:  # a bundled set beside a fallback loses nothing (a sweep over data sets keeps working)
        fetched = " or ".join(EXPECTED_SHA256)
        rules.append(("data", cfg.data, ("fallback",), f"data set {cfg.data.dataset!r} reads your own file at "
                                                        f"`data.path` (the fallback replaces {fetched} when `make "
                                                        f"data` has not fetched it)"))
    return rules


def _positive(value: Any) -> bool:
    """A number above zero (a parameter not yet checked by its component: any type)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _overridden(cfg: ExperimentConfig) -> list[Rule]:
    """Keys that another key of the same config replaces. Judged on the config as written, before its algorithm's
    recipe runs: a recipe may derive one from the other (Robust-HDP turns ``batch_size`` into ``batch_sizes``)."""
    dp, client = cfg.client.dp, cfg.client
    rules: list[Rule] = []
    if dp.epsilons:
        rules.append(("client.dp", dp, ("epsilon", "epsilon_distribution"),
                      "`client.dp.epsilons` gives every client's budget"))
    elif dp.epsilon_distribution:
        rules.append(("client.dp", dp, ("epsilon",), "`client.dp.epsilon_distribution` draws every client's budget"))
    if client.batch_sizes:
        rules.append(("client", client, ("batch_size",), "`client.batch_sizes` gives every client's batch size"))
    return rules


def inert_settings(cfg: ExperimentConfig, as_written: bool = False) -> list[tuple[str, str, Any]]:
    """``(key path, why, default value)`` of every key ``cfg`` sets that its other settings make do nothing: on
    the config as its recipe left it, or (``as_written``) the keys another key of the written config replaces."""
    found = []
    for path, table, keys, why in (_overridden if as_written else _rules)(cfg):
        default = type(table)()
        for key in keys_set(table, keys):
            full, value, unset = f"{path}.{key}" if path else key, getattr(table, key), getattr(default, key)
            if isinstance(value, Component) and value.name == unset.name:  # the parameters differ: name each
                found += [(f"{full}.{param}", why, unset.params.get(param, NO_DEFAULT))
                          for param in sorted(value.params)
                          if value.params[param] != unset.params.get(param, NO_DEFAULT)]
            else:
                found.append((full, why, unset))
    return found


def check_inert_settings(cfg: ExperimentConfig, as_written: bool = False) -> None:
    """Refuse the first key of :func:`inert_settings` (with every other one named), before anything is built.

    Raises:
      ConfigError: naming the key path and what turns it off.
    """
    found = inert_settings(cfg, as_written)
    if found:
        (key, why, default), others = found[0], [k for k, _, _ in found[1:]]
        more = f"; also {', '.join(f'`{k}`' for k in others)}" if others else ""
        if default is NO_DEFAULT:
            fix = "remove it"
        else:  # a component: its name
            fix = f"remove it or set it to its default {json.dumps(getattr(default, 'name', default))}"
        raise ConfigError(f"`{key}` is set but does nothing: {why}; {fix}{more}.")


FILE_FREE_DATASETS = ("breast_cancer", "diabetes", "digits", "digits_canvas", "fedprox_synthetic", "synthetic")
"""Built-in data sets that read no file: ``data.data_dir`` means nothing to them."""


def idle_settings(cfg: ExperimentConfig) -> list[str]:
    """Notices of keys that do nothing in this run but are accepted (not refused as :func:`inert_settings` are),
    so that a sweep turning their part off keeps working: said, never silent."""
    attack, engine, data = cfg.attack, cfg.engine, cfg.data
    default_attack, default_engine = type(attack)(), type(engine)()
    notes = []
    if attack.name == "none":
        notes += [f"`attack.{key}` = {json.dumps(getattr(attack, key))} does nothing without an attack"
                  for key in ("view", "byzantine_hold_data") if getattr(attack, key) != getattr(default_attack, key)]
    if engine.executor == "sequential" and engine.max_clients_per_batch != default_engine.max_clients_per_batch:
        notes.append("`engine.max_clients_per_batch` does nothing with the sequential executor (one client at a time)")
    file_free = data.dataset in FILE_FREE_DATASETS and not data.path
    if data.fallback and file_free:
        notes.append(f"`data.fallback` does nothing: {data.dataset!r} is bundled, never absent")
    if data.data_dir and file_free:
        notes.append(f"`data.data_dir` does nothing: {data.dataset!r} reads no file")
    return [f"NOTICE: {n}." for n in notes]


def check_budget_has_a_use(cfg: ExperimentConfig, stage_events: list[Any]) -> None:
    """Refuse a privacy budget (``client.dp.epsilon``, ``epsilons``, ``epsilon_distribution``, ``delta``,
    ``accountant``) in a run where nothing is private: no DP-SGD and no client or server stage that adds noise.
    The run would otherwise train without noise and keep no ledger, and its budget would read as a guarantee.

    Raises:
      ConfigError: naming the key path.
    """
    dp = cfg.client.dp
    given = [] if dp.mode != "off" or stage_events else keys_set(dp, ("epsilon", "epsilons", "epsilon_distribution",
                                                                      "delta", "accountant"))
    if given:
        raise ConfigError(f"`client.dp.{given[0]}` is set but nothing in this run is private: `client.dp.mode` is "
                          f'"off" and no client or server stage adds noise that a ledger is charged for '
                          f'(correlated_noise is accounted only by algorithm cafcor); set `client.dp.mode` to '
                          f'"per_example" or "batch_clip", add a noise stage, or remove it.')
