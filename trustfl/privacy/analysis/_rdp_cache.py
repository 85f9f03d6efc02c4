"""Memoise dp_accounting's per-step RDP curves.

A federated run composes the same per-round event (same q, same z) for every client, every round; dp_accounting
recomputes the RDP curve of the subsampled Gaussian each time (O(Σ orders) log-combinations). The curve depends
only on (q, z, orders), so it is computed once and reused. The arithmetic is dp_accounting's own.
"""
from __future__ import annotations

import functools

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as _rdp

_TARGETS = ("_compute_rdp_poisson_subsampled_gaussian", "_compute_rdp_sample_wor_gaussian")


def _memoise(fn):
    @functools.lru_cache(maxsize=4096)
    def cached(q: float, z: float, orders: tuple) -> object:
        value = fn(q, z, list(orders))
        return value.copy() if isinstance(value, np.ndarray) else value

    @functools.wraps(fn)
    def wrapper(q, noise_multiplier, orders):
        try:
            value = cached(float(q), float(noise_multiplier), tuple(float(o) for o in np.atleast_1d(orders)))
        except TypeError:  # unhashable or unusual arguments: no caching
            return fn(q, noise_multiplier, orders)
        return value.copy() if isinstance(value, np.ndarray) else value

    wrapper.__trustfl_cached__ = True
    return wrapper


def install() -> None:
    for name in _TARGETS:
        fn = getattr(_rdp, name, None)
        if fn is not None and not getattr(fn, "__trustfl_cached__", False):
            setattr(_rdp, name, _memoise(fn))


install()
