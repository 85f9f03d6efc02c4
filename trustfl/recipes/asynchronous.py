"""Recipes of the asynchronous engine: QuAFL and its baselines FedBuff, FedAsync and FedNova.

Each recipe names the async engine's schedule and fills it from ``[recipe]``; speeds, time, compressors, DP,
aggregators and attacks come from the rest of the config, as for every algorithm.

- ``quafl`` (Zakerinia et al., "Communication-Efficient Federated Learning With Data and Client Heterogeneity",
  Alg. 1): the ``polling`` schedule. ``[recipe]``: ``client_averaging``, ``server_averaging`` (default true),
  ``decode_key`` (``"base"``: the paper's ``X^i``; ``"current"``: the authors' code; only with a keyed downlink),
  ``speed_weights`` (default false), ``lr_scaling`` (``"none"``, the paper; ``"code"``: local lr × (s+1)/s, the
  authors' code, only with server averaging). Models are averaged with equal weights ``1/(s+1)``
  (``server.weighting`` is set to ``uniform``).
- ``fedbuff`` (Nguyen et al. 2022, "Federated learning with buffered asynchronous aggregation"): the
  ``buffered`` schedule. ``[recipe]``: ``variant`` (``"original"``: staleness weight 1/√(1+τ), the client
  restarts from the updated model; ``"code"``: the QuAFL authors' simplification — no staleness weight,
  restart from the pre-update model, local lr × s/n), ``server_lr`` (default 1).
- ``fedasync`` (Xie, Koyejo, Gupta 2019, "Asynchronous federated optimization"): the ``buffered`` schedule with
  one client per step and ``x ← (1 − α_τ) x + α_τ x_i``, ``α_τ = α (1+τ)^{−a}``. ``[recipe]``: ``alpha``
  (default 0.6, in (0, 1]), ``a`` (default 0.5, >= 0).
- ``fednova`` (Wang et al. 2020, "Tackling the objective inconsistency problem in heterogeneous federated
  optimization"): the ``synchronous`` schedule; each client runs the steps it completes before ``deadline``
  (at least one) and the update is normalised by the steps. ``[recipe]``: ``deadline`` (simulated time, > 0).

A ``[recipe]`` key that the rest of the config makes do nothing is refused by name (``decode_key`` without a
lattice downlink, ``speed_weights`` with equal speeds, ``a`` when every step's staleness is 0).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from trustfl.config.schema import Component, ExperimentConfig
from trustfl.core.registry import register
from trustfl.engine.asynchronous import idle_schedule_params
from trustfl.engine.federation import Federation
from trustfl.errors import ConfigError
from trustfl.recipes.base import AbstractRecipe, recipe_choice, recipe_keys, recipe_number


def _on_async(cfg: ExperimentConfig, algorithm: str, schedule: str, params: dict[str, Any],
              **changes: Any) -> ExperimentConfig:
    if cfg.engine.kind not in ("sync", "async"):
        raise ConfigError(f"`engine.kind` {cfg.engine.kind!r} cannot run algorithm {algorithm!r}; use \"async\".")
    if cfg.engine.schedule != Component("synchronous"):
        given = ", ".join(f"`engine.schedule.{k}`" for k in ["name", *sorted(cfg.engine.schedule.params)])
        raise ConfigError(f"{given} set, but algorithm {algorithm!r} sets the schedule from `[recipe]`; remove "
                          "`engine.schedule`.")
    engine = dataclasses.replace(cfg.engine, kind="async", schedule=Component(schedule, params))
    return dataclasses.replace(cfg, engine=engine, **changes)


def _flag(rec: dict[str, Any], key: str, default: bool) -> bool:
    value = rec.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"`recipe.{key}` must be true or false, found {value!r}.")
    return value


def _refuse_idle(fed: Federation) -> None:
    """Refuse a ``[recipe]`` key whose schedule parameter this federation makes do nothing (the recipe's keys
    bear the parameters' names)."""
    idle = idle_schedule_params(fed)
    if idle:
        raise ConfigError(f"`recipe.{idle[0][0]}` is set but does nothing: {idle[0][1]}; remove it.")


class QuAFL(AbstractRecipe):
    def configure(self, cfg: ExperimentConfig) -> ExperimentConfig:
        rec = recipe_keys(cfg, "quafl", ("client_averaging", "server_averaging", "decode_key", "speed_weights",
                                         "lr_scaling"))
        server_avg = _flag(rec, "server_averaging", True)
        scaling = recipe_choice(rec, "lr_scaling", "none", ("none", "code"))
        if scaling != "none" and not server_avg:
            raise ConfigError("`recipe.lr_scaling` is set but does nothing: the code's factor (s+1)/s makes up for "
                              "the server keeping 1/(s+1) of its model, and `recipe.server_averaging` is false; "
                              "remove it.")
        s = max(cfg.cohort.size, 1)
        params = {"client_averaging": _flag(rec, "client_averaging", True), "server_averaging": server_avg,
                  "decode_key": recipe_choice(rec, "decode_key", "base", ("base", "current")),
                  "speed_weights": _flag(rec, "speed_weights", False),
                  "lr_scale": (s + 1) / s if scaling == "code" else 1.0}
        return _on_async(cfg, "quafl", "polling", params,
                         server=dataclasses.replace(cfg.server, weighting="uniform"))

    def finalize(self, fed: Federation, cfg: ExperimentConfig) -> None:
        _refuse_idle(fed)


class FedBuff(AbstractRecipe):
    def configure(self, cfg: ExperimentConfig) -> ExperimentConfig:
        rec = recipe_keys(cfg, "fedbuff", ("variant", "server_lr"))
        variant = recipe_choice(rec, "variant", "original", ("original", "code"))
        server_lr = recipe_number(rec, "server_lr", 1.0, low=0, low_open=True, finite=True)
        params: dict[str, Any] = {"mixing": "fedbuff", "server_lr": server_lr}
        if variant == "code":
            params.update(staleness="none", refresh="current",
                          lr_scale=max(cfg.cohort.size, 1) / max(cfg.data.num_clients, 1))
        return _on_async(cfg, "fedbuff", "buffered", params,
                         server=dataclasses.replace(cfg.server, weighting="uniform"))


_ALPHA = "the mixing weight of x ← (1 − α) x + α x_i; above 1 the model moves past the client's"


class FedAsync(AbstractRecipe):
    def configure(self, cfg: ExperimentConfig) -> ExperimentConfig:
        rec = recipe_keys(cfg, "fedasync", ("alpha", "a"))
        if cfg.cohort.sampler != "uniform" or cfg.cohort.size != 1:
            raise ConfigError("FedAsync updates the model at every client report: set `cohort.sampler` = "
                              "\"uniform\" and `cohort.size` = 1.")
        params = {"mixing": "fedasync", "a": recipe_number(rec, "a", 0.5, low=0, finite=True),
                  "alpha": recipe_number(rec, "alpha", 0.6, low=0, high=1, low_open=True, note=_ALPHA)}
        return _on_async(cfg, "fedasync", "buffered", params)

    def finalize(self, fed: Federation, cfg: ExperimentConfig) -> None:
        _refuse_idle(fed)


class FedNova(AbstractRecipe):
    def configure(self, cfg: ExperimentConfig) -> ExperimentConfig:
        rec = recipe_keys(cfg, "fednova", ("deadline",))
        if "deadline" not in rec:
            raise ConfigError("algorithm \"fednova\" needs `recipe.deadline` (simulated time each client trains "
                              "per round).")
        # deadline 0 is the synchronous schedule's FedAvg: FedNova without its normalisation
        deadline = recipe_number(rec, "deadline", None, low=0, low_open=True, finite=True,
                                 note="simulated time each client trains per round; 0 would be plain FedAvg")
        return _on_async(cfg, "fednova", "synchronous", {"deadline": deadline})


register("algorithm", "quafl")(QuAFL)
register("algorithm", "fedbuff")(FedBuff)
register("algorithm", "fedasync")(FedAsync)
register("algorithm", "fednova")(FedNova)
