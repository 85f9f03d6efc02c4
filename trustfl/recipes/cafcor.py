"""CafCor (Allouah, Guerraoui & Stephan, ICML 2025): correlated noise, worker momentum and CAF, as one recipe.

``algorithm = "cafcor"`` turns an experiment into Algorithm 1 (Sec. 3 of the paper)::

    each round, each honest worker i:   g = Clip((1/b) Σ_{x∈S} ∇ℓ(θ; x); C)    (S: b points w/o replacement)
                                        g̃ = g + v̄^{(i)} + Σ_{j≠i} v^{(ij)}      (correlated_noise stage)
                                        m^{(i)} ← β m^{(i)} + (1 − β) g̃           (worker_momentum stage)
    server:                             θ ← θ − γ·CAF(m^{(1..n)}; f)

In engine terms: ``client.steps = 1``, ``client.dp.mode = "batch_clip"`` with ``clip = C``, ``batch_sampler =
"fixed"``, ``server.weighting = "uniform"``, client stages ``[correlated_noise(σ_cor, σ_ind), secldp_accounting
(ε_step), worker_momentum(β)]`` and the ``caf`` aggregator (``f`` = ``attack.num_byzantine``) unless the config
names another one. A client's message is its model delta ``−lr·(g + λθ)`` (``lr = client.lr``, λ = weight decay),
so the noise stds are multiplied by ``client.lr`` (the sensitivity scales the same way, ε is unchanged) and the
paper's γ is ``client.lr × server.lr`` (put γ in ``client.lr`` and keep ``server.lr = 1``).

``[recipe]`` keys:

* ``threat_model``: ``"secldp"`` (default; q = ``num_colluding`` colluding workers, default 0, σ_ind = 0 unless
  ``ind_to_cor``), ``"byzldp"`` (q = f, σ_ind = σ_cor unless ``ind_to_cor``), ``"ldp"`` (σ_cor = 0), ``"cdp"``
  (σ_cor = 0, per-worker σ_ind = s/√(n−f) with s the std on the sum; docs/papers/cafcor.md; only with the plain
  mean, no ``pre_aggregators``, no simulated attack and a lossless uplink), or ``"example_cdp"``
  (example-level CDP of Exp. B: per-example clipping, per-worker noise multiplier z/√(n−f), Poisson batches).
* ``epsilon``, ``delta`` (default 1e-4): the user-level target, calibrated over T = ``rounds`` steps with
  :func:`trustfl.privacy.analysis.secldp.calibrate_secldp` for C = ``client.dp.clip``, n = ``data.num_clients``,
  f = ``attack.num_byzantine``. Not used by ``example_cdp``, which takes ``noise_multiplier`` (z on the sum).
* ``conversion``: RDP → (ε, δ) conversion of the calibration: ``"rdp"`` (default; dp_accounting's RDP accountant
  at its default orders, i.e. exactly what the engine's RDP ledgers compute), ``"opacus"`` (Opacus' orders, as in
  the paper's Sec. 5; dp_accounting's RDP at those fractional orders is slightly looser, so ledgers then report up
  to ~1 % more than the target), ``"mironov"`` (the paper's closed form; looser, ledgers report less) or ``"pld"`` (PLD
  calibration and PLD ledgers; exact but slow, ~30 s).
* ``noise_path``: ``"exact"`` (default; pairwise seeds by key agreement, O(n²d)) or ``"fast"`` (same law, O(nd)).
* ``momentum``: β (default 0.9; the paper uses 0.85 on MNIST, 0.9 on Fashion-MNIST).
* ``num_byzantine``: a declared Byzantine bound f when no attack is simulated (``attack.name = "none"``), e.g. a
  deployment whose Byzantine nodes are real: it sets CAF's f and the threat model's f; every client keeps a ledger.
* ``ind_to_cor``, ``num_colluding``: see ``threat_model``. ``aggregator``: the rule when the config leaves
  ``[aggregator]`` at its default (``"caf"``; ``"mean"`` gives DSGD).
* ``byzantine_hold_data``: default ``false`` for update-level attacks (the paper: malicious workers hold no data),
  ``true`` for data-level attacks (label flipping needs data to flip); ``attack.byzantine_hold_data = false`` in
  the config always wins.

Accounting: the ``secldp_accounting`` stage charges every honest client one Lemma A.4 step per round, so the
ledgers (and ``summary.json``) report the threat model's ε, equal to the target (within the calibration
tolerance 1e-4) for ``conversion = "rdp"`` and ``"pld"``. For ``example_cdp`` the ledgers hold each client's
*local* view of the per-worker noise; the CDP ε of the aggregate (Opacus RDP, z, q = b/m_i, T) is in
``run_info.json["cafcor"]``.

Example:
  >>> from trustfl.config.load import config_from_dict
  >>> cfg = config_from_dict({"algorithm": "cafcor", "rounds": 30, "data": {"num_clients": 100},
  ...                         "client": {"dp": {"clip": 2.25}}, "attack": {"name": "alie", "num_byzantine": 5},
  ...                         "recipe": {"threat_model": "secldp", "epsilon": 27.8, "conversion": "opacus"}})
  >>> round(calibrate(cfg).sigma_cor, 3)   # docs/papers/cafcor.md: 0.603
  0.603

References:
  Allouah, Guerraoui, Stephan. Towards Trustworthy Federated Learning with Untrusted Participants. ICML 2025.
  https://arxiv.org/abs/2505.01874
"""
from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import statistics
from typing import TYPE_CHECKING, Any

