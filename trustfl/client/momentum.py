"""Worker momentum: each client sends an exponential moving average of its (noisy) updates (CafCor Alg. 1).

Client ``i`` keeps its own momentum ``m^{(i)}`` between rounds and, whenever it takes part in a round with the
message ``x_i`` computed so far (e.g. the noisy clipped gradient ``g̃_t^{(i)}``), replaces it by

    m^{(i)} ← β·m^{(i)} + (1 − β)·x_i,      m^{(i)} = 0 before the client's first round,

and sends ``m^{(i)}`` (Algorithm 1, line 8, with trustfl's convention for ``t = 0``: the state starts at 0 and the
first message is ``(1 − β)·g̃``, not a zero update; docs/papers/cafcor.md, "Choices"; ByzFL's
``m ← βm + (1−β)g``). β is constant (the paper's experiments), so the β_{t−1}/β_t indexing question does not
arise.

Momentum, like every later step, is post-processing of the noisy gradient: it changes no privacy guarantee.

References:
  Allouah, Guerraoui, Stephan. Towards Trustworthy Federated Learning with Untrusted Participants. ICML 2025.
  https://arxiv.org/abs/2505.01874 (Algorithm 1).
  Karimireddy, He, Jaggi. Learning from History for Byzantine Robust Optimization. ICML 2021.
  https://arxiv.org/abs/2012.10333 (worker momentum against Byzantine workers).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.core.stage import AbstractStage
from trustfl.errors import MessageError
from trustfl.types import ParamLayout, RoundContext, StageOut

MomentumState = dict[int, torch.Tensor]
"""Client id → that client's momentum ``m^{(i)}`` (shape ``(d,)``); a client absent from the dict has ``m = 0``."""


@dataclass(frozen=True)
class WorkerMomentum(AbstractStage):
    """Per-client momentum ``m ← β m + (1 − β) x`` (see the module docstring); emits no metrics and no events.

    Row ``r`` belongs to client ``ctx.client_ids[r]`` and is computed from that row and that client's entry of the
    state only, so clients that skip a round keep their momentum unchanged. The state is a new dict every round
    (the input state is never modified in place).

    Attributes:
      beta: ``β`` in ``[0, 1)``; ``β = 0`` sends ``x`` unchanged.
    """

    beta: float

    def __post_init__(self) -> None:
        b = self.beta
        check_number("beta", b, low=0, high=1, high_open=True, note="worker momentum")

    def init(self, layout: ParamLayout) -> MomentumState:
        return {}

    def apply(self, x: torch.Tensor, state: MomentumState, ctx: RoundContext) -> StageOut:
        if x.ndim != 2 or not x.is_floating_point():
            raise MessageError(f"worker_momentum takes a floating (m, d) tensor, found shape {tuple(x.shape)} "
                               f"and dtype {x.dtype}.")
        ids = tuple(int(c) for c in ctx.client_ids)
        if len(ids) != x.shape[0] or len(set(ids)) != len(ids):
            raise MessageError(f"worker_momentum: `ctx.client_ids` must name each of the {x.shape[0]} rows once, "
                               f"found {ids}.")
        new: MomentumState = dict(state) if state else {}
        if x.shape[0] == 0:
            return StageOut(x, new)
        beta = float(self.beta)
        if beta == 0.0:
            out = x.clone()
        else:
            prev = torch.zeros_like(x)
            for r, c in enumerate(ids):
                m = new.get(c)
                if m is not None:
                    if m.shape != x.shape[1:]:
                        raise MessageError(f"client {c}'s momentum has shape {tuple(m.shape)}, the message "
                                           f"{tuple(x.shape[1:])}; the model layout changed.")
                    prev[r] = m
            out = prev.mul_(beta).add_(x, alpha=1.0 - beta)  # β m + (1 − β) x, one vectorised op per round
        for r, c in enumerate(ids):
            new[c] = out[r].clone()
        return StageOut(out, new)


@register("client_stage", "worker_momentum")
def worker_momentum(beta: float = 0.9) -> WorkerMomentum:
    """CafCor's worker momentum ``m ← β m + (1 − β) x`` with one momentum per client.

    Args:
      beta: ``β`` in ``[0, 1)`` (the paper: 0.85 on MNIST, 0.9 on Fashion-MNIST).

    Example:
      >>> from trustfl.types import RoundContext
      >>> stage = worker_momentum(0.5)
      >>> s = stage.init(None)
      >>> out = stage.apply(torch.ones(2, 3), s, RoundContext(0, 0, (4, 7)))
      >>> out.x[0].tolist(), sorted(out.state)
      ([0.5, 0.5, 0.5], [4, 7])
      >>> stage.apply(torch.ones(1, 3), out.state, RoundContext(1, 0, (7,))).x.tolist()
      [[0.75, 0.75, 0.75]]
    """
    return WorkerMomentum(beta)
