"""Simulated time for asynchronous engines: client speed models and the lazy virtual clock (QuAFL's timing model).

See :mod:`trustfl.simtime.clock` for the time semantics and :mod:`trustfl.simtime.speed` for the speed models.
"""
from trustfl.simtime.clock import ClockState, completed_steps, expected_steps, finish_times, prob_zero_steps
from trustfl.simtime.speed import (AbstractSpeedModel, Deterministic, ExponentialGroups, ExponentialUniformMeans,
                                   Trace)

__all__ = ["AbstractSpeedModel", "ClockState", "Deterministic", "ExponentialGroups", "ExponentialUniformMeans",
           "Trace", "completed_steps", "expected_steps", "finish_times", "prob_zero_steps"]