from trustfl.config.schema import Component, ExperimentConfig, keys_set
from trustfl.core.registry import lookup, register
from trustfl.errors import ConfigError, PrivacyError, RegistryError
from trustfl.privacy.analysis.gaussian import calibrate_noise_multiplier, epsilon_subsampled_gaussian
from trustfl.privacy.analysis.secldp import (CONVERSIONS, OPACUS_ORDERS, calibrate_secldp,
                                             equivalent_noise_multiplier, secldp_epsilon)
from trustfl.recipes.base import AbstractRecipe, recipe_choice, recipe_keys

if TYPE_CHECKING:
    from trustfl.engine.federation import Federation

USER_LEVEL = ("secldp", "byzldp", "ldp", "cdp")
THREAT_MODELS = USER_LEVEL + ("example_cdp",)
NOISE_PATHS = ("exact", "fast")
KEYS = ("threat_model", "epsilon", "delta", "conversion", "noise_path", "momentum", "ind_to_cor", "num_colluding",
        "aggregator", "byzantine_hold_data", "noise_multiplier", "num_byzantine")
DEFAULT_DELTA = 1e-4
DEFAULT_MOMENTUM = 0.9
RECIPE_CONVERSIONS = ("rdp",) + tuple(CONVERSIONS)
"""``"rdp"``: dp_accounting's RDP accountant at its default orders (the ledgers'); the others as in secldp.py."""


def planned_epsilon(step: float, steps: int, delta: float, conversion: str) -> float:
    """ε after ``steps`` rounds of RDP slope ``step`` under ``conversion`` (see :data:`RECIPE_CONVERSIONS`)."""
    if conversion == "rdp":
        return epsilon_subsampled_gaussian(equivalent_noise_multiplier(step), 1.0, steps, delta, "rdp")
    return secldp_epsilon(step, steps, delta, conversion)


@dataclasses.dataclass(frozen=True)
class CafCorCalibration:
    """The noise of one CafCor run, in gradient units (multiply by ``client.lr`` for message units).

    ``epsilon_step`` is the RDP slope of one round (Lemma A.4) for user-level threat models; ``noise_multiplier``
    is z on the honest sum for ``example_cdp`` (each worker uses z/√(n−f)).
    """

    threat_model: str
    num_workers: int
    num_byzantine: int
    num_colluding: int
    steps: int
    clip: float
    delta: float
    epsilon: float | None = None
    conversion: str = "rdp"
    sigma_cor: float = 0.0
    sigma_ind: float = 0.0
    epsilon_step: float | None = None
    noise_multiplier: float | None = None

    @property
    def honest(self) -> int:
        return self.num_workers - self.num_byzantine

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.epsilon_step is not None:
            out["noise_multiplier_equivalent"] = equivalent_noise_multiplier(self.epsilon_step)
            out["epsilon_planned"] = planned_epsilon(self.epsilon_step, self.steps, self.delta, self.conversion)
            out["message_noise_std"] = math.sqrt((self.num_workers - 1) * self.sigma_cor ** 2 + self.sigma_ind ** 2)
            out["honest_average_noise_std"] = math.sqrt(
                (self.num_byzantine * self.sigma_cor ** 2 + self.sigma_ind ** 2) / self.honest)
        return out


