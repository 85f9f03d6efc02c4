"""The executor's stacked schedule (:func:`batch_matrix`) against the per-client list (:func:`batch_schedule`)."""
from __future__ import annotations

import pytest
import torch

from trustfl.data import PoissonSampler, ShuffleSampler
from trustfl.engine.local import ClientPlan, LocalTraining, batch_matrix, batch_schedule


@pytest.mark.parametrize("sampler", [ShuffleSampler(), PoissonSampler()], ids=["shuffle", "poisson"])
@pytest.mark.parametrize("max_steps", [None, 0, 1, 3, 50])
@pytest.mark.parametrize("n", [0, 1, 37, 64])
def test_matrix_and_list_schedules_hold_the_same_batches(sampler, max_steps, n) -> None:
    training = LocalTraining(sampler=sampler, lr=0.1, epochs=2)
    plan = ClientPlan(3, torch.arange(n), max(1, min(16, n)), max_steps=max_steps)
    batches = batch_schedule(training, plan, seed=5, round_=2)
    matrix = batch_matrix(training, plan, seed=5, round_=2)
    assert matrix.shape[0] == len(batches)
    widest = max((b.numel() for b in batches), default=0)
    assert matrix.shape[1] == max(1, widest)  # a straggler's cut schedule is as wide as its remaining batches
    for row, batch in zip(matrix, batches):
        assert torch.equal(row[row >= 0], batch) and bool((row[batch.numel():] == -1).all())
