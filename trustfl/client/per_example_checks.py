"""What the per-example gradient functions check of their inputs before they compute (:mod:`trustfl.client.per_example`):
stacked parameters the model holds, batches of the cohort's shape whose padding is blanked, labels the loss can read,
a clipping norm and an expected batch size in range. Each refusal is a ConfigError (PrivacyError for the norm) naming
the argument."""
from __future__ import annotations

import contextlib
import math
from typing import Iterator, Mapping

import numpy as np
import torch
from torch import nn

from trustfl.core.checks import check_number
from trustfl.errors import ConfigError, PrivacyError
from trustfl.objectives.base import AbstractObjective, Batch
from trustfl.objectives.builtin import CrossEntropy

Params = dict[str, torch.Tensor]
"""Parameters by name."""


@contextlib.contextmanager
def labels_in_range(objective: AbstractObjective) -> Iterator[None]:
    """Cross-entropy on a label past the model's outputs: torch's IndexError or RuntimeError, as a ConfigError (no
    check in the step's path: the loss kernels find it)."""
    try:
        yield
    except (IndexError, RuntimeError) as e:
        if isinstance(objective, CrossEntropy) and "out of bounds" in str(e):
            raise ConfigError(f"`batch['y']` holds a label outside the model's outputs (class labels are 0 .. "
                              f"outputs-1): {e}") from e
        raise


def blank_padding(batch: Batch, keep: torch.Tensor) -> dict[str, torch.Tensor]:
    """The batch with its padding rows zeroed, so that NaN, garbage or out-of-range labels there cannot leak into
    0·NaN products. On the CPU a batch without padding comes back as it is (a host read of ``keep``, free there);
    on other devices the rows are always blanked, so that a step never waits for the device."""
    if keep.device.type == "cpu" and bool(keep.all()):
        return dict(batch)
    return {k: torch.where(keep.reshape(*keep.shape, *([1] * (v.dim() - 2))), v, torch.zeros((), dtype=v.dtype))
            for k, v in batch.items()}


def check_expected_batch_size(value: float | torch.Tensor, m: int) -> None:
    """Refuse anything but a positive finite number or a ``()`` / ``(m,)`` tensor of them (not a string or a flag
    that ``torch.as_tensor`` would take); checked before the conversion to the sums' dtype, which may round a tiny
    one to 0 (that one is refused as beyond the dtype's range, after)."""
    if isinstance(value, torch.Tensor):
        ok = value.dtype != torch.bool and not value.is_complex() and value.shape in ((), (m,)) and \
            bool((value > 0).all()) and bool(torch.isfinite(value).all())
    else:
        ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)) \
            and 0 < value < math.inf
    if not ok:
        raise ConfigError(f"`expected_batch_size` must be a positive number or an ({m},) tensor of positive "
                          f"numbers, found {value!r}.")


def prepare(model: nn.Module, params_stacked: Mapping[str, torch.Tensor], batch: Batch, mask: torch.Tensor,
             max_norm: float, objective: AbstractObjective) -> tuple[Params, dict[str, torch.Tensor], torch.Tensor]:
    """Validate a cohort batch; return detached params, the batch with padding blanked, and the keep mask."""
    check_norm(max_norm)
    m = check_stacked(params_stacked)
    check_batch(batch, mask, 2, m)
    check_fit(model, params_stacked, batch, objective)
    keep = mask != 0
    blanked = blank_padding(batch, keep)
    objective.check_batch(blanked, tuple(keep.shape))  # after blanking: padding rows may hold any label
    return {k: v.detach() for k, v in params_stacked.items()}, blanked, keep


def check_fit(model: nn.Module, params: Mapping[str, torch.Tensor], batch: Batch,
               objective: AbstractObjective) -> None:
    """Refuse stacked parameters the model does not hold (a name it lacks, another shape) and a floating input of
    another dtype than the parameters': torch would raise deep inside the forward pass, or (per-example gradients)
    silently ignore an unknown name."""
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for name, v in params.items():
        if name not in shapes:
            raise ConfigError(f"`params_stacked` holds {name!r}, which is not a parameter of the "
                              f"{type(model).__name__} (its parameters: {sorted(shapes)}).")
        if tuple(v.shape[1:]) != shapes[name]:
            raise ConfigError(f"`params_stacked[{name!r}]` has shape {tuple(v.shape)}: (m, *{shapes[name]}) expected "
                              f"for the {type(model).__name__}'s parameter.")
    x = batch.get(objective.input_key)
    dtype = next(iter(params.values())).dtype
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
        raise ConfigError(f"`batch[{objective.input_key!r}]` is {x.dtype} but the parameters are {dtype}; convert one "
                          f"to the other.")


def check_norm(max_norm: float) -> None:
    check_number("max_norm", max_norm, low=0, low_open=True, finite=True, error=PrivacyError)


def check_stacked(params: Mapping[str, torch.Tensor]) -> int:
    if not params:
        raise ConfigError("`params_stacked` is empty; pass at least one stacked parameter.")
    counts = {k: (v.shape[0] if v.dim() else None) for k, v in params.items()}
    m = next(iter(counts.values()))
    if m is None or any(c != m for c in counts.values()):
        raise ConfigError(f"every stacked tensor needs the same leading client dimension m, found {counts}.")
    return m


def check_batch(batch: Batch, mask: torch.Tensor | None, lead: int, m: int | None = None) -> None:
    what = "m, B" if lead == 2 else "B"
    if not isinstance(batch, Mapping) or not batch:
        raise ConfigError(f"`batch` must be a non-empty mapping of named tensors, found {type(batch).__name__}.")
    shapes = {k: tuple(v.shape) for k, v in batch.items()}
    lead_shape = next(iter(shapes.values()))[:lead]
    if len(lead_shape) != lead or any(s[:lead] != lead_shape for s in shapes.values()):
        raise ConfigError(f"every batch tensor must start with the dims ({what}), found {shapes}.")
    if m is not None and lead_shape[0] != m:
        raise ConfigError(f"the batch holds {lead_shape[0]} clients but the parameters hold m = {m}.")
    if mask is not None and tuple(mask.shape) != lead_shape:
        raise ConfigError(f"`mask` must have the shape ({what}) = {lead_shape}, found {tuple(mask.shape)}.")