def _number(rec: dict[str, Any], key: str, default: Any, ok, allowed: str) -> Any:
    value = rec.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(float(value)):
        raise ConfigError(f"`recipe.{key}` must be {allowed}, found {value!r}.")
    return float(value)


def byzantine_bound(cfg: ExperimentConfig, rec: dict[str, Any]) -> int:
    """``f``: ``attack.num_byzantine`` when an attack is simulated, else ``recipe.num_byzantine`` (a declared bound
    with no simulated adversary, e.g. a deployment where the Byzantine nodes are real; default 0)."""
    declared = rec.get("num_byzantine")
    if declared is None:
        return cfg.attack.num_byzantine
    if cfg.attack.name != "none":
        raise ConfigError(f"`recipe.num_byzantine` declares f without a simulated attack, but `attack.name` is "
                          f"{cfg.attack.name!r}; give f as `attack.num_byzantine`.")
    if isinstance(declared, bool) or not isinstance(declared, int) or declared < 0:
        raise ConfigError(f"`recipe.num_byzantine` must be an integer >= 0, found {declared!r}.")
    return declared


def _counts(cfg: ExperimentConfig, rec: dict[str, Any], threat: str) -> tuple[int, int, int]:
    n, f = cfg.data.num_clients, byzantine_bound(cfg, rec)
    if n < 2:
        raise ConfigError(f"`data.num_clients` must be >= 2 for CafCor (pairwise noise), found {n}.")
    if not 0 <= f < n:
        key = "recipe.num_byzantine" if "num_byzantine" in rec else "attack.num_byzantine"
        raise ConfigError(f"`{key}` must be in [0, {n - 1}], found {f}.")
    q = rec.get("num_colluding")
    if q is not None and threat != "secldp":
        raise ConfigError(f"`recipe.num_colluding` applies to threat_model = \"secldp\" only, found {threat!r}.")
    if q is not None and (isinstance(q, bool) or not isinstance(q, int) or not 0 <= q <= f):
        raise ConfigError(f"`recipe.num_colluding` (q) must be an integer in [0, f = {f}], found {q!r}.")
    return n, f, (f if threat == "byzldp" else (q or 0))


