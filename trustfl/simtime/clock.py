"""The virtual clock of the asynchronous engines: step counts at a contact, finish times, clock state, closed forms.

Time semantics (QuAFL authors' code, kept exactly): client i last contacted at time t_i runs local steps of
durations d_{i,1}, d_{i,2}, … (from its speed model) back to back. When the server contacts it at time T it has
completed::

    q_i = max{q ≤ K : t_i + d_{i,1} + … + d_{i,q} < T}          (strictly before T; the step in progress is lost)

steps, and afterwards t_i := T, the server time at the *start* of the round (the interaction time is not charged to
the client). A client that finished its K steps idles until contacted. Simulation is lazy: durations are drawn only
at a contact, from ``(seed, round of last contact, client)``, so :class:`ClockState` (last contact time and round
per client, and the server time) is the whole state of the clock.

Warning:
  In the authors' ``client.py`` the duration of the step interrupted by a contact is drawn in advance and carried
  into the next interval, where it is conditioned to exceed the time left before the contact. Here every contact
  draws a fresh sequence, which is what the closed forms below (and docs/papers/quafl.md) assume.

References:
  Zakerinia, Talaei, Nadiradze, Alistarh. "Communication-Efficient Federated Learning With Data and Client
  Heterogeneity" (QuAFL), §2 (system model) and Appendix A.2 (simulation). https://arxiv.org/abs/2206.10032
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import torch

from trustfl.core.checks import check_number, describe_value
from trustfl.errors import CheckpointError, ConfigError

if TYPE_CHECKING:  # speed.py imports MAX_TIME from here
    from trustfl.simtime.speed import AbstractSpeedModel

MAX_TIME = 1e100
"""The largest simulated time a setting may give: a step's duration or mean (``engine.speed``), the server's
interaction and waiting times. Far beyond any run's time scale, and small enough that the clock's sums over a run
(at most 10^7 server steps of up to K local steps each) stay far inside float64 (up to 1.8e308): near it they
overflowed to inf after a round."""
TIME_NOTE = "simulated time; larger ones overflow the clock's sums over a run"


def _prefix_times(start: torch.Tensor, durations: torch.Tensor) -> torch.Tensor:
    """``(m, K+1)`` completion times ``t_i, t_i + d_{i,1}, …``, summed left to right from ``t_i`` (as the authors'
    ``client.time += next_step_time``), so boundary comparisons round as theirs do on the CPU."""
    if start.dim() != 1 or durations.dim() != 2 or durations.shape[0] != start.shape[0]:
        raise ConfigError(f"`start` must have shape (m,) and `durations` shape (m, K), found "
                          f"{tuple(start.shape)} and {tuple(durations.shape)}.")
    start = start.to(torch.float64)
    return torch.cumsum(torch.cat([start[:, None], durations.to(start)], dim=1), dim=1)


def completed_steps(start: torch.Tensor, durations: torch.Tensor, now: float | torch.Tensor) -> torch.Tensor:
    """Number of steps each client completed strictly before ``now``, capped at K::

        q_i = max{q ≤ K : t_i + d_{i,1} + … + d_{i,q} < now}

    Counted as the authors' loop does (``while taken < K and time + next < now``): the leading run of completion
    times below ``now``.

    Args:
      start: ``(m,)`` float64 last-contact times t_i.
      durations: ``(m, K)`` float64 step durations (K columns: the cap).
      now: the contact time, a float, a 0-d tensor or an ``(m,)`` tensor (not NaN).

    Returns:
      int64 tensor ``(m,)`` in ``[0, K]`` on the device of ``start``.

    Raises:
      ConfigError: ``now`` of another shape, or NaN.

    Example:
      >>> completed_steps(torch.tensor([0.0, 0.0]), torch.tensor([[1.0, 1.0], [0.5, 0.5]], dtype=torch.float64), 2.0)
      tensor([1, 2])
    """
    done = _prefix_times(start, durations)[:, 1:]
    try:
        now_t = torch.as_tensor(now, dtype=torch.float64, device=done.device)
    except (TypeError, ValueError, RuntimeError):
        now_t = None
    if now_t is None or now_t.dim() > 1 or (now_t.dim() == 1 and now_t.shape[0] != done.shape[0]) \
            or bool(torch.isnan(now_t).any()):
        raise ConfigError(f"`now` must be a number (not NaN), a 0-d tensor or a ({done.shape[0]},) tensor (one "
                          f"time per client of `start`), found {describe_value(now)}.")
    if now_t.dim() == 1:
        now_t = now_t[:, None]
    return (done < now_t).to(torch.int64).cumprod(dim=1).sum(dim=1)


def finish_times(start: torch.Tensor, durations: torch.Tensor, steps: int | torch.Tensor) -> torch.Tensor:
    """Time at which each client completes its first ``steps`` steps: ``t_i + d_{i,1} + … + d_{i,steps_i}``.

    For synchronous baselines (the round ends at the slowest client's K-th step) and buffered ones (the earliest
    finishers fill the buffer). ``steps = 0`` gives ``start``.

    Args:
      start: ``(m,)`` float64 start times.
      durations: ``(m, K)`` float64 step durations.
      steps: an int or an ``(m,)`` int64 tensor, each in ``[0, K]``.

    Returns:
      float64 tensor ``(m,)``.

    Example:
      >>> finish_times(torch.zeros(2, dtype=torch.float64), torch.tensor([[1.0, 2.0], [3.0, 4.0]],
      ...              dtype=torch.float64), torch.tensor([2, 1])).tolist()
      [3.0, 3.0]
    """
    times = _prefix_times(start, durations)
    k = torch.as_tensor(steps, device=times.device)
    if k.is_floating_point() or k.dtype == torch.bool:
        raise ConfigError(f"`steps` must be an int or an integer tensor, found {steps!r}.")
    k = k.to(torch.int64).expand(times.shape[0])
    if k.numel() and (int(k.min()) < 0 or int(k.max()) > durations.shape[1]):
        raise ConfigError(f"`steps` must lie in [0, {durations.shape[1]}] (the columns of `durations`), found "
                          f"values in [{int(k.min())}, {int(k.max())}].")
    return times.gather(1, k[:, None]).squeeze(1)


@dataclass
class ClockState:
    """The whole state of the virtual clock; O(n) memory (16 bytes per client).

    Mutated in place by :meth:`contact` and :meth:`advance` (copying 16 MB per round at n = 10⁶ would dominate);
    :meth:`state_dict` returns a snapshot.

    Attributes:
      server_time: the server's clock T.
      last_contact: ``(n,)`` float64, t_i (0 at start).
      last_round: ``(n,)`` int64, the round of client i's last contact; −1 before its first.

    Example:
      >>> from trustfl.simtime.speed import Deterministic
      >>> clock = ClockState.initial(3)
      >>> speed = Deterministic(duration=1.0).bind(3, seed=0)
      >>> clock.advance(2.5)
      >>> clock.poll(torch.tensor([0, 2]), 0, speed, seed=0, max_steps=4).tolist()
      [2, 2]
      >>> clock.last_contact.tolist(), clock.last_round.tolist()
      ([2.5, 0.0, 2.5], [0, -1, 0])
    """

    server_time: float
    last_contact: torch.Tensor
    last_round: torch.Tensor

    def __post_init__(self) -> None:
        check_number("server_time", self.server_time, finite=True)
        self.server_time = float(self.server_time)
        lc, lr = self.last_contact, self.last_round
        if not isinstance(lc, torch.Tensor) or lc.dim() != 1 or lc.dtype != torch.float64:
            raise ConfigError("`last_contact` must be a 1-D float64 tensor.")
        if not isinstance(lr, torch.Tensor) or lr.shape != lc.shape or lr.dtype != torch.int64 \
                or lr.device != lc.device:
            raise ConfigError(f"`last_round` must be an int64 tensor of shape {tuple(lc.shape)} on {lc.device}.")

    @classmethod
    def initial(cls, num_clients: int, *, start_time: float = 0.0,
                device: torch.device | str = "cpu") -> ClockState:
        """The clock at the start of a run: every client last contacted at ``start_time`` in round −1."""
        check_number("num_clients", num_clients, integer=True, low=1)
        return cls(float(start_time),
                   torch.full((int(num_clients),), float(start_time), dtype=torch.float64, device=device),
                   torch.full((int(num_clients),), -1, dtype=torch.int64, device=device))

    @property
    def num_clients(self) -> int:
        """n."""
        return self.last_contact.shape[0]

    def durations(self, client_ids: torch.Tensor, speed: AbstractSpeedModel, seed: int,
                  max_steps: int) -> torch.Tensor:
        """``speed.durations`` of the given clients, keyed by their last-contact rounds: ``(m, max_steps)``."""
        ids = client_ids.to(device=self.last_round.device, dtype=torch.int64)
        return speed.durations(ids, self.last_round[ids], seed, max_steps)

    def steps_done(self, client_ids: torch.Tensor, durations: torch.Tensor) -> torch.Tensor:
        """``completed_steps`` of the given clients at the current server time."""
        ids = client_ids.to(device=self.last_contact.device, dtype=torch.int64)
        return completed_steps(self.last_contact[ids], durations, self.server_time)

    def contact(self, client_ids: torch.Tensor, round: int) -> None:
        """Record that the server contacted ``client_ids`` in ``round`` at the current server time (in place)::

            t_i := server_time,   last_round_i := round

        Raises:
          ConfigError: duplicate ids, ``round`` < 0, or a client already contacted in ``round`` or later (its
            next step durations would repeat a stream).
        """
        check_number("round", round, integer=True, low=0)
        ids = client_ids.to(device=self.last_round.device, dtype=torch.int64)
        if ids.dim() != 1:
            raise ConfigError(f"`client_ids` must be 1-D, found shape {tuple(ids.shape)}.")
        if ids.numel() == 0:
            return
        if int(ids.min()) < 0 or int(ids.max()) >= self.num_clients:
            raise ConfigError(f"`client_ids` must lie in [0, {self.num_clients}), found values in "
                              f"[{int(ids.min())}, {int(ids.max())}].")
        if torch.unique(ids).numel() != ids.numel():
            raise ConfigError("`client_ids` must be distinct within one contact.")
        latest = int(self.last_round[ids].max())
        if latest >= round:
            raise ConfigError(f"`round` must exceed the last contact round of every contacted client ({latest}), "
                              f"found {round}; contact each client at most once per round.")
        self.last_contact[ids] = self.server_time
        self.last_round[ids] = int(round)

    def poll(self, client_ids: torch.Tensor, round: int, speed: AbstractSpeedModel, seed: int,
             max_steps: int) -> torch.Tensor:
        """One QuAFL contact: draw the clients' durations, count the steps done before ``server_time``, then
        :meth:`contact`. Returns the ``(m,)`` int64 step counts."""
        steps = self.steps_done(client_ids, self.durations(client_ids, speed, seed, max_steps))
        self.contact(client_ids, round)
        return steps

    def advance(self, dt: float) -> None:
        """``server_time += dt`` (e.g. ``sit + swt``), ``dt`` finite and >= 0.

        Raises:
          ConfigError: a bad ``dt``, or a sum that overflows (``server_time`` is then unchanged).
        """
        check_number("dt", dt, low=0, finite=True)
        after = self.server_time + float(dt)
        if not math.isfinite(after):
            raise ConfigError(f"`dt` = {dt!r} would take the server time {self.server_time!r} past the largest "
                              f"float; the clock is unchanged.")
        self.server_time = after

    def state_dict(self) -> dict[str, torch.Tensor]:
        """A snapshot of tensors only: ``server_time`` (0-d float64), ``last_contact``, ``last_round`` (copies)."""
        return {"server_time": torch.tensor(self.server_time, dtype=torch.float64),
                "last_contact": self.last_contact.clone(), "last_round": self.last_round.clone()}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any], *, device: torch.device | str | None = None) -> ClockState:
        """The clock saved by :meth:`state_dict`, bitwise, optionally moved to ``device``.

        Raises:
          CheckpointError: a key is missing or a tensor has the wrong shape or type.
        """
        missing = {"server_time", "last_contact", "last_round"} - set(state)
        if missing:
            raise CheckpointError(f"Clock state lacks {sorted(missing)}; the checkpoint is not from this engine.")
        try:
            server_time = float(torch.as_tensor(state["server_time"], dtype=torch.float64).item())
            lc, lr = state["last_contact"], state["last_round"]
            if device is not None:
                lc, lr = lc.to(device), lr.to(device)
            return cls(server_time, lc.clone(), lr.clone())
        except (ConfigError, AttributeError, RuntimeError, TypeError, ValueError) as exc:
            raise CheckpointError(f"Corrupt clock state: {exc}") from exc


_CANCELLED = 2.0 ** -20
"""Below this, ``1 − (1−p)·e^{−c/m}`` has lost most of its digits and is computed in its cancellation-free form."""
_MAX_TERMS = 1 << 32
"""Most terms :func:`expected_steps` sums (2²⁰ per chunk): beyond, the series would run for hours."""


def _ceil(x: float) -> int:
    """``math.ceil(x)``, with anything above 2⁶² (inf included) taken as 2⁶² (beyond :data:`_MAX_TERMS` anyway)."""
    return math.ceil(min(x, 2.0 ** 62))


def _check_rates(p: float, c: float, mean: float) -> float:
    check_number("p", p, low=0, high=1, low_open=True)
    check_number("c", c, low=0, finite=True)
    check_number("mean", mean, low=0, low_open=True, finite=True)
    return float(c) / float(mean)


def prob_zero_steps(p: float, c: float, mean: float) -> float:
    """P(a contacted client completed no step), exponential steps, Bernoulli(p) polling every c time units::

        P(0) = Σ_{g≥1} p(1−p)^{g−1} e^{−gc/m} = p·e^{−c/m} / (1 − (1−p)·e^{−c/m})

    The gap between two contacts is G·c with G ~ Geometric(p) on {1, 2, …} (p = s/n when s of n clients are
    sampled uniformly each round); a client's first contact has a different gap and is excluded.

    Args:
      p: per-round contact probability, in (0, 1].
      c: round length ``sit + swt``, >= 0.
      mean: the client's mean step time m, > 0.

    Example:
      >>> round(prob_zero_steps(0.25, 4.0, 8.0), 4)
      0.2782
    """
    lam = _check_rates(p, c, mean)
    e = math.exp(-lam)
    denominator = 1.0 - (1.0 - p) * e
    if denominator < _CANCELLED:  # 1 − (1−p)e cancels (p and c/m tiny): the same as p·e − expm1(−λ), exactly
        denominator = p * e - math.expm1(-lam)
    return p * e / denominator


def expected_steps(p: float, c: float, mean: float, max_steps: int, *, tol: float = 1e-12) -> float:
    """H_i, the expected number of steps a contacted client completed (docs/papers/quafl.md, "Simulated time")::

        H = Σ_{g≥1} p(1−p)^{g−1} · E[min(K, N_g)],   N_g ~ Poisson(g·c/m)
        E[min(K, N)] = μ·P(N ≤ K−2) + K·P(N ≥ K),   μ = E[N]

    The series is summed up to G terms: either the first G whose omitted tail is below ``tol`` (it is at most
    min(K, c/m·(G + 1/p))·(1−p)^G), or, when sooner, the first G beyond which every E[min(K, N_g)] is within
    ``tol / K`` of its limit K, the remainder then being added as K·(1−p)^G. The error is below ``tol``.

    Args:
      p: per-round contact probability, in (0, 1].
      c: round length, >= 0.
      mean: the client's mean step time m, > 0.
      max_steps: the cap K >= 0.
      tol: truncation tolerance, > 0.

    Raises:
      ConfigError: an argument out of range, or a series of more than 2³² terms (p and c/m both tiny).

    Example:
      >>> round(expected_steps(0.25, 4.0, 8.0, 1000), 6)   # no cap in effect: c / (m p)
      2.0
      >>> abs(expected_steps(0.25, 4.0, 8.0, 1) - (1 - prob_zero_steps(0.25, 4.0, 8.0))) < 1e-12
      True
    """
    lam = _check_rates(p, c, mean)
    check_number("max_steps", max_steps, integer=True, low=0)
    check_number("tol", tol, low=0, low_open=True, finite=True)
    k = int(max_steps)
    if k == 0 or lam == 0.0:
        return 0.0
    if math.isinf(lam):  # c/m beyond float64: every gap holds infinitely many steps, so K are done
        return float(k)
    p, q = float(p), 1.0 - float(p)
    g_geo = 1
    power = lambda g: q ** g  # noqa: E731  (1−p)^g
    if q > 0.0:
        # Σ_{g>G} p(1−p)^{g−1} E[min(K, N_g)] ≤ min(K, λ·E[g | g > G])·(1−p)^G = min(K, λ(G + 1/p))·(1−p)^G.
        log_q = math.log(q) if q < 1.0 else math.log1p(-p)
        if q == 1.0:  # p below the float spacing at 1: (1−p)^g from log1p
            power = lambda g: math.exp(g * log_q)  # noqa: E731
        g_geo = max(1, _ceil(math.log(tol) / log_q))
        while g_geo <= _MAX_TERMS and (bound := min(k, lam * (g_geo + 1.0 / p)) * power(g_geo)) >= tol:
            g_geo += max(1, _ceil(math.log(bound / tol) / -log_q))
    from scipy import special  # here: importing scipy takes seconds, and only this statistic needs it

    # Beyond mu_sat, K·P(N ≤ K−1) < tol: E[min(K, N)] is K up to tol / K·K.
    mu_sat = float(special.pdtri(k - 1, tol / k))
    g_sat = max(1, _ceil(mu_sat / lam)) if math.isfinite(mu_sat) else g_geo
    g_max = min(g_geo, g_sat)
    if g_max > _MAX_TERMS:
        raise ConfigError(f"expected_steps: `p` = {p!r} with c/m = {lam!r} needs over {_MAX_TERMS} terms of the "
                          f"series; raise `p`, `c` or `tol`, or lower `mean`.")
    total = 0.0
    chunk = 1 << 20
    for first in range(1, g_max + 1, chunk):
        g = np.arange(first, min(first + chunk, g_max + 1), dtype=np.float64)
        mu = g * lam
        capped = k * special.pdtrc(k - 1, mu) + (mu * special.pdtr(k - 2, mu) if k >= 2 else 0.0)
        total += float(np.sum(p * np.exp((g - 1) * math.log1p(-p)) * capped)) if q > 0 else float(capped[0])
    return total + (k * power(g_max) if g_sat < g_geo else 0.0)
