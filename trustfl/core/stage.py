"""The stage abstraction: small objects with explicit state, composed into named chains (optax style).

A stage maps a message matrix ``x`` of shape ``(n, d)`` (one row per client of the round) to a new matrix, or,
for aggregators, to a vector of shape ``(d,)``. State goes in and comes out of :meth:`AbstractStage.apply`;
nothing is kept on the object, so a checkpoint is the set of state objects.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from trustfl.core.checks import describe_value
from trustfl.core.finite import finite_rows
from trustfl.core.registry import of_trustfl
from trustfl.errors import ConfigError
from trustfl.types import ParamLayout, RoundContext, StageOut


class AbstractStage(abc.ABC):
    """Base of every stage. Subclasses are frozen dataclasses validated in ``__post_init__``.

    Attributes:
      privacy_noise: ``True`` for stages whose only job is to add privacy noise; the simulator drops them to
        build the *noiseless* view an attack may be given (``attack.view = "noiseless"``).
    """

    privacy_noise: ClassVar[bool] = False

    def init(self, layout: ParamLayout) -> Any:
        """The initial state for messages of ``layout`` (default: no state)."""
        return None

    @abc.abstractmethod
    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        """Transform ``x`` and return the new value, state, metrics and DP events."""

    def round_event(self) -> Any:
        """The DP event this stage charges each participating client per round (``None``: it spends nothing).

        Used before training to check that a whole schedule fits every client's budget.
        """
        return None


@dataclass(frozen=True)
class Chain(AbstractStage):
    """Named stages applied in order; state is a dict addressed by name and metrics are prefixed ``name/``."""

    stages: tuple[tuple[str, AbstractStage], ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for name, _ in self.stages:
            if name in seen:
                raise ConfigError(f"stage names in a chain must be unique, found {name!r} twice.")
            seen.add(name)

    def init(self, layout: ParamLayout) -> dict[str, Any]:
        return {name: stage.init(layout) for name, stage in self.stages}

    def round_events(self) -> list[Any]:
        """Every stage's per-round DP event, in order (``None`` entries dropped)."""
        return [e for _, stage in self.stages if (e := stage.round_event()) is not None]

    def without_privacy_noise(self) -> Chain:
        """The same chain minus its privacy-noise stages (the simulator's noiseless view of honest messages)."""
        return Chain(tuple((name, stage) for name, stage in self.stages if not stage.privacy_noise))

    def apply(self, x: torch.Tensor, state: dict[str, Any], ctx: RoundContext) -> StageOut:
        new_state: dict[str, Any] = {}
        metrics: dict[str, float] = {}
        events: list = []
        for name, stage in self.stages:
            out = stage.apply(x, state[name], ctx)
            check_stage_out(out, name, x, scan=not of_trustfl(stage))
            x = out.x
            new_state[name] = out.state
            metrics.update({f"{name}/{k}": v for k, v in out.metrics.items()})
            events.extend(out.events)
        return StageOut(x, new_state, metrics, tuple(events))


def stage_out_problem(out: Any, like: torch.Tensor, finite_in: torch.Tensor | None) -> str | None:
    """What is wrong with ``out`` (what a stage or an aggregator returned), or ``None``: it must be a StageOut
    whose ``x`` has ``like``'s shape, dtype and device, needs no gradient, has no non-finite row where
    ``finite_in`` (per row of ``x``; one entry for a vector; ``None``: not scanned) is True, and tensor metrics of
    one number each."""
    if not isinstance(out, StageOut):
        return f"returned a {type(out).__name__}, not a StageOut"
    y = out.x
    if not isinstance(y, torch.Tensor) or y.shape != like.shape or y.dtype != like.dtype or y.device != like.device:
        return f"returned `x` = {describe_value(y)}"
    if y.requires_grad:  # autograd would refuse the engine's in-place updates of it in a later round
        return "returned `x` that requires grad (detach it)"
    poisoned = None if finite_in is None else finite_in & ~_finite(y)
    if poisoned is not None and bool(poisoned.any()):
        rows = torch.nonzero(poisoned).flatten().tolist()
        which = "" if y.ndim < 2 else f" in row(s) {rows[:8]}" + (f" and {len(rows) - 8} more" if len(rows) > 8 else "")
        return f"returned non-finite values (NaN or ±inf){which}"
    return next((f"returned metric {k!r} as a tensor of shape {tuple(v.shape)}, not one number"
                 for k, v in out.metrics.items() if isinstance(v, torch.Tensor) and v.numel() != 1), None)


def _finite(x: torch.Tensor) -> torch.Tensor:
    """Per row of an ``(n, d)`` matrix (one entry for a vector): whether every entry is finite."""
    return finite_rows(x) if x.ndim == 2 else torch.isfinite(x).all().reshape(1)


def check_stage_out(out: Any, name: str, x: torch.Tensor, scan: bool = True) -> None:
    """Refuse (ConfigError naming stage ``name``) what a stage returned for ``x`` unless it keeps the input's shape,
    dtype and device and is finite where the input was (:func:`stage_out_problem`): a stage of your own that breaks
    this would otherwise drop or poison the clients' messages without a word (the server would reject them as if
    training had diverged). ``scan=False`` skips the finiteness scan (two passes over ``x``): :class:`Chain` skips
    it for trustfl's own stages, which keep finite rows finite up to float32's maximum (every one is fuzzed for
    it: tests/fuzz/test_stages_keep_finite.py), and scans the stages of your own."""
    problem = stage_out_problem(out, x, _finite(x) if scan else None)
    if problem is not None:
        raise ConfigError(f"stage {name!r} {problem}; a stage must return a StageOut whose `x` has its input's shape "
                          f"{tuple(x.shape)}, dtype {x.dtype} and device {x.device}, finite where the input is.")


def chain(*stages: tuple[str, AbstractStage]) -> Chain:
    """Compose ``(name, stage)`` pairs, e.g. ``chain(("clip", clip_l2(1.0)), ("noise", gaussian(0.8)))``."""
    return Chain(tuple(stages))