def calibrate(cfg: ExperimentConfig) -> CafCorCalibration:
    """The run's noise from ``cfg.recipe`` (pure; see the module docstring for the keys).

    Raises:
      ConfigError: naming the ``recipe.*`` (or other) key of an invalid or degenerate setting, e.g. SecLDP with
        f = q and σ_ind = 0 (the server can cancel all correlated noise; Lemma A.4).
    """
    rec = recipe_keys(cfg, "cafcor", KEYS)
    threat = recipe_choice(rec, "threat_model", "secldp", THREAT_MODELS)
    n, f, q = _counts(cfg, rec, threat)
    delta = _number(rec, "delta", DEFAULT_DELTA, lambda v: 0 < v < 1, "a number in (0, 1)")
    common = dict(threat_model=threat, num_workers=n, num_byzantine=f, num_colluding=q, steps=cfg.rounds,
                  clip=float(cfg.client.dp.clip), delta=delta)
    if threat == "example_cdp":
        for key in ("epsilon", "ind_to_cor", "conversion"):
            if key in rec:
                raise ConfigError(f"`recipe.{key}` does not apply to threat_model = \"example_cdp\", which is set "
                                  f"by `recipe.noise_multiplier` (z on the sum; its ε is recorded in run_info.json).")
        z = _number(rec, "noise_multiplier", None, lambda v: 0 < v < math.inf, "a finite number > 0")
        if z is None:
            raise ConfigError("`recipe.noise_multiplier` (z on the honest sum, e.g. 0.5) is required with "
                              "threat_model = \"example_cdp\".")
        return CafCorCalibration(**common, noise_multiplier=z)
    if "noise_multiplier" in rec:
        raise ConfigError(f"`recipe.noise_multiplier` applies to threat_model = \"example_cdp\" only; "
                          f"{threat!r} is calibrated from `recipe.epsilon`.")
    eps = _number(rec, "epsilon", None, lambda v: 0 < v < math.inf, "a finite number > 0")
    if eps is None:
        raise ConfigError(f"`recipe.epsilon` (the target ε) is required with threat_model = {threat!r}.")
    conversion = recipe_choice(rec, "conversion", "rdp", RECIPE_CONVERSIONS)
    ratio = _number(rec, "ind_to_cor", None, lambda v: 0 <= v < math.inf, "a finite number >= 0")
    if ratio is not None and threat in ("ldp", "cdp"):
        raise ConfigError(f"`recipe.ind_to_cor` applies to \"secldp\" and \"byzldp\" only, found {threat!r} "
                          f"(which uses σ_cor = 0).")
    if threat == "byzldp" and ratio == 0:
        raise ConfigError("`recipe.ind_to_cor` must be > 0 with threat_model = \"byzldp\": with q = f colluding "
                          "workers and σ_ind = 0 the server can cancel all correlated noise (no privacy).")
    if threat == "secldp" and f == q and not ratio:
        raise ConfigError(f"`recipe.ind_to_cor` must be > 0 with threat_model = \"secldp\" and f = q = {f}: "
                          f"(f − q)σ_cor² + σ_ind² = 0, so the server can cancel all correlated noise (no "
                          f"privacy). Set `recipe.ind_to_cor` > 0, or use threat_model = \"ldp\"/\"cdp\".")
    try:
        noise = calibrate_secldp(threat, eps, delta, cfg.rounds, float(cfg.client.dp.clip), n, f,
                                 num_colluding=q if threat == "secldp" and q else None, ind_to_cor=ratio,
                                 conversion="opacus" if conversion == "rdp" else conversion)
        scale, step = 1.0, noise.step
        if conversion == "rdp":
            # ε_step ∝ σ⁻² at a fixed σ_ind/σ_cor: rescaling the Opacus calibration hits the ledger's target.
            step = 1.0 / (2.0 * calibrate_noise_multiplier(eps, delta, 1.0, cfg.rounds, "rdp") ** 2)
            scale = math.sqrt(noise.step / step)
    except PrivacyError as err:
        raise ConfigError(f"`recipe` (threat_model {threat!r}, epsilon {eps!r}): {err}") from None
    return CafCorCalibration(**common, epsilon=eps, conversion=conversion, sigma_cor=scale * noise.sigma_cor,
                             sigma_ind=scale * noise.sigma_ind, epsilon_step=step)


def _aggregator(cfg: ExperimentConfig, rec: dict[str, Any]) -> Component:
    """The configured rule, else ``recipe.aggregator`` (default CAF), with ``f`` filled in if the rule takes it."""
    named = not (cfg.aggregator.name == "mean" and not cfg.aggregator.params)
    wanted = rec.get("aggregator")
    if wanted is not None and not isinstance(wanted, str):
        raise ConfigError(f"`recipe.aggregator` must be a registered aggregator name, found {wanted!r}.")
    if named and wanted is not None and wanted != cfg.aggregator.name:
        raise ConfigError(f"`recipe.aggregator` = {wanted!r} conflicts with `aggregator.name` = "
                          f"{cfg.aggregator.name!r}; give one of them.")
    comp = cfg.aggregator if named else Component(wanted or "caf")
    try:
        factory = lookup("aggregator", comp.name)
    except RegistryError as err:
        raise ConfigError(f"`{'aggregator' if named else 'recipe.aggregator'}`: {err}") from None
    if "f" in inspect.signature(factory).parameters and "f" not in comp.params:
        comp = Component(comp.name, {**comp.params, "f": byzantine_bound(cfg, rec)})
    return comp


