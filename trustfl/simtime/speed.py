"""Client speed models: how long each local SGD step takes on the virtual clock.

A speed model draws, for each contacted client, the durations ``d_{i,1}, …, d_{i,K}`` of the local steps it runs
after its last contact. Draws are lazy and keyed: client ``i`` whose last contact was round ``r`` always gets the
sequence of ``make_generator(seed, r, i, "step_times")``, so results do not depend on which other clients were
polled, and a run resumed from its clock state draws exactly what an uninterrupted run would.

=========================  ==========================================================================
name                       one step of client i takes
=========================  ==========================================================================
exponential_groups         Exp(mean ``slow_mean`` for ids < ⌈slow_share·n⌉, else ``fast_mean``)
exponential_uniform_means  Exp(m_i), m_i ~ U[low, high] drawn once per run (stream ``"speed_means"``)
deterministic              ``duration``, or ``slow`` / ``fast`` for two groups
trace                      the durations listed for i in a CSV file, cycled from the first at each contact
=========================  ==========================================================================

A model is configured by its hyperparameters (``engine.speed.*``) and then bound to the federation with
``bind(num_clients, seed=seed)``, which returns a bound copy; only bound models draw.

References:
  Zakerinia, Talaei, Nadiradze, Alistarh. "Communication-Efficient Federated Learning With Data and Client
  Heterogeneity" (QuAFL), §4 and Appendix A.2 (exponential step times, mean 2 for fast and 8 for slow clients).
  https://arxiv.org/abs/2206.10032

Example:
  >>> import torch
  >>> speed = ExponentialGroups(slow_share=0.25).bind(8, seed=0)
  >>> speed.mean_step(torch.tensor([0, 1, 2])).tolist()
  [8.0, 8.0, 2.0]
  >>> d = speed.durations(torch.tensor([0, 5]), torch.tensor([-1, 3]), seed=0, steps=4)
  >>> d.shape, d.dtype
  (torch.Size([2, 4]), torch.float64)
"""
from __future__ import annotations

import copy
import csv
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from trustfl.core.checks import check_number, describe_value, is_device
from trustfl.core.memory import out_of_memory_as_error, refuse_beyond_free
from trustfl.core.registry import component_name, of_trustfl, register
from trustfl.core.rng import make_generator
from trustfl.errors import ConfigError
from trustfl.simtime.clock import MAX_TIME, TIME_NOTE

_KEY = "engine.speed"
STEP_STREAM = "step_times"
"""Stream name of the step-duration generators: ``make_generator(seed, last_round, client, STEP_STREAM)``."""
MEANS_STREAM = "speed_means"
"""Stream name of the per-client mean draw of ``exponential_uniform_means``."""

S = TypeVar("S", bound="AbstractSpeedModel")
_CHECKED_BYTES = 1 << 28
"""Durations of more bytes than this are checked against the free memory before they are drawn."""


def _number(key: str, value: object, *, minimum: float = 0.0, strict: bool = True,
            maximum: float = MAX_TIME) -> float:
    """``value`` as a float, refused unless finite and in the allowed range (``ConfigError`` naming the key); by
    default a step time, in ``(0, MAX_TIME]``."""
    rule = f"in {'(' if strict else '['}{minimum:g}, {maximum:g}]" + (f" ({TIME_NOTE})" if maximum == MAX_TIME else "")
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok:
        x = float(value)  # type: ignore[arg-type]
        ok = math.isfinite(x) and (x > minimum if strict else x >= minimum) and x <= maximum
    if not ok:
        raise ConfigError(f"`{_KEY}.{key}` must be a finite number {rule}, found {value!r}.")
    return float(value)  # type: ignore[arg-type]


