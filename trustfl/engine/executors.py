"""Executors run the local updates of a cohort: all at once (vectorized, the default) or one by one.

Both produce the same messages (up to floating-point error): the same batches, the same SGD arithmetic, the
same noise streams. The vectorized executor stacks the clients' parameters and runs every local step of the
whole cohort as one batched computation (``torch.func.vmap`` over clients); clients with fewer steps or smaller
batches are masked (a masked step leaves parameters and momentum untouched). It is an execution detail: row
``i`` of every batched tensor is computed from client ``i``'s data and generators only.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from trustfl.client.per_example import clipped_batch_mean, clipped_grad_sum
from trustfl.core.registry import register
from trustfl.engine.local import ClientPlan, LocalTraining, add_dp_noise, batch_schedule, dp_generator
from trustfl.types import ParamLayout, Params


@dataclass
class ClientResults:
    """What the cohort sends: flat model deltas ``(m, d)`` and per-client training statistics."""

    updates: torch.Tensor
    train_loss: torch.Tensor
    num_steps: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class TrainData:
    """The simulator's view of the training data: one tensor, and each client's rows into it."""

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int


class AbstractExecutor(abc.ABC):
    @abc.abstractmethod
    def run(self, model: nn.Module, global_params: Params, plans: Sequence[ClientPlan], data: TrainData,
            training: LocalTraining, seed: int, round_: int) -> ClientResults:
        """Run every planned client's local update from ``global_params``."""


def _labels(data: TrainData, rows: torch.Tensor, flip: torch.Tensor | bool) -> torch.Tensor:
    y = data.y[rows]
    if isinstance(flip, bool):
        return data.num_classes - 1 - y if flip else y
    return torch.where(flip.view(-1, *([1] * (y.dim() - 1))), data.num_classes - 1 - y, y)


def _sgd_update(params: Params, grads: Params, bufs: Params | None, training: LocalTraining,
                active: torch.Tensor | None) -> None:
    """In-place ``torch.optim.SGD`` step (momentum, weight decay); rows with ``active = False`` are unchanged."""
    for name, p in params.items():
        g = grads[name]
        if training.weight_decay:
            g = g.add(p, alpha=training.weight_decay)
        if bufs is not None:
            buf = bufs[name]
            new_buf = buf.mul(training.momentum).add_(g)
            if active is not None:
                new_buf = torch.where(active.view(-1, *([1] * (p.dim() - 1))), new_buf, buf)
            bufs[name] = new_buf
            g = new_buf
        if active is not None:
            g = g * active.view(-1, *([1] * (p.dim() - 1))).to(g.dtype)
        p.sub_(g, alpha=training.lr)


@register("executor", "vectorized")
class VectorizedExecutor(AbstractExecutor):
    """All clients of a cohort in one batched computation (stacked parameters, vmap over clients).

    Args:
      max_clients_per_batch: split larger cohorts into groups of at most this many clients (bounds memory);
        0 runs the whole cohort at once.
    """

    def __init__(self, max_clients_per_batch: int = 0) -> None:
        self.max_clients_per_batch = max_clients_per_batch

    def run(self, model, global_params, plans, data, training, seed, round_) -> ClientResults:
        group = self.max_clients_per_batch or len(plans)
        parts = [self._run_group(model, global_params, plans[i:i + group], data, training, seed, round_)
                 for i in range(0, len(plans), group)]
        if len(parts) == 1:
            return parts[0]
        return ClientResults(torch.cat([p.updates for p in parts]), torch.cat([p.train_loss for p in parts]),
                             [s for p in parts for s in p.num_steps])

    def _run_group(self, model, global_params, plans, data, training, seed, round_) -> ClientResults:
        m = len(plans)
        schedules = [batch_schedule(training, p, seed, round_) for p in plans]
        num_steps = [len(s) for s in schedules]
        total_steps = max(num_steps, default=0)
        widest = max((int(b.numel()) for s in schedules for b in s), default=1) or 1
        # (steps, m, widest) positions into each client's own rows; -1 pads
        pos = torch.full((total_steps, m, widest), -1, dtype=torch.long)
        for i, sched in enumerate(schedules):
            for s, batch in enumerate(sched):
                pos[s, i, :batch.numel()] = batch
        longest = max(int(p.rows.numel()) for p in plans) or 1
        own_rows = torch.zeros((m, longest), dtype=torch.long)
        for i, p in enumerate(plans):
            own_rows[i, :p.rows.numel()] = p.rows
        has_step = torch.arange(total_steps).unsqueeze(1) < torch.tensor(num_steps).unsqueeze(0)  # (steps, m)
        flip = torch.tensor([p.flip_labels for p in plans])

        params = {k: v.detach().unsqueeze(0).repeat(m, *([1] * v.dim())) for k, v in global_params.items()}
        bufs = {k: torch.zeros_like(v) for k, v in params.items()} if training.momentum else None
        gens = [dp_generator(p, seed, round_) for p in plans] if training.private else []
        loss_sum = torch.zeros(m, dtype=torch.float64)
        grad_fn = _batched_grad(model)
        for s in range(total_steps):
            mask = pos[s] >= 0
            rows = torch.gather(own_rows, 1, pos[s].clamp(min=0))
            x, y = data.x[rows], _labels(data, rows, flip)
            active = has_step[s]
            if training.dp_mode == "per_example":
                sums, _ = clipped_grad_sum(model, params, x, y, mask, training.clip, method=training.dp_method)
                divisor = torch.tensor([float(p.batch_size) for p in plans])
                grads = add_dp_noise(sums, plans, training.clip, divisor, gens)
                with torch.no_grad():
                    losses = _batched_losses(model, params, x, y, mask)
            elif training.dp_mode == "batch_clip":
                clipped, _, losses = clipped_batch_mean(model, params, x, y, mask, training.clip, return_loss=True)
                grads = add_dp_noise(clipped, plans, training.clip, torch.ones(m), gens)
            else:
                active = active & mask.any(1)
                grads, losses = grad_fn(params, x, y, mask.to(x.dtype))
            loss_sum += torch.where(active, losses.detach().double(), 0.0)
            with torch.no_grad():
                _sgd_update(params, grads, bufs, training, None if bool(active.all()) else active)
        layout = ParamLayout.of(global_params)
        updates = layout.flatten(params, batch_dims=1) - layout.flatten(global_params).unsqueeze(0)
        steps_t = torch.tensor(num_steps, dtype=torch.float64).clamp(min=1)
        return ClientResults(updates, (loss_sum / steps_t).float(), num_steps)


