"""Client batch samplers: shuffling, fixed-size sampling without replacement, Poisson sampling.

A sampler turns a client's data size ``n`` and batch size ``b`` into a list of index batches (int64 tensors into
``0..n−1``, the client's own index list). Which sampler ran matters to privacy accounting, so each declares
``accounting``:

=========  ===============================================================  ========================
name       one step draws                                                   ``accounting``
=========  ===============================================================  ========================
shuffle    the next ⌈n/b⌉-th slice of a fresh permutation per epoch         ``"shuffle"``
fixed      b distinct indices, uniformly among all size-b subsets           ``"without_replacement"``
poisson    each index independently with probability q = b/n (size varies)  ``"poisson"``
=========  ===============================================================  ========================

An epoch is ⌈n/b⌉ steps for every sampler. Randomness comes only from the ``torch.Generator`` passed in.

Example:
  >>> import torch
  >>> batches = PoissonSampler().steps(100, 10, torch.Generator().manual_seed(0), num_steps=3)
  >>> len(batches), batches[0].dtype
  (3, torch.int64)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from trustfl.core.checks import describe_value
from trustfl.core.registry import component_name, register
from trustfl.errors import ConfigError


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"`{name}` must be an int >= 1, found {value!r}.")
    return int(value)


class AbstractBatchSampler:
    """Base of the batch samplers.

    Attributes:
      accounting: how batches are drawn, for the privacy accountant: ``"poisson"``, ``"without_replacement"`` or
        ``"shuffle"``.
    """

    accounting: ClassVar[str]
    max_batch_is_n: ClassVar[bool] = False
    """Whether ``batch_size > num_samples`` is allowed (then a batch is the whole data set)."""

    def steps(self, num_samples: int, batch_size: int, generator: torch.Generator, *, epochs: int | None = None,
              num_steps: int | None = None) -> list[torch.Tensor]:
        """The index batches of ``epochs`` epochs (⌈n/b⌉ steps each) or of exactly ``num_steps`` steps.

        Args:
          num_samples: n, the client's number of examples (>= 1).
          batch_size: b (>= 1; <= n unless the sampler is ``shuffle``).
          generator: the only source of randomness.
          epochs: number of epochs; give exactly one of ``epochs`` and ``num_steps``.
          num_steps: number of steps.

        Returns:
          A list of int64 tensors of indices in ``[0, n)``.

        Raises:
          ConfigError: an invalid size or count, or not exactly one of ``epochs`` / ``num_steps``.
        """
        n, b, total = self._count(num_samples, batch_size, epochs, num_steps)
        batches = self._draw(n, b, total, generator)
        self._check_drawn(batches, n, total, pad=False)
        return batches

    def step_matrix(self, num_samples: int, batch_size: int, generator: torch.Generator, *,
                    epochs: int | None = None, num_steps: int | None = None) -> torch.Tensor:
        """The batches of :meth:`steps` (the same draws from ``generator``) as one int64 matrix ``(steps, width)``:
        row ``s`` holds step ``s``'s indices followed by −1 pads; ``width`` is the largest batch (at least 1).

        A cohort's schedules are stacked from these without one tensor per batch (the simulator's hot path)."""
        n, b, total = self._count(num_samples, batch_size, epochs, num_steps)
        matrix = self._draw_matrix(n, b, total, generator)
        self._check_drawn(matrix, n, total, pad=True)
        return matrix

    def _check_drawn(self, drawn: object, n: int, total: int, pad: bool) -> None:
        """Refuse (ConfigError naming the sampler) draws that are not ``total`` steps of int64 indices into the
        client's ``n`` examples: one ``(steps, width)`` matrix with −1 pads (``pad``), or a list of one 1-D batch per
        step. A sampler of your own would otherwise read past the client's data, crash inside a round, or take
        other steps than the accountant charges."""
        low, ndim = (-1, 2) if pad else (0, 1)
        is_tensor = isinstance(drawn, torch.Tensor)
        parts = [drawn] if pad or not isinstance(drawn, list) else drawn
        steps = (drawn.shape[0] if is_tensor and drawn.ndim else -1) if pad else \
            (len(drawn) if isinstance(drawn, list) else -1)

        def fits(p: object) -> bool:
            return isinstance(p, torch.Tensor) and p.dtype == torch.int64 and p.ndim == ndim and (
                p.numel() == 0 or (int(p.min()) >= low and int(p.max()) < n))

        bad = next((p for p in parts if not fits(p)), None)
        if steps != total or bad is not None:
            shown = bad if bad is not None else (parts[0] if parts else None)
            what = describe_value(shown) + (f" with values in [{int(shown.min())}, {int(shown.max())}]"
                                            if isinstance(shown, torch.Tensor) and shown.numel() else "")
            raise ConfigError(f"`client.batch_sampler`: {component_name('batch_sampler', self)} drew {what} over "
                              f"{steps} step(s); it must draw {total} step(s) of int64 indices in [{low}, {n}) for a "
                              f"client of {n} examples.")

    def _count(self, num_samples: int, batch_size: int, epochs: int | None,
               num_steps: int | None) -> tuple[int, int, int]:
        """``(n, b, total steps)`` after checking the arguments of :meth:`steps`."""
        n, b = self._check(num_samples, batch_size)
        if (epochs is None) == (num_steps is None):
            raise ConfigError(f"Give exactly one of `epochs` and `num_steps`, found epochs={epochs!r}, "
                              f"num_steps={num_steps!r}.")
        per_epoch = math.ceil(n / b)
        total = per_epoch * _positive_int("epochs", epochs) if epochs is not None \
            else _positive_int("num_steps", num_steps)
        return n, b, total

    def sample_rate(self, num_samples: int, batch_size: int) -> float:
        """The sampling rate q = b/n (capped at 1 where b > n is allowed)."""
        n, b = self._check(num_samples, batch_size)
        return min(b, n) / n

    def _check(self, num_samples: int, batch_size: int) -> tuple[int, int]:
        n = _positive_int("num_samples", num_samples)
        b = _positive_int("batch_size", batch_size)
        if b > n and not self.max_batch_is_n:
            raise ConfigError(f"`batch_size` must be <= num_samples={n} for the {self.accounting!r} sampler, "
                              f"found {b}; lower it for small clients or use the shuffle sampler.")
        return n, b

    def _draw(self, n: int, b: int, total: int, generator: torch.Generator) -> list[torch.Tensor]:
        raise NotImplementedError

    def _draw_matrix(self, n: int, b: int, total: int, generator: torch.Generator) -> torch.Tensor:
        return padded_rows(self._draw(n, b, total, generator))


@register("batch_sampler", "shuffle")
@dataclass(frozen=True)
class ShuffleSampler(AbstractBatchSampler):
    """Epochs of a fresh random permutation cut into batches of b; the last batch of an epoch may be smaller.

    Every index appears exactly once per epoch. With ``num_steps`` the epochs continue back to back and the last
    one may be cut short. ``b > n`` gives one batch of all n per epoch.
    """

    accounting: ClassVar[str] = "shuffle"
    max_batch_is_n: ClassVar[bool] = True

    def _draw(self, n: int, b: int, total: int, generator: torch.Generator) -> list[torch.Tensor]:
        batches: list[torch.Tensor] = []
        while len(batches) < total:
            batches.extend(torch.randperm(n, generator=generator).split(b))
        return batches[:total]

    def _draw_matrix(self, n: int, b: int, total: int, generator: torch.Generator) -> torch.Tensor:
        width, per_epoch = min(b, n), math.ceil(n / b)
        epochs = math.ceil(total / per_epoch)
        if n % width == 0:  # no batch is short: the permutations themselves, cut into rows
            perms = [torch.randperm(n, generator=generator) for _ in range(epochs)]
            return (perms[0] if epochs == 1 else torch.cat(perms)).view(-1, width)[:total]
        out = torch.full((epochs, per_epoch * width), -1, dtype=torch.long)
        for e in range(epochs):  # the permutations of _draw, in order; an epoch's last batch padded
            out[e, :n] = torch.randperm(n, generator=generator)
        return out.view(epochs * per_epoch, width)[:total]


@register("batch_sampler", "fixed")
@dataclass(frozen=True)
class FixedSizeSampler(AbstractBatchSampler):
    """Each step draws b distinct indices uniformly at random (sampling without replacement within a step,
    independently across steps), the scheme of CafCor's Algorithm 1 and of "sampled without replacement" DP events.
    """

    accounting: ClassVar[str] = "without_replacement"

    def _draw(self, n: int, b: int, total: int, generator: torch.Generator) -> list[torch.Tensor]:
        return [_distinct_uniform(n, b, generator) for _ in range(total)]


@register("batch_sampler", "poisson")
@dataclass(frozen=True)
class PoissonSampler(AbstractBatchSampler):
    """Each step includes every index independently with probability q = b/n, so the batch size is
    Binomial(n, q) with mean b and may be 0 (empty batches are returned as empty tensors, never skipped, since
    DP-SGD's privacy analysis counts them).

    References:
      Abadi et al., "Deep learning with differential privacy", CCS 2016, https://arxiv.org/abs/1607.00133;
      Mironov, Talwar, Zhang, "Rényi differential privacy of the sampled Gaussian mechanism", 2019,
      https://arxiv.org/abs/1908.10530
    """

    accounting: ClassVar[str] = "poisson"

    def _draw(self, n: int, b: int, total: int, generator: torch.Generator) -> list[torch.Tensor]:
        return [_bernoulli_indices(n, b / n, generator) for _ in range(total)]


def padded_rows(batches: list[torch.Tensor]) -> torch.Tensor:
    """``batches`` (1-D int64) as the rows of one matrix, each followed by −1 pads (at least one column)."""
    width = max((int(x.numel()) for x in batches), default=0)
    if width == 0:
        return torch.full((len(batches), 1), -1, dtype=torch.long)
    return torch.nn.utils.rnn.pad_sequence(batches, batch_first=True, padding_value=-1)


def _distinct_uniform(n: int, b: int, generator: torch.Generator) -> torch.Tensor:
    """b distinct indices, a uniformly random ordered b-subset of [0, n), in O(b) work when b << n.

    The first b distinct values of an i.i.d. uniform sequence are, by symmetry, a uniform sample without
    replacement, so drawing ~1.5·b integers and keeping first occurrences has the law of ``randperm(n)[:b]``
    without its O(n) cost (a client with 60,000 examples and b = 64 draws ~100 integers, not 60,000).
    """
    if 4 * b >= n:
        return torch.randperm(n, generator=generator)[:b]
    draws = torch.randint(n, (b + b // 2 + 8,), generator=generator)
    while True:
        values, order = torch.sort(draws, stable=True)
        first = torch.ones_like(values, dtype=torch.bool)
        first[1:] = values[1:] != values[:-1]
        keep = draws[order[first].sort().values]  # distinct values in the order they were drawn
        if keep.numel() >= b:
            return keep[:b]
        draws = torch.cat([draws, torch.randint(n, (b,), generator=generator)])


def _bernoulli_indices(n: int, q: float, generator: torch.Generator) -> torch.Tensor:
    """Indices of n independent Bernoulli(q) trials that came up 1, in O(n·q) work.

    The gaps between successive included indices are i.i.d. Geometric(q) on {1, 2, ...}; a gap is drawn by
    inversion as ``1 + floor(log(1 − U) / log(1 − q))`` with U ~ U[0, 1) (P(gap = k) = (1 − q)^(k−1)·q), so the
    set has exactly the law of ``nonzero(rand(n) < q)`` without drawing n uniforms per step.
    """
    if q >= 1.0:
        return torch.arange(n)
    log_keep = math.log1p(-q)
    chunk = int(n * q + 4 * math.sqrt(n * q) + 16)
    pieces: list[torch.Tensor] = []
    last = -1.0
    while last < n:
        u = torch.rand(chunk, generator=generator, dtype=torch.float64)
        positions = last + torch.cumsum(torch.floor(torch.log1p(-u) / log_keep) + 1, dim=0)
        pieces.append(positions)
        last = float(positions[-1])
    positions = torch.cat(pieces)
    return positions[positions < n].to(torch.int64)
