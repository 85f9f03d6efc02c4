"""Server optimizers (Reddi et al. 2021, "Adaptive Federated Optimization", arXiv:2003.00295).

The aggregate ``Δ`` is the (robustly) averaged client delta ``θ_client − θ``, i.e. a negative pseudo-gradient.
State is explicit: ``init`` returns it, ``step`` takes and returns it.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import torch

from trustfl.core.registry import register
from trustfl.errors import ConfigError


class AbstractServerOptimizer(abc.ABC):
    def init(self, params: torch.Tensor) -> Any:
        return None

    @abc.abstractmethod
    def step(self, params: torch.Tensor, delta: torch.Tensor, state: Any) -> tuple[torch.Tensor, Any]:
        """Return the new flat parameters and state."""


def _check(ok: bool, name: str, value: float, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"`server.{name}` must be {allowed}, found {value!r}.")


@register("server_optimizer", "sgd")
@dataclass(frozen=True)
class ServerSGD(AbstractServerOptimizer):
    """``v ← μ v + Δ``; ``θ ← θ + η v`` (FedAvg is η = 1, μ = 0; FedAvgM is μ > 0)."""

    lr: float = 1.0
    momentum: float = 0.0

    def __post_init__(self) -> None:
        _check(self.lr > 0, "lr", self.lr, "> 0")
        _check(0 <= self.momentum < 1, "momentum", self.momentum, "in [0, 1)")

    def init(self, params: torch.Tensor) -> Any:
        return torch.zeros_like(params) if self.momentum else None

    def step(self, params, delta, state):
        if self.momentum:
            state = state.mul(self.momentum).add_(delta)
            delta = state
        return params + self.lr * delta, state


@register("server_optimizer", "fedadam")
@dataclass(frozen=True)
class FedAdam(AbstractServerOptimizer):
    """FedAdam (Reddi et al. 2021, Alg. 2): ``m ← β₁m + (1−β₁)Δ``, ``v ← β₂v + (1−β₂)Δ²``, ``θ ← θ + η m/(√v + τ)``."""

    lr: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def __post_init__(self) -> None:
        _check(self.lr > 0, "lr", self.lr, "> 0")
        _check(0 <= self.beta1 < 1, "beta1", self.beta1, "in [0, 1)")
        _check(0 <= self.beta2 < 1, "beta2", self.beta2, "in [0, 1)")
        _check(self.tau > 0, "tau", self.tau, "> 0")

    def init(self, params):
        return {"m": torch.zeros_like(params), "v": torch.zeros_like(params)}

    def step(self, params, delta, state):
        m = state["m"].mul(self.beta1).add_(delta, alpha=1 - self.beta1)
        v = state["v"].mul(self.beta2).addcmul_(delta, delta, value=1 - self.beta2)
        return params + self.lr * m / (v.sqrt() + self.tau), {"m": m, "v": v}