def _check_drawn(model: "AbstractSpeedModel", method: str, x: object, shape: tuple[int, ...], rule: str, *,
                 positive: bool, device: torch.device | None = None) -> None:
    """Refuse (ConfigError naming the model) what a speed model of your own returned unless it is a float64 tensor
    of ``shape`` (on ``device``) whose entries are ``> 0`` (``positive``) or ``>= 0`` and at most ``MAX_TIME``: a
    negative or NaN step time would otherwise run the clock backwards or stop it without a word, a huge one
    overflow it."""
    problem = None
    if not isinstance(x, torch.Tensor) or x.shape != shape or x.dtype != torch.float64 or \
            (device is not None and x.device != device):
        problem = f"gave {describe_value(x)}"
        rule = f"a float64 tensor of shape {shape}" + ("" if device is None else f" on {device}") + f", {rule}"
    else:
        bad = ~torch.isfinite(x) | ((x <= 0) if positive else (x < 0)) | (x > MAX_TIME)
        if bool(bad.any()):
            problem = f"gave {x[bad].flatten()[0].item()!r} at {tuple(torch.nonzero(bad)[0].tolist())}"
    if problem is not None:
        where = "" if method == "_bind_means" else f"`{_KEY}`: "  # bind()'s caller names the key
        raise ConfigError(f"{where}{component_name('speed_model', model)} {problem} from {method}(); its step "
                          f"times must be {rule}.")


def _slow_count(slow_share: float, num_clients: int) -> int:
    # The authors' trainer: slow clients are 0 .. ceil(ratio * n) - 1, float product included.
    return min(math.ceil(slow_share * num_clients), num_clients)


def _refuse_idle(model: "ExponentialGroups | Deterministic", num_clients: int, fast: str, slow: str,
                 same: str | None) -> None:
    """Refuse a parameter of a two-group model, set away from its default, that the groups make do nothing: the
    slow time without slow clients, the fast time without fast ones, ``slow_share`` with one time for both
    (``same``: why they are one)."""
    default, count = type(model)(), _slow_count(float(model.slow_share), num_clients)
    idle = [(slow, "`slow_share` is 0 (no client is slow)") if count == 0 else None,
            (fast, f"`slow_share` makes every one of the {num_clients} clients slow") if count == num_clients
            else None, ("slow_share", same) if same else None]
    for key, why in filter(None, idle):
        if getattr(model, key) != getattr(default, key):
            raise ConfigError(f"`{_KEY}.{key}` is set but does nothing: {why}; remove it.")


