"""Shared by the engine tests: build a federation and run rounds directly (no run directory)."""
from trustfl.config.build import build_federation
from trustfl.engine.sync import initial_state, run_round


def train(cfg, rounds):
    """``(federation, final state, per-round metrics)`` after ``rounds`` rounds of ``cfg``."""
    fed = build_federation(cfg, quiet=True)
    state = initial_state(fed)
    history = []
    for _ in range(rounds):
        state, metrics = run_round(fed, state)
        history.append(metrics)
    return fed, state, history
