"""Local training: what one client does with the model it received (shared by every executor).

A client's local update is plain SGD (optional momentum and weight decay, ``torch.optim.SGD`` semantics) on its
own batches, for ``epochs`` passes or ``steps`` steps, with an optional sample-level DP gradient:

- ``per_example`` (DP-SGD, Abadi et al. 2016): ``g = (Σ_b clip_C(∇ℓ_b) + N(0, z²C²I)) / b`` with ``b`` the
  expected batch size;
- ``batch_clip`` (CafCor Alg. 1, eq. 1): ``g = clip_C((1/|B|) Σ_b ∇ℓ_b)`` (+ ``N(0, z²C²I)`` if ``z > 0``).

The message a client sends is its model delta ``θ_local − θ_global``. Every draw comes from the client's own
generators, derived from (seed, round, client, stage), so executors agree to floating-point error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
from dp_accounting import dp_event

from trustfl.core.rng import make_generator
from trustfl.data.sampling import AbstractBatchSampler
from trustfl.types import Params


@dataclass(frozen=True)
class LocalTraining:
    """How every client trains locally (hyper-parameters shared by the cohort)."""

    sampler: AbstractBatchSampler
    lr: float
    epochs: int = 1
    steps: int = 0
    momentum: float = 0.0
    weight_decay: float = 0.0
    dp_mode: str = "off"  # off | per_example | batch_clip
    clip: float = 1.0
    dp_method: str = "ghost"

    @property
    def private(self) -> bool:
        return self.dp_mode != "off"


@dataclass(frozen=True)
class ClientPlan:
    """One client's job in a round: its data rows, batch size, noise multiplier, and whether it is poisoned."""

    client_id: int
    rows: torch.Tensor
    """Indices of the client's examples in the training set (int64)."""
    batch_size: int
    noise_multiplier: float = 0.0
    flip_labels: bool = False


def batch_schedule(training: LocalTraining, plan: ClientPlan, seed: int, round_: int) -> list[torch.Tensor]:
    """The client's batches for this round, as indices into its own rows (from its own "batches" stream)."""
    n = int(plan.rows.numel())
    if n == 0:
        return []
    gen = make_generator(seed, round_, plan.client_id, "batches")
    if training.steps > 0:
        return training.sampler.steps(n, plan.batch_size, gen, num_steps=training.steps)
    return training.sampler.steps(n, plan.batch_size, gen, epochs=training.epochs)


def dp_generator(plan: ClientPlan, seed: int, round_: int) -> torch.Generator:
    return make_generator(seed, round_, plan.client_id, "dpsgd")


def step_event(training: LocalTraining, plan: ClientPlan) -> dp_event.DpEvent | None:
    """The DP event of one local step of this client (``None`` without sample-level DP).

    Poisson sampling is accounted as Poisson-subsampled Gaussian; shuffling and fixed-size sampling as sampling
    without replacement of ``b`` of ``n`` (the standard DP-SGD accounting for shuffled batches, documented as an
    approximation for ``shuffle``); mini-batch clipping as an unamplified Gaussian (user-level, add/remove).
    """
    if not training.private or plan.noise_multiplier <= 0:
        return None
    gauss = dp_event.GaussianDpEvent(plan.noise_multiplier)
    if training.dp_mode == "batch_clip":
        return gauss
    n = int(plan.rows.numel())
    b = min(plan.batch_size, n)
    if training.sampler.accounting == "poisson":
        return dp_event.PoissonSampledDpEvent(b / n, gauss)
    if b >= n:
        return gauss
    return dp_event.SampledWithoutReplacementDpEvent(n, b, gauss)


def num_local_steps(training: LocalTraining, num_samples: int, batch_size: int) -> int:
    """Steps one round takes for a client with ``num_samples`` examples (without drawing the batches)."""
    if num_samples == 0:
        return 0
    if training.steps > 0:
        return training.steps
    return training.epochs * math.ceil(num_samples / min(batch_size, num_samples))


def add_dp_noise(grads: Params, plans: Sequence[ClientPlan], clip: float, divisor: torch.Tensor,
                 generators: Sequence[torch.Generator]) -> Params:
    """``(g_i + N(0, z_i² C² I)) / divisor_i`` per client ``i``, drawing one tensor per parameter in order."""
    out: Params = {}
    stds = torch.tensor([p.noise_multiplier * clip for p in plans], dtype=torch.float64)
    for name, g in grads.items():
        shape = (len(plans),) + (1,) * (g.dim() - 1)
        if bool((stds > 0).any()):
            noise = torch.zeros_like(g)
            for i, gen in enumerate(generators):
                if stds[i] > 0:
                    noise[i] = torch.randn(g.shape[1:], generator=gen, dtype=g.dtype).mul_(float(stds[i]))
            g = g + noise
        out[name] = g / divisor.to(g.dtype).view(shape)
    return out