def _batched_losses(model: nn.Module, params: Params, x: torch.Tensor, y: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor:
    logits = vmap(lambda p, xb: functional_call(model, p, (xb,)))(params, x)
    losses = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
    w = mask.to(losses.dtype)
    return (losses * w).sum(1) / w.sum(1).clamp(min=1)


def _batched_grad(model: nn.Module):
    """Per-client gradients of per-client mean losses: one grad of their sum w.r.t. the stacked parameters."""

    def total(params: Params, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor):
        per_client = _batched_losses(model, params, x, y, w)
        return per_client.sum(), per_client.detach()

    return grad(total, has_aux=True)


@register("executor", "sequential")
class SequentialExecutor(AbstractExecutor):
    """One client at a time with an ordinary module and ``torch.optim.SGD`` (the reference path)."""

    def run(self, model, global_params, plans, data, training, seed, round_) -> ClientResults:
        layout = ParamLayout.of(global_params)
        flat_global = layout.flatten(global_params)
        updates, losses, steps = [], [], []
        for plan in plans:
            local, loss, n_steps = self._train_one(model, global_params, plan, data, training, seed, round_)
            updates.append(layout.flatten(local) - flat_global)
            losses.append(loss)
            steps.append(n_steps)
        return ClientResults(torch.stack(updates), torch.tensor(losses, dtype=torch.float32), steps)

    def _train_one(self, model, global_params, plan, data, training, seed, round_):
        schedule = batch_schedule(training, plan, seed, round_)
        params = {k: v.detach().clone().requires_grad_(True) for k, v in global_params.items()}
        opt = torch.optim.SGD(params.values(), lr=training.lr, momentum=training.momentum,
                              weight_decay=training.weight_decay)
        gen = dp_generator(plan, seed, round_) if training.private else None
        total, counted = 0.0, 0
        for batch in schedule:
            rows = plan.rows[batch]
            x, y = data.x[rows], _labels(data, rows, plan.flip_labels)
            if training.private:
                stacked = {k: v.detach().unsqueeze(0) for k, v in params.items()}
                mask = torch.ones(1, x.shape[0], dtype=torch.bool)
                loss = None
                if training.dp_mode == "per_example":
                    g, _ = clipped_grad_sum(model, stacked, x.unsqueeze(0), y.unsqueeze(0), mask, training.clip,
                                            method=training.dp_method)
                    divisor = torch.tensor([float(plan.batch_size)])
                else:
                    g, _, loss = clipped_batch_mean(model, stacked, x.unsqueeze(0), y.unsqueeze(0), mask,
                                                    training.clip, return_loss=True)
                    divisor = torch.ones(1)
                g = add_dp_noise(g, [plan], training.clip, divisor, [gen])
                for k, p in params.items():
                    p.grad = g[k][0]
                if x.shape[0]:
                    if loss is None:
                        with torch.no_grad():
                            loss = F.cross_entropy(functional_call(model, params, (x,)), y)
                    total += float(loss.sum())
                    counted += 1
            else:
                if x.shape[0] == 0:
                    continue
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(functional_call(model, params, (x,)), y)
                loss.backward()
                total += loss.item()
                counted += 1
            opt.step()
        return {k: v.detach() for k, v in params.items()}, total / max(counted, 1), len(schedule)