@dataclass(frozen=True)
class AbstractSpeedModel:
    """Base of the speed models: validation of calls, binding, and the per-client mean step time.

    Subclasses are frozen dataclasses of hyperparameters that implement ``_bind_means`` (the ``(n,)`` float64 mean
    step time per client) and ``_draw`` (the durations of the contacted clients).
    """

    _num_clients: int | None = field(default=None, init=False, repr=False, compare=False)
    _seed: int | None = field(default=None, init=False, repr=False, compare=False)
    _means: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)

    def bind(self: S, num_clients: int, *, seed: int) -> S:
        """A copy of this model bound to ``num_clients`` clients and the run ``seed``.

        Args:
          num_clients: n >= 1; client ids are ``0 .. n−1``.
          seed: the run seed; ``durations`` must be called with the same one.

        The copy compares equal to ``self``: equality is over the hyperparameters only.

        Raises:
          ConfigError: ``num_clients`` < 1, or (``trace``) the file does not list exactly the clients 0..n−1.
        """
        check_number("num_clients", num_clients, integer=True, low=1)
        check_number("seed", seed, integer=True)
        bound = copy.copy(self)
        means = self._bind_means(int(num_clients), int(seed))
        if not of_trustfl(self):
            _check_drawn(self, "_bind_means", means, (int(num_clients),), f"in (0, {MAX_TIME:g}]", positive=True)
        object.__setattr__(bound, "_num_clients", int(num_clients))
        object.__setattr__(bound, "_seed", int(seed))
        object.__setattr__(bound, "_means", means)
        return bound

    @property
    def num_clients(self) -> int:
        """n, the number of clients this model is bound to."""
        return self._bound()[0]

    def file_data(self) -> dict[str, torch.Tensor]:
        """What the model read from files, by name (none; ``trace``: its step times), which a checkpoint's data
        digest covers so that a resume after the file was edited is refused."""
        return {}

    def mean_step(self, client_ids: torch.Tensor) -> torch.Tensor:
        """The mean step time m_i of each client, float64 of shape ``(m,)`` on the device of ``client_ids``.

        For ``trace`` it is the mean of the client's listed durations.
        """
        _, _, means = self._bound()
        ids = self._check_ids(client_ids)
        return means[ids.cpu()].to(ids.device)

    def durations(self, client_ids: torch.Tensor, last_round: torch.Tensor, seed: int, steps: int) -> torch.Tensor:
        """The durations of the first ``steps`` local steps each client runs after its last contact.

        Row ``j`` depends only on ``(seed, last_round[j], client_ids[j])``: client ``i`` last contacted in round
        ``r`` (``-1``: never contacted, its steps start at time 0) draws from
        ``make_generator(seed, r, i, "step_times", device=client_ids.device)``.

        Args:
          client_ids: ``(m,)`` int64 ids in ``[0, n)``.
          last_round: ``(m,)`` int64 round of each client's last contact (>= −1).
          seed: the run seed given to ``bind``.
          steps: K >= 0, the number of steps to draw per client.

        Returns:
          float64 tensor ``(m, steps)`` on the device of ``client_ids``, every entry in ``[0, MAX_TIME]``.

        Raises:
          ConfigError: the model is unbound, ``seed`` differs from the bound seed, or an argument is malformed.
          ResourceError: the ``(m, steps)`` durations do not fit in memory.
        """
        _, bound_seed, _ = self._bound()
        ids = self._check_ids(client_ids)
        if not isinstance(last_round, torch.Tensor) or last_round.shape != ids.shape or last_round.is_floating_point():
            raise ConfigError(f"`last_round` must be an integer tensor of shape {tuple(ids.shape)}, found "
                              f"{describe_value(last_round)}.")
        if last_round.numel() and int(last_round.min()) < -1:
            raise ConfigError(f"`last_round` must be >= -1 (−1: never contacted), found {int(last_round.min())}.")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or int(seed) != bound_seed:
            raise ConfigError(f"`seed` must be the seed given to bind() ({bound_seed}), found {seed!r}.")
        check_number("steps", steps, integer=True, low=0)
        with out_of_memory_as_error(f"drawing {int(steps):,} step durations for each of {ids.numel():,} clients",
                                    "`steps` (the local steps K, or the rounds × iterations drawn at once)"):
            nbytes = 8 * ids.numel() * int(steps)
            if nbytes > _CHECKED_BYTES:  # reading the free memory costs a file read: only for large requests
                refuse_beyond_free(nbytes, ids.device)
            drawn = self._draw(ids, last_round.to(device=ids.device, dtype=torch.int64), int(seed), int(steps))
        if not of_trustfl(self):
            _check_drawn(self, "_draw", drawn, (ids.numel(), int(steps)), f"in [0, {MAX_TIME:g}]", positive=False,
                         device=ids.device)
        return drawn

    # -- subclass hooks ---------------------------------------------------------------------------------------
    def _bind_means(self, num_clients: int, seed: int) -> torch.Tensor:
        raise NotImplementedError

    def _draw(self, ids: torch.Tensor, last_round: torch.Tensor, seed: int, steps: int) -> torch.Tensor:
        raise NotImplementedError

    # -- helpers ----------------------------------------------------------------------------------------------
    def _bound(self) -> tuple[int, int, torch.Tensor]:
        if self._num_clients is None or self._seed is None or self._means is None:
            raise ConfigError(f"{type(self).__name__} is not bound to a federation; call "
                              f".bind(num_clients, seed=seed) first.")
        return self._num_clients, self._seed, self._means

    def _check_ids(self, client_ids: torch.Tensor) -> torch.Tensor:
        n = self._bound()[0]
        if not isinstance(client_ids, torch.Tensor) or client_ids.dim() != 1 or client_ids.is_floating_point() \
                or client_ids.dtype == torch.bool:
            raise ConfigError(f"`client_ids` must be a 1-D integer tensor, found {describe_value(client_ids)}.")
        ids = client_ids.to(torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= n):
            raise ConfigError(f"`client_ids` must lie in [0, {n}), found values in "
                              f"[{int(ids.min())}, {int(ids.max())}].")
        return ids

    def _scaled_exponentials(self, ids: torch.Tensor, last_round: torch.Tensor, seed: int,
                             steps: int) -> torch.Tensor:
        """Exp(1) draws from each client's own generator (one per contacted client), times its mean."""
        out = torch.empty(ids.numel(), steps, dtype=torch.float64, device=ids.device)
        for j, (client, rnd) in enumerate(zip(ids.tolist(), last_round.tolist())):
            gen = make_generator(seed, rnd, client, STEP_STREAM, device=ids.device)
            out[j].exponential_(1.0, generator=gen)
        return out * self.mean_step(ids)[:, None]


