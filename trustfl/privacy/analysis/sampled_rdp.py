"""RDP of the subsampled Gaussian mechanism at many orders: dp_accounting's bounds, the same bits, vectorized.

dp_accounting evaluates these bounds one order at a time in pure Python. Calibrating a noise multiplier evaluates
them for every candidate σ, and that was nearly all of the time it took to build a federation with per-client
budgets (``benchmarks/calibration_speed.py``: 26 s for 8 clients sampled without replacement, 18 s for Robust-HDP's
10 clients at its fractional orders; 3.3 and 3.7 s here). Here the terms of each order's sum are computed as arrays,
with the same floating-point operations in the same order as dp_accounting 0.6 (numpy's ``exp``/``log1p`` where it
calls numpy's, the C library's through ``math`` where it calls ``math``, scipy's special functions elementwise), and
the running log-sums are numpy's ``logaddexp.accumulate``, the formula of dp_accounting's ``_log_add``. The vectors
are dp_accounting's to the bit for every noise multiplier in :data:`CHECKED_SIGMAS` (the tests compare them on a
grid); :func:`leaf_rdp` leaves any other to dp_accounting, and :func:`fast_path_agrees` checks the installed
dp_accounting once per process: where the bits differ (another version), dp_accounting's own functions compute
everything.

- Sampling without replacement (replace-one adjacency): Theorem 27 of Wang, Balle & Kasiviswanathan, "Subsampled
  Rényi Differential Privacy and Analytical Moments Accountant" (AISTATS 2019, https://arxiv.org/abs/1808.00087).
  For an integer order α, log A_α = log(1 + Σ_{i=2..α} C(α, i) q^i B_i), B_2 = min(4(e^{ε(2)} − 1), 2e^{ε(2)}),
  B_i = min(4 sqrt(Δ^{2⌊i/2⌋} Δ^{2⌈i/2⌉}), 2e^{(i−1)ε(i)}) for i >= 3 (only the second term above order 256),
  Δ^k the forward differences at 0 of e^{(j−1)ε(j)}, ε(j) = j/(2σ²); RDP(α) = log A_α/(α − 1), a fractional
  order interpolating its integer neighbours (Corollary 10). dp_accounting recomputes the differences for every
  order, O(α²) each; the k-th difference depends only on the first k + 1 terms, so one table for the largest
  order serves them all.
- Poisson sampling (add/remove adjacency): Mironov, Talwar & Zhang, "Rényi Differential Privacy of the Sampled
  Gaussian Mechanism" (2019, https://arxiv.org/abs/1908.10530), Sec. 3.3: the binomial sum for integer orders,
  the two-sided series with erfc terms for fractional ones (stopped, as there, once both terms decrease and are
  e^{30} below the total; an order whose series has not stopped after 1000 terms is +inf, excluded, where
  dp_accounting also logs a warning).

Example:
  >>> import numpy as np
  >>> from dp_accounting.rdp import rdp_privacy_accountant as rdp
  >>> orders = [1.5, 2, 3, 10, 32.5, 300]
  >>> ours = wor_gaussian_rdp(0.05, 1.3, orders)
  >>> bool(np.array_equal(ours, rdp._compute_rdp_sample_wor_gaussian(0.05, 1.3, orders)))
  True
  >>> ours = poisson_gaussian_rdp(0.05, 1.3, orders)
  >>> bool(np.array_equal(ours, rdp._compute_rdp_poisson_subsampled_gaussian(0.05, 1.3, orders)))
  True
"""
from __future__ import annotations

import functools
import math
from typing import Any, Optional, Sequence

import numpy as np

__all__ = ["CHECKED_SIGMAS", "MAX_SERIES_TERMS", "STIRLING_ABOVE", "fast_path_agrees", "leaf_rdp",
           "log_forward_differences", "poisson_gaussian_rdp", "wor_gaussian_rdp"]

STIRLING_ABOVE = 256
"""Orders above this use the bound's second term only (dp_accounting's ``max_alpha``)."""
CHECKED_SIGMAS = (1e-3, 1e6)
"""Noise multipliers :func:`leaf_rdp` computes here (the range tests compare with dp_accounting; calibration searches
within it). Outside it dp_accounting's own functions run, with their own errors for σ² that under- or overflows."""
MAX_SERIES_TERMS = 1000
"""Terms of a fractional order's Poisson series before it counts as not converged (dp_accounting's limit)."""


