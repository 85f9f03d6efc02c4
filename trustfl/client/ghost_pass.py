"""The hooked pass of ghost clipping: each layer's input and output gradient for any model
:func:`trustfl.client.ghost_plan.ghost_plan` describes (stacks of linear layers take
:func:`trustfl.client.linear_stack.ghost_inputs` instead).

Forward hooks record each planned layer's input. The output gradients come from one backward pass that computes no
weight gradients (the parameters are detached): for one client, w.r.t. the layer outputs themselves
(:func:`one_client_taps`); for a cohort under ``vmap``, w.r.t. zero probes added to the outputs (autograd cannot reach
a tensor made inside ``vmap``), or through the opt-in vmap-free cohort forward. One client's convolutions on the CPU
may compute by patches (:mod:`trustfl.client.patch_conv`), which the norms then reuse.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.func import vmap

from trustfl.client import ghost
from trustfl.client.cohort_forward import _cohort_forward
from trustfl.client.ghost_plan import Plan
from trustfl.client.patch_conv import by_patches
from trustfl.objectives.base import AbstractObjective, Batch, flat_batch

Params = dict[str, torch.Tensor]


def activations_and_backprops(model: nn.Module, plan: Plan, params: Params, batch: Batch, keep: torch.Tensor,
                               objective: AbstractObjective, cohort_layers: bool = False
                               ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor,
                                          list[torch.Tensor | None]]:
    """Inputs ``a`` and output gradients ``∂(Σ_b keep_b ℓ_b)/∂z`` of each layer, each ``(m·B, ...)``, the
    per-example losses ``ℓ`` ``(m·B,)``, and each layer's patches where its forward made them (else ``None``).

    One client: :func:`one_client_taps` where it applies. Otherwise forward hooks record each layer's input and add a
    zero probe to its output; the gradient w.r.t. the probes is the output gradient. Parameters are detached, so the
    backward pass computes no weight gradients. One client on the CPU: its ``Conv2d`` layers compute by patches
    (:mod:`trustfl.client.patch_conv`) in either pass, and hand their patches on.
    """
    m = keep.shape[0]
    if m != 1:
        return (*_hooked_pass(model, plan, params, batch, keep, objective, cohort_layers), [None] * len(plan))
    layers, modules = [layer for layer, _ in plan], dict(model.named_modules())
    with by_patches(layers, modules, batch[objective.input_key].device) as columns:
        tapped = one_client_taps(model, layers, modules, params, batch, keep, objective)
        if tapped is None:
            tapped = _hooked_pass(model, plan, params, batch, keep, objective, cohort_layers)
    return (*tapped, columns)


def _hooked_pass(model: nn.Module, plan: Plan, params: Params, batch: Batch, keep: torch.Tensor,
                 objective: AbstractObjective, cohort_layers: bool
                 ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Forward hooks record each layer's input and add a zero probe to its output (one client: plain autograd; a
    cohort: under ``vmap``, or the vmap-free cohort forward)."""
    m, b = keep.shape
    x = batch[objective.input_key]
    layers = [layer for layer, _ in plan]
    state: dict[str, list[torch.Tensor] | None] = {"probes": None, "acts": None}

    def hook(i: int) -> Callable[..., torch.Tensor]:
        def tap(_mod: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
            state["acts"][i] = inputs[0]  # type: ignore[index]
            probe = state["probes"][i]  # type: ignore[index]
            if probe is None:  # the cohort forward taps the output itself
                return out
            if m == 1 and out.dim() == 4 and out.is_contiguous(memory_format=torch.channels_last) \
                    and not out.is_contiguous():  # a patched convolution's output (no vmap for one client)
                probe = probe.contiguous(memory_format=torch.channels_last)  # the sum keeps the output's layout
            return out + probe
        return tap

    def client_forward(p: Params, probes: list[torch.Tensor], bi: Batch):
        state["probes"], state["acts"] = probes, [bi[objective.input_key]] * len(layers)
        outputs = objective.forward(model, p, bi)
        acts, state["probes"], state["acts"] = tuple(state["acts"]), None, None
        return outputs, acts

    modules = dict(model.named_modules())
    cohort = m > 1 and cohort_layers and all(layer.kind in ("linear", "conv2d") for layer in layers)
    dtype = x.dtype if x.is_floating_point() else next(iter(params.values())).dtype  # token ids: the model's dtype
    probes = [] if cohort else [torch.zeros((m, b, *s), dtype=dtype, device=x.device, requires_grad=True)
                                for _, s in plan]
    handles = [modules[layer.name].register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
    try:
        with torch.enable_grad():
            if cohort:  # probes: the tensors whose gradients are the output gradients
                outputs, acts, probes = _cohort_forward(model, layers, params, batch, client_forward, m, b)
            elif m == 1:  # no vmap needed for one client: plain autograd is cheaper
                outputs, acts = client_forward({k: v[0] for k, v in params.items()}, [p[0] for p in probes],
                                               {k: v[0] for k, v in batch.items()})
                outputs, acts = outputs.unsqueeze(0), tuple(a.unsqueeze(0) for a in acts)
            else:
                outputs, acts = vmap(client_forward)(params, probes, batch)
            losses = objective.losses(outputs.flatten(0, 1), flat_batch(batch, 2))
            backprops = torch.autograd.grad((losses * keep.reshape(-1)).sum(), probes)
            backprops = [g.reshape(m, b, *s) for g, (_, s) in zip(backprops, plan)]
    finally:
        for h in handles:
            h.remove()
    flat = lambda t: t.reshape(m * b, *t.shape[2:])  # noqa: E731
    return [flat(a.detach()) for a in acts], [flat(g) for g in backprops], losses.detach()


def one_client_taps(model: nn.Module, layers: list[ghost.GhostLayer], modules: dict[str, nn.Module], params: Params,
                     batch: Batch, keep: torch.Tensor, objective: AbstractObjective
                     ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor] | None:
    """What :func:`activations_and_backprops` returns for one client, without zero probes: autograd differentiates
    each layer's output itself (the first one, outside any graph, made a view of a leaf), so no probe is filled and
    added to every output. The same bits as the probed pass (``tests/client/test_ghost.py``). ``None`` when the model
    changes a tapped output in place (an ``inplace=True`` ReLU, say): that gradient would be the changed tensor's, and
    the probed pass runs instead."""
    acts: list[torch.Tensor | None] = [None] * len(layers)  # every entry set by its hook, or the pass returns None
    taps: list[tuple[torch.Tensor, int] | None] = [None] * len(layers)

    def hook(i: int) -> Callable[..., torch.Tensor]:
        def tap(_mod: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor) -> torch.Tensor:
            acts[i] = inputs[0]
            if not out.requires_grad:  # a view of a new leaf: autograd.grad w.r.t. a leaf itself trips torch's module
                out = out.detach().requires_grad_(True).view_as(out)  # trackers (FlopCounterMode, say)
            taps[i] = (out, out._version)
            return out
        return tap

    handles = [modules[layer.name].register_forward_hook(hook(i)) for i, layer in enumerate(layers)]
    try:
        with torch.enable_grad():
            one = {k: v[0] for k, v in batch.items()}  # the client's (B, ...) batch
            outputs = objective.forward(model, {k: v[0] for k, v in params.items()}, one)
            losses = objective.losses(outputs, one)
            if any(t is None or t[0]._version != t[1] for t in taps):
                return None
            backprops = torch.autograd.grad((losses * keep.reshape(-1)).sum(), [t[0] for t in taps])  # type: ignore
    except RuntimeError:  # an in-place change of the tapped leaf's view; a genuine error recurs in the probed pass
        return None
    finally:
        for h in handles:
            h.remove()
    return [a.detach() for a in acts], list(backprops), losses.detach()  # type: ignore[union-attr]
