"""Noise-aware weighting for heterogeneous-DP federated learning: Robust-HDP and its baselines.

Each client runs local DP-SGD with its own noise multiplier ``z_i``, so the noise variance of its update,

    σ_i² = K_i·⌈N_i/b_i⌉·η²·p·c²·z_i²/b_i²                       (Eq. 3 + Eq. 7),

differs by orders of magnitude across clients. The minimum-variance weights of the aggregate (Eq. 8) are
``w_i = (1/σ_i²)/Σ_j (1/σ_j²)``. The rules here differ only in how they get ``w`` (renormalised over the rows of
the round, i.e. the participating clients):

  * ``robust_hdp`` (Alg. 1): estimates ``σ̂_i² = ‖S_{:,i}‖²`` by Robust PCA of ``M = xᵀ`` (server-side only;
    it reads no client report, so a client lying about ε changes nothing);
  * ``oracle``: ``w ∝ 1/reports["oracle_noise_variance"]`` (simulation only, Eq. 8);
  * ``weiavg``: ``w ∝ reports["reported_epsilon"]`` (Liu et al. 2021, Alg. 2);
  * ``dpfedavg``: ``w ∝ reports["num_samples"]`` (Noble et al. 2022; with every client at ε_min this is the
    "minimum ε" baseline, and without DP it is FedAvg).

The pure helpers give the noise model and Table 3's metric ``Σ_i w_i² σ_i² / (p η²)``.

References:
  Malekmohammadi, Yu, Cao, "Noise-Aware Algorithm for Heterogeneous Differentially Private Federated Learning",
  ICML 2024, https://arxiv.org/abs/2406.03519
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Mapping, Sequence

import torch

from trustfl.aggregate.base import AbstractAggregator, list_rows, weighted_rows
from trustfl.aggregate.rpca import MuRule, SvdMethod, TolMode, check_pcp_options, pcp
from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.errors import ConfigError, MessageError
from trustfl.types import ParamLayout, RoundContext, StageOut

ArrayLike = float | int | Sequence[float] | torch.Tensor


def _f64(name: str, value: ArrayLike, *, positive: bool) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.float64)
    bad = ~torch.isfinite(t) | ((t <= 0) if positive else (t < 0))
    if bool(bad.any()):
        rule = "> 0" if positive else ">= 0"
        raise ConfigError(f"`{name}` must be finite and {rule}, found {t.tolist()}.")
    return t


def _normalize(name: str, raw: torch.Tensor) -> torch.Tensor:
    total = raw.sum()
    if raw.numel() == 0 or not float(total) > 0:
        raise ConfigError(f"`{name}` must have a positive sum, found {raw.tolist()}.")
    return raw / total


def update_noise_variance(z: ArrayLike, batch_size: ArrayLike, num_samples: ArrayLike, local_epochs: ArrayLike,
                          lr: ArrayLike, clip: ArrayLike, p: int) -> torch.Tensor:
    """Noise variance of a DP-SGD update, ``σ_i² = K_i·⌈N_i/b_i⌉·η²·p·c²·z_i²/b_i²`` (Eq. 3 + Eq. 7).

    ``Var`` is the sum of the ``p`` per-coordinate variances. Arguments broadcast (scalars or per-client vectors).

    Example:
      >>> round(float(update_noise_variance(2.0, 32, 2400, 1, 0.01, 3.0, 1000)), 6)  # 75·1e-4·1000·9·4/32²
      0.263672
    """
    b, n = torch.as_tensor(batch_size), torch.as_tensor(num_samples)
    if b.is_floating_point() or n.is_floating_point() or bool((b < 1).any()) or bool((n < 1).any()):
        raise ConfigError(f"`batch_size` and `num_samples` must be integers >= 1, found {b.tolist()} and "
                          f"{n.tolist()}.")
    steps = _f64("local_epochs", local_epochs, positive=True) * (-torch.div(-n, b, rounding_mode="floor"))
    z_, b_ = _f64("z", z, positive=False), b.to(torch.float64)
    scale = _f64("lr", lr, positive=True) ** 2 * _f64("clip", clip, positive=True) ** 2 * float(p)
    return steps * scale * z_ ** 2 / b_ ** 2


def aggregate_noise_metric(weights: ArrayLike, variances: ArrayLike, p: int, lr: float) -> float:
    """Table 3's metric: per-parameter noise variance of the aggregate over η², ``Σ_i w_i² σ_i² / (p η²)``."""
    w, v = _f64("weights", weights, positive=False), _f64("variances", variances, positive=False)
    return float((w ** 2 * v).sum() / (float(p) * float(lr) ** 2))


