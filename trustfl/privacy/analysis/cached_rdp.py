"""dp_accounting's RDP accountant, with the RDP vector of each distinct event computed once per process.

A federated run composes the same per-round event (same q, same z, same steps) for every client, every round, and
dp_accounting recomputes the RDP of the subsampled Gaussian each time (tens of milliseconds at trustfl's 70
integer orders). RDP composes additively: an RDP accountant is the running sum, order by order, of one vector per
composed event. :class:`CachedRdpAccountant` keeps that sum itself and takes each event's vector from a cache
keyed by the event (dp_accounting's events are frozen, hashable attrs classes). A Gaussian leaf, Poisson-sampled
or sampled without replacement, gets its vector from :func:`~trustfl.privacy.analysis.sampled_rdp.leaf_rdp`
(dp_accounting's bounds vectorized, the same bits); any other leaf through dp_accounting's public API: a fresh
``RdpAccountant`` composes the event alone and its ``rdp`` is the vector. ε and δ come from
dp_accounting's ``compute_epsilon`` / ``compute_delta``, as in ``RdpAccountant.get_epsilon`` / ``get_delta``.
Nothing in dp_accounting is modified.

Bitwise equal to ``RdpAccountant``: that accountant adds ``count · rdp(event)`` to its running vector once per
leaf event (``SelfComposedDpEvent`` multiplies the count down, ``ComposedDpEvent`` composes its events in
order). The cached vector of a leaf is a fresh accountant's ``0 + count · rdp(event)``, the same floats, and
:meth:`CachedRdpAccountant._maybe_compose` adds them to the running vector in the same order. One departure: an
order whose RDP dp_accounting returns as NaN (its series did not converge) counts as +inf, no bound, where
``RdpAccountant`` would report ε = 0 for the whole vector.

Example:
  >>> from dp_accounting import dp_event
  >>> from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant
  >>> from trustfl.privacy.analysis.cached_rdp import CachedRdpAccountant
  >>> event = dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.1)), 10)
  >>> orders = list(range(2, 65))
  >>> fast = CachedRdpAccountant(orders).compose(event, 3).get_epsilon(1e-5)
  >>> bool(fast == RdpAccountant(orders).compose(event, 3).get_epsilon(1e-5))
  True
"""
from __future__ import annotations

import copy
import functools
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

import numpy as np

from trustfl.errors import PrivacyError

if TYPE_CHECKING:
    from dp_accounting import dp_event
    from dp_accounting.privacy_accountant import NeighboringRelation, PrivacyAccountant

__all__ = ["CachedRdpAccountant", "clear_caches"]

_CACHE_SIZE = 4096
"""Distinct (event, count, orders, relation) vectors and (RDP vector, δ) epsilons kept per process."""

_OrdersKey = tuple[tuple, str]


def _leaves(event: dp_event.DpEvent, count: int) -> Iterator[tuple[dp_event.DpEvent, int]]:
    """The (event, count) pairs an RDP accountant adds one vector for, in its order (DpEvent semantics)."""
    from dp_accounting import dp_event

    if isinstance(event, dp_event.SelfComposedDpEvent):
        yield from _leaves(event.event, event.count * count)
    elif isinstance(event, dp_event.ComposedDpEvent):
        for sub in event.events:
            yield from _leaves(sub, count)
    else:
        yield event, count


def _fresh_vector(event: dp_event.DpEvent, count: int, orders: _OrdersKey,
                  relation: NeighboringRelation) -> np.ndarray:
    from dp_accounting.rdp import rdp_privacy_accountant

    from trustfl.privacy.analysis.sampled_rdp import leaf_rdp

    acc = rdp_privacy_accountant.RdpAccountant(orders=list(orders[0]), neighboring_relation=relation)
    try:
        vector = leaf_rdp(event, count, acc.orders, relation)
        if vector is None:
            vector = acc.compose(event, count).rdp  # a copy, owned here
    except ArithmeticError as err:  # e.g. σ² underflows to 0 (z below about 1e-154) or overflows (z above 1e154)
        raise PrivacyError(f"the RDP accountant cannot analyse {event} ({type(err).__name__}: {err}); its noise "
                           f"multiplier is outside what it computes (about 1e-150 to 1e150).") from None
    if np.isnan(vector).any():
        # An order whose RDP dp_accounting could not compute is NaN (its series did not converge, e.g. for a noise
        # multiplier below about 1e-152); its compute_epsilon then returns ε = 0 for the whole vector. Such an
        # order gives no bound: +inf, which its conversion skips.
        vector = np.where(np.isnan(vector), np.inf, vector)
    vector.flags.writeable = False  # shared by every accountant that composes this event
    return vector