@register("speed_model", "exponential_groups")
@dataclass(frozen=True)
class ExponentialGroups(AbstractSpeedModel):
    """Two speed groups with exponential step times (QuAFL §4, App. A.2)::

        slow = {0, …, ⌈slow_share·n⌉ − 1},   d_{i,k} ~ Exp(mean slow_mean if i ∈ slow else fast_mean)

    The slow clients are the lowest ids, as in the authors' trainer (``math.ceil(ratio * n)``). The paper uses
    means 8 and 2; its slow share is 30 % (§4) or one fourth (App. A.2), the code's default 0.3. A mean or share
    the groups make do nothing is refused when the model is bound (``slow_mean`` with no slow client,
    ``slow_share`` with equal means).

    Args:
      slow_share: share of slow clients, in [0, 1].
      fast_mean: mean step time of a fast client, in (0, MAX_TIME].
      slow_mean: mean step time of a slow client, in (0, MAX_TIME].

    Example:
      >>> ExponentialGroups(slow_share=0.3).bind(20, seed=1).mean_step(torch.arange(20)).eq(8.0).sum().item()
      6
    """

    slow_share: float = 0.25
    fast_mean: float = 2.0
    slow_mean: float = 8.0

    def __post_init__(self) -> None:
        _number("slow_share", self.slow_share, strict=False, maximum=1.0)
        _number("fast_mean", self.fast_mean)
        _number("slow_mean", self.slow_mean)

    def _bind_means(self, num_clients: int, seed: int) -> torch.Tensor:
        _refuse_idle(self, num_clients, "fast_mean", "slow_mean",
                     "`fast_mean` and `slow_mean` are equal" if self.fast_mean == self.slow_mean else None)
        means = torch.full((num_clients,), float(self.fast_mean), dtype=torch.float64)
        means[:_slow_count(float(self.slow_share), num_clients)] = float(self.slow_mean)
        return means

    def _draw(self, ids: torch.Tensor, last_round: torch.Tensor, seed: int, steps: int) -> torch.Tensor:
        return self._scaled_exponentials(ids, last_round, seed, steps)


@register("speed_model", "exponential_uniform_means")
@dataclass(frozen=True)
class ExponentialUniformMeans(AbstractSpeedModel):
    """Exponential step times with a per-client mean drawn once per run (QuAFL Fig. 5/6, App. A)::

        m_i ~ U[low, high] (continuous, i.i.d.; generator make_generator(seed, "speed_means")),
        d_{i,k} ~ Exp(mean m_i)

    The paper says only that "average time per client per local step is uniformly random between 2 and 9"; the
    continuous uniform is our reading.

    Args:
      low: smallest mean step time, in (0, MAX_TIME].
      high: largest mean step time, in [low, MAX_TIME].

    Example:
      >>> m = ExponentialUniformMeans().bind(1000, seed=0).mean_step(torch.arange(1000))
      >>> bool(m.min() >= 2.0 and m.max() <= 9.0)
      True
    """

    low: float = 2.0
    high: float = 9.0

    def __post_init__(self) -> None:
        low = _number("low", self.low)
        high = _number("high", self.high)
        if high < low:
            raise ConfigError(f"`{_KEY}.high` must be >= `{_KEY}.low` = {self.low!r}, found {self.high!r}.")

    def _bind_means(self, num_clients: int, seed: int) -> torch.Tensor:
        gen = make_generator(seed, MEANS_STREAM)
        u = torch.rand(num_clients, generator=gen, dtype=torch.float64)
        return float(self.low) + (float(self.high) - float(self.low)) * u

    def _draw(self, ids: torch.Tensor, last_round: torch.Tensor, seed: int, steps: int) -> torch.Tensor:
        return self._scaled_exponentials(ids, last_round, seed, steps)


