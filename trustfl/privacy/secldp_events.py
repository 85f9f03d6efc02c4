"""The SecLDP accounting stage: charge each honest client one CafCor step (Lemma A.4) per round.

CafCor's noise (:mod:`trustfl.privacy.correlated`) emits no DP events, because its guarantee depends on the threat
model (f, q, σ_cor, σ_ind), not on one client's noise alone. This stage, placed in the client chain next to the
noise, emits ``(client_id, GaussianDpEvent(z_eff))`` for every honest row, with ``z_eff = 1/√(2ε_step)`` the
Gaussian mechanism whose Rényi divergences equal those of one step, ``D_α = α·ε_step``
(:func:`trustfl.privacy.analysis.secldp.step_event`). Composing ``T`` such events in a client's RDP ledger gives
the Thm 4.1 composition ``RDP(α) = T·α·ε_step``, so ledgers and ``summary.json`` report the threat model's ε.
The message matrix passes through unchanged.

Byzantine clients have no privacy to protect and no ledger: in simulation they are the last ``ctx.num_byzantine``
ids (``n − f, …, n − 1``, the engine's convention) and get no event.

References:
  Allouah, Guerraoui, Stephan. Towards Trustworthy Federated Learning with Untrusted Participants. ICML 2025.
  https://arxiv.org/abs/2505.01874 (Lemma A.4, Thm 4.1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from trustfl.core.checks import check_number
from trustfl.core.registry import register
from trustfl.core.stage import AbstractStage
from trustfl.privacy.analysis.secldp import equivalent_noise_multiplier, step_event
from trustfl.types import RoundContext, StageOut

if TYPE_CHECKING:
    from dp_accounting import dp_event


@dataclass(frozen=True)
class SecLdpAccounting(AbstractStage):
    """Emit one Lemma A.4 step per honest row and round; ``x`` is returned unchanged.

    Attributes:
      step: ``ε_step`` > 0, the RDP slope of one step under the run's threat model
        (:func:`trustfl.privacy.analysis.secldp.threat_model_step`).

    Metrics: ``epsilon_step`` and ``noise_multiplier`` (``z_eff``).
    """

    step: float

    def __post_init__(self) -> None:
        s = self.step
        check_number("step", s, low=0, low_open=True, finite=True, note="ε_step of one CafCor round")

    def round_event(self) -> dp_event.GaussianDpEvent:
        return step_event(float(self.step))

    def apply(self, x: torch.Tensor, state: Any, ctx: RoundContext) -> StageOut:
        event = step_event(float(self.step))
        first_byzantine = ctx.num_clients - ctx.num_byzantine if ctx.num_clients else math.inf
        events = tuple((int(c), event) for c in ctx.client_ids if int(c) < first_byzantine)
        metrics = {"epsilon_step": float(self.step), "noise_multiplier": equivalent_noise_multiplier(self.step)}
        return StageOut(x, state, metrics, events)


@register("client_stage", "secldp_accounting")
def secldp_accounting(step: float) -> SecLdpAccounting:
    """Charge every honest client one CafCor step of RDP slope ``step`` per round (Lemma A.4).

    Example:
      >>> from trustfl.types import RoundContext
      >>> ctx = RoundContext(0, 0, (0, 1, 2), num_byzantine=1, num_clients=3)
      >>> out = secldp_accounting(0.5).apply(torch.zeros(3, 2), None, ctx)
      >>> [c for c, _ in out.events], out.events[0][1].noise_multiplier
      ([0, 1], 1.0)
    """
    return SecLdpAccounting(step)
