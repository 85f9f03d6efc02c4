"""SCAFFOLD's control variates (Karimireddy et al. 2020, Algorithm 1, update option II) as one gradient transform.

Client ``i`` corrects every local gradient by the drift estimate, ``g ← g − c_i + c`` (line 10), and after ``K_i``
local steps of size ``η_l`` from the received model ``x`` to ``y_i`` updates its control variate (line 12, option II)

    c_i⁺ = c_i − c + (x − y_i) / (K_i η_l),

keeps ``c_i⁺`` in the client state store and sends ``Δc_i = c_i⁺ − c_i`` beside its model delta. The server folds
the accepted ``Δc_i`` into its variate (line 17), ``c ← c + (1/N) Σ_{i ∈ S} Δc_i`` with ``N`` the population size,
and sends ``c`` with the model. With full participation and zero initial variates, ``c = (1/N) Σ_i c_i`` holds
after every round. A client that took no step keeps its variate (``Δc_i = 0``).

References:
  Karimireddy et al., *SCAFFOLD: stochastic controlled averaging for federated learning*, ICML 2020.
  https://arxiv.org/abs/1910.06378
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from trustfl.client.transforms import AbstractGradientTransform
from trustfl.core.registry import register


@register("gradient_transform", "scaffold")
@dataclass(frozen=True)
class Scaffold(AbstractGradientTransform):
    """SCAFFOLD's drift correction with client variates ``c_i`` (state ``c``) and the server variate ``c``."""

    def client_state_defaults(self, params):
        return {"c": torch.zeros_like(params)}

    def extras_widths(self, layout):
        return {"c": layout.numel}

    def init(self, params, cohort):
        c_i = cohort.client_state["c"]
        correction = cohort.received["c"].unsqueeze(0) - c_i
        return {"c_i": c_i, "c": cohort.received["c"], "correction": cohort.layout.unflatten(correction)}

    def apply(self, grads, state, params, active, cohort):
        return {k: g + state["correction"][k] for k, g in grads.items()}, state

    def finish(self, state, cohort, start, end, num_steps):
        steps = num_steps.to(start.dtype).unsqueeze(1)
        stepped = steps > 0
        drift = (start - end) / (steps.clamp(min=1) * cohort.lr)
        new_c = torch.where(stepped, state["c_i"] - state["c"].unsqueeze(0) + drift, state["c_i"])
        return {"c": new_c}, {"c": new_c - state["c_i"]}

    def server_init(self, params):
        return {"c": torch.zeros_like(params)}

    def downlink(self, server_state):
        return {"c": server_state["c"]}

    def server_update(self, server_state, extras, ctx):
        delta = extras["c"]
        if delta.shape[0] == 0:
            return server_state
        return {"c": server_state["c"] + delta.sum(0) / max(ctx.num_clients, 1)}