def oracle_weights(variances: ArrayLike) -> torch.Tensor:
    """Eq. 8: ``w_i = (1/σ_i²) / Σ_j (1/σ_j²)``, the minimiser of ``Σ w_i² σ_i²`` on the simplex."""
    return _normalize("variances", 1.0 / _f64("variances", variances, positive=True))


def weiavg_weights(eps: ArrayLike) -> torch.Tensor:
    """WeiAvg: ``w_i = ε_i / Σ_j ε_j``."""
    return _normalize("eps", _f64("eps", eps, positive=False))


def dpfedavg_weights(sizes: ArrayLike) -> torch.Tensor:
    """DPFedAvg (and FedAvg, minimum-ε): ``w_i = N_i / Σ_j N_j``."""
    return _normalize("sizes", _f64("sizes", sizes, positive=False))


def require_report(ctx: RoundContext, key: str, rule: str, n: int) -> torch.Tensor:
    """``ctx.reports[key]`` as a float64 ``(n,)`` vector; a clear ``ConfigError`` if it is missing or malformed."""
    if key not in ctx.reports:
        hint = " (simulation only: the engine must pass the true value)" if key.startswith("oracle_") else ""
        raise ConfigError(f"aggregator {rule!r} needs the per-row report ctx.reports[{key!r}]{hint}; found "
                          f"reports {sorted(ctx.reports)}.")
    value = torch.as_tensor(ctx.reports[key]).to(torch.float64).reshape(-1)
    if value.shape != (n,):
        raise ConfigError(f"ctx.reports[{key!r}] must hold one value per row ({n}), found shape "
                          f"{tuple(value.shape)}.")
    return value


def weight_metrics(w: torch.Tensor, ctx: RoundContext, per_client: bool) -> dict[str, float]:
    """``weight/min``, ``weight/max`` and, if ``per_client``, ``weight/<client_id>``."""
    out = {"weight/min": float(w.min()), "weight/max": float(w.max())}
    if per_client:
        out.update({f"weight/{cid}": float(wi) for cid, wi in zip(ctx.client_ids, w.tolist())})
    return out


def _weighted(x: torch.Tensor, w: torch.Tensor, state: Any, ctx: RoundContext, per_client: bool) -> StageOut:
    return StageOut(weighted_rows(w, x), state, weight_metrics(w, ctx, per_client))


@register("aggregator", "dpfedavg")
@dataclass(frozen=True)
class DPFedAvg(AbstractAggregator):
    """``Σ_i w_i x_i`` with ``w_i = N_i/Σ_j N_j`` from ``ctx.reports["num_samples"]`` (DPFedAvg, FedAvg, min-ε).

    Example:
      >>> from trustfl.types import RoundContext
      >>> ctx = RoundContext(0, 0, (0, 1), reports={"num_samples": torch.tensor([1.0, 3.0])})
      >>> DPFedAvg().apply(torch.tensor([[0.0], [4.0]]), None, ctx).x.tolist()
      [3.0]
    """

    reports: ClassVar[tuple[str, ...]] = ("num_samples",)
    per_client_metrics: bool = False

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        w = dpfedavg_weights(require_report(ctx, "num_samples", "dpfedavg", x.shape[0]))
        return _weighted(x, w, state, ctx, self.per_client_metrics)