@register("speed_model", "deterministic")
@dataclass(frozen=True)
class Deterministic(AbstractSpeedModel):
    """Fixed step times (QuAFL's "uniform" timing experiments)::

        d_{i,k} = slow if i < ⌈slow_share·n⌉ else fast

    Give either ``duration`` (every client; 1.0 when nothing is given) or ``fast`` (default 1.0) and ``slow``
    (default ``fast``) with ``slow_share``. A time or share the groups make do nothing is refused when the model is
    bound (``slow`` without ``slow_share``, ``slow_share`` with one time for both).

    Args:
      duration: step time of every client, in (0, MAX_TIME]; excludes ``fast`` and ``slow``.
      slow_share: share of slow clients (the lowest ids), in [0, 1].
      fast: step time of the other clients, in (0, MAX_TIME].
      slow: step time of the slow clients, in (0, MAX_TIME].

    Example:
      >>> Deterministic(slow_share=0.5, fast=1.0, slow=3.0).bind(4, seed=0).durations(
      ...     torch.tensor([0, 3]), torch.tensor([-1, -1]), seed=0, steps=2).tolist()
      [[3.0, 3.0], [1.0, 1.0]]
    """

    duration: float | None = None
    slow_share: float = 0.0
    fast: float | None = None
    slow: float | None = None

    def __post_init__(self) -> None:
        if self.duration is not None and (self.fast is not None or self.slow is not None):
            raise ConfigError(f"Give either `{_KEY}.duration` or `{_KEY}.fast`/`{_KEY}.slow`, found "
                              f"duration={self.duration!r}, fast={self.fast!r}, slow={self.slow!r}.")
        _number("slow_share", self.slow_share, strict=False, maximum=1.0)
        for key in ("duration", "fast", "slow"):
            if getattr(self, key) is not None:
                _number(key, getattr(self, key))

    def _bind_means(self, num_clients: int, seed: int) -> torch.Tensor:
        fast = float(self.fast if self.fast is not None else self.duration if self.duration is not None else 1.0)
        slow = float(self.slow) if self.slow is not None else fast
        same = ("`duration` gives every client the same step time" if self.duration is not None
                else "no `slow` is given, so slow clients take `fast`" if self.slow is None
                else "`slow` and `fast` are equal" if slow == fast else None)
        _refuse_idle(self, num_clients, "fast", "slow", same)
        means = torch.full((num_clients,), fast, dtype=torch.float64)
        means[:_slow_count(float(self.slow_share), num_clients)] = slow
        return means

    def _draw(self, ids: torch.Tensor, last_round: torch.Tensor, seed: int, steps: int) -> torch.Tensor:
        return self.mean_step(ids)[:, None].expand(-1, steps).clone()


