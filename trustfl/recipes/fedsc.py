"""FedSC (Jing, Yu, Zhang & Zhang, ICML 2024) and its baselines FedAvg+SC and centralized SC.

``algorithm = "fedsc"`` (Algorithm 1 of the FedSC paper) composes existing parts:

- objective ``spectral_contrastive`` (Eq. 5 / Eq. 80 on the mini-batch estimators of Sec. 5.2, representations
  clipped to √μ as in the authors' code), computed per client inside the vectorized step;
- augmentation ``views`` (2V views of every example, from each client's own stream of the round);
- client statistic ``fedsc_correlation``: DP-CalR (Algorithm 2) at θ^{t−1} before local training, the server's
  store of every client's last matrix with incremental replacement, all clients at the first share, and each
  participant's R̃_{−j} and α_t (App. C's linear decay) on its personal downlink;
- uniform averaging of the participants' models (Algorithm 1, line 23): ``server.weighting = "uniform"``;
- evaluators ``linear_probe`` (backbone) and ``knn`` (projector) unless the config names others, and the initial
  model's evaluation (``engine.eval_initial``): a random network's probe, the floor.

``algorithm = "fedavg_sc"``: the same without matrices (α ≡ 1: the plain SC loss, FedAvg+SC).
``algorithm = "centralized_sc"``: FedAvg+SC with one client holding all the training data (the upper bound);
``data.num_clients`` becomes 1 and ``data.partition`` ``iid`` (the run's notice names those it replaced);
``cohort.sampler`` must be ``"all"``.

``[recipe]`` keys (all optional): ``mu`` (4.0), ``scale`` (1: the paper's loss; 2: the code's), ``views`` (training
V, 1), ``augment`` (the ``views`` augmentation's kernel: ``shift``, ``shift_mode``, ``brightness``, ``contrast``,
``dropout``, ``noise_std``, ``flip``; both refused where ``client.augment`` names an augmentation of the user's);
FedSC only: ``share_views`` (V of DP-CalR, 5), ``alpha`` (``"schedule"``: App. C's linear decay from
``alpha_start`` (1.0) to ``alpha_end`` (0.2), ``alpha_endpoint`` (false); ``"q"``: α = q_j, Eq. 5's provable form),
``share_from`` (t0, 1), ``share_every`` (k, 1), ``weighting`` (q_j: ``"num_samples"`` or ``"uniform"``), and
DP-CalR's privacy: ``epsilon`` (a per-client budget; σ_j is calibrated to spend it over the
T_j sharing rounds, or checked against it when ``sigma`` is given), ``delta`` (1e-4), ``sigma`` (σ per matrix entry;
0 = no noise), ``neighboring`` (``"replace_one"``: Δ = √2μ/|D_j|, or ``"zero_out"``). Every release is charged to
the client's ledger (RDP accountant); ε is reported per round and in ``summary.json``; a schedule that would
overspend is refused before training. A key the others turn off is refused: the schedule's ``alpha_*`` with
``alpha = "q"``, ``delta`` and ``neighboring`` without noise. Numbers float32 cannot carry are refused too: ``mu``
must lie in [1e-75, 1e76] (√μ a normal float32), ``scale`` and a nonzero ``sigma`` (given or calibrated) in
[1e-30, 1e30].

References:
  Jing et al., *FedSC: Provable Federated Self-supervised Learning with Spectral Contrastive Objective over
  Non-i.i.d. Data*, ICML 2024. https://proceedings.mlr.press/v235/jing24b.html
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

from trustfl.config.schema import Component, DataConfig, ExperimentConfig, keys_set
from trustfl.core.registry import register
from trustfl.errors import ConfigError, TrustFLError
from trustfl.objectives.spectral import check_mu, check_scale
from trustfl.privacy.accountant import Budget, LedgerBook, check_schedule
from trustfl.privacy.analysis.fedsc import calibrate_fedsc_sigma, fedsc_epsilon, release_event
from trustfl.recipes.base import AbstractRecipe, recipe_choice, recipe_keys, recipe_number
from trustfl.selfsup.augment import Augmentation
from trustfl.selfsup.share import ALPHA_MODES, SIGMA_RANGE, check_sigma

if TYPE_CHECKING:
    from trustfl.engine.federation import Federation

COMMON = ("mu", "scale", "views", "augment")
FEDSC = COMMON + ("share_views", "alpha", "alpha_start", "alpha_end", "alpha_endpoint", "share_from",
                  "share_every", "weighting", "epsilon", "delta", "sigma", "neighboring")
AUGMENT_KEYS = ("shift", "brightness", "contrast", "dropout", "noise_std", "flip", "shift_mode")


def self_supervised_client(cfg: ExperimentConfig, rec: dict[str, Any], algorithm: str, objective: str,
                           privacy: str) -> Any:
    """The client table of a self-supervised recipe: ``recipe.views`` / ``recipe.augment`` as the ``views``
    augmentation (refused where ``client.augment`` names the user's own), checked: no other objective and no
    parameters of the user's for it, no DP-SGD (``privacy`` says what protects the run instead), no client statistics
    of the user's."""
    views = recipe_number(rec, "views", 1, integer=True, low=1)
    augment = rec.get("augment", {})
    if not isinstance(augment, dict) or set(augment) - set(AUGMENT_KEYS):
        bad = sorted(set(augment) - set(AUGMENT_KEYS)) if isinstance(augment, dict) else [augment]
        raise ConfigError(f"`recipe.augment` must be a table of {', '.join(AUGMENT_KEYS)}; found {bad[0]!r}.")
    try:  # its values, named as the user wrote them (the run builds them as `client.augment`)
        Augmentation(**augment)
    except (TrustFLError, TypeError, ValueError) as err:
        raise ConfigError(f"`recipe.augment`: {err}") from None
    if cfg.objective.name not in ("auto", objective):
        raise ConfigError(f"`objective.name` is {cfg.objective.name!r}; algorithm {algorithm!r} trains the "
                          f"{objective!r} objective (set its `recipe.*` keys instead).")
    if cfg.objective.params:  # the recipe builds the objective from `recipe.*`: a parameter here would be dropped
        key = sorted(cfg.objective.params)[0]
        raise ConfigError(f"`objective.{key}` is not read: algorithm {algorithm!r} builds the {objective!r} "
                          f"objective from its `recipe.*` keys; remove `objective.{key}` (`recipe.{key}`, where "
                          f"the algorithm has it, sets the same thing).")
    dp_keys = keys_set(cfg.client.dp)
    if dp_keys:  # DP-SGD does not apply, and a budget here would protect nothing
        raise ConfigError(f"`client.dp.{dp_keys[0]}` must be unset with algorithm {algorithm!r}: its loss is not a "
                          f"mean of per-example losses; {privacy}.")
    if cfg.client.statistics:
        raise ConfigError(f"`client.statistics` is set by algorithm {algorithm!r}; remove it.")
    client = dataclasses.replace(cfg.client, statistics=[])
    if cfg.client.augment.name == "none":
        return dataclasses.replace(client, augment=Component("views", {"num_views": views, **augment}))
    given = [k for k, unset in (("views", 1), ("augment", {})) if rec.get(k, unset) != unset]
    if given:  # the user's own augmentation makes the views: these would be dropped
        raise ConfigError(f"`recipe.{given[0]}` is set but does nothing: `client.augment` is set "
                          f"({cfg.client.augment.name!r}) and makes the views itself; remove one of them.")
    return client


SSL_MODELS = ("sc_mlp", "sc_cnn")


def two_view_model(cfg: ExperimentConfig, rec: dict[str, Any], algorithm: str, predictor: bool) -> Any:
    """The model table of a recipe whose loss pairs two views of every image: ``recipe.views`` must be 1 and the
    model an encoder with a projector (:data:`SSL_MODELS`); with ``predictor`` it gets ``[128]`` unless
    ``model.predictor`` is set."""
    if recipe_number(rec, "views", 1, integer=True, low=1) != 1:
        raise ConfigError(f"`recipe.views` must be 1 with algorithm {algorithm!r}: its loss pairs two views of "
                          f"every image.")
    if cfg.model.name not in SSL_MODELS:
        raise ConfigError(f"`model.name` is {cfg.model.name!r}; algorithm {algorithm!r} needs an encoder with a "
                          f"projector{' and a predictor' if predictor else ''}: one of {SSL_MODELS}.")
    if predictor and "predictor" not in cfg.model.params:
        return dataclasses.replace(cfg.model, params={**cfg.model.params, "predictor": [128]})
    return cfg.model


def self_supervised_run(cfg: ExperimentConfig, objective: Component, client: Any, **changes: Any) -> ExperimentConfig:
    """``cfg`` with the objective and client table, the representation evaluators (linear probe, kNN) unless set,
    the initial network evaluated (the random-init floor) and uniform averaging (Algorithm 1, line 23)."""
    evaluators = cfg.evaluators or [Component("linear_probe"), Component("knn")]
    return dataclasses.replace(cfg, objective=objective, client=client, evaluators=evaluators,
                               server=dataclasses.replace(cfg.server, weighting="uniform"),
                               engine=dataclasses.replace(cfg.engine, eval_initial=True), **changes)


SHARE_DEFAULTS = {"alpha_start": 1.0, "alpha_end": 0.2, "alpha_endpoint": False, "delta": 1e-4,
                  "neighboring": "replace_one"}
"""The defaults of the FedSC keys that another key can turn off (one left at its default is not refused)."""


def _refuse_inert(rec: dict[str, Any], share: dict[str, Any]) -> None:
    """Refuse a FedSC key set away from its default that the others make do nothing: the α schedule's keys with
    ``alpha = "q"``, DP-CalR's δ and neighbouring relation without noise (no ``epsilon``, ``sigma`` 0)."""
    inert = []
    if share["alpha_mode"] == "q":
        inert += [(k, '`recipe.alpha` is "q" (α = q_j every round; the schedule\'s keys are for `recipe.alpha` = '
                      '"schedule")') for k in ("alpha_start", "alpha_end", "alpha_endpoint")]
    if "epsilon" not in rec and share["sigma"] == 0:
        inert += [(k, "DP-CalR adds no noise and nothing is accounted (set `recipe.epsilon` or a `recipe.sigma` > 0 "
                      "for DP)") for k in ("delta", "neighboring")]
    for key, why in inert:
        if key in rec and rec[key] != SHARE_DEFAULTS[key]:
            raise ConfigError(f"`recipe.{key}` is set but does nothing: {why}; remove it.")


class SpectralRecipe(AbstractRecipe):
    """FedSC (``share = True``) or FedAvg+SC; ``centralized``: one client holding all the data."""

    def __init__(self, algorithm: str, share: bool, centralized: bool = False) -> None:
        self.algorithm, self.share, self.centralized = algorithm, share, centralized
        self._notice = ""  # what ``configure`` replaced, said by ``finalize`` (the same instance builds the run)

    def configure(self, cfg: ExperimentConfig) -> ExperimentConfig:
        rec = recipe_keys(cfg, self.algorithm, FEDSC if self.share else COMMON)
        mu = check_mu("recipe.mu", rec.get("mu", 4.0))
        scale = check_scale("recipe.scale", rec.get("scale", 1.0))
        client = self_supervised_client(cfg, rec, self.algorithm, "spectral_contrastive",
                                        "FedSC's privacy is DP-CalR (`recipe.epsilon`)")
        data = cfg.data
        if self.centralized:
            data = self._centralized_data(cfg)
        elif self.share:
            if cfg.data.num_clients < 2:
                raise ConfigError(f"`data.num_clients` must be >= 2 for FedSC (R̃_(-j) averages the other "
                                  f"clients), found {cfg.data.num_clients}; use algorithm = \"centralized_sc\".")
            client = dataclasses.replace(client, statistics=[Component("fedsc_correlation", self._share(rec, mu))])
        return self_supervised_run(cfg, Component("spectral_contrastive", {"mu": mu, "scale": scale}), client,
                                   data=data)

    def _centralized_data(self, cfg: ExperimentConfig) -> DataConfig:
        """One client holding the whole training split (documented: the shipped configs' ``--set
        algorithm=centralized_sc`` replaces their clients and partition, which the run's notice says). A cohort
        sampler is the user's own choice and is refused, not replaced: the one client trains every round."""
        if cfg.cohort.sampler != "all":
            raise ConfigError(f"`cohort.sampler` must be \"all\" with algorithm {self.algorithm!r} (its one client, "
                              f"holding all the training data, trains every round), found {cfg.cohort.sampler!r}.")
        given, replaced = keys_set(cfg.data, ("num_clients", "partition")), []  # set away from their defaults
        if "num_clients" in given and cfg.data.num_clients != 1:
            replaced.append(f"`data.num_clients` = {cfg.data.num_clients}")
        if "partition" in given:  # its default is "iid"
            replaced.append(f"`data.partition` {cfg.data.partition.name!r}")
        if replaced:
            self._notice = (f"NOTICE: algorithm {self.algorithm!r} gives one client all the training data; "
                            f"{' and '.join(replaced)} {'is' if len(replaced) == 1 else 'are'} not used.")
        return dataclasses.replace(cfg.data, num_clients=1, partition=Component("iid"))

    def _share(self, rec: dict[str, Any], mu: float) -> dict[str, Any]:
        d = SHARE_DEFAULTS
        out = {"mu": mu, "views": recipe_number(rec, "share_views", 5, integer=True, low=1),
               "alpha_mode": recipe_choice(rec, "alpha", "schedule", ALPHA_MODES),
               "alpha_start": recipe_number(rec, "alpha_start", d["alpha_start"], low=0, high=1),
               "alpha_end": recipe_number(rec, "alpha_end", d["alpha_end"], low=0, high=1),
               "share_from": recipe_number(rec, "share_from", 1, integer=True, low=1),
               "share_every": recipe_number(rec, "share_every", 1, integer=True, low=1),
               "weighting": recipe_choice(rec, "weighting", "num_samples", ("num_samples", "uniform")),
               "neighboring": recipe_choice(rec, "neighboring", d["neighboring"], ("replace_one", "zero_out")),
               "sigma": check_sigma("recipe.sigma", rec.get("sigma", 0.0))}
        endpoint = rec.get("alpha_endpoint", d["alpha_endpoint"])
        if not isinstance(endpoint, bool):
            raise ConfigError(f"`recipe.alpha_endpoint` must be true or false, found {endpoint!r}.")
        out["alpha_endpoint"] = endpoint
        if "epsilon" in rec:
            recipe_number(rec, "epsilon", None, low=0, low_open=True, finite=True)
        recipe_number(rec, "delta", d["delta"], low=0, high=1, low_open=True, high_open=True)
        _refuse_inert(rec, out)
        return out

    def finalize(self, fed: "Federation", cfg: ExperimentConfig) -> None:
        sizes = fed.client_rows.sizes()
        empty = [i for i, s in enumerate(sizes) if s == 0]
        if empty:
            raise ConfigError(f"`data.partition`: client {empty[0]} holds no training examples (sizes {sizes}); "
                              f"{self.algorithm} needs |D_j| >= 1 for every client (FedSC's q_j and DP-CalR's "
                              f"sensitivity μ/|D_j|). Lower `data.num_clients` or change the partition.")
        small = [i for i, s in enumerate(sizes) if s < fed.batch_sizes[i]]
        if small:
            fed.info["notice_small_clients"] = (f"clients {small} hold fewer examples than a batch: each of their "
                                                f"steps uses all their examples (B = |D_j|).")
        fed.info["fedsc"] = {"algorithm": self.algorithm, "sizes": sizes}
        if self._notice:
            fed.info["notice"] = f"{fed.info['notice']} {self._notice}" if "notice" in fed.info else self._notice
        if not self.share:
            return
        rec = dict(cfg.recipe)
        (name, stat), = fed.statistics
        releases = stat.releases()
        eps, delta = rec.get("epsilon"), float(rec.get("delta", 1e-4))
        sigma = float(rec.get("sigma", 0.0))
        fed.info["fedsc"].update({"releases_per_client": releases, "mu": stat.mu})
        if releases == 0:
            raise ConfigError(f"`recipe.share_from` = {stat.share_from} is after the last of {cfg.rounds} rounds: no "
                              f"matrix would ever be shared (nor protected by `recipe.epsilon` / `sigma`), so the run "
                              f"would be algorithm \"fedavg_sc\"; lower it, or run that algorithm.")
        if eps is None and sigma == 0:  # no noise: no δ nor neighbouring relation reported (keys refused here)
            return
        fed.info["fedsc"].update({"delta": delta, "neighboring": stat.neighboring})
        if fed.ledger is not None:
            raise ConfigError("`recipe.epsilon` / `recipe.sigma`: FedSC's DP-CalR ledgers cannot be combined with "
                              "other privacy stages (`client_stages`, `server_stages`) in one run.")
        try:
            if eps is not None and sigma == 0:
                sigmas = [calibrate_fedsc_sigma(float(eps), delta, stat.mu, s, releases, stat.neighboring, "rdp")
                          for s in sizes]
                off = [sg for sg in sigmas if not SIGMA_RANGE[0] <= sg <= SIGMA_RANGE[1]]
                if off:  # σ_j ∝ μ: an extreme μ gives a σ the float32 noise cannot carry
                    raise ConfigError(f"the calibrated σ = {off[0]:g} is outside [{SIGMA_RANGE[0]:g}, "
                                      f"{SIGMA_RANGE[1]:g}], where float32 draws the noise; σ scales with "
                                      f"`recipe.mu`.")
            else:
                sigmas = [sigma] * len(sizes)
            budgets = {i: Budget(math.inf if eps is None else float(eps), delta) for i in range(len(sizes))}
            for i, s in enumerate(sizes):
                if eps is not None:
                    check_schedule(i, budgets[i], release_event(sigmas[i], stat.mu, s, stat.neighboring), releases)
            stat = dataclasses.replace(stat, sigma=tuple(sigmas))
            closed_form = [fedsc_epsilon(sg, stat.mu, s, releases, delta, stat.neighboring)
                           for sg, s in zip(sigmas, sizes)]
        except TrustFLError as err:
            raise ConfigError(f"`recipe.epsilon` / `recipe.sigma` (δ = {delta:g}, μ = {stat.mu:g}, {releases} "
                              f"sharing rounds): {err}") from None
        fed.statistics = ((name, stat),)
        fed.ledger = LedgerBook(budgets, "rdp")
        fed.info["fedsc"].update({"sigma": sigmas, "epsilon_budget": eps, "epsilon_closed_form": closed_form})


@register("algorithm", "fedsc")
def fedsc() -> AbstractRecipe:
    return SpectralRecipe("fedsc", share=True)


@register("algorithm", "fedavg_sc")
def fedavg_sc() -> AbstractRecipe:
    return SpectralRecipe("fedavg_sc", share=False)


@register("algorithm", "centralized_sc")
def centralized_sc() -> AbstractRecipe:
    return SpectralRecipe("centralized_sc", share=False, centralized=True)