@register("aggregator", "weiavg")
@dataclass(frozen=True)
class WeiAvg(AbstractAggregator):
    """``Σ_i w_i x_i`` with ``w_i = ε_i/Σ_j ε_j`` from ``ctx.reports["reported_epsilon"]`` (Liu et al. 2021).

    Warning:
      The reported ε is not verified: a client that reports 10× its ε gets about 10× the weight.
    """

    reports: ClassVar[tuple[str, ...]] = ("reported_epsilon",)
    per_client_metrics: bool = False

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        w = weiavg_weights(require_report(ctx, "reported_epsilon", "weiavg", x.shape[0]))
        return _weighted(x, w, state, ctx, self.per_client_metrics)


@register("aggregator", "oracle")
@dataclass(frozen=True)
class OracleNoiseWeights(AbstractAggregator):
    """Eq. 8 with the true variances ``ctx.reports["oracle_noise_variance"]`` (simulation-only reference)."""

    reports: ClassVar[tuple[str, ...]] = ("oracle_noise_variance",)
    per_client_metrics: bool = False

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        w = oracle_weights(require_report(ctx, "oracle_noise_variance", "oracle", x.shape[0]))
        return _weighted(x, w, state, ctx, self.per_client_metrics)


def _check_choice(name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"`{name}` must be one of {', '.join(map(repr, allowed))}, found {value!r}.")


def _stored(variances: Mapping[int, float], client_ids: Sequence[int]) -> torch.Tensor | None:
    """Stored ``σ̂²`` of ``client_ids`` as a float64 vector, or ``None`` if some client was never seen."""
    if any(cid not in variances for cid in client_ids):
        return None
    return torch.tensor([variances[cid] for cid in client_ids], dtype=torch.float64)


def inverse_variance_weights(variances: torch.Tensor, floor: float) -> torch.Tensor:
    """Eq. 8 on estimates: ``w ∝ 1/max(σ̂_i², floor·max_j σ̂_j²)``; uniform if every estimate is 0."""
    top = float(variances.max())
    if not top > 0:
        return torch.full_like(variances, 1.0 / variances.numel())
    inv = 1.0 / variances.clamp_min(floor * top)
    return inv / inv.sum()