def _check_client(cfg: ExperimentConfig, mode: str) -> None:
    c, dp = cfg.client, cfg.client.dp
    if c.steps not in (0, 1):
        raise ConfigError(f"`client.steps` must be 1 with algorithm 'cafcor' (one gradient per round), found "
                          f"{c.steps}.")
    if c.momentum:
        raise ConfigError(f"`client.momentum` must be 0 with algorithm 'cafcor' (worker momentum is "
                          f"`recipe.momentum`), found {c.momentum}.")
    if dp.mode not in ("off", mode):
        raise ConfigError(f"`client.dp.mode` must be \"off\" or {mode!r} with this threat model (the recipe sets "
                          f"it), found {dp.mode!r}.")
    recipe_set = keys_set(dp, ("epsilon", "epsilons", "epsilon_distribution", "noise_multiplier", "delta", "accountant",
                               "calibration", "method", "round_noise_to"))
    if recipe_set:
        raise ConfigError(f"`client.dp.{recipe_set[0]}` must be unset with algorithm 'cafcor': the recipe sets the "
                          f"noise, δ and accountant from the `recipe` table (`client.dp` takes `mode` and `clip`).")
    if cfg.cohort.sampler != "all":
        raise ConfigError(f"`cohort.sampler` must be \"all\" with algorithm 'cafcor' (every worker sends every "
                          f"round; pair noise of absent workers would not cancel), found {cfg.cohort.sampler!r}.")
    if cfg.client_stages:
        raise ConfigError("`client_stages` must be empty with algorithm 'cafcor': the recipe builds them "
                          "(correlated_noise, secldp_accounting, worker_momentum).")


def _check_cdp(cfg: ExperimentConfig, aggregator: Component) -> None:
    """Refuse ``threat_model = "cdp"`` where the model is not a function of the honest workers' sum: its ε is that
    of the noise ``s`` they make together on the sum, while each message carries only ``s/√(n − f)``."""
    problems = []
    if aggregator.name != "mean" or cfg.pre_aggregators:
        problems.append(f"the aggregator is {aggregator.name!r}" + (" with `pre_aggregators`" if cfg.pre_aggregators
                                                                    else "") + ", not the plain mean")
    if cfg.attack.name != "none":
        problems.append(f"`attack.name` {cfg.attack.name!r} crafts rows from the honest messages one by one")
    if cfg.compress.uplink.name not in ("none", "identity"):
        problems.append(f"`compress.uplink` {cfg.compress.uplink.name!r} changes each message on its own")
    if problems:
        raise ConfigError(f"`recipe.threat_model` = \"cdp\" charges each worker the ε of its honest peers' noise "
                          f"on their sum, which holds only for a model computed from that sum (DSGD-CDP: the plain "
                          f"mean of the messages as sent, no simulated attack): {'; '.join(problems)}. Use "
                          f"`recipe.aggregator` = \"mean\" without an attack, or a local threat model (\"secldp\", "
                          f"\"byzldp\", \"ldp\").")


def _hold_data(cfg: ExperimentConfig, rec: dict[str, Any]) -> bool:
    if not cfg.attack.byzantine_hold_data:
        return False
    value = rec.get("byzantine_hold_data")
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"`recipe.byzantine_hold_data` must be true or false, found {value!r}.")
    if value is not None:
        return value
    if cfg.attack.name == "none":
        return True
    try:
        return bool(getattr(lookup("attack", cfg.attack.name), "data_level", False))
    except RegistryError as err:
        raise ConfigError(f"`attack.name`: {err}") from None


