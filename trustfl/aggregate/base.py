"""Aggregator and pre-aggregator bases, the pre-aggregation wrapper and the (weighted) mean.

An aggregator is a stage from a message matrix ``x`` of shape ``(n, d)`` to a vector of shape ``(d,)``; its output
dtype equals its input dtype. ``ctx.weights`` (shape ``(n,)``, may be ``None`` for uniform) are the server's
client weights (e.g. dataset sizes); robust rules that have no weighted form ignore them and say so.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import torch

from trustfl.core.registry import register
from trustfl.core.stage import AbstractStage
from trustfl.errors import ConfigError
from trustfl.types import ParamLayout, RoundContext, StageOut


def _default_context(n: int, weights: torch.Tensor | None, seed: int) -> RoundContext:
    return RoundContext(round=0, seed=seed, client_ids=tuple(range(n)), weights=weights, num_clients=n)


def check_messages(x: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``x`` is a non-empty floating ``(n, d)`` matrix."""
    if x.ndim != 2 or x.shape[0] == 0 or not x.is_floating_point():
        raise ValueError(f"aggregators take a non-empty floating (n, d) tensor, found shape {tuple(x.shape)} "
                         f"and dtype {x.dtype}.")


class AbstractAggregator(AbstractStage):
    """``(n, d) -> (d,)``. Call ``agg(x)`` for a one-off stateless use, or ``init``/``apply`` in a pipeline."""

    def __call__(self, x: torch.Tensor, weights: torch.Tensor | None = None, *, seed: int = 0) -> torch.Tensor:
        check_messages(x)
        state = self.init(ParamLayout(("x",), ((x.shape[1],),)))
        return self.apply(x, state, _default_context(x.shape[0], weights, seed)).x


class AbstractPreAggregator(AbstractStage):
    """``(n, d) -> (m, d)``: transforms the messages before a rule (NNM, bucketing, clipping)."""

    def __call__(self, x: torch.Tensor, *, seed: int = 0) -> torch.Tensor:
        check_messages(x)
        state = self.init(ParamLayout(("x",), ((x.shape[1],),)))
        return self.apply(x, state, _default_context(x.shape[0], None, seed)).x


@dataclass(frozen=True)
class PreAggregated(AbstractAggregator):
    """Apply ``pre`` (one or several pre-aggregators, in order), then ``inner``."""

    pre: tuple[AbstractPreAggregator, ...]
    inner: AbstractAggregator

    def init(self, layout: ParamLayout) -> dict[str, Any]:
        return {"pre": [p.init(layout) for p in self.pre], "inner": self.inner.init(layout)}

    def apply(self, x: torch.Tensor, state: dict[str, Any], ctx: RoundContext) -> StageOut:
        metrics: dict[str, float] = {}
        pre_states = []
        for stage, st in zip(self.pre, state["pre"]):
            out = stage.apply(x, st, ctx)
            if out.x.shape[0] != x.shape[0]:  # rows no longer belong to clients: weights become uniform
                ctx = ctx.with_rows(tuple(range(out.x.shape[0])), None)
            x = out.x
            pre_states.append(out.state)
            metrics.update(out.metrics)
        out = self.inner.apply(x, state["inner"], ctx)
        metrics.update(out.metrics)
        return StageOut(out.x, {"pre": pre_states, "inner": out.state}, metrics)


def normalized_weights(ctx: RoundContext, n: int, like: torch.Tensor) -> torch.Tensor:
    """``ctx.weights / sum`` in ``like``'s dtype (uniform when no weights are given)."""
    if ctx.weights is None:
        return torch.full((n,), 1.0 / n, dtype=like.dtype)
    w = ctx.weights.to(like.dtype)
    if w.shape != (n,) or bool((w < 0).any()) or float(w.sum()) <= 0:
        raise ValueError(f"weights must be a non-negative ({n},) vector with a positive sum, found {w.tolist()}.")
    return w / w.sum()


@register("aggregator", "mean")
@dataclass(frozen=True)
class Mean(AbstractAggregator):
    """Weighted mean ``Σ_i w_i x_i / Σ_i w_i`` (uniform without weights). Cost O(nd)."""

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        w = normalized_weights(ctx, x.shape[0], x)
        return StageOut(w @ x, state)


def require_f(f: int, name: str = "f") -> None:
    """Validate a Byzantine bound at construction."""
    if not isinstance(f, int) or isinstance(f, bool) or f < 0:
        raise ConfigError(f"`{name}` must be an integer >= 0, found {f!r}.")
