"""PFA (Liu et al. 2021), as run by the Robust-HDP authors' code: cluster by reported ε, project, weight by ε.

Per call (the PFA of the Robust-HDP authors' code; see docs/papers/robust_hdp.md):

  1. Split the rows into *public* and *private* by a 2-component clustering of the MinMax-scaled reported ε;
     public is the cluster with the larger mean ε.
  2. Standardise every coordinate over the public updates, ``u = (x − m)/s`` (``m``, ``s``: per-coordinate mean
     and population std over the public rows; ``s = 1`` where the std is 0, as scikit-learn's StandardScaler).
  3. Replace every private update by its reconstruction from the top-``k`` principal directions ``V`` of the
     standardised public updates: ``x ← (u V Vᵀ)·s + m`` (the public PCA mean is 0 after standardising).
  4. Output ``Σ_i w_i x_i`` with ``w_i = ε_i/Σ_j ε_j`` (public updates unchanged).

Choices against the authors' code (documented, deliberate):
  * The clustering is scikit-learn's, as in the code: ``GaussianMixture(2, random_state=clustering_seed)`` on the
    MinMax-scaled reported ε (``"gmm"``, the default) or ``KMeans(2)`` (``"kmeans"``).
  * The code clusters once, on all clients, before training; here the split is made per call over the rows
    present, in client-id order (identical under full participation and constant ε; scikit-learn's mixture fit
    depends on the order of its points). ``public_ids`` fixes the public set instead.
  * With fewer than 2 public rows the public PCA is undefined (the standardised public matrix is 0); the
    projection is then skipped and PFA reduces to WeiAvg (metric ``projected = 0``). If all ε are equal, every
    row is public.

References:
  Liu, Lou, Xu, Jiang, "Projected Federated Averaging with Heterogeneous Differential Privacy", VLDB 2022,
  https://www.vldb.org/pvldb/vol15/p828-liu.pdf
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from trustfl.aggregate.base import AbstractAggregator, rescaled, weighted_rows
from trustfl.aggregate.noise_aware import require_report, weiavg_weights, weight_metrics
from trustfl.core.checks import check_number
from trustfl.core.finite import all_finite
from trustfl.core.registry import register
from trustfl.errors import ConfigError, MessageError
from trustfl.types import RoundContext, StageOut

def _cluster_labels(v: np.ndarray, clustering: str, seed: int) -> np.ndarray:
    """Two-cluster labels of the 1-D values ``v`` by scikit-learn, as the authors' code clusters."""
    points = v[:, None]
    if clustering == "gmm":
        from sklearn.mixture import GaussianMixture
        return GaussianMixture(n_components=2, random_state=seed).fit(points).predict(points)
    from sklearn.cluster import KMeans
    return KMeans(n_clusters=2, random_state=seed, n_init=10).fit(points).labels_


def public_mask(eps: torch.Tensor, clustering: str = "gmm", seed: int = 0) -> torch.Tensor:
    """Boolean mask of the public rows: the 2-cluster split of MinMax-scaled ``eps`` with the larger mean ε.

    ``clustering``: ``"gmm"`` (scikit-learn ``GaussianMixture(2, random_state=seed)``, the authors' default) or
    ``"kmeans"`` (``KMeans(2, random_state=seed)``). The mask is on ``eps``'s device.

    Example:
      >>> public_mask(torch.tensor([0.2, 0.21, 5.0, 4.5, 0.19])).tolist()
      [False, False, True, True, False]
    """
    values = eps.detach().to("cpu", torch.float64).numpy()
    lo, hi = float(values.min()), float(values.max())
    if values.size < 2 or hi == lo:
        return torch.ones(eps.numel(), dtype=torch.bool, device=eps.device)
    labels = _cluster_labels((values - lo) / (hi - lo), clustering, seed)
    if (labels == labels[0]).all():
        return torch.ones(eps.numel(), dtype=torch.bool, device=eps.device)
    high = int(values[labels == 1].mean() > values[labels == 0].mean())
    return torch.as_tensor(labels == high, device=eps.device)


def project_private(public: torch.Tensor, private: torch.Tensor, k: int = 1) -> torch.Tensor:
    """Reconstruct ``private`` rows from the top-``k`` principal directions of the standardised ``public`` rows.

    Computed in float64 on the ``n_pub×n_pub`` Gram matrix of the standardised public rows ``U``: its top
    eigenpairs ``(λ_j, a_j)`` give the unit directions ``v_j = Uᵀ a_j/√λ_j``. Needs ``n_pub >= 2``. Scale-equivariant
    (``c·x`` gives ``c·`` the result), which :class:`PFA` uses to redo it without overflow.
    """
    pub = public.to(torch.float64)
    mean = pub.mean(0)
    std = pub.std(0, correction=0)
    # a coordinate is constant when its std is within rounding error of 0 (scikit-learn's rule); scale 1 there
    constant = std <= pub.shape[0] * torch.finfo(torch.float64).eps * mean.abs()
    std = torch.where(constant, 1.0, std)
    u = (pub - mean) / std
    try:
        evals, evecs = torch.linalg.eigh(u @ u.T)
    except torch.linalg.LinAlgError as exc:  # only seen on non-finite input (the engine screens it)
        raise MessageError(f"pfa: the eigendecomposition of the public rows' Gram matrix failed ({exc}); check "
                           "that the messages are finite.") from exc
    top = evals[-k:].clamp_min(0.0)
    keep = top > 1e-12 * float(evals[-1].clamp_min(0.0))
    dirs = (evecs[:, -k:][:, keep] / top[keep].sqrt()).T @ u           # (k', d) orthonormal rows
    scaled = (private.to(torch.float64) - mean) / std
    return ((scaled @ dirs.T) @ dirs * std + mean).to(private.dtype)