_cached_vector = functools.lru_cache(maxsize=_CACHE_SIZE)(_fresh_vector)


@functools.lru_cache(maxsize=_CACHE_SIZE)
def _cached_epsilon(rdp: bytes, orders: _OrdersKey, delta: float) -> tuple[float, float]:
    from dp_accounting.rdp import rdp_privacy_accountant

    eps, order = rdp_privacy_accountant.compute_epsilon(np.array(orders[0]), np.frombuffer(rdp), delta)
    return eps, order


def clear_caches() -> None:
    """Forget every cached RDP vector and ε (tests; results never depend on the caches)."""
    _cached_vector.cache_clear()
    _cached_epsilon.cache_clear()


def __getattr__(name: str) -> Any:
    # The class subclasses dp_accounting's PrivacyAccountant: it is defined on first use, so that importing this
    # module (which the registry does for every run) does not import dp_accounting (and scipy).
    if name == "CachedRdpAccountant":
        return _define_accountant()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _define_accountant() -> type:
    from dp_accounting.privacy_accountant import NeighboringRelation, PrivacyAccountant
    from dp_accounting.rdp import rdp_privacy_accountant

    class CachedRdpAccountant(PrivacyAccountant):
        """An RDP accountant equal, bit for bit, to dp_accounting's ``RdpAccountant`` on the same events.

        Args:
          orders: RDP orders (as for ``RdpAccountant``; ints and floats give the same arrays as there).
          neighboring_relation: dp_accounting's neighbouring relation.
        """

        def __init__(self, orders: Sequence[float],
                     neighboring_relation: NeighboringRelation = NeighboringRelation.ADD_OR_REMOVE_ONE) -> None:
            super().__init__(neighboring_relation)
            # Never composed into: it checks which events are supported, with dp_accounting's own error details.
            self._reference = rdp_privacy_accountant.RdpAccountant(orders=list(orders),
                                                                   neighboring_relation=neighboring_relation)
            self._orders = self._reference.orders
            self._orders_key: _OrdersKey = (tuple(orders), self._orders.dtype.str)
            self._rdp = np.zeros_like(self._orders, dtype=np.float64)

        def _vector(self, event: dp_event.DpEvent, count: int) -> np.ndarray:
            try:
                hash(event)
            except TypeError:  # an event holding a list (e.g. tree aggregation's step counts): not cached
                return _fresh_vector(event, count, self._orders_key, self.neighboring_relation)
            return _cached_vector(event, count, self._orders_key, self.neighboring_relation)

        def _maybe_compose(self, event: dp_event.DpEvent, count: int,
                           do_compose: bool) -> Optional[PrivacyAccountant.CompositionErrorDetails]:
            if not do_compose:
                return self._reference._maybe_compose(event, count, False)  # a check: changes nothing
            for leaf, n in _leaves(event, count):
                self._rdp += self._vector(leaf, n)
            return None

        def get_epsilon_and_optimal_order(self, target_delta: float) -> tuple[float, float]:
            return _cached_epsilon(self._rdp.tobytes(), self._orders_key, float(target_delta))

        def get_epsilon(self, target_delta: float) -> float:
            return self.get_epsilon_and_optimal_order(target_delta)[0]

        def get_delta_and_optimal_order(self, target_epsilon: float) -> tuple[float, float]:
            return rdp_privacy_accountant.compute_delta(self._orders, self._rdp, target_epsilon)

        def get_delta(self, target_epsilon: float) -> float:
            return self.get_delta_and_optimal_order(target_epsilon)[0]

        @property
        def rdp(self) -> np.ndarray:
            """The RDP at each order so far (a copy)."""
            return np.copy(self._rdp)

        @property
        def orders(self) -> np.ndarray:
            """The RDP orders (a copy)."""
            return np.copy(self._orders)

        def __deepcopy__(self, memo: dict) -> "CachedRdpAccountant":
            # The reference accountant and the orders are never changed: shared. The running vector and
            # dp_accounting's event ledger are the state: copied.
            new = copy.copy(self)
            memo[id(self)] = new
            new._rdp = self._rdp.copy()
            new._ledger = copy.deepcopy(self._ledger, memo)
            return new

    CachedRdpAccountant.__qualname__ = "CachedRdpAccountant"  # picklable as trustfl...cached_rdp.CachedRdpAccountant
    globals()["CachedRdpAccountant"] = CachedRdpAccountant
    return CachedRdpAccountant