@register("aggregator", "robust_hdp")
@dataclass(frozen=True)
class RobustHDP(AbstractAggregator):
    """Robust-HDP (Alg. 1): inverse-noise-variance weights estimated by Robust PCA of the round's updates.

    With the round's messages as the columns of ``M = xᵀ ∈ R^{p×n}``, PCP (:func:`~trustfl.aggregate.rpca.pcp`)
    splits ``M = L + S``; ``σ̂_i² = ‖S_{:,i}‖₂²`` estimates the DP-noise variance of client ``i`` and

        w_i = (1/σ̂_i²) / Σ_{j in round} (1/σ̂_j²),        output = Σ_i w_i x_i.

    ``σ̂²`` is floored at ``variance_floor·max_j σ̂_j²`` before inverting (the paper has no guard). The weights
    read neither ``ctx.reports`` nor ``ctx.weights``: a client falsifying its ε cannot change them.

    Large models (§3.6): with ``block_size = p'`` the estimate uses ``Q = num_blocks`` row blocks of ``M`` of
    ``p'`` rows each, ``σ̂_i² = mean_q (p/p')·‖S_q[:,i]‖²`` (the ``p/p'`` scale cancels in ``w``).
    ``block="first"`` takes the contiguous blocks ``[q p', (q+1) p')`` (the paper: the first block of the flat
    ``parameters()`` order; Q = 1 was enough for CIFAR at p' = 2·10⁵); ``block="random"`` takes disjoint random
    coordinate subsets from ``ctx.generator("robust_hdp")`` (a variant, not the paper's).

    Modes: ``"every_round"`` (the paper) re-estimates each call. ``"once"`` (the authors' code) keeps the
    estimates in the stage state, keyed by client id, and re-normalises them over later participants; a round
    with a client never seen before re-estimates on that round's matrix and overwrites the entries of its
    participants (others are kept). Valid because σ_i² depends only on per-client constants (ε, b, N, K, η).

    ``estimator="naive"`` is the ablation ``σ̂_i² = ‖x_i‖²`` (no PCP; as good in the noise-dominated regime).

    Metrics: ``iterations`` (PCP iterations summed over blocks, 0 when reused), ``converged`` (1/0), ``residual``
    (largest final ``‖M − L − S‖_F``), ``rank`` (of ``L``), ``recomputed`` (1/0), ``weight/min``,
    ``weight/max`` and, with ``per_client_metrics``, ``weight/<client_id>``.

    Cost: ``O(n² p')`` per PCP iteration per block and four ``(n, p')`` float64 buffers.

    Warning:
      With the default Candès μ the number of iterations grows like √p: at p ≈ 3·10⁴, n = 20 the weights settle
      after ≈ 700–1000 iterations, at p ≈ 3·10⁵ 1000 iterations are far from enough. For large p use
      ``mu_rule="spectral", mu_growth=1.05`` (≈ 130–150 iterations, independent of p), or blocks. Check the
      ``converged`` metric.

    Args:
      mode: ``"every_round"`` or ``"once"``.
      estimator: ``"rpca"`` or ``"naive"``.
      block_size: ``p'`` (``None``: the whole matrix; also when ``p' >= p``).
      block: ``"first"`` or ``"random"``.
      num_blocks: ``Q >= 1``; needs ``Q·p' <= p``.
      variance_floor: relative floor on ``σ̂²``, in ``[0, 1)``.
      lam, mu, mu_rule, tol, tol_mode, max_iter, mu_growth, mu_max, svd, check_every: PCP options (see
        ``pcp``).
      per_client_metrics: also report ``weight/<client_id>``.

    Raises:
      MessageError: for float64 messages too large for float64 squares (norms above ~1e150); never for values in
        the float32 range.

    References:
      Malekmohammadi, Yu, Cao, ICML 2024, https://arxiv.org/abs/2406.03519; Candès et al. 2011,
      https://arxiv.org/abs/0912.3599

    Example:
      >>> x = torch.tensor([[1.0, -1.0], [2.0, 2.0], [-4.0, 4.0]])
      >>> out = RobustHDP(estimator="naive", per_client_metrics=True).apply(x, None, RoundContext(0, 0, (0, 1, 2)))
      >>> [round(out.metrics[f"weight/{i}"], 2) for i in range(3)]  # ∝ 1, 1/4, 1/16
      [0.76, 0.19, 0.05]
    """

    mode: Literal["every_round", "once"] = "every_round"
    estimator: Literal["rpca", "naive"] = "rpca"
    block_size: int | None = None
    block: Literal["first", "random"] = "first"
    num_blocks: int = 1
    variance_floor: float = 1e-12
    lam: float | None = None
    mu: float | None = None
    mu_rule: MuRule = "candes"
    tol: float | None = None
    tol_mode: TolMode = "relative"
    max_iter: int = 1000
    mu_growth: float = 1.0
    mu_max: float | None = None
    svd: SvdMethod = "gram"
    check_every: int = 1
    per_client_metrics: bool = False

    def __post_init__(self) -> None:
        _check_choice("mode", self.mode, ("every_round", "once"))
        _check_choice("estimator", self.estimator, ("rpca", "naive"))
        _check_choice("block", self.block, ("first", "random"))
        check_number("block_size", self.block_size, integer=True, low=1, allow_none=True)
        check_number("num_blocks", self.num_blocks, integer=True, low=1)
        check_number("variance_floor", self.variance_floor, low=0, high=1, high_open=True)
        check_pcp_options(lam=self.lam, mu=self.mu, mu_rule=self.mu_rule, tol=self.tol, tol_mode=self.tol_mode,
                          max_iter=self.max_iter, mu_growth=self.mu_growth, mu_max=self.mu_max, svd=self.svd,
                      check_every=self.check_every)

    def init(self, layout: ParamLayout) -> dict[str, dict[int, float]]:
        return {"noise_variance": {}}

    def _blocks(self, d: int, ctx: RoundContext, device: torch.device | str = "cpu"
                ) -> tuple[list[torch.Tensor | slice], float]:
        """Column selections of ``x`` and the scale ``p/p'``."""
        if self.block_size is None or self.block_size >= d:
            return [slice(None)], 1.0
        size, q = self.block_size, self.num_blocks
        if q * size > d:
            raise ConfigError(f"`num_blocks`·`block_size` must be <= the message size {d}, found "
                              f"{q}·{size} = {q * size}; lower `num_blocks` to at most {d // size}.")
        if self.block == "first":
            return [slice(i * size, (i + 1) * size) for i in range(q)], d / size
        # Drawn on the CPU (the same blocks on every device), then moved to the messages' device to index them.
        perm = torch.randperm(d, generator=ctx.generator("robust_hdp"))[: q * size].view(q, size)
        return list(perm.sort(dim=1).values.to(device)), d / size

    def estimate(self, x: torch.Tensor, ctx: RoundContext) -> tuple[torch.Tensor, dict[str, float]]:
        """``σ̂²`` (float64, one per row of ``x``) and the estimator's metrics."""
        blocks, scale = self._blocks(x.shape[1], ctx, x.device)
        total = torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
        info = {"iterations": 0.0, "converged": 1.0, "residual": 0.0, "rank": 0.0}
        for cols in blocks:
            xb = x[:, cols]
            if self.estimator == "naive":
                total += torch.linalg.vector_norm(xb, dim=1, dtype=torch.float64) ** 2
                continue
            res = pcp(xb.T, lam=self.lam, mu=self.mu, mu_rule=self.mu_rule, tol=self.tol, tol_mode=self.tol_mode,
                      max_iter=self.max_iter, mu_growth=self.mu_growth, mu_max=self.mu_max, svd=self.svd,
                      check_every=self.check_every)
            total += torch.linalg.vector_norm(res.sparse, dim=0) ** 2
            info["iterations"] += res.iterations
            info["converged"] = min(info["converged"], float(res.converged))
            info["residual"] = max(info["residual"], res.residual)
            info["rank"] = max(info["rank"], float(res.rank))
        bad = ~torch.isfinite(total)
        if bool(bad.any()):  # float64 messages of norm above ~1e154 (any float32 value is fine)
            rows = list_rows(torch.nonzero(bad).flatten())
            raise MessageError(f"aggregator 'robust_hdp': the squared norms of rows {rows} overflow float64; "
                               "robust_hdp needs message norms below ~1e150.")
        return total * (scale / len(blocks)), info

    def apply(self, x: torch.Tensor, state: Mapping[str, Mapping[int, float]] | None,
              ctx: RoundContext) -> StageOut:
        ids = tuple(ctx.client_ids)
        if len(ids) != x.shape[0]:
            raise ConfigError(f"ctx.client_ids must name every row: {len(ids)} ids for {x.shape[0]} rows.")
        stored: Mapping[int, float] = (state or {}).get("noise_variance", {})
        variances = _stored(stored, ids) if self.mode == "once" else None
        if variances is None:
            variances, metrics = self.estimate(x, ctx)
            metrics["recomputed"] = 1.0
            if self.mode == "once":
                state = {"noise_variance": {**stored, **dict(zip(ids, variances.tolist()))}}
        else:
            metrics = {"iterations": 0.0, "converged": 1.0, "residual": 0.0, "rank": 0.0, "recomputed": 0.0}
        w = inverse_variance_weights(variances, self.variance_floor)
        metrics.update(weight_metrics(w, ctx, self.per_client_metrics))
        return StageOut(weighted_rows(w, x), state, metrics)
