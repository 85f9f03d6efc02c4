"""Local training plans: which batches each client draws, how many steps it may take, and their DP events.

What a client computes on those batches is the local chain (``client/transforms.py``): gradient method
(plain / per-example clipped / batch-clipped) → gradient transforms (DP noise, proximal term, control variates,
weight decay, momentum) → local SGD. The message a client sends is ``θ_local − θ_received``. Every draw comes
from the client's own generators, derived from (seed, round, client, stage), so executors agree.

Accounting: ``per_example`` (DP-SGD, Abadi et al. 2016) charges a subsampled Gaussian per step; ``batch_clip``
(CafCor Alg. 1, eq. 1) an unamplified Gaussian per step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

import torch

from trustfl.core.rng import make_generator
from trustfl.data.sampling import AbstractBatchSampler

if TYPE_CHECKING:
    from dp_accounting import dp_event


@dataclass(frozen=True)
class LocalTraining:
    """How every client's local work is scheduled and accounted (hyper-parameters shared by the cohort)."""

    sampler: AbstractBatchSampler
    lr: float
    epochs: int = 1
    steps: int = 0
    momentum: float = 0.0
    weight_decay: float = 0.0
    dp_mode: str = "off"  # off | per_example | batch_clip: what a step's DP event is
    clip: float = 1.0
    dp_method: str = "ghost"
    lr_schedule: str = "constant"  # constant | cosine: the local learning rate of each round (round_lr)

    @property
    def private(self) -> bool:
        return self.dp_mode != "off"


def round_lr(training: LocalTraining, round_: int, rounds: int) -> float:
    """The local learning rate of round ``round_`` (0-based) of ``rounds``: η_l (``constant``), or cosine annealing
    η_r = η_l·½(1 + cos(π r/T)) (``cosine``, the FedSC authors' per-round schedule)."""
    if training.lr_schedule == "constant":
        return training.lr
    return training.lr * 0.5 * (1.0 + math.cos(math.pi * round_ / max(rounds, 1)))


@dataclass(frozen=True)
class ClientPlan:
    """One client's job in a round: its data rows, batch size, noise multiplier, poisoning and step budget."""

    client_id: int
    rows: torch.Tensor
    """Indices of the client's examples in the training set (int64)."""
    batch_size: int
    noise_multiplier: float = 0.0
    flip_labels: bool = False
    max_steps: int | None = None
    """Most local steps the client completes this round (``None``: all planned); a straggler's budget."""


@dataclass(frozen=True)
class TrainData:
    """The simulator's view of the training data: named tensors (examples first), each client's rows into them.

    ``num_classes`` is 0 for real-valued targets. Data-level poisoning (label flipping) maps ``y`` to
    ``num_classes − 1 − y`` on the poisoned clients' rows.
    """

    tensors: Mapping[str, torch.Tensor]
    num_classes: int

    def gather(self, rows: torch.Tensor, flip: torch.Tensor | bool = False) -> dict[str, torch.Tensor]:
        """The batch of ``rows`` (any shape); ``flip`` (a bool or one per leading row) poisons the labels."""
        batch = {k: v[rows] for k, v in self.tensors.items()}
        if "y" in batch and not (isinstance(flip, bool) and not flip):
            y = batch["y"]
            if isinstance(flip, bool):
                batch["y"] = self.num_classes - 1 - y
            else:
                batch["y"] = torch.where(flip.view(-1, *([1] * (y.dim() - 1))), self.num_classes - 1 - y, y)
        return batch


def batch_schedule(training: LocalTraining, plan: ClientPlan, seed: int, round_: int) -> list[torch.Tensor]:
    """The client's batches for this round, as indices into its own rows (from its own "batches" stream).

    A step budget truncates the schedule: a straggler completes the first ``max_steps`` planned steps.
    """
    n = int(plan.rows.numel())
    if n == 0:
        return []
    gen = make_generator(seed, round_, plan.client_id, "batches")
    if training.steps > 0:
        schedule = training.sampler.steps(n, plan.batch_size, gen, num_steps=training.steps)
    else:
        schedule = training.sampler.steps(n, plan.batch_size, gen, epochs=training.epochs)
    return schedule if plan.max_steps is None else schedule[:plan.max_steps]


def step_event(training: LocalTraining, plan: ClientPlan) -> dp_event.DpEvent | None:
    """The DP event of one local step of this client (``None`` without sample-level DP).

    Poisson sampling is accounted as Poisson-subsampled Gaussian; shuffling and fixed-size sampling as sampling
    without replacement of ``b`` of ``n`` (the standard DP-SGD accounting for shuffled batches, documented as an
    approximation for ``shuffle``); mini-batch clipping as an unamplified Gaussian (user-level, add/remove).
    """
    if not training.private or plan.noise_multiplier <= 0:
        return None
    from dp_accounting import dp_event  # here: a run without DP never imports dp_accounting (and scipy)

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
