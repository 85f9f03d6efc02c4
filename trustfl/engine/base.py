"""The engine interface: an engine decides *when* the parts run; the shared loop (``engine/loop.py``) does the rest.

A new engine (asynchronous on a virtual clock, vertical) implements :class:`AbstractEngine` and registers as
``("engine", kind)``; checkpoints, resume, evaluation, metrics rows, progress, the run directory and budgets
come from the loop.
"""
from __future__ import annotations

import abc
from typing import Any

from trustfl.engine.federation import EngineState, Federation


class AbstractEngine(abc.ABC):
    """Turns a federation and its state into the next state, one *round* (one server update) at a time."""

    @abc.abstractmethod
    def initial_state(self, fed: Federation) -> EngineState:
        """The state before the first round."""

    @abc.abstractmethod
    def run_round(self, fed: Federation, state: EngineState) -> tuple[EngineState, dict[str, Any]]:
        """Run round ``state.round``; return the new state and the round's metrics."""

    def finished(self, fed: Federation, state: EngineState) -> bool:
        """Whether the run ends before its planned rounds (e.g. a simulated-time limit)."""
        return False
