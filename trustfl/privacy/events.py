"""Thin builders for dp_accounting ``DpEvent`` descriptions, and their JSON form.

Mechanisms *describe* what they did with these events; accountants (:mod:`trustfl.privacy.accountant`)
compute what it cost. An event is immutable and carries no state.

Example:
  >>> ev = self_composed(poisson_sampled(gaussian_event(1.1), 0.01), 100)
  >>> describe(ev)["type"], describe(ev)["count"]
  ('SelfComposedDpEvent', 100)
  >>> event_from_dict(describe(ev)) == ev
  True
"""
from __future__ import annotations

import numbers
import types
from typing import TYPE_CHECKING, Any, Mapping

from trustfl.core.checks import check_number
from trustfl.errors import PrivacyError

if TYPE_CHECKING:
    from dp_accounting import dp_event
    from dp_accounting.dp_event import DpEvent

__all__ = ["DpEvent", "composed", "describe", "event_from_dict", "gaussian_event", "poisson_sampled",
           "self_composed", "without_replacement_sampled"]


def _dp_event() -> types.ModuleType:
    """``dp_accounting.dp_event``, imported on first use (dp_accounting imports scipy: seconds), not with trustfl."""
    from dp_accounting import dp_event

    return dp_event


def __getattr__(name: str) -> Any:
    if name == "DpEvent":  # the public alias ``trustfl.privacy.events.DpEvent``, resolved on first access
        return _dp_event().DpEvent
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check_event(event: object, name: str = "event") -> DpEvent:
    if not isinstance(event, _dp_event().DpEvent):
        raise PrivacyError(f"`{name}` must be a dp_accounting DpEvent, found {type(event).__name__}.")
    return event


def gaussian_event(noise_multiplier: float) -> dp_event.GaussianDpEvent:
    """The Gaussian mechanism with noise std ``noise_multiplier · sensitivity``.

    Args:
      noise_multiplier: z = σ / Δ₂ >= 0; z = 0 means no noise (the event is non-private).
    """
    check_number("noise_multiplier", noise_multiplier, low=0, finite=True, error=PrivacyError)
    return _dp_event().GaussianDpEvent(float(noise_multiplier))


def poisson_sampled(event: DpEvent, q: float) -> DpEvent:
    """``event`` applied to a Poisson sample: every record is included independently with probability ``q``.

    Args:
      event: the mechanism applied to the sample (usually a :func:`gaussian_event`).
      q: the sampling probability in [0, 1]. q = 1 is no subsampling, so ``event`` is returned unchanged.
    """
    _check_event(event)
    rate = float(check_number("q", q, low=0, high=1, note="the sampling probability", error=PrivacyError))
    if rate == 1.0:
        return event
    return _dp_event().PoissonSampledDpEvent(rate, event)


def without_replacement_sampled(event: DpEvent, n: int, b: int) -> DpEvent:
    """``event`` applied to ``b`` records drawn uniformly without replacement from ``n``.

    Warning:
      dp_accounting analyses this event only under the replace-one neighbouring relation (RDP accountant,
      Wang, Balle & Kasiviswanathan 2019, https://arxiv.org/abs/1808.00087); build the ledger with
      ``neighboring="replace_one"``. The PLD accountant does not support it.
    """
    _check_event(event)
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in (n, b)) or not 0 < b <= n:
        raise PrivacyError(f"`n` and `b` must be integers with 0 < b <= n, found n={n!r}, b={b!r}.")
    return _dp_event().SampledWithoutReplacementDpEvent(int(n), int(b), event)


def self_composed(event: DpEvent, count: int) -> DpEvent:
    """``count`` adaptive repetitions of ``event`` (count >= 0)."""
    _check_event(event)
    check_number("count", count, integer=True, low=0, error=PrivacyError)
    return _dp_event().SelfComposedDpEvent(event, int(count))


def composed(events: list[DpEvent]) -> DpEvent:
    """The adaptive composition of several events, in order."""
    if not isinstance(events, (list, tuple)):
        raise PrivacyError(f"`events` must be a list of dp_accounting DpEvents, found {type(events).__name__}.")
    for i, ev in enumerate(events):
        _check_event(ev, f"events[{i}]")
    return _dp_event().ComposedDpEvent(list(events))


def _encode(value: Any) -> Any:
    if isinstance(value, _dp_event().DpEvent):
        return describe(value)
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return value


def describe(event: DpEvent) -> dict[str, Any]:
    """A JSON-serialisable description of ``event``: ``{"type": class name, field: value, ...}``.

    Nested events are described recursively; :func:`event_from_dict` inverts it exactly.
    """
    import attr  # dp_accounting's events are attrs classes (imported with them; not with trustfl)

    _check_event(event)
    out: dict[str, Any] = {"type": type(event).__name__}
    for field in attr.fields(type(event)):
        out[field.name] = _encode(getattr(event, field.name))
    return out


def _decode(value: Any) -> Any:
    if isinstance(value, Mapping) and "type" in value:
        return event_from_dict(value)
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def event_from_dict(data: Mapping[str, Any]) -> DpEvent:
    """Rebuild the event that :func:`describe` described (used to restore ledgers from checkpoints)."""
    import attr

    name = data.get("type") if isinstance(data, Mapping) else None
    dp_event = _dp_event()
    cls = getattr(dp_event, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, dp_event.DpEvent)):
        raise PrivacyError(f"Unknown DP event description {data!r}: `type` must name a dp_accounting DpEvent.")
    fields = {f.name: _decode(data[f.name]) for f in attr.fields(cls) if f.name in data}
    try:
        event = cls(**fields)
    except TypeError as exc:
        raise PrivacyError(f"Cannot rebuild {name} from {dict(data)!r}: {exc}.") from exc
    check = _BUILDERS.get(str(name))
    if check is not None:  # the builder's checks: a description's values are not trusted more than a caller's
        try:
            check(event)
        except PrivacyError as exc:
            raise PrivacyError(f"Cannot rebuild {name} from {dict(data)!r}: {exc}") from None
    return event


_BUILDERS = {
    "GaussianDpEvent": lambda e: gaussian_event(e.noise_multiplier),
    "PoissonSampledDpEvent": lambda e: poisson_sampled(e.event, e.sampling_probability),
    "SampledWithoutReplacementDpEvent": lambda e: without_replacement_sampled(e.event, e.source_dataset_size,
                                                                              e.sample_size),
    "SelfComposedDpEvent": lambda e: self_composed(e.event, e.count),
    "ComposedDpEvent": lambda e: composed(e.events),
}
"""What :func:`event_from_dict` checks a rebuilt event of each type with: the builder of that type."""