class CafCorRecipe(AbstractRecipe):
    """Algorithm 1 of CafCor as a configuration (see the module docstring)."""

    def configure(self, cfg: ExperimentConfig) -> ExperimentConfig:
        rec = dict(cfg.recipe)
        cal = calibrate(cfg)
        beta = _number(rec, "momentum", DEFAULT_MOMENTUM, lambda v: 0 <= v < 1, "a number in [0, 1)")
        path = recipe_choice(rec, "noise_path", "exact", NOISE_PATHS)
        example = cal.threat_model == "example_cdp"
        mode = "per_example" if example else "batch_clip"
        _check_client(cfg, mode)
        sampler = cfg.client.batch_sampler
        if example:
            if sampler == "fixed":
                raise ConfigError("`client.batch_sampler` must be \"poisson\" with threat_model = \"example_cdp\": "
                                  "its ε is the Poisson-subsampled Gaussian (Opacus recipe; see "
                                  "docs/papers/cafcor.md, \"Example-level CDP\").")
            sampler = "poisson"
        elif sampler == "shuffle":
            sampler = "fixed"  # Algorithm 1: b points without replacement (the engine's default is shuffling)
        dp = dataclasses.replace(cfg.client.dp, mode=mode, delta=cal.delta,
                                 noise_multiplier=cal.noise_multiplier / math.sqrt(cal.honest) if example else 0.0,
                                 accountant="pld" if cal.conversion == "pld" else "rdp")
        client = dataclasses.replace(cfg.client, steps=1, batch_sampler=sampler, dp=dp)
        lr = float(cfg.client.lr)
        stages = [Component("worker_momentum", {"beta": beta})]
        if not example:
            stages = [Component("correlated_noise", {"sigma_cor": lr * cal.sigma_cor, "sigma_ind": lr * cal.sigma_ind,
                                                     "path": path if cal.sigma_cor > 0 else "fast"}),
                      Component("secldp_accounting", {"step": cal.epsilon_step})] + stages
        attack = dataclasses.replace(cfg.attack, byzantine_hold_data=_hold_data(cfg, rec))
        server = dataclasses.replace(cfg.server, weighting="uniform")
        aggregator = _aggregator(cfg, rec)
        if cal.threat_model == "cdp":
            _check_cdp(cfg, aggregator)
        return dataclasses.replace(cfg, client=client, client_stages=stages, aggregator=aggregator,
                                   attack=attack, server=server)

    def finalize(self, fed: "Federation", cfg: ExperimentConfig) -> None:
        """Record the calibration (and, for ``example_cdp``, each honest client's CDP ε) in ``fed.info``."""
        cal = calibrate(cfg)
        info = cal.as_dict()
        info.update({"momentum": _number(dict(cfg.recipe), "momentum", DEFAULT_MOMENTUM, lambda v: 0 <= v < 1,
                                         "a number in [0, 1)"),
                     "client_lr": float(cfg.client.lr), "aggregator": cfg.aggregator.name,
                     "client_stages": [c.name for c in cfg.client_stages],
                     "noise_path": next((c.params["path"] for c in cfg.client_stages if c.name == "correlated_noise"),
                                        None), "ledger_accountant": cfg.client.dp.accountant})
        if cal.threat_model == "example_cdp":
            info["per_worker_noise_multiplier"] = cfg.client.dp.noise_multiplier
            info.update(_example_cdp_epsilons(fed, cal))
        fed.info["cafcor"] = info


def _example_cdp_epsilons(fed: "Federation", cal: CafCorCalibration) -> dict[str, Any]:
    """CDP ε of each honest client: Opacus-style RDP of the Poisson-subsampled Gaussian (z, q_i = b/m_i, T)."""
    eps = {}
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)  # dp_accounting warns for every fractional order it drops at small z
    try:
        for i, rows in enumerate(fed.client_rows):
            m = int(rows.numel())
            if i in fed.byzantine or m == 0:
                continue
            q = min(1.0, fed.batch_sizes[i] / m)
            eps[i] = epsilon_subsampled_gaussian(cal.noise_multiplier, q, cal.steps, cal.delta, "rdp", "poisson",
                                                 orders=OPACUS_ORDERS)
    finally:
        absl.setLevel(level)
    values = list(eps.values()) or [math.nan]
    return {"cdp_epsilon_recipe": "Opacus RDP accountant (orders 1.1..10.9, 12..63), Poisson-subsampled Gaussian, "
                                  "z on the honest sum, q_i = b/m_i, T = rounds, add/remove adjacency",
            "cdp_epsilon": {str(k): v for k, v in eps.items()}, "cdp_epsilon_min": min(values),
            "cdp_epsilon_median": statistics.median(values), "cdp_epsilon_max": max(values)}


@register("algorithm", "cafcor")
def cafcor() -> CafCorRecipe:
    """The CafCor recipe (``algorithm = "cafcor"`` in TOML)."""
    return CafCorRecipe()
