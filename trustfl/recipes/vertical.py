"""Recipes of the vertical engine: DPZV and the VFL baselines VAFL, ZOO-VFL and VFL-CZOFO.

Each recipe sets ``engine.kind = "vertical"`` (and ``model.name = "vertical"`` when the model is left at its
default), reads its ``[recipe]`` keys and, once the federation is built, adds its method and its privacy.

Privacy (``recipe.epsilon``, left out = none; ``recipe.delta``, default 1e-3; ``recipe.accountant``:
``gdp``, the DPZV paper's first-order CLT μ-GDP, Thm C.2–C.4, or ``gdp_clt``, ``rdp``). Every server iteration
draws ``B`` of the ``D`` samples without replacement, so every protected message is one subsampled Gaussian release
at rate ``q = B/D`` under replace-one adjacency: ``rdp`` charges it as dp_accounting's
``SampledWithoutReplacementDpEvent(D, B, GaussianDpEvent(z))`` (replace-one), the μ-GDP accountants with their CLT
form of the subsampled Gaussian (the paper's; an approximation, not a worst-case bound); ``pld`` is refused
(dp_accounting's PLD accountant cannot analyse sampling without replacement). The noise multiplier is calibrated
so the whole run spends exactly ε under the chosen accountant, and the ledgers enforce it:

- ``dpzv`` protects the scalar the server returns (Thm 6.1): per-sample differences clipped to ``[−C, C]``
  (sensitivity ``2C/B`` of the batch mean under replace-one), noise ``σ_dp = z·2C/B``. Every reply counts
  against every party's ledger (a coalition of all parties sees all ``T`` replies, the paper's composition), so
  with ``gdp`` the noise is the paper's ``σ_dp = 2C√T/(D·μ)``.
- ``vafl``, ``zoo_vfl``, ``czofo`` protect each party's embeddings as VAFL does: every sample's embedding clipped
  to ``embedding_clip`` (sensitivity ``2·C_e`` under replace-one), Gaussian noise ``σ_e = z·2·C_e`` on every
  coordinate. Party ``m``'s ledger counts its own releases (ZOO-VFL sends two per activation); ``z`` is
  calibrated for the party with the most releases in the run's activation order. ``recipe.release_count =
  "all"`` charges every iteration's releases to every party instead (the DPZV paper's count T for its baselines:
  √M times more noise than a party's own releases need).

``[recipe]`` keys: ``dpzv``: ``smoothing`` (λ, 1e-3), ``clip`` (C, 10), ``clipping`` (false: no clipping, the
paper's Fig. 4 ablation; non-private only),
``difference`` (``"lambda"``: eq. 7; ``"two_lambda"``: eq. 3), ``direction`` (``"sphere"`` of radius √d, or
``"gaussian"``), ``server_update`` (``"sgd"``, option (ii), or ``"zo"``, option (i)); ``zoo_vfl``: ``smoothing``;
``czofo``: ``embedding_smoothing`` (μ, 1e-3); the baselines: ``embedding_clip`` (C_e, 1.0).

A key another key turns off is refused by name: without ``epsilon`` (no DP: no noise, no ledger, the baselines'
embeddings unclipped) ``delta``, ``accountant``, ``embedding_clip`` and ``release_count``; DPZV's ``clip`` with
``clipping = false``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from trustfl.config.schema import Component, ExperimentConfig
from trustfl.core.registry import register
from trustfl.errors import ConfigError, PrivacyError
from trustfl.privacy.accountant import Budget, LedgerBook
from trustfl.privacy.events import gaussian_event, poisson_sampled, without_replacement_sampled
from trustfl.recipes.base import AbstractRecipe, recipe_choice, recipe_keys
from trustfl.vertical.methods import CZOFO, DPZV, VAFL, ZOOVFL
from trustfl.vertical.parties import EmbeddingPrivacy

PRIVACY_KEYS = ("epsilon", "delta", "accountant")
BASELINE_KEYS = ("embedding_clip", "release_count")
ACCOUNTANTS = ("gdp", "gdp_clt", "rdp", "pld")
KEYS = {"dpzv": ("smoothing", "clip", "clipping", "difference", "direction", "server_update"),
        "vafl": BASELINE_KEYS, "zoo_vfl": ("smoothing", *BASELINE_KEYS),
        "czofo": ("embedding_smoothing", *BASELINE_KEYS)}
NEEDS_EPSILON = ("delta", "accountant", "embedding_clip", "release_count")
"""The keys that act only with ``recipe.epsilon``."""


def _number(rec: dict[str, Any], key: str, default: float) -> float:
    value = rec.get(key, default)
    if value is default:
        return default
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf):
        raise ConfigError(f"`recipe.{key}` must be a finite number > 0, found {value!r}.")
    return float(value)


def _flag(rec: dict[str, Any], key: str, default: bool) -> bool:
    value = rec.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"`recipe.{key}` must be true or false, found {value!r}.")
    return value


def check_keys_act(rec: dict[str, Any], algorithm: str) -> None:
    """Refuse the ``[recipe]`` keys that another of its keys turns off (the first named, every other listed).

    Raises:
      ConfigError: "`recipe.release_count` is set but does nothing: `recipe.epsilon` is not set, ...".
    """
    found = []
    if "epsilon" not in rec:
        sent = ("the server's replies carry no noise" if algorithm == "dpzv" else
                "the embeddings are sent unclipped and without noise")
        found += [(key, f"`recipe.epsilon` is not set, so the run has no DP ({sent}; no ledger is kept); set "
                        f"`recipe.epsilon` or remove it") for key in NEEDS_EPSILON if key in rec]
    if algorithm == "dpzv" and "clip" in rec and not _flag(rec, "clipping", True):
        found.append(("clip", "`recipe.clipping` is false, so the loss differences are not clipped; remove it"))
    if found:
        (key, why), others = found[0], [k for k, _ in found[1:]]
        more = f"; also {', '.join(f'`recipe.{k}`' for k in others)}" if others else ""
        raise ConfigError(f"`recipe.{key}` is set but does nothing: {why}{more}.")


class VerticalRecipe(AbstractRecipe):
    """The shared part: engine, model, privacy keys; subclasses build their method."""

    algorithm = ""

    def configure(self, cfg: ExperimentConfig) -> ExperimentConfig:
        check_keys_act(recipe_keys(cfg, self.algorithm, KEYS[self.algorithm] + PRIVACY_KEYS), self.algorithm)
        if cfg.engine.kind not in ("sync", "vertical"):
            raise ConfigError(f"`engine.kind` {cfg.engine.kind!r} cannot run algorithm {self.algorithm!r}; use "
                              f"\"vertical\" (or leave it out).")
        model = Component("vertical") if cfg.model == Component("mlp") else cfg.model
        return dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, kind="vertical"), model=model)

    def method(self, rec: dict[str, Any], cfg: ExperimentConfig):
        raise NotImplementedError

    def finalize(self, fed, cfg: ExperimentConfig) -> None:
        rec = dict(cfg.recipe)
        setup = fed.vertical
        method = self.method(rec, cfg)
        if method.channel == "scalar" and setup.party_momentum:
            raise ConfigError(f"`client.momentum` is {setup.party_momentum}, but a {self.algorithm} party steps "
                              f"along its regenerated direction only (a momentum buffer would cost a model-sized "
                              f"copy); set it to 0.")
        if isinstance(method, ZOOVFL) and setup.party_momentum:
            raise ConfigError("`client.momentum` is not supported by zoo_vfl (a zeroth-order party); set it to 0.")
        epsilon = _number(rec, "epsilon", math.inf)
        delta = rec.get("delta", 1e-3)
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
            raise ConfigError(f"`recipe.delta` must be a number in (0, 1), found {delta!r}.")
        accountant = recipe_choice(rec, "accountant", "gdp", ACCOUNTANTS)
        if accountant == "pld" and "epsilon" in rec:
            raise ConfigError("`recipe.accountant` = \"pld\": every server iteration draws B of the D samples "
                              "without replacement (replace-one adjacency), which dp_accounting's PLD accountant "
                              "cannot analyse; use \"rdp\" (or the paper's \"gdp\").")
        info = fed.info["vertical"]
        info.update(method=self.algorithm)
        setup.method = method
        setup.cache_init = "forward"
        if math.isinf(epsilon):  # no DP: no ε, δ or noise reported (the horizontal engine reports no privacy)
            return
        info.update(epsilon=epsilon, delta=delta)
        bound = self._bound(method)
        if math.isinf(bound):
            raise ConfigError(f"`recipe.clipping` is false, but `recipe.epsilon` = {epsilon:g} needs the "
                              f"clipping bound `recipe.clip`.")
        setup.charge_all = method.channel == "scalar" or recipe_choice(rec, "release_count", "own",
                                                                       ("own", "all")) == "all"
        counts = setup.order.bincount(minlength=setup.num_parties)
        per_party = int(setup.order.numel()) if setup.charge_all else int(counts.max())
        total = per_party * method.releases
        q = setup.batch_size / setup.num_samples
        from trustfl.privacy.analysis.gaussian import calibrate_noise_multiplier

        # rdp: the batches' real sampling, B of D without replacement, under replace-one (noise z·2C: z over the
        # replace-one sensitivity). The μ-GDP accountants keep the paper's CLT form of the subsampled Gaussian.
        wor = accountant == "rdp" and setup.batch_size < setup.num_samples
        try:
            z = calibrate_noise_multiplier(epsilon, delta, q, total, accountant=accountant, tol=1e-6 * epsilon,
                                           sampling="without_replacement" if wor else "poisson",
                                           dataset_size=setup.num_samples if wor else None)
        except PrivacyError as err:
            raise ConfigError(f"`recipe.epsilon` = {epsilon:g} over {total} releases at rate {q:.4g}: "
                              f"{err}") from None
        if method.channel == "scalar":
            method.noise_std = z * 2 * bound / setup.batch_size
        else:
            method.privacy = EmbeddingPrivacy(bound, z * 2 * bound)
            setup.cache_init = "zeros"  # a warm-up pass would release every embedding once more
        setup.release_event = without_replacement_sampled(gaussian_event(z), setup.num_samples, setup.batch_size) \
            if wor else poisson_sampled(gaussian_event(z), q)
        fed.ledger = LedgerBook({m: Budget(epsilon, delta) for m in range(setup.num_parties)},
                                accountant=accountant, neighboring="replace_one" if wor else "add_remove")
        info.update(noise_multiplier=z, releases=total, sample_rate=q, accountant=accountant,
                    noise_std=method.noise_std if method.channel == "scalar" else method.privacy.noise_std)

    @staticmethod
    def _bound(method) -> float:
        return method.clip if method.channel == "scalar" else method.privacy.clip


class DPZVRecipe(VerticalRecipe):
    algorithm = "dpzv"

    def method(self, rec, cfg):
        return DPZV(party_lr=cfg.client.lr, smoothing=_number(rec, "smoothing", 1e-3),
                    clip=_number(rec, "clip", 10.0) if _flag(rec, "clipping", True) else math.inf,
                    difference=recipe_choice(rec, "difference", "lambda", ("lambda", "two_lambda")),
                    direction_kind=recipe_choice(rec, "direction", "sphere", ("sphere", "gaussian")),
                    server_update=recipe_choice(rec, "server_update", "sgd", ("sgd", "zo")))


def _embedding_privacy(rec: dict[str, Any]) -> EmbeddingPrivacy:
    clip = _number(rec, "embedding_clip", 1.0)
    return EmbeddingPrivacy(clip if "epsilon" in rec else math.inf)


class VAFLRecipe(VerticalRecipe):
    algorithm = "vafl"

    def method(self, rec, cfg):
        return VAFL(party_lr=cfg.client.lr, privacy=_embedding_privacy(rec))


class ZOOVFLRecipe(VerticalRecipe):
    algorithm = "zoo_vfl"

    def method(self, rec, cfg):
        return ZOOVFL(party_lr=cfg.client.lr, smoothing=_number(rec, "smoothing", 1e-3),
                      privacy=_embedding_privacy(rec))


class CZOFORecipe(VerticalRecipe):
    algorithm = "czofo"

    def method(self, rec, cfg):
        return CZOFO(party_lr=cfg.client.lr, embedding_smoothing=_number(rec, "embedding_smoothing", 1e-3),
                     privacy=_embedding_privacy(rec))


register("algorithm", "dpzv")(DPZVRecipe)
register("algorithm", "vafl")(VAFLRecipe)
register("algorithm", "zoo_vfl")(ZOOVFLRecipe)
register("algorithm", "czofo")(CZOFORecipe)
