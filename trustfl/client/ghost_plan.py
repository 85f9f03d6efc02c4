"""Which layers ghost clipping computes norms for, and their output shapes: found once per model and batch shape.

A *plan* lists the :class:`~trustfl.client.ghost.GhostLayer` of every trained parameter with the shape of that
layer's output for one example. It is found by running one example of client 0 through the model with forward hooks
(which also checks that each such layer runs exactly once per forward), and kept per model object, keyed by what it
depends on: the objective, the trained parameters' names, shapes and dtypes, and the batch entries' per-example
shapes and dtypes. A DP-SGD step then skips the module walk and the traced example (about 5 % of a ``cnn_cafcor``
step and 8 % of an MLP step on one CPU thread); it only checks that each planned layer still describes its module
(a layer replaced or re-configured in place is planned again).
"""
from __future__ import annotations

import weakref
from typing import Callable, Mapping

import torch
from torch import nn

from trustfl.client import ghost
from trustfl.objectives.base import AbstractObjective, Batch

Plan = list[tuple[ghost.GhostLayer, tuple[int, ...]]]

_PLANS: weakref.WeakKeyDictionary[nn.Module, dict[tuple, tuple[AbstractObjective, Plan | None]]] = \
    weakref.WeakKeyDictionary()


def ghost_plan(model: nn.Module, params: Mapping[str, torch.Tensor], batch: Batch,
               objective: AbstractObjective) -> Plan | None:
    """The plan of ``model`` for stacked ``params`` ``(m, ...)`` and a batch with leading ``(m, B)``, or ``None`` when
    ghost clipping cannot run (an unsupported or tied trained parameter, or a layer that runs more than once or never
    in a forward pass). Cached per model object; the cached plan is a fresh list each call."""
    key = (id(objective), _signature(params, 1), _signature(batch, 2))
    cached = _PLANS.setdefault(model, {})
    hit = cached.get(key)
    # the objective is held, so its id cannot be reused meanwhile; a layer replaced or re-configured since (another
    # stride, say, with the same parameter shapes) no longer matches its description, and the plan is found again
    if hit is None or hit[0] is not objective or (hit[1] is not None and not _still_describes(model, hit[1])):
        hit = (objective, _find_plan(model, params, batch, objective))
        cached[key] = hit
    return None if hit[1] is None else list(hit[1])


def _still_describes(model: nn.Module, plan: Plan) -> bool:
    """Whether every layer of ``plan`` still describes the module of its name (type, geometry, trained keys)."""
    for layer, _ in plan:
        try:
            module = model.get_submodule(layer.name)
            trained = {p: key for p, key in (("weight", layer.weight), ("bias", layer.bias)) if key is not None}
            if ghost.describe(layer.name, module, trained) != layer:
                return False
        except (AttributeError, ghost.GhostUnsupportedError):
            return False
    return True


def _signature(tensors: Mapping[str, torch.Tensor], lead: int) -> tuple:
    return tuple((k, tuple(v.shape[lead:]), v.dtype, v.device.type) for k, v in tensors.items())


def _find_plan(model: nn.Module, params: Mapping[str, torch.Tensor], batch: Batch,
               objective: AbstractObjective) -> Plan | None:
    try:
        layers = ghost.ghost_layers(model, params)
    except ghost.GhostUnsupportedError:
        return None
    calls = [0] * len(layers)
    shapes: list[tuple[int, ...]] = [()] * len(layers)

    def hook(i: int) -> Callable[..., None]:
        def record(_mod: nn.Module, _inp: object, out: torch.Tensor) -> None:
            calls[i] += 1
            shapes[i] = tuple(out.shape[1:])
        return record

    modules = dict(model.named_modules())
    handles = [modules[layer.name].register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
    try:  # one example of client 0, without autograd (cheaper than a meta-device trace, which decomposes ops)
        with torch.no_grad():
            objective.forward(model, {k: v[0] for k, v in params.items()}, {k: v[0, :1] for k, v in batch.items()})
    finally:
        for h in handles:
            h.remove()
    if any(c != 1 for c in calls):  # a layer called twice (or never) breaks the per-layer norm formulas
        return None
    return list(zip(layers, shapes))
