"""Aggregator and pre-aggregator bases, the pre-aggregation wrapper, the (weighted) mean and the overflow-safe helpers.

An aggregator is a stage from a message matrix ``x`` of shape ``(n, d)`` to a vector of shape ``(d,)``; its output
dtype equals its input dtype. ``ctx.weights`` (shape ``(n,)``, may be ``None`` for uniform) are the server's
client weights (e.g. dataset sizes); robust rules that have no weighted form ignore them and say so.

Numerical range: any finite message, up to the largest value of its dtype, is kept or excluded by a rule's own
logic and never overflows inside it. Squared norms, distances and Gram matrices are formed in float64 where float32
would overflow, and means and weighted means fall back to float64 (float64 messages: to a power-of-two rescaling,
which is exact) when the plain sum overflows. A convex combination of finite rows is always representable; a
result that is not (e.g. an attack's ``−2·mean``) saturates at ``±finfo(dtype).max``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import torch

from trustfl.core.checks import check_number, describe_value
from trustfl.core.finite import all_finite, finite_rows
from trustfl.core.registry import component_name, register
from trustfl.core.stage import AbstractStage
from trustfl.errors import MessageError
from trustfl.types import ParamLayout, RoundContext, StageOut

_MAX_LISTED_ROWS = 10


def _default_context(n: int, weights: torch.Tensor | None, seed: int,
                     reports: Mapping[str, torch.Tensor] | None = None) -> RoundContext:
    return RoundContext(round=0, seed=seed, client_ids=tuple(range(n)), weights=weights, num_clients=n,
                        reports=dict(reports or {}))


def list_rows(rows: torch.Tensor) -> str:
    """``[3, 7]``, or the first few indices and the count when there are many."""
    idx = rows.tolist()
    if len(idx) <= _MAX_LISTED_ROWS:
        return str(idx)
    return f"[{', '.join(map(str, idx[:_MAX_LISTED_ROWS]))}, ...] ({len(idx)} rows)"


def check_messages(x: Any, stage: object | None = None, kind: str = "aggregator") -> None:
    """The input check of every directly called aggregator and pre-aggregator.

    Args:
      x: the messages; must be a floating ``(n, d)`` tensor with ``n, d >= 1`` and finite entries.
      stage, kind: the component, named in the error (``aggregator 'krum'``).

    Raises:
      MessageError: naming the component and, for non-finite entries, the rows that hold them.
    """

    def who() -> str:
        return kind if stage is None else component_name(kind, stage)

    if not isinstance(x, torch.Tensor):
        raise MessageError(f"{who()}: messages must be a torch.Tensor of shape (n, d), found {type(x).__name__}.")
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise MessageError(f"{who()}: messages must be a 2-D (n, d) tensor with n >= 1 rows and d >= 1 columns, "
                           f"found shape {tuple(x.shape)}.")
    if not x.is_floating_point():
        raise MessageError(f"{who()}: messages must have a floating dtype (float16, bfloat16, float32, float64), "
                           f"found {x.dtype}; convert them with `x.float()`.")
    bad = ~finite_rows(x)
    if bool(bad.any()):
        raise MessageError(f"{who()}: rows {list_rows(torch.nonzero(bad).flatten())} are not finite (NaN or ±inf); "
                           "the engine screens such messages before aggregation, so drop them before a direct call.")


def check_weights(weights: Any, n: int, stage: object | None = None, kind: str = "aggregator") -> None:
    """Raise :class:`MessageError` unless ``weights`` is a finite, non-negative ``(n,)`` vector with a positive sum."""
    who = kind if stage is None else component_name(kind, stage)
    try:
        w = torch.as_tensor(weights)
    except (TypeError, ValueError, RuntimeError, OverflowError):  # a string, a ragged list, None: no vector at all
        raise MessageError(f"{who}: `weights` must be a finite, non-negative ({n},) vector with a positive sum, "
                           f"found {describe_value(weights)}.") from None
    if (w.shape != (n,) or w.is_complex() or w.dtype == torch.bool or not bool(torch.isfinite(w).all())
            or bool((w < 0).any()) or not float(w.sum()) > 0):
        raise MessageError(f"{who}: `weights` must be a finite, non-negative ({n},) vector with a positive sum, "
                           f"found shape {tuple(w.shape)}: {w.tolist()}.")


class AbstractAggregator(AbstractStage):
    """``(n, d) -> (d,)``. Call ``agg(x)`` for a one-off stateless use, or ``init``/``apply`` in a pipeline.

    ``agg(x, weights, seed=, reports=)`` checks its input first (:func:`check_messages`): ``x`` must be a floating
    ``(n, d)`` tensor with ``n, d >= 1`` whose entries are all finite, and ``weights`` (if given) a finite,
    non-negative ``(n,)`` vector with a positive sum. ``reports`` are the per-row values some rules read
    (``ctx.reports``, e.g. ``reported_epsilon``). ``apply`` does not repeat the check: the engine screens
    non-finite and misshapen messages before aggregation (its ``rejected`` metric), so a rule only ever sees usable
    rows. Finite rows of any size never overflow inside a rule (see the module docstring).

    Raises:
      MessageError: from ``agg(x, ...)``, naming the aggregator and the bad rows, e.g. "aggregator 'krum': rows
        [3, 7] are not finite (NaN or ±inf); ...".
    """

    pairwise: ClassVar[bool] = False
    """Whether the rule forms the ``n × n`` Gram matrix of its rows (:func:`~trustfl.aggregate.geometric.gram_matrix`;
    its memory grows as ``n²``, checked against the machine when a run is built)."""
    reports: ClassVar[tuple[str, ...]] = ()
    """The per-row reports (``ctx.reports`` keys) the rule reads; a run refuses, before training, a rule whose
    reports nobody gives (``reported_epsilon``: only algorithm ``robust_hdp`` reports it)."""

    def min_messages(self) -> int:
        """The fewest messages the rule accepts (its requirement, e.g. ``n > 2f``): 1 by default."""
        return 1

    def too_few(self, n: int) -> str | None:
        """Why ``n`` messages can never be aggregated by this rule, or ``None`` (enough)."""
        return _needs(self, n)

    def __call__(self, x: torch.Tensor, weights: torch.Tensor | None = None, *, seed: int = 0,
                 reports: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
        check_messages(x, self, "aggregator")
        if weights is not None:
            check_weights(weights, x.shape[0], self, "aggregator")
            weights = torch.as_tensor(weights, device=x.device)  # a list of numbers, say
        state = self.init(ParamLayout(("x",), ((x.shape[1],),)))
        return self.apply(x, state, _default_context(x.shape[0], weights, seed, reports)).x


class AbstractPreAggregator(AbstractStage):
    """``(n, d) -> (m, d)``: transforms the messages before a rule (NNM, bucketing, clipping).

    ``pre(x, seed=)`` checks ``x`` as :class:`AbstractAggregator` does and raises :class:`MessageError` naming the
    pre-aggregator and the bad rows; ``apply`` relies on the engine's screening.
    """

    pairwise: ClassVar[bool] = False
    """As :attr:`AbstractAggregator.pairwise`."""

    def min_messages(self) -> int:
        """The fewest messages it accepts (e.g. ``n > f``): 1 by default."""
        return 1

    def rows_out(self, n: int) -> int | None:
        """How many rows it returns for ``n`` messages; ``None`` (the default): not known before it runs."""
        return None

    def __call__(self, x: torch.Tensor, *, seed: int = 0) -> torch.Tensor:
        check_messages(x, self, "pre_aggregator")
        state = self.init(ParamLayout(("x",), ((x.shape[1],),)))
        return self.apply(x, state, _default_context(x.shape[0], None, seed)).x


def _needs(stage: Any, n: int) -> str | None:
    """``stage`` needs more than ``n`` messages: what it needs, or ``None``."""
    if n >= stage.min_messages():
        return None
    return f"{type(stage).__name__} needs at least {stage.min_messages()} messages, found {n}"


@dataclass(frozen=True)
class PreAggregated(AbstractAggregator):
    """Apply ``pre`` (one or several pre-aggregators, in order), then ``inner``."""

    pre: tuple[AbstractPreAggregator, ...]
    inner: AbstractAggregator

    @property  # type: ignore[override]
    def pairwise(self) -> bool:  # a stage of the chain forms the Gram matrix of what reaches it
        return self.inner.pairwise or any(p.pairwise for p in self.pre)

    @property  # type: ignore[override]
    def reports(self) -> tuple[str, ...]:  # what the inner rule reads
        return self.inner.reports

    def init(self, layout: ParamLayout) -> dict[str, Any]:
        return {"pre": [p.init(layout) for p in self.pre], "inner": self.inner.init(layout)}

    def too_few(self, n: int) -> str | None:
        """Why ``n`` messages can never be aggregated (a stage's :meth:`min_messages` above what reaches it), or
        ``None`` (enough, or a pre-aggregator whose output rows are not known in advance)."""
        messages = n
        for stage in self.pre:
            if (problem := _needs(stage, n)) is not None:
                return problem
            rows = stage.rows_out(n)
            if rows is None:
                return None
            n = rows
        if n < self.inner.min_messages():
            return f"{type(self.inner).__name__} needs at least {self.inner.min_messages()} rows, and the " \
                   f"pre-aggregators turn {messages} messages into {n}"
        return None

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
    """``ctx.weights / sum`` in ``like``'s dtype (uniform when no weights are given).

    Raises:
      MessageError: unless the weights are a finite, non-negative ``(n,)`` vector with a positive sum.
    """
    if ctx.weights is None:
        return torch.full((n,), 1.0 / n, dtype=like.dtype, device=like.device)
    check_weights(ctx.weights, n)
    given = torch.as_tensor(ctx.weights, device=like.device)
    w = given.to(like.dtype)
    out = w / w.sum()
    if bool(torch.isfinite(out).all()) and float(out.sum()) > 0:
        return out
    # The weights overflowed or underflowed in ``like``'s dtype (5e37·[1, 2, 3] in float32, 1e-300 in float64):
    # the same ratios, scaled by the largest weight first, in float64
    w = given.to(torch.float64)
    w = w / w.amax()
    return (w / w.sum()).to(like.dtype)


def rescaled(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` without overflow, for a positively homogeneous ``fn`` (``fn(c·x) = c·fn(x)`` for ``c > 0``: means,
    weighted means, trimmed means) whose plain evaluation overflowed.

    Float16/bfloat16/float32 messages are evaluated in float64, where sums and squares of their values cannot
    overflow. Float64 messages are scaled by a power of two so that ``max|x| < 1`` (exact), evaluated, and scaled
    back. The result saturates at ``±finfo(x.dtype).max`` (only reachable when the exact result is not
    representable). Cost: one ``(n, d)`` float64 temporary; it runs only after an overflow.
    """
    big = torch.finfo(x.dtype).max
    if x.dtype != torch.float64:
        return fn(x.to(torch.float64)).clamp(-big, big).to(x.dtype)
    peak = float(x.abs().max()) if x.numel() else 0.0
    if not 0.0 < peak < math.inf:
        return fn(x)
    e = math.frexp(peak)[1]  # peak < 2**e
    out = fn(torch.ldexp(x, torch.tensor(-e, device=x.device)))
    return torch.ldexp(out.clamp(-math.ldexp(big, -e), math.ldexp(big, -e)), torch.tensor(e, device=x.device))


def mean_rows(x: torch.Tensor) -> torch.Tensor:
    """``x.mean(dim=0)``, recomputed by :func:`rescaled` if the sum overflowed."""
    out = x.mean(dim=0)
    return out if all_finite(out) else rescaled(lambda z: z.mean(dim=0), x)


def weighted_rows(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``w @ x`` in ``x``'s dtype for weights ``w`` of shape ``(n,)`` or ``(m, n)``, recomputed by :func:`rescaled`
    if a product or partial sum overflowed."""
    out = w.to(device=x.device, dtype=x.dtype) @ x
    return out if all_finite(out) else rescaled(lambda z: w.to(device=z.device, dtype=z.dtype) @ z, x)


@register("aggregator", "mean")
@dataclass(frozen=True)
class Mean(AbstractAggregator):
    """Weighted mean ``Σ_i w_i x_i / Σ_i w_i`` (uniform without weights). Cost O(nd).

    Never overflows for finite messages (a convex combination; see :func:`weighted_rows`).
    """

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        w = normalized_weights(ctx, x.shape[0], x)
        return StageOut(weighted_rows(w, x), state)


def require_f(f: int, name: str = "f") -> None:
    """Validate a Byzantine bound at construction."""
    check_number(name, f, integer=True, low=0)


def aggregator_name(aggregator: AbstractAggregator) -> str:
    """``aggregator 'cwtm'``, or ``aggregator 'cwtm' after pre-aggregator 'nnm'`` for a :class:`PreAggregated`."""
    if not isinstance(aggregator, PreAggregated):
        return component_name("aggregator", aggregator)
    return f"{component_name('aggregator', aggregator.inner)} after " + \
        ", ".join(component_name("pre_aggregator", p) for p in aggregator.pre)