def _running_log_sum(start: float, log_terms: np.ndarray) -> np.ndarray:
    """log(e^start + e^{t_0} + … + e^{t_k}) for every k (along the last axis), one term at a time as dp_accounting's
    ``_log_add`` adds them (numpy's ``logaddexp`` is the same formula: the larger plus log1p(exp(smaller − larger)))."""
    first = np.full(log_terms.shape[:-1] + (1,), start)
    return np.logaddexp.accumulate(np.concatenate((first, log_terms), axis=-1), axis=-1)[..., 1:]


def _log_comb(n: float, k: np.ndarray) -> np.ndarray:
    from scipy import special

    return special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)


_libm_log1p = np.frompyfunc(math.log1p, 1, 1)
_libm_exp = np.frompyfunc(math.exp, 1, 1)


def log_forward_differences(logs: np.ndarray) -> np.ndarray:
    """log |Δ^k a_0| for k = 1 … len(logs) − 1, the sequence a given as log a_j (every a_j > 0): dp_accounting's
    ``_get_forward_diffs``, whose sequence is (1, e^{f(0)}, e^{f(1)}, …), one vectorized pass per order.

    Each entry is updated from its old value and its right neighbour's, as there; the arithmetic is the same
    elementwise (numpy's ``exp``/``log1p`` where dp_accounting calls numpy's, the C library's through ``math``
    where it calls ``math``), so the table is the same bits.
    """
    logs = np.array(logs, dtype=np.float64)
    positive = np.ones(logs.size, dtype=bool)
    deltas = np.empty(logs.size - 1)
    for order in range(logs.size - 1):
        m = logs.size - 1 - order
        cur, nxt = logs[:m].copy(), logs[1:m + 1].copy()
        cur_pos, nxt_pos = positive[:m].copy(), positive[1:m + 1].copy()
        same = cur_pos == nxt_pos
        up, down = same & (nxt > cur), same & (nxt < cur)
        level = same & ~up & ~down
        new = np.empty(m)
        new_pos = np.empty(m, dtype=bool)
        # Same signs: log |e^nxt − e^cur|, positive when nxt > cur, the sign flipped when both are negative.
        new[up] = nxt[up] + _libm_log1p(-np.exp(cur[up] - nxt[up])).astype(np.float64)
        new[down] = cur[down] + np.log1p(-np.exp(nxt[down] - cur[down]))
        new[level] = -np.inf
        new_pos[up | level], new_pos[down] = True, False
        new_pos[same & ~nxt_pos] = ~new_pos[same & ~nxt_pos]
        # Opposite signs: log(e^cur + e^nxt), with nxt's sign.
        mixed = ~same
        low, high = np.minimum(cur[mixed], nxt[mixed]), np.maximum(cur[mixed], nxt[mixed])
        finite = low != -np.inf
        added = high.copy()
        added[finite] = _libm_log1p(_libm_exp(low[finite] - high[finite])).astype(np.float64) + high[finite]
        new[mixed], new_pos[mixed] = added, nxt_pos[mixed]
        logs[:m], positive[:m] = new, new_pos
        deltas[order] = logs[0]
    return deltas


def _log_a(q: float, sigma: float, alpha: int, deltas: np.ndarray) -> float:
    """log A_α of Theorem 27 for an integer order α >= 2, the differences ``deltas`` of exp(cgf) given."""
    two_var = 2.0 * sigma ** 2
    eps_2 = 1.0 * 2.0 / two_var
    log_q = np.log(q)
    first = (2 * log_q + _log_comb(alpha, np.float64(2))
             + np.minimum(np.log(4) + (eps_2 + math.log1p(-np.exp(-eps_2))), eps_2 + np.log(2)))
    i = np.arange(3, alpha + 1, dtype=np.float64)
    cgf = (i - 1) * 1.0 * i / two_var  # (i − 1) · ε(i): the CGF at i − 1
    if alpha <= STIRLING_ABOVE:
        lo = 2 * np.floor(i / 2.0).astype(np.int64) - 1
        hi = 2 * np.ceil(i / 2.0).astype(np.int64) - 1
        terms = np.minimum(np.log(4) + 0.5 * (deltas[lo] + deltas[hi]), np.log(2) + cgf)
        terms = terms + (i * log_q + _log_comb(alpha, i))
    else:
        terms = np.log(2) + cgf + i * log_q + _log_comb(alpha, i)
    return float(_running_log_sum(0.0, np.concatenate(([first], terms)))[-1])