@register("aggregator", "pfa")
@dataclass(frozen=True)
class PFA(AbstractAggregator):
    """Projected federated averaging as in the Robust-HDP code (see the module docstring for the steps).

    Reads ``ctx.reports["reported_epsilon"]`` (unverified: a client that over-reports ε gains weight and may
    become a public, basis-defining client). A projection that overflows is redone by
    :func:`~trustfl.aggregate.base.rescaled` (a reconstruction beyond the dtype's range saturates). Metrics:
    ``public`` (count), ``projected`` (1/0), ``weight/min``, ``weight/max`` (and ``weight/<client_id>`` with
    ``per_client_metrics``).

    Args:
      clustering: ``"gmm"`` (the code's default) or ``"kmeans"``.
      clustering_seed: ``random_state`` of the clustering (the code passes its run seed; default 0).
      public_ids: if given, the client ids that are public (no clustering); rows of other clients are private.
      projection_dim: number of public principal directions ``k >= 1`` (the paper: 1).
      per_client_metrics: also report ``weight/<client_id>``.

    Example:
      >>> from trustfl.types import RoundContext
      >>> x = torch.tensor([[1.0, 0.0], [2.0, 0.0], [3.0, 5.0]], dtype=torch.float64)
      >>> ctx = RoundContext(0, 0, (0, 1, 2), reports={"reported_epsilon": torch.tensor([2.0, 2.0, 1.0])})
      >>> out = PFA().apply(x, None, ctx)  # private row (3, 5) → (3, 0); weights 0.4, 0.4, 0.2
      >>> [round(v, 6) for v in out.x.tolist()], out.metrics["public"]
      ([1.8, 0.0], 2.0)
    """

    reports: ClassVar[tuple[str, ...]] = ("reported_epsilon",)
    clustering: Literal["gmm", "kmeans"] = "gmm"
    clustering_seed: int = 0
    public_ids: tuple[int, ...] | None = None
    projection_dim: int = 1
    per_client_metrics: bool = False

    def __post_init__(self) -> None:
        if self.clustering not in ("gmm", "kmeans"):
            raise ConfigError(f"`clustering` must be 'gmm' or 'kmeans', found {self.clustering!r}.")
        check_number("clustering_seed", self.clustering_seed, integer=True, low=0, high=2 ** 32 - 1,
                     note="scikit-learn's random_state")
        k = self.projection_dim
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ConfigError(f"`projection_dim` must be an integer >= 1, found {k!r}.")
        if self.public_ids is not None:
            if not isinstance(self.public_ids, (tuple, list)) or not all(
                    isinstance(i, int) and not isinstance(i, bool) for i in self.public_ids):
                raise ConfigError(f"`public_ids` must be a tuple of client ids (int) or None, found "
                                  f"{self.public_ids!r}.")
            object.__setattr__(self, "public_ids", tuple(self.public_ids))

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        eps = require_report(ctx, "reported_epsilon", "pfa", x.shape[0])
        w = weiavg_weights(eps)
        if self.public_ids is None:
            # cluster in client-id order, as the code does (the mixture's fit depends on the order of its points)
            order = torch.as_tensor(ctx.client_ids, device=eps.device).argsort(stable=True)
            pub = torch.empty(eps.numel(), dtype=torch.bool, device=eps.device)
            pub[order] = public_mask(eps[order], self.clustering, self.clustering_seed)
        else:
            pub = torch.tensor([cid in self.public_ids for cid in ctx.client_ids], dtype=torch.bool, device=x.device)
        projected = int(pub.sum()) >= 2 and not bool(pub.all())
        if projected:
            k = min(self.projection_dim, int(pub.sum()))
            # float64 squares of values above ~1e150 overflow: rescale those up front; otherwise redo only if a
            # reconstruction left the dtype's range
            rows = project_private(x[pub], x[~pub], k) if float(x.abs().max()) < 1e150 else None
            if rows is None or not all_finite(rows):
                rows = rescaled(lambda z: project_private(z[pub], z[~pub], k), x)
            x = x.clone()
            x[~pub] = rows
        metrics = {"public": float(pub.sum()), "projected": float(projected)}
        metrics.update(weight_metrics(w, ctx, self.per_client_metrics))
        return StageOut(weighted_rows(w, x), state, metrics)
