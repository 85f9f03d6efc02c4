"""Aggregation rules ``(n, d) -> (d,)`` and pre-aggregators ``(n, d) -> (m, d)``, buildable by registry name."""
from trustfl.aggregate.base import AbstractAggregator, AbstractPreAggregator, PreAggregated

__all__ = ["AbstractAggregator", "AbstractPreAggregator", "PreAggregated"]
