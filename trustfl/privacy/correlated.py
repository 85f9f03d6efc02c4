"""Correlated Gaussian noise that cancels in the sum (CafCor, Sec. 3 and Algorithm 1), plus independent noise.

Client ``i`` of ``n`` protocol participants adds to its message, in round ``t``,

    N_i = Σ_{j ∈ [n] \\ {i}} v^{(ij)} + v̄^{(i)},   v^{(ij)} = +z^{ij} if i < j, −z^{ij} if i > j,
    z^{ij} ~ N(0, σ_cor² I_d) drawn from the seed both i and j derive for (t, purpose),   v̄^{(i)} ~ N(0, σ_ind² I_d),

(Algorithm 1, line 6; "workers with smaller indices add the generated noise, while their paired counterparts
subtract it"). The pair terms cancel in ``Σ_i N_i`` when all ``n`` follow the protocol. Per coordinate,
``Var(N_i) = (n − 1)σ_cor² + σ_ind²`` and ``Cov(N_i, N_j) = −σ_cor²`` (``i ≠ j``), i.e. the pair part has
covariance ``σ_cor²·(nI − 11ᵀ) ⊗ I_d``.

Two samplers:
  * **exact** (:class:`PairwiseCorrelatedNoise`): real pair seeds from X25519 + HKDF (:mod:`trustfl.privacy.keys`);
    each row is computed from its own client's private key and the public directory only. Cost O(n·d) per client,
    O(n²·d) per cohort: for small ``n·d`` and tests.
  * **fast** (:func:`centered_pair_noise`): ``N = σ_cor·√n·(G − 1·mean_rows(G))`` with ``G ~ N(0, 1)^{n×d}``,
    the same joint law (covariance ``σ_cor²·n·P``, ``P = I − 11ᵀ/n``) in O(n·d) (docs/papers/cafcor.md). It
    draws all rows from one generator: a simulation shortcut, not a protocol.

Warning:
  In simulation the Byzantine clients' pair terms are drawn for the honest rows too, but the Byzantine clients do
  not follow the protocol, so these terms never cancel: the honest sum keeps noise of variance
  ``m·f·σ_cor²`` per coordinate (``m`` honest rows, ``f`` absent peers) even with ``σ_ind = 0``
  (docs/papers/cafcor.md, "Key equations"). The same holds for any of the ``n`` participants that is not among
  the rows (e.g. not sampled).

References:
  Allouah, Guerraoui, Stephan. Towards Trustworthy Federated Learning with Untrusted Participants. ICML 2025.
  https://arxiv.org/abs/2505.01874
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import torch

from trustfl.core.checks import FLOAT32_MAX, check_number
from trustfl.core.registry import register
from trustfl.core.rng import run_draws
from trustfl.core.stage import AbstractStage
from trustfl.errors import ConfigError, PrivacyError
from trustfl.privacy.keys import ClientKeys, PublicKeyDirectory, pair_seed
from trustfl.privacy.noise import client_rows_noise
from trustfl.types import RoundContext, StageOut

PATHS = ("exact", "fast")
_ADD_CHUNK = 1 << 14
"""Elements per add when a client's row of pair terms is summed on a draw thread: below torch's grain size (32,768),
so the add runs on that thread alone."""


def _check_sigma(value: float, name: str) -> None:
    check_number(name, value, low=0, high=FLOAT32_MAX, note="it scales float32 noise")


def _draw_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass(frozen=True)
class PairwiseCorrelatedNoise:
    """The exact pairwise-seed mechanism: each client's pair noise from its own keys and the public directory.

    Args:
      sigma_cor: ``σ_cor``, the per-coordinate std of each pair term ``z^{ij}``.
      purpose: the HKDF purpose string that separates these seeds from other uses of the same pair keys.

    The draw dtype is part of the protocol: both ends of a pair must draw ``z^{ij}`` in the same dtype.

    Example:
      >>> keys = [ClientKeys.generate(i, bytes(32)) for i in range(3)]
      >>> mech = PairwiseCorrelatedNoise(1.0)
      >>> rows = mech.cohort_noise(keys, PublicKeyDirectory.of(keys), round=0, d=4, dtype=torch.float64)
      >>> bool(rows.sum(0).abs().max() < 1e-12)
      True
    """

    sigma_cor: float
    purpose: str = "correlated_noise"

    def __post_init__(self) -> None:
        _check_sigma(self.sigma_cor, "sigma_cor")
        if not isinstance(self.purpose, str) or not self.purpose:
            raise ConfigError(f"`purpose` must be a non-empty string, found {self.purpose!r}.")

    def client_noise(self, keys: ClientKeys, directory: PublicKeyDirectory, round: int, d: int,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``Σ_{j ≠ i} v^{(ij)}`` for client ``i = keys.client_id`` over every peer ``j`` in ``directory``; ``(d,)``.

        Each ``z^{ij} = σ_cor·g`` with ``g ~ N(0, I_d)`` drawn (vectorised over ``d``) from a ``torch.Generator``
        seeded with ``pair_seed(sk_i, pk_j, i, j, purpose, round)``.
        """
        return self._pair_sum(keys, directory, round, torch.zeros(d, dtype=dtype), chunked=False).mul_(self.sigma_cor)

    def _pair_sum(self, keys: ClientKeys, directory: PublicKeyDirectory, round: int, out: torch.Tensor,
                  chunked: bool) -> torch.Tensor:
        """``Σ_{j ≠ i} ±g^{ij}`` added into ``out`` (``(d,)``, zeros), before the scale ``σ_cor``. ``chunked``: add
        as :func:`_add_on_this_thread` does, for a row summed on a draw thread."""
        i = keys.client_id
        buf = torch.empty_like(out)
        gen = torch.Generator()
        for j in directory.ids:
            if j == i:
                continue
            gen.manual_seed(pair_seed(keys, directory[j], i, j, self.purpose, round))
            torch.randn(out.shape, generator=gen, dtype=out.dtype, out=buf)
            sign = 1.0 if i < j else -1.0
            if chunked:
                _add_on_this_thread(out, buf, sign)
            else:
                out.add_(buf, alpha=sign)
        return out

    def cohort_noise(self, keys: Sequence[ClientKeys] | Mapping[int, ClientKeys], directory: PublicKeyDirectory,
                     round: int, d: int, client_ids: Sequence[int] | None = None,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Rows ``client_noise`` for ``client_ids`` (default: every client of ``keys``), for simulation; ``(m, d)``.

        Row ``r`` uses only ``keys[client_ids[r]]`` and the public directory.

        Raises:
          PrivacyError: if a requested client has no key pair.
        """
        by_id = dict(keys) if isinstance(keys, Mapping) else {k.client_id: k for k in keys}
        ids = list(by_id) if client_ids is None else list(client_ids)
        missing = [c for c in ids if c not in by_id]
        if missing:
            raise PrivacyError(f"no key pair for client(s) {missing}; keys are held for {sorted(by_id)}.")
        rows = torch.zeros((len(ids), d), dtype=dtype)
        run_draws([lambda r=r, c=c: self._pair_sum(by_id[c], directory, round, rows[r], chunked=True)
                   for r, c in enumerate(ids)], len(ids) * len(directory.ids) * d, "cpu")  # rows on torch's threads
        return rows.mul_(self.sigma_cor)


def centered_pair_noise(n: int, d: int, sigma_cor: float, generator: torch.Generator,
                        dtype: torch.dtype = torch.float32, rows: Sequence[int] | None = None) -> torch.Tensor:
    """The fast sampler: ``N = σ_cor·√n·(G − 1·mean_rows(G))``, ``G ~ N(0, 1)^{n×d}`` (docs/papers/cafcor.md).

    ``Cov(N_i, N_j) = σ_cor²·n·(δ_ij − 1/n)``: ``(n − 1)σ_cor²`` on the diagonal and ``−σ_cor²`` off it, the law of
    the exact pair noise; the ``n`` rows sum to 0 (up to rounding). Cost O(n·d), computed in place.

    Args:
      n, d: the full matrix is ``(n, d)``; all ``n`` rows are always drawn, so a row's value does not depend on
        which rows are kept.
      sigma_cor: ``σ_cor``.
      generator: the (server) generator of the draw; the noise is drawn on its device.
      dtype: the draw dtype.
      rows: the row indices to return, in order (default: all ``n``).

    Returns:
      ``N[rows]``, shape ``(len(rows), d)``.

    Raises:
      ConfigError: if ``n < 1``, ``d < 0`` or a row index is outside ``[0, n)``.
    """
    if n < 1 or d < 0:
        raise ConfigError(f"`n` must be >= 1 and `d` >= 0, found n={n}, d={d}.")
    g = torch.randn((n, d), generator=generator, dtype=dtype, device=generator.device)
    mean = g.mean(dim=0, keepdim=True)
    if rows is not None and list(rows) != list(range(n)):
        if any(not 0 <= r < n for r in rows):
            raise ConfigError(f"`rows` must be indices in [0, {n}), found {list(rows)}.")
        g = g.index_select(0, torch.tensor(list(rows), dtype=torch.long, device=g.device))
    return g.sub_(mean).mul_(sigma_cor * math.sqrt(n))


def simulation_key_seed(seed: int) -> bytes:
    """The 32-byte seed the simulation derives every client's key pair from: ``SHA-256("trustfl/simulation-keys"
    ‖ seed)``. Anyone who knows the run seed can compute these keys: a deployment uses them only to reproduce
    a simulation (``deploy.secrets = "run_seed"``)."""
    return hashlib.sha256(b"trustfl/simulation-keys" + int(seed).to_bytes(16, "big", signed=True)).digest()


def simulation_keys(seed: int, n: int) -> tuple[dict[int, ClientKeys], PublicKeyDirectory]:
    """Key pairs of clients ``0..n−1`` derived from the run seed, and the public directory (simulation setup).

    The 32-byte key seed is ``SHA-256("trustfl/simulation-keys" ‖ seed)``; see :meth:`ClientKeys.generate`.
    """
    key_seed = simulation_key_seed(seed)
    keys = {i: ClientKeys.generate(i, key_seed) for i in range(n)}
    return keys, PublicKeyDirectory.of(keys.values())


@dataclass(frozen=True)
class CorrelatedNoise(AbstractStage):
    """Client-side stage: add pairwise-cancelling noise and independent ``N(0, σ_ind²)`` noise to each row.

    Row ``r`` belongs to client ``ctx.client_ids[r]`` among ``n = ctx.num_clients`` protocol participants with
    ids ``0..n−1``; each row gets the pair terms with all ``n − 1`` peers (cancelling only with the peers present
    and following the protocol) and independent noise from ``ctx.generator("noise_ind", client_id)``.

    * ``path="exact"``: each client derives its pair seeds from its own X25519 key (keys from the run seed,
      :func:`simulation_keys`, or a deployed node's own keys in ``ctx.pair_keys``) and the public directory; row
      ``r`` depends on its own client's key only.
    * ``path="fast"``: draws the full ``n``-row matrix by :func:`centered_pair_noise` from the server generator
      ``ctx.generator("correlated_noise_fast")`` and keeps the participants' rows: the same joint law, but a
      simulation shortcut, not a protocol (no client could compute its own row).

    The stage emits no DP events: the SecLDP guarantee (Lemma A.4) depends on ``f`` and ``q``,
    so the recipe charges it. Metrics: ``message_noise_std`` = ``√((n−1)σ_cor² + σ_ind²)`` per coordinate of one
    row, and ``sum_noise_std`` = ``√(m(n−m)σ_cor² + mσ_ind²)``, the noise left in the sum of the ``m`` rows.
    """

    privacy_noise: ClassVar[bool] = True

    sigma_cor: float
    sigma_ind: float = 0.0
    path: str = "exact"
    purpose: str = "correlated_noise"

    def __post_init__(self) -> None:
        _check_sigma(self.sigma_cor, "sigma_cor")
        _check_sigma(self.sigma_ind, "sigma_ind")
        if self.path not in PATHS:
            raise ConfigError(f"`path` must be one of {PATHS}, found {self.path!r}.")
        if not isinstance(self.purpose, str) or not self.purpose:
            raise ConfigError(f"`purpose` must be a non-empty string, found {self.purpose!r}.")

    def sum_noise_std(self, m: int, n: int) -> float:
        """The noise std left per coordinate in the sum of ``m`` of the ``n`` participants' rows (the pair terms
        with the ``n − m`` absent peers do not cancel): ``√(m(n−m)σ_cor² + mσ_ind²)``."""
        return math.sqrt(m * (n - m) * self.sigma_cor ** 2 + m * self.sigma_ind ** 2)

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        m, d = _check_rows(x, ctx)
        n = ctx.num_clients
        dtype = _draw_dtype(x.dtype)
        if self.path == "exact":
            keys, directory = ctx.pair_keys if ctx.pair_keys is not None else simulation_keys(ctx.seed, n)
            mech = PairwiseCorrelatedNoise(self.sigma_cor, self.purpose)
            # The pair terms are drawn on the CPU whatever the message's device: the two ends of a pair must draw
            # the same z^{ij}, and a CUDA generator's stream differs from the CPU's for the same seed.
            noise = mech.cohort_noise(keys, directory, ctx.round, d, ctx.client_ids, dtype).to(x.device)
        else:
            noise = centered_pair_noise(n, d, self.sigma_cor, ctx.generator("correlated_noise_fast",
                                                                            device=x.device), dtype,
                                        rows=ctx.client_ids)
        if self.sigma_ind > 0:  # each client's own stream, as the gaussian_noise stage draws it
            noise.add_(client_rows_noise(ctx, "noise_ind", d, dtype, x.device), alpha=self.sigma_ind)
        metrics = {
            "message_noise_std": math.sqrt((n - 1) * self.sigma_cor ** 2 + self.sigma_ind ** 2),
            "sum_noise_std": self.sum_noise_std(m, n),
        }
        out = noise.add_(x) if noise.dtype == x.dtype else x + noise.to(x.dtype)  # noise is a fresh tensor
        return StageOut(out, state, metrics)


def _add_on_this_thread(row: torch.Tensor, other: torch.Tensor, alpha: float) -> None:
    """``row += alpha · other`` (1-D, on the CPU) in pieces of :data:`_ADD_CHUNK`, so that on a draw thread the add
    runs on that thread alone. The same elementwise result as one ``add_``."""
    for start in range(0, row.numel(), _ADD_CHUNK):
        row[start:start + _ADD_CHUNK].add_(other[start:start + _ADD_CHUNK], alpha=alpha)


def _check_rows(x: torch.Tensor, ctx: RoundContext) -> tuple[int, int]:
    if x.ndim != 2 or not x.is_floating_point():
        raise PrivacyError(f"correlated_noise takes a floating (m, d) tensor, found shape {tuple(x.shape)} "
                           f"and dtype {x.dtype}.")
    m, d = x.shape
    ids = ctx.client_ids
    if len(ids) != m:
        raise PrivacyError(f"`ctx.client_ids` must name each of the {m} rows, found {len(ids)} ids.")
    n = ctx.num_clients
    if n < 2:
        raise PrivacyError(f"`ctx.num_clients` (protocol participants n) must be >= 2 for pairwise noise, found {n}.")
    if len(set(ids)) != m or any(not 0 <= c < n for c in ids):
        raise PrivacyError(f"`ctx.client_ids` must be distinct ids in [0, {n}), found {ids}.")
    return m, d


@register("client_stage", "correlated_noise")
def correlated_noise(sigma_cor: float, sigma_ind: float = 0.0, path: str = "exact") -> CorrelatedNoise:
    """CafCor's client noise: pairwise-cancelling ``σ_cor`` terms plus independent ``σ_ind`` noise.

    Args:
      sigma_cor: std of each pair term, ``>= 0``.
      sigma_ind: std of the independent noise, ``>= 0``.
      path: ``"exact"`` (pair seeds by key agreement) or ``"fast"`` (centred-Gaussian sampler, same law).

    Example:
      >>> from trustfl.types import RoundContext
      >>> ctx = RoundContext(round=0, seed=1, client_ids=(0, 1, 2), num_clients=3)
      >>> out = correlated_noise(0.5).apply(torch.zeros(3, 4, dtype=torch.float64), None, ctx)
      >>> bool(out.x.sum(0).abs().max() < 1e-12)
      True
    """
    return CorrelatedNoise(sigma_cor, sigma_ind, path)
