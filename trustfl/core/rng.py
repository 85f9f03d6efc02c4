"""Explicit randomness: every random draw comes from a generator derived from (seed, round, client, stage).

Library code never calls ``torch.manual_seed``. Seeds are derived by hashing the key tuple with BLAKE2b, so a
stream depends only on its own key: adding a client or a stage never shifts another stream, and a resumed run
draws exactly what an uninterrupted one would.
"""
from __future__ import annotations

import hashlib
import math
import numbers
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from trustfl.errors import ConfigError

SERVER = -1
"""Client id used for draws made by the server (cohort sampling, central noise, attacks)."""

PARALLEL_DRAW_MIN = 1 << 16
"""Numbers drawn in one call of :func:`run_draws` below which it draws on the calling thread alone."""

_pool: tuple[int, int, ThreadPoolExecutor] | None = None  # (pid, workers, pool), made on first use per process


def derive_seed(seed: int, *keys: object) -> int:
    """Return a 63-bit seed for the stream named by ``(seed, *keys)``.

    Args:
      seed: the run seed.
      *keys: any reprs-stable values, e.g. ``(round, client, "noise")``.

    Example:
      >>> derive_seed(0, 1, 2, "noise") == derive_seed(0, 1, 2, "noise")
      True
      >>> derive_seed(0, 1, 2, "noise") != derive_seed(0, 1, 3, "noise")
      True
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):  # 1.5 would be 1, inf an OverflowError
        raise ConfigError(f"`seed` must be an integer, found {seed!r}.")
    text = repr((int(seed),) + tuple(keys)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") & ((1 << 63) - 1)


def make_generator(seed: int, *keys: object, device: torch.device | str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` (default the CPU) seeded from ``derive_seed(seed, *keys)``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(derive_seed(seed, *keys))
    return gen


def numpy_rng(seed: int, *keys: object) -> np.random.Generator:
    """A NumPy PCG64 generator seeded from ``derive_seed(seed, *keys)``."""
    return np.random.default_rng(derive_seed(seed, *keys))


def run_draws(draws: Sequence[Callable[[], object]], numel: int, device: torch.device | str) -> None:
    """Run independent draws, each from its own generator into its own output, on up to ``torch.get_num_threads()``
    threads when they are on the CPU and make at least :data:`PARALLEL_DRAW_MIN` numbers in all (``numel``).

    A CPU generator fills a tensor on one thread, so the draws of a cohort's clients, one generator each, would
    leave the other cores idle. Every generator's stream, and so every result, is the same as drawing one after
    another, which is what happens on other devices (their kernels already run in parallel) or with one thread.
    The draws must not call multi-threaded operations (``torch.randn(..., out=...)`` alone is safe).

    Example:
      >>> gens = [make_generator(0, i) for i in range(2)]
      >>> out = torch.empty(2, 3)
      >>> run_draws([lambda i=i: torch.randn(3, generator=gens[i], out=out[i]) for i in range(2)], 6, "cpu")
      >>> torch.equal(out[1], torch.randn(3, generator=make_generator(0, 1)))
      True
    """
    workers = torch.get_num_threads()
    if min(workers, len(draws)) < 2 or numel < PARALLEL_DRAW_MIN or torch.device(device).type != "cpu":
        for draw in draws:
            draw()
        return
    global _pool
    if _pool is None or _pool[0] != os.getpid() or _pool[1] != workers:  # a forked child cannot use its parent's
        if _pool is not None and _pool[0] == os.getpid():
            _pool[2].shutdown(wait=False)
        _pool = (os.getpid(), workers, ThreadPoolExecutor(workers, thread_name_prefix="trustfl-draw"))
    futures = [_pool[2].submit(draw) for draw in draws]
    errors = [f.exception() for f in futures]  # waits for every draw, so none writes after this returns
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first


def normal_rows(tensors: Sequence[torch.Tensor], generators: Sequence[torch.Generator],
                rows: Sequence[int] | None = None) -> None:
    """Fill row ``i`` of every tensor in ``tensors`` with standard normals from ``generators[i]``, the tensors in
    order (client ``i``'s stream: one ``torch.randn(t.shape[1:], generator=generators[i])`` per tensor), for every
    ``i`` in ``rows`` (default: all); the clients' draws run through :func:`run_draws`.

    Example:
      >>> z = torch.empty(2, 3)
      >>> normal_rows([z], [make_generator(0, 0), make_generator(0, 1)])
      >>> torch.equal(z[1], torch.randn(3, generator=make_generator(0, 1)))
      True
    """
    rows = range(len(generators)) if rows is None else rows

    def draw(i: int) -> None:
        for t in tensors:
            torch.randn(t.shape[1:], generator=generators[i], dtype=t.dtype, device=t.device, out=t[i])

    run_draws([lambda i=i: draw(i) for i in rows], len(rows) * sum(math.prod(t.shape[1:]) for t in tensors),
              tensors[0].device if tensors else "cpu")