def wor_gaussian_rdp(q: float, sigma: float, orders: Sequence[float]) -> np.ndarray:
    """RDP at each order of the Gaussian mechanism (noise multiplier ``sigma``) on a fraction ``q`` of the data
    sampled without replacement (replace-one adjacency): dp_accounting's ``_compute_rdp_sample_wor_gaussian``,
    to the bit for σ in :data:`CHECKED_SIGMAS`, in a fraction of its time.

    Raises:
      ValueError: ``q`` outside [0, 1], ``sigma <= 0`` (unless q = 0) or an order below 1 (where dp_accounting's
        function fails an assertion or divides by zero).
    """
    q, sigma = float(q), float(sigma)
    orders = [float(a) for a in orders]
    if not 0 <= q <= 1 or not (sigma > 0 or q == 0) or not all(alpha >= 1 for alpha in orders):
        raise ValueError(f"Need q in [0, 1], sigma > 0 and orders >= 1, found q={q}, sigma={sigma}, "
                         f"orders={orders}.")
    if q == 0 or q == 1.0:
        return np.array([0 if q == 0 else alpha / (2 * sigma ** 2) for alpha in orders])
    needed = [int(k) for alpha in orders if not math.isinf(alpha)
              for k in {math.floor(alpha), math.ceil(alpha)} if 2 <= k <= STIRLING_ABOVE]
    deltas = np.zeros(0)
    if needed:
        x = np.arange(max(needed) + 2, dtype=np.float64)
        deltas = log_forward_differences(np.concatenate(([0.0], x * 1.0 * (x + 1) / (2.0 * sigma ** 2))))

    @functools.cache
    def log_a(alpha: int) -> float:
        return 0.0 if alpha == 1 else _log_a(q, sigma, alpha, deltas)

    out = []
    for alpha in orders:
        if math.isinf(alpha):
            out.append(np.inf)
        elif alpha.is_integer():
            out.append(log_a(int(alpha)) / (alpha - 1))
        else:
            t = alpha - math.floor(alpha)
            out.append(((1 - t) * log_a(math.floor(alpha)) + t * log_a(math.ceil(alpha))) / (alpha - 1))
    return np.array(out)


def _poisson_log_a_int(q: float, sigma: float, alpha: int) -> float:
    i = np.arange(alpha + 1, dtype=np.float64)
    log_coef = _log_comb(alpha, i) + i * math.log(q) + (alpha - i) * math.log1p(-q)
    return float(_running_log_sum(-np.inf, log_coef + (i * i - i) / (2 * (sigma ** 2)))[-1])


def _log_erfc(x: np.ndarray) -> np.ndarray:
    from scipy import special

    return math.log(2) + special.log_ndtr(-x * 2 ** 0.5)


def _poisson_log_a_frac(q: float, sigma: float, alphas: np.ndarray, terms: int) -> np.ndarray:
    """log A_α for fractional orders ``alphas`` (one row each) from the first ``terms`` terms of both series; NaN
    where they have not stopped by then."""
    i = np.arange(terms, dtype=np.float64)
    alpha = alphas[:, None]
    j = alpha - i
    z0 = sigma ** 2 * math.log(1 / q - 1) + 0.5
    log_coef = _log_comb(alpha, i)
    log_q, log1mq, scale = math.log(q), math.log1p(-q), math.sqrt(2) * sigma
    lower = (log_coef + i * log_q + j * log1mq + (i * i - i) / (2 * (sigma ** 2))
             + (math.log(0.5) + _log_erfc((i - z0) / scale)))
    upper = (log_coef + j * log_q + i * log1mq + (j * j - j) / (2 * (sigma ** 2))
             + (math.log(0.5) + _log_erfc((z0 - j) / scale)))
    total = np.logaddexp(_running_log_sum(-np.inf, lower), _running_log_sum(-np.inf, upper))
    done = np.zeros(total.shape, dtype=bool)
    done[:, 1:] = (lower[:, 1:] < lower[:, :-1]) & (upper[:, 1:] < upper[:, :-1])
    done &= np.maximum(lower, upper) < total - 30
    first = done.argmax(axis=1)
    return np.where(done.any(axis=1), total[np.arange(len(alphas)), first], np.nan)


def _poisson_log_a_fracs(q: float, sigma: float, alphas: np.ndarray) -> np.ndarray:
    """log A_α for fractional orders; +inf where the series has not stopped within :data:`MAX_SERIES_TERMS`."""
    out = _poisson_log_a_frac(q, sigma, alphas, 64)  # most stop within a few dozen terms
    slow = np.isnan(out)
    if slow.any():
        out[slow] = _poisson_log_a_frac(q, sigma, alphas[slow], MAX_SERIES_TERMS)
    return np.where(np.isnan(out), np.inf, out)