@register("speed_model", "trace")
@dataclass(frozen=True)
class Trace(AbstractSpeedModel):
    """Step times replayed from a CSV file with header ``client,duration``::

        d_{i,k} = trace_i[(k − 1) mod L_i],   k = 1, 2, …  (restarting at the first row at every contact)

    where ``trace_i`` lists client i's rows in file order and ``L_i`` is their count. Rows of different clients may
    interleave. Durations must lie in ``[0, MAX_TIME]``, and each client's mean must be > 0. ``bind(n)`` requires rows
    for every client 0..n−1 and none beyond. The seed and rounds are not used.

    Args:
      path: the CSV file.

    Raises:
      ConfigError: the file is missing or malformed; the message names ``engine.speed.path``, the file and the
        row (row 1 is the first line after the header).
    """

    path: str | Path = ""
    _values: torch.Tensor = field(init=False, repr=False, compare=False)
    _clients: torch.Tensor = field(init=False, repr=False, compare=False)
    _client_rows: dict[int, int] = field(init=False, repr=False, compare=False)
    _offsets: torch.Tensor = field(init=False, repr=False, compare=False)
    _counts: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.path, bool) or not isinstance(self.path, (str, os.PathLike)) or not str(self.path):
            # an int would be opened as a file descriptor (1: stdout, closed afterwards)
            raise ConfigError(f"`{_KEY}.path` must be the path of a CSV file (a string), found {self.path!r}.")
        where = f"`{_KEY}.path` file {str(self.path)!r}"
        if is_device(self.path):  # /dev/zero: read without end
            raise ConfigError(f"{where} is a device, not a CSV file.")
        try:
            with open(self.path, newline="") as fh:
                rows = list(csv.reader(fh))
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where} cannot be read: {exc}.") from exc
        if not rows or [c.strip() for c in rows[0]] != ["client", "duration"]:
            raise ConfigError(f"{where}, line 1: the header must be `client,duration`, found "
                              f"{','.join(rows[0]) if rows else 'an empty file'!r}.")
        clients: list[int] = []
        values: list[float] = []
        first_row: dict[int, int] = {}
        moving: set[int] = set()  # the clients with a duration > 0
        for number, row in enumerate(rows[1:], start=1):
            if not row or all(not c.strip() for c in row):
                continue
            at = f"{where}, row {number} (line {number + 1})"
            if len(row) != 2:
                raise ConfigError(f"{at}: expected 2 columns `client,duration`, found {len(row)}: {row!r}.")
            try:
                client = int(row[0].strip())
            except ValueError:
                client = -1
            if not 0 <= client < 2 ** 63:  # an int64 id (the file lists clients 0..n−1)
                raise ConfigError(f"{at}: `client` must be an integer >= 0 and below 2**63, found {row[0]!r}.")
            try:
                value = float(row[1].strip())
            except ValueError:
                value = float("nan")
            if not (math.isfinite(value) and 0 <= value <= MAX_TIME):
                raise ConfigError(f"{at}: `duration` must be a finite number in [0, {MAX_TIME:g}] ({TIME_NOTE}), "
                                  f"found {row[1]!r}.")
            clients.append(client)
            values.append(value)
            first_row.setdefault(client, number)
            if value > 0:
                moving.add(client)
        if not clients:
            raise ConfigError(f"{where} has no data rows; add one `client,duration` row per step.")
        client_t = torch.tensor(clients, dtype=torch.int64)
        value_t = torch.tensor(values, dtype=torch.float64)
        order = torch.sort(client_t, stable=True).indices
        object.__setattr__(self, "_clients", client_t[order])
        object.__setattr__(self, "_values", value_t[order])
        object.__setattr__(self, "_client_rows", first_row)
        # per distinct id, in order (nothing sized by the largest id): indexed by id once bind() finds 0..n−1
        counts = torch.unique_consecutive(client_t[order], return_counts=True)[1]
        object.__setattr__(self, "_counts", counts)
        object.__setattr__(self, "_offsets", torch.cumsum(counts, 0) - counts)
        zero = [c for c in sorted(first_row) if c not in moving]
        if zero:
            c = zero[0]
            raise ConfigError(f"{where}, row {first_row[c]} (line {first_row[c] + 1}): client {c} has only zero "
                              f"durations (mean 0); every client needs a positive mean step time.")

    def file_data(self) -> dict[str, torch.Tensor]:
        return {"speed_clients": self._clients, "speed_durations": self._values}

    def _bind_means(self, num_clients: int, seed: int) -> torch.Tensor:
        where = f"`{_KEY}.path` file {str(self.path)!r}"
        extra = [c for c in self._client_rows if c >= num_clients]
        if extra:
            c = min(extra, key=lambda k: self._client_rows[k])
            raise ConfigError(f"{where}, row {self._client_rows[c]} (line {self._client_rows[c] + 1}): client {c} is "
                              f"out of range for num_clients={num_clients}; ids must lie in [0, {num_clients}).")
        counts = torch.bincount(self._clients, minlength=num_clients)
        missing = (counts == 0).nonzero().flatten().tolist()
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
            raise ConfigError(f"{where} has no rows for client(s) {shown} ({len(missing)} missing); every client "
                              f"0..{num_clients - 1} needs at least one row.")
        totals = torch.zeros(num_clients, dtype=torch.float64).index_add_(0, self._clients, self._values)
        return totals / counts.to(torch.float64)

    def _draw(self, ids: torch.Tensor, last_round: torch.Tensor, seed: int, steps: int) -> torch.Tensor:
        # bind() checked that the file lists exactly the clients 0..n-1, so _counts has n entries, one per id.
        cpu_ids = ids.cpu()
        lengths = self._counts[cpu_ids][:, None]
        index = self._offsets[cpu_ids][:, None] + torch.arange(steps, dtype=torch.int64)[None, :] % lengths
        return self._values[index].to(ids.device)
