"""How many clients the vectorized executor trains in one batched computation (``engine.max_clients_per_batch``).

A group of ``g`` clients holds, per client, its stacked parameters, their gradients, a copy in the gradients'
layout, the local chain's state, its final parameters and its message (about ``k·d`` numbers for ``d`` parameters,
``k`` = :data:`PARAMETER_COPIES`), plus the activations of its batch; materialised per-example gradients
(``client.dp.method = "vmap"``) add ``B·d``. ``"auto"`` takes the largest group whose estimate fits in
:data:`GROUP_SHARE` of the memory free on the run's device once the cohort's messages are set aside
(``torch.cuda.mem_get_info`` on CUDA, ``MemAvailable`` on the CPU) and, on the CPU, whose step activations stay
under :data:`CPU_GROUP_ACTIVATIONS`, so a cohort larger than what fits is trained in chunks. The round's ``(m, d)``
message matrix itself must fit whatever the chunking: :func:`check_cohort_fits` refuses a cohort whose messages
alone would take more than :data:`MESSAGE_SHARE` of the device's memory, naming the key that sets the cohort's size.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from trustfl.aggregate.geometric import GRAM_BYTES
from trustfl.core import memory
from trustfl.errors import ConfigError

PARAMETER_COPIES = 8
"""Per-client copies of the parameter vector a group holds at its peak (see the module docstring)."""
ACTIVATION_COPIES = 4
"""Copies of one example's activations held per example (forward values, their gradients, masks, margin)."""
GROUP_SHARE = 0.5
"""Share of the free memory one group may take (the rest: data, the round's messages, the server's work)."""
CPU_GROUP_ACTIVATIONS = 128 << 20
"""On the CPU, the most bytes of activations (as :func:`activation_bytes` estimates them) one ``"auto"`` group holds
in a local step. Beyond it the step's elementwise work (ReLU and pooling backward, zero fills, copies) streams
through main memory and a group gets slower per client: CafCor's CNN (7.8 MB per client of 32 examples by this
estimate) trains 100 clients in about 9.5 s per round in groups of 10–20, 15 s in groups of 50 and 19 s as one group
(benchmarks/scale.py's ``--chunk``, 2-core CPU); the MLP 784-200-200-10 (0.8 MB per client) is fastest as one group
of 100 and is not capped there."""
MESSAGE_SHARE = 0.4
"""Most of the device's free memory the round's ``(m, d)`` float32 messages may take (the server's screening and
aggregation make about two more copies)."""


def activation_numel(model: nn.Module, params: dict[str, torch.Tensor], example: dict[str, torch.Tensor],
                     forward: Any) -> int:
    """Numbers of the outputs of ``model``'s leaf modules for one example (its activations), measured by hooks
    on one no-grad forward pass ``forward(model, params, example)``."""
    total = 0

    def count(_module: nn.Module, _inputs: Any, output: Any) -> None:
        nonlocal total
        if isinstance(output, torch.Tensor):
            total += output.numel()

    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    handles = [m.register_forward_hook(count) for m in leaves]
    try:
        with torch.no_grad():
            forward(model, params, example)
    finally:
        for h in handles:
            h.remove()
    return total


def bytes_per_client(num_params: int, activations: int, batch_size: int, materialised: bool,
                     element_size: int = 4) -> int:
    """The estimate of one client's share of a group's memory (module docstring)."""
    copies = PARAMETER_COPIES + (batch_size if materialised else 0)
    return element_size * copies * num_params + activation_bytes(activations, batch_size, element_size)


def group_size(cohort: int, per_client: int, free: int, step_activations: int = 0) -> int:
    """The most clients, at least 1 and at most ``cohort``, whose estimate fits in ``GROUP_SHARE·free`` and, when
    ``step_activations`` (one client's, from :func:`activation_bytes`; pass it on the CPU only) is given, whose
    activations fit in :data:`CPU_GROUP_ACTIVATIONS`."""
    if cohort <= 0:
        return 1
    most = int(GROUP_SHARE * free) // max(per_client, 1)
    if step_activations > 0:
        most = min(most, CPU_GROUP_ACTIVATIONS // step_activations)
    return max(1, min(cohort, most))


def refuse_group_beyond_free(cohort: int, group: int, num_params: int, device: torch.device | str) -> None:
    """A MemoryError before a fixed-size group trains when the least it needs, beside the cohort's messages, is
    more than the free memory: its stacked parameters and their gradients (two of the :data:`PARAMETER_COPIES`).
    ``"auto"`` sizes groups to fit instead; a fixed size that cannot fit would otherwise fail (or, on a machine that
    overcommits memory, be killed) inside the first step."""
    memory.refuse_beyond_free(message_bytes(cohort, num_params) + 2 * message_bytes(group, num_params), device)


def activation_bytes(activations: int, batch_size: int, element_size: int = 4) -> int:
    """One client's activations in a local step (the activation term of :func:`bytes_per_client`)."""
    return element_size * ACTIVATION_COPIES * batch_size * activations


def message_bytes(cohort: int, num_params: int) -> int:
    """The round's ``(cohort, d)`` float32 message matrix."""
    return 4 * cohort * num_params


def check_cohort_fits(cohort: int, num_params: int, device: torch.device | str, key: str,
                      free: int | None = None, pairwise: bool = False) -> None:
    """Refuse a cohort whose ``(cohort, d)`` float32 messages alone exceed ``MESSAGE_SHARE`` of the free memory, or,
    for an aggregator that forms the Gram matrix of the messages (``pairwise``), whose messages and Gram matrices
    (:data:`~trustfl.aggregate.geometric.GRAM_BYTES` per pair) together exceed it.

    Raises:
      ConfigError: naming ``key`` (the setting that makes the cohort this large), the sizes and the fix.
    """
    free = memory.free_memory(device) if free is None else free
    need = message_bytes(cohort, num_params)
    if pairwise and need + GRAM_BYTES * cohort ** 2 > free:
        most = math.isqrt(max(free - need, 0) // GRAM_BYTES)
        raise ConfigError(
            f"`{key}`: a round of {cohort} clients needs the {cohort} x {cohort} float64 Gram matrices of its "
            f"aggregator's pairwise distances ({memory.format_bytes(GRAM_BYTES * cohort ** 2)} beside the "
            f"messages' {memory.format_bytes(need)}), more than the {memory.format_bytes(free)} free on "
            f"{torch.device(device)}; use at most about {max(most, 1)} clients per round or a rule without pairwise "
            f"distances.")
    if need > MESSAGE_SHARE * free:
        most = int(MESSAGE_SHARE * free) // max(message_bytes(1, num_params), 1)
        raise ConfigError(
            f"`{key}`: a round of {cohort} clients sends a {cohort} x {num_params} float32 message matrix "
            f"({need / 2 ** 30:.1f} GiB), more than the server can hold and aggregate in the "
            f"{free / 2 ** 30:.1f} GiB free on {torch.device(device)} (chunking bounds the clients' training, not "
            f"the messages the server aggregates); use at most about {max(most, 1)} clients per round or a "
            f"smaller model.")


def expected_cohort(sampler: str, num_clients: int, size: int, rate: float) -> int:
    """The cohort size a sampler gives (``poisson``: its mean plus four standard deviations)."""
    if sampler == "uniform":
        return min(size, num_clients)
    if sampler == "poisson":
        mean = rate * num_clients
        return min(num_clients, math.ceil(mean + 4 * math.sqrt(mean * (1 - rate))))
    return num_clients
