"""Robust-HDP (Malekmohammadi, Yu, Cao, ICML 2024) and its baselines as one recipe: ``algorithm = "robust_hdp"``.

Every client runs local DP-SGD (per-example clipping at ``c``, Poisson batches of expected size ``b_i``, noise
``N(0, c² z_i² I)``, plain SGD) with its own budget ε_i, and the server aggregates the model deltas with the
weights of the chosen ``method`` (the paper's baselines, Sec. 4.1 and App. B.3):

==============  ===========================================  ===========================================
``method``      clients train with                           server weights (aggregator)
==============  ===========================================  ===========================================
``robust_hdp``  z(ε_i, δ, b_i/N_i, E·E_i)                     w ∝ 1/‖S_{:,i}‖² by Robust PCA (``robust_hdp``)
``weiavg``      z(ε_i, …)                                    w ∝ reported ε_i (``weiavg``)
``pfa``         z(ε_i, …)                                    projection + w ∝ reported ε_i (``pfa``)
``dpfedavg``    z(ε_i, …)                                    w ∝ N_i (``dpfedavg``)
``min_eps``     z(min_j ε_j, δ, b_i/N_i, E·E_i) for everyone  w ∝ N_i (``dpfedavg``)
``oracle``      z(ε_i, …)                                    Eq. 8 with the true σ_i² (``oracle``, simulation)
``fedavg``      no DP                                        w ∝ N_i (``dpfedavg``)
==============  ===========================================  ===========================================

``[recipe]`` keys (all optional):

* ``method``: one of the table's names (default ``"robust_hdp"``).
* ``eps_list``: one of the authors' fixed lists (``"dist1"`` … ``"dist9"``, n = 20, cycled for other n); otherwise
  ε comes from ``client.dp.epsilons`` / ``epsilon_distribution`` / ``epsilon``, resolved here once so that every
  method (and ``min_eps``) sees the same list.
* ``batch_list``: use the authors' batch sizes (cycled); default true with ``eps_list`` and no ``client.batch_sizes``.
* ``sort_by_batch``: renumber the clients so that equal batch sizes are adjacent (a stable sort of the
  (ε_i, b_i) pairs by b_i). Under an i.i.d. split a client's number carries no meaning, so this changes nothing
  but speed: the vectorized executor with ``engine.max_clients_per_batch`` then batches clients with similar
  step counts and batch widths together. ``falsify.client`` still names the client's position in the list.
* ``falsify = {client = i, factor = f}`` (f defaults to 10): client ``i`` reports ``f·ε_i`` to the server but
  trains at its true ε_i (its noise, ledger and budget are the true ones). Only ε-reading rules (WeiAvg, PFA)
  can be fooled.
* ``clip`` (default 3.0) and ``delta`` (default 1e-4): the paper's c and δ; they overwrite ``client.dp``.
* ``rpca``: options of the ``robust_hdp`` aggregator (e.g. ``{mode = "once", max_iter = 1000}``); ``pfa``:
  options of the ``pfa`` aggregator.
* ``lrs = {method = lr, …}``: per-method local learning rates (the paper tunes η_l per method, Tables 8–11);
  the entry of the chosen method overrides ``client.lr``.

``finalize`` adds two per-client reports: ``reported_epsilon`` (what each client tells the server, falsified
where asked) and, in simulation only, ``oracle_noise_variance``, the update-noise variance of Eq. 3 + Eq. 7,

    σ_i² = K_i·⌈N_i/b_i⌉·η_l²·p·c²·z_i²/b_i²,

with each client's actual z_i (from the calibration), b_i, N_i, local steps, η_l, c and p. Both are recorded in
``fed.info["robust_hdp"]`` together with the aggregate-noise metric Σ w_i² σ_i²/(p η_l²) (Table 3) that the
ε-, N- and oracle-weightings would give.

Example:
  >>> from trustfl.config.load import config_from_dict
  >>> cfg = config_from_dict({"algorithm": "robust_hdp", "data": {"num_clients": 20},
  ...                         "recipe": {"method": "min_eps", "eps_list": "dist6"}})
  >>> out = RobustHDPRecipe().configure(cfg)
  >>> out.aggregator.name, set(out.client.dp.epsilons), out.client.dp.clip, out.client.batch_sizes[:3]
  ('dpfedavg', {0.15}, 3.0, [32, 64, 16])

References:
  Malekmohammadi, Yu, Cao, "Noise-Aware Algorithm for Heterogeneous Differentially Private Federated Learning",
  ICML 2024, https://arxiv.org/abs/2406.03519
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

import torch

from trustfl.aggregate.noise_aware import (aggregate_noise_metric, dpfedavg_weights, oracle_weights,
                                           update_noise_variance, weiavg_weights)
from trustfl.config.schema import ClientConfig, Component, ExperimentConfig, keys_set
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.privacy.budgets import RHDP_FIXED_LISTS, client_epsilons
from trustfl.recipes.base import AbstractRecipe, check_recipe_table

if TYPE_CHECKING:
    from trustfl.engine.federation import Federation

METHODS: Mapping[str, str] = {"robust_hdp": "robust_hdp", "weiavg": "weiavg", "pfa": "pfa",
                              "dpfedavg": "dpfedavg", "min_eps": "dpfedavg", "oracle": "oracle",
                              "fedavg": "dpfedavg"}
"""Method → the aggregator it uses."""
PAPER_CLIP = 3.0
PAPER_DELTA = 1e-4
_KEYS = ("method", "eps_list", "batch_list", "sort_by_batch", "falsify", "clip", "delta", "rpca", "pfa", "lrs")


@dataclass(frozen=True)
class RobustHDPSettings:
    """The validated ``[recipe]`` table (see the module docstring)."""

    method: str = "robust_hdp"
    eps_list: str = ""
    batch_list: bool | None = None
    sort_by_batch: bool = False
    falsify_client: int | None = None
    falsify_factor: float = 1.0
    clip: float = PAPER_CLIP
    delta: float = PAPER_DELTA
    rpca: dict[str, Any] = field(default_factory=dict)
    pfa: dict[str, Any] = field(default_factory=dict)
    lrs: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"`recipe.method` must be one of {', '.join(METHODS)}, found {self.method!r}.")
        lists = sorted(k for k in RHDP_FIXED_LISTS if k.startswith("dist"))
        if self.eps_list and self.eps_list.lower() not in lists:
            raise ConfigError(f"`recipe.eps_list` must be one of {', '.join(lists)}, found {self.eps_list!r}.")
        if self.falsify_client is not None and (isinstance(self.falsify_client, bool)
                                                or not isinstance(self.falsify_client, int)
                                                or self.falsify_client < 0):
            raise ConfigError(f"`recipe.falsify.client` must be a client index >= 0, found {self.falsify_client!r}.")
        if not (isinstance(self.falsify_factor, (int, float)) and 0 < self.falsify_factor < math.inf):
            raise ConfigError(f"`recipe.falsify.factor` must be a finite number > 0, found {self.falsify_factor!r}.")
        if not (isinstance(self.clip, (int, float)) and 0 < self.clip < math.inf):
            raise ConfigError(f"`recipe.clip` must be a finite number > 0, found {self.clip!r}.")
        if not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise ConfigError(f"`recipe.delta` must be in (0, 1), found {self.delta!r}.")
        for name, lr in self.lrs.items():
            if name not in METHODS:
                raise ConfigError(f"`recipe.lrs.{name}`: unknown method; allowed: {', '.join(METHODS)}.")
            if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf:
                raise ConfigError(f"`recipe.lrs.{name}` must be a finite number > 0, found {lr!r}.")

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> "RobustHDPSettings":
        """Parse ``cfg.recipe``; unknown keys are a ``ConfigError`` naming the allowed ones."""
        check_recipe_table(table, "robust_hdp", _KEYS)
        falsify = table.get("falsify", {})
        if not isinstance(falsify, Mapping) or set(falsify) - {"client", "factor"} or (falsify and "client" not in
                                                                                    falsify):
            raise ConfigError(f"`recipe.falsify` must be a table {{client = i, factor = f}}, found {falsify!r}.")
        for key in ("rpca", "pfa", "lrs"):
            if not isinstance(table.get(key, {}), Mapping):
                raise ConfigError(f"`recipe.{key}` must be a table, found {table[key]!r}.")
        batch_list = table.get("batch_list")
        if batch_list is not None and not isinstance(batch_list, bool):
            raise ConfigError(f"`recipe.batch_list` must be true or false, found {batch_list!r}.")
        if not isinstance(table.get("sort_by_batch", False), bool):
            raise ConfigError(f"`recipe.sort_by_batch` must be true or false, found {table['sort_by_batch']!r}.")
        return cls(method=str(table.get("method", "robust_hdp")), eps_list=str(table.get("eps_list", "")),
                   batch_list=batch_list, sort_by_batch=table.get("sort_by_batch", False),
                   falsify_client=falsify.get("client"),
                   falsify_factor=falsify.get("factor", 10.0) if falsify else 1.0,
                   clip=table.get("clip", PAPER_CLIP), delta=table.get("delta", PAPER_DELTA),
                   rpca=dict(table.get("rpca", {})), pfa=dict(table.get("pfa", {})), lrs=dict(table.get("lrs", {})))


def _cycled(values: tuple[float, ...] | list[float], n: int) -> list[float]:
    return [values[i % len(values)] for i in range(n)]


def _check_client(cfg: ExperimentConfig) -> None:
    """Refuse the ``client`` keys the recipe sets, instead of overwriting a value the user gave."""
    dp, client = cfg.client.dp, cfg.client
    given = [f"client.dp.{k}" for k in keys_set(dp, ("clip", "delta"))]  # calibration's one other value is its own
    if dp.mode == "batch_clip":
        given.append("client.dp.mode")
    if client.batch_sampler not in (ClientConfig().batch_sampler, "poisson"):
        given.append("client.batch_sampler")
    if given:
        raise ConfigError(f"`{given[0]}` is set, but algorithm 'robust_hdp' sets it: c and δ come from `recipe.clip` "
                          f"and `recipe.delta` (the paper's 3.0 and 1e-4 by default), and DP-SGD is the paper's "
                          f"(per-example clipping, Poisson batches, its own calibration); remove it.")


class RobustHDPRecipe(AbstractRecipe):
    """Sets the DP settings and the aggregator of ``recipe.method``; adds the ε and oracle-noise reports.

    ``configure`` remembers the client order it chose (``sort_by_batch``) for ``finalize`` on the same instance,
    as ``build_federation`` does.
    """

    def __init__(self) -> None:
        self._order: list[int] | None = None

    def configure(self, cfg: ExperimentConfig) -> ExperimentConfig:
        s = RobustHDPSettings.from_table(cfg.recipe)
        _check_client(cfg)
        n = cfg.data.num_clients
        client, dp = cfg.client, cfg.client.dp
        batch_list = s.batch_list if s.batch_list is not None else bool(s.eps_list) and not client.batch_sizes
        batches = (_cycled(RHDP_FIXED_LISTS["batch_sizes"], n) if batch_list
                   else _cycled(client.batch_sizes, n) if client.batch_sizes else [client.batch_size] * n)
        if s.method in s.lrs:
            client = dataclasses.replace(client, lr=float(s.lrs[s.method]))
        aggregator = Component(METHODS[s.method], self._aggregator_params(s, cfg))
        if s.falsify_client is not None and s.falsify_client >= n:
            raise ConfigError(f"`recipe.falsify.client` must be < num_clients = {n}, found {s.falsify_client}.")
        order = self._order = client_order(s, batches)
        client = dataclasses.replace(client, batch_sizes=[batches[i] for i in order])
        if s.method == "fedavg":
            dp = dataclasses.replace(dp, mode="off", epsilons=[], epsilon_distribution="", epsilon=0.0)
            return dataclasses.replace(cfg, client=dataclasses.replace(client, dp=dp), aggregator=aggregator)
        if s.eps_list:
            eps = _cycled(RHDP_FIXED_LISTS[s.eps_list.lower()], n)
        else:
            eps = client_epsilons(cfg.client.dp, n, cfg.seed)
            if eps is None:
                raise ConfigError("algorithm 'robust_hdp' needs per-client budgets: set `recipe.eps_list` "
                                  "(\"dist1\"…\"dist9\") or `client.dp.epsilons` / `epsilon_distribution` / "
                                  "`epsilon`.")
        eps = [eps[i] for i in order]
        if s.method == "min_eps":
            eps = [min(eps)] * n
        dp = dataclasses.replace(dp, mode="per_example", clip=float(s.clip), delta=float(s.delta),
                                 epsilons=[float(e) for e in eps], epsilon_distribution="", epsilon=0.0,
                                 calibration="rhdp")
        client = dataclasses.replace(client, batch_sampler="poisson", dp=dp)
        return dataclasses.replace(cfg, client=client, aggregator=aggregator)

    @staticmethod
    def _aggregator_params(s: RobustHDPSettings, cfg: ExperimentConfig) -> dict[str, Any]:
        name = METHODS[s.method]
        params = dict(cfg.aggregator.params) if cfg.aggregator.name == name else {}
        if s.method == "robust_hdp":
            params.update(s.rpca)
        elif s.method == "pfa":
            params.update(s.pfa)
        return params

    def finalize(self, fed: "Federation", cfg: ExperimentConfig) -> None:
        s = RobustHDPSettings.from_table(cfg.recipe)
        n = fed.num_clients
        record: dict[str, Any] = {"method": s.method, "aggregator": METHODS[s.method],
                                  "lr": fed.training.lr, "clip": fed.training.clip,
                                  "batch_sizes": list(fed.batch_sizes)}
        fed.info["robust_hdp"] = record
        if s.method == "fedavg":
            return
        order = self._order if self._order is not None else list(range(n))
        liar = None if s.falsify_client is None else order.index(s.falsify_client)
        record["client_order"] = order
        true_eps = [float(e) for e in fed.info["privacy"]["epsilon_budget"]]
        reported = list(true_eps)
        if liar is not None:
            reported[liar] = true_eps[liar] * float(s.falsify_factor)
        variances = oracle_noise_variances(fed)
        fed.reports["reported_epsilon"] = torch.tensor(reported, dtype=torch.float64)
        fed.reports["oracle_noise_variance"] = variances
        record.update({"true_epsilon": true_eps, "reported_epsilon": reported,
                       "falsified_client": liar,
                       "falsify_factor": None if s.falsify_client is None else float(s.falsify_factor),
                       "noise_multiplier": [float(z) for z in fed.noise_multipliers],
                       "oracle_noise_variance": variances.tolist(),
                       "predicted_noise_metric": predicted_noise_metrics(fed)})


def client_order(settings: RobustHDPSettings, batch_sizes: list[int]) -> list[int]:
    """``order[j]``: the list position of the client that runs as client ``j`` (identity unless sorting)."""
    if not settings.sort_by_batch:
        return list(range(len(batch_sizes)))
    return sorted(range(len(batch_sizes)), key=lambda i: batch_sizes[i])


def oracle_noise_variances(fed: "Federation") -> torch.Tensor:
    """σ_i² of Eq. 3 + Eq. 7 for every client, from its actual z_i, b_i, N_i and local schedule (float64).

    ``K_i`` is ``client.epochs``; with ``client.steps = T > 0`` it is ``T/⌈N_i/b_i⌉`` so that ``K_i·⌈N_i/b_i⌉``
    is the actual number of local steps. Clients without data or noise get 0.
    """
    sizes = torch.tensor([int(r.numel()) for r in fed.client_rows])
    batches = torch.tensor([min(b, max(int(n), 1)) for b, n in zip(fed.batch_sizes, sizes.tolist())])
    z = torch.tensor(fed.noise_multipliers, dtype=torch.float64)
    ok = (sizes > 0) & (z > 0)
    out = torch.zeros(len(sizes), dtype=torch.float64)
    if not bool(ok.any()):
        return out
    n_ok, b_ok = sizes[ok], batches[ok]
    per_epoch = -torch.div(-n_ok, b_ok, rounding_mode="floor")
    k = (fed.training.steps / per_epoch.to(torch.float64) if fed.training.steps > 0
         else torch.full((len(n_ok),), float(fed.training.epochs), dtype=torch.float64))
    out[ok] = update_noise_variance(z[ok], b_ok, n_ok, k, fed.training.lr, fed.training.clip, fed.layout.numel)
    return out


def predicted_noise_metrics(fed: "Federation") -> dict[str, float]:
    """Table 3's metric Σ w_i² σ_i²/(p η_l²) under the ε-, N- and oracle weightings of this federation.

    ``weiavg`` uses the *reported* ε (so a falsified report shows up here), ``dpfedavg`` the sample counts and
    ``oracle`` the true variances. Computed over the clients with a positive variance.
    """
    var = fed.reports["oracle_noise_variance"]
    ok = var > 0
    if not bool(ok.any()):
        return {}
    p, lr = fed.layout.numel, fed.training.lr
    v = var[ok]
    return {"weiavg": aggregate_noise_metric(weiavg_weights(fed.reports["reported_epsilon"][ok]), v, p, lr),
            "dpfedavg": aggregate_noise_metric(dpfedavg_weights(fed.reports["num_samples"][ok]), v, p, lr),
            "oracle": aggregate_noise_metric(oracle_weights(v), v, p, lr)}


@register("algorithm", "robust_hdp")
def robust_hdp() -> AbstractRecipe:
    return RobustHDPRecipe()