def poisson_gaussian_rdp(q: float, sigma: float, orders: Sequence[float]) -> np.ndarray:
    """RDP at each order of the Gaussian mechanism (noise multiplier ``sigma``) on a Poisson sample of rate ``q``:
    dp_accounting's ``_compute_rdp_poisson_subsampled_gaussian``, to the bit for σ in :data:`CHECKED_SIGMAS`,
    without its warnings.

    Raises:
      ValueError: ``q`` outside [0, 1] or a negative ``sigma`` (as dp_accounting's function does).
    """
    q, sigma = float(q), float(sigma)
    if not 0 <= q <= 1:
        raise ValueError(f"Sampling rate must be in [0, 1]. Found {q}.")
    if sigma < 0:
        raise ValueError(f"Noise multiplier must be non-negative: {sigma}")
    fractional = [float(alpha) for alpha in orders if not (np.isinf(alpha) or float(alpha).is_integer())]
    log_a_frac = {}
    if fractional and 0 < q < 1 and sigma > 0:
        log_a_frac = dict(zip(fractional, _poisson_log_a_fracs(q, sigma, np.array(fractional)).tolist()))
    out: list[float] = []
    for alpha in orders:
        if q == 0:
            out.append(0)
        elif np.isinf(alpha) or sigma == 0:
            out.append(np.inf)
        elif q == 1.0:
            out.append(alpha / (2 * sigma ** 2))
        elif float(alpha).is_integer():
            out.append(_poisson_log_a_int(q, sigma, int(alpha)) / (alpha - 1))
        else:
            out.append(log_a_frac[float(alpha)] / (alpha - 1))
    return np.array(out)


def leaf_rdp(event: Any, count: int, orders: np.ndarray, relation: Any) -> Optional[np.ndarray]:
    """``count`` times the RDP at ``orders`` of a Gaussian, Poisson-sampled Gaussian or without-replacement-sampled
    Gaussian event, as dp_accounting's ``RdpAccountant(orders, relation).compose(event, count).rdp`` gives it;
    ``None`` for any other event or relation, or where this module does not reproduce the installed
    dp_accounting (the caller then composes through dp_accounting)."""
    from dp_accounting import dp_event
    from dp_accounting.privacy_accountant import NeighboringRelation as Relation

    inner = getattr(event, "event", None)
    if isinstance(event, dp_event.GaussianDpEvent):
        rdp = functools.partial(poisson_gaussian_rdp, 1.0, event.noise_multiplier)
    elif not isinstance(inner, dp_event.GaussianDpEvent):
        return None
    elif isinstance(event, dp_event.PoissonSampledDpEvent) and relation in (Relation.ADD_OR_REMOVE_ONE,
                                                                           Relation.REPLACE_SPECIAL):
        rdp = functools.partial(poisson_gaussian_rdp, event.sampling_probability, inner.noise_multiplier)
    elif (isinstance(event, dp_event.SampledWithoutReplacementDpEvent) and relation is Relation.REPLACE_ONE
          and 0 <= event.sample_size <= event.source_dataset_size):  # otherwise dp_accounting fails its assertion
        rdp = functools.partial(wor_gaussian_rdp, event.sample_size / event.source_dataset_size,
                                inner.noise_multiplier)
    else:
        return None
    sigma = (event if inner is None else inner).noise_multiplier
    if not CHECKED_SIGMAS[0] <= sigma <= CHECKED_SIGMAS[1] or not fast_path_agrees():
        return None
    vector = np.zeros_like(orders, dtype=np.float64)
    vector += count * rdp(orders)
    return vector


@functools.cache
def fast_path_agrees() -> bool:
    """Whether :func:`wor_gaussian_rdp` and :func:`poisson_gaussian_rdp` give the installed dp_accounting's vectors,
    bit for bit, on a probe that covers every form of the bounds (checked once per process, some milliseconds)."""
    try:
        from dp_accounting.rdp import rdp_privacy_accountant as rdp

        orders = [2, 2.5, 3, 4, 7, 12.5, 40, 300]  # series that stop: dp_accounting logs nothing
        probes = ((0.01, 0.8), (0.3, 2.5))
        return all(np.array_equal(wor_gaussian_rdp(q, sigma, orders),
                                  rdp._compute_rdp_sample_wor_gaussian(q, sigma, orders))
                   and np.array_equal(poisson_gaussian_rdp(q, sigma, orders),
                                      rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, orders))
                   for q, sigma in probes)
    except (ImportError, AttributeError, TypeError, ValueError, ArithmeticError):
        return False
