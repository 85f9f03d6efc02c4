"""DP-SGD gradients with torch.func, vectorized over a cohort of clients (one of the few modules that use torch.func).

One step of client ``i`` with batch ``S_i`` (padded to ``B`` rows; ``mask`` marks the real ones) computes

    g_{ib}   = ∇_θ ℓ(θ_i; batch_{ib}),  ℓ = the objective's per-example loss          (per-example gradient)
    c_{ib}   = min(1, C / (‖g_{ib}‖₂ + 1e-6))                                          (Opacus's clip factor)
    s_i      = Σ_{b real} c_{ib} g_{ib}                                               (clipped_grad_sum)
    g̃_i     = (s_i + N(0, σ²C² I)) / E|S_i|                                         (noisy_clipped_mean)

(Abadi et al. 2016, Algorithm 1), and CafCor's mini-batch clipping ``Clip((1/|S_i|) Σ_b g_{ib}; C)`` (Allouah et al.,
Algorithm 1, eq. 1; :func:`clipped_batch_mean`). All ``m`` clients run together: stacked parameters (leading client
dimension ``m``) go through ``functional_call`` under ``vmap`` over clients, so there is no Python loop over clients.

``method="ghost"`` never materialises per-example gradients of fully connected layers: one forward pass records each
``nn.Linear``/``nn.Conv1d``/``nn.Conv2d`` input (any stride, dilation, groups; zero or symmetric "same" padding) and
each ``nn.LayerNorm``/``nn.GroupNorm``/``nn.Embedding`` input (:mod:`trustfl.client.ghost_direct`), one backward
pass gives the output gradients (no weight gradients; :mod:`trustfl.client.ghost_pass`), and
:mod:`trustfl.client.ghost` turns them into per-example norms and the clipped sum. ``method="vmap"`` materialises
per-example gradients, in chunks of examples.

References:
  Abadi et al., *Deep learning with differential privacy*, CCS 2016. https://arxiv.org/abs/1607.00133
  Allouah, Guerraoui, Stephan, *Towards trustworthy federated learning with untrusted participants* (CafCor).
  Li et al., ghost clipping, https://arxiv.org/abs/2110.05679; Bu et al., book-keeping, https://arxiv.org/abs/2210.00038
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch
from torch import nn
from torch.func import grad, vmap

from trustfl.client import ghost
from trustfl.client.ghost_pass import activations_and_backprops
from trustfl.client.ghost_plan import Plan, ghost_plan
from trustfl.client.linear_stack import FusedSGD, applies, linear_stack
from trustfl.client.linear_stack import ghost_inputs as stack_ghost_inputs
from trustfl.client.linear_stack import mean_grad as stack_mean_grad
from trustfl.client.per_example_checks import (Params, check_batch, check_expected_batch_size, check_norm,
                                               check_stacked, labels_in_range, prepare)
from trustfl.core.checks import check_number
from trustfl.core.rng import normal_rows
from trustfl.errors import ConfigError, PrivacyError
from trustfl.objectives.base import AbstractObjective, Batch, flat_batch, masked_mean
from trustfl.objectives.builtin import CrossEntropy

CROSS_ENTROPY = CrossEntropy()

METHODS = ("ghost", "vmap")
VMAP_BUDGET = 2**25
"""Per-example gradient elements materialised at once by ``method="vmap"`` when ``chunk_size`` is None."""
COHORT_LAYERS = False
"""Default of ``clipped_grad_sum(cohort_layers=None)``: the vmap-free cohort forward is opt-in (not bitwise)."""


def clip_factors(norms: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Opacus's clip factor ``min(1, C / (‖g‖ + 1e-6))``, elementwise.

    Example:
      >>> clip_factors(torch.tensor([0.5, 4.0]), 2.0).tolist()
      [1.0, 0.49999988079071045]
    """
    return (max_norm / (norms + 1e-6)).clamp(max=1.0)


def _one_example_loss(model: nn.Module, objective: AbstractObjective) -> Callable[[Params, Batch], torch.Tensor]:
    def loss(params: Params, example: Batch) -> torch.Tensor:
        one = {k: v.unsqueeze(0) for k, v in example.items()}  # grad needs a scalar: batch of one
        return objective.losses(objective.forward(model, params, one), one).sum()
    return loss


def per_example_grads(model: nn.Module, params: Mapping[str, torch.Tensor], batch: Batch, *,
                      objective: AbstractObjective = CROSS_ENTROPY, chunk_size: int | None = None) -> Params:
    """Materialised per-example gradients of one client: ``out[k][b] = ∂ℓ(θ; x_b, y_b)/∂θ_k``.

    Args:
      model: the model (returns logits); only its structure and buffers are used.
      params: unstacked parameters ``{name: tensor}`` (a subset of ``model.named_parameters()`` names).
      batch: named tensors with ``B`` examples first, e.g. ``{"x": (B, *input_shape), "y": (B,)}``.
      objective: the per-example loss (default: cross-entropy on ``batch["y"]``).
      chunk_size: examples per vmap chunk (``None``: all at once).

    Returns:
      ``{name: (B, *param_shape)}``.

    Example:
      >>> from trustfl.models import build_model
      >>> net = build_model("logreg", (4,), 3, seed=0)
      >>> p = {k: v.detach() for k, v in net.named_parameters()}
      >>> batch = {"x": torch.zeros(5, 4), "y": torch.zeros(5, dtype=torch.long)}
      >>> per_example_grads(net, p, batch)["linear.weight"].shape
      torch.Size([5, 3, 4])
    """
    check_batch(batch, None, 1)
    objective.check_batch(batch, tuple(next(iter(batch.values())).shape[:1]))
    params = {k: v.detach() for k, v in params.items()}
    with labels_in_range(objective):
        return vmap(grad(_one_example_loss(model, objective)), in_dims=(None, 0), chunk_size=chunk_size)(params, batch)


def clipped_grad_sum(model: nn.Module, params_stacked: Mapping[str, torch.Tensor], batch: Batch,
                     mask: torch.Tensor, max_norm: float, *, objective: AbstractObjective = CROSS_ENTROPY,
                     method: str = "ghost", chunk_size: int | None = None,
                     cohort_layers: bool | None = None, return_loss: bool = False
                     ) -> tuple[Params, torch.Tensor] | tuple[Params, torch.Tensor, torch.Tensor]:
    """Per-client sum of clipped per-example gradients, all ``m`` clients at once.

    Computes ``s_i = Σ_b 1[mask_{ib}] · min(1, C/(‖g_{ib}‖ + 1e-6)) · g_{ib}`` with ``g_{ib}`` the gradient of
    the objective's loss of example ``b`` of client ``i`` at client ``i``'s parameters.

    Args:
      model: the model (returns logits); only its structure and buffers are used.
      params_stacked: ``{name: (m, *param_shape)}``, client ``i``'s parameters in row ``i``.
      batch: named tensors with leading dims ``(m, B)``, e.g. ``{"x": (m, B, *input_shape), "y": (m, B)}``.
      mask: ``(m, B)`` bool or float; nonzero marks a real example, zero a padding row (contributes nothing, whatever
        its batch values).
      max_norm: the clipping norm ``C > 0``.
      objective: the per-example loss (default: cross-entropy on ``batch["y"]``).
      method: ``"ghost"`` (norms from activations and output gradients; falls back to ``"vmap"`` when a trained
        parameter is outside the layers :func:`trustfl.client.ghost.ghost_layers` supports, parameters are tied,
        or a layer runs more than once per forward; see :func:`supports_ghost`) or ``"vmap"`` (materialised).
      chunk_size: ``"vmap"`` only: examples per client per chunk (``None``: sized so that about ``2**25``
        per-example gradient elements are held at once).
      cohort_layers: ``"ghost"`` only, opt-in (``None``: :data:`COHORT_LAYERS`, off): for ``m > 1`` clients, run the
        forward without ``vmap`` as one ``m·B`` batch whose ``nn.Linear``/``nn.Conv2d`` layers compute with their
        client's weights (:mod:`trustfl.client.cohort_forward`; about 10% faster for a 10-client ``cnn_cafcor``
        cohort on one CPU thread, neutral for MLPs). Same results as the default path to float rounding (1e-12 relative at
        float64); bitwise equal in float32 on the shipped configs on CPU, but not guaranteed (other convolution
        kernels), hence off by default. Needs an objective whose ``forward`` is the plain ``functional_call``.
      return_loss: also return each client's mean loss over its real examples ``(m,)``, what
        :func:`batched_mean_losses` gives; the ghost path takes it from its own forward pass (no second one): the same
        bits when the cohort runs in one pass, float rounding apart when its clients run in groups.

    Returns:
      ``(sums, norms)``: ``sums[k]`` of shape ``(m, *param_shape)`` and the per-example gradient norms ``(m, B)``
      before clipping (0 for padding); ``(sums, norms, losses)`` with ``return_loss``.

    Raises:
      ConfigError: bad ``method``, ``chunk_size`` or shapes. PrivacyError: ``max_norm <= 0``.

    Warning:
      Models must be free of batch coupling (no BatchNorm in train mode) and of random ops (dropout: call
      ``model.eval()``), as every per-example gradient method requires.
    """
    if method not in METHODS:
        raise ConfigError(f"`method` must be one of {METHODS}, found {method!r}.")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ConfigError(f"`chunk_size` must be a positive integer or None, found {chunk_size!r}.")
    params, batch, keep = prepare(model, params_stacked, batch, mask, max_norm, objective)
    if keep.numel() == 0:  # no client or no example: nothing to clip
        return _nothing(params, keep, return_loss)
    with labels_in_range(objective):
        return _clipped_grad_sum(model, params, batch, keep, max_norm, objective, method, chunk_size, cohort_layers,
                                 return_loss)


def _clipped_grad_sum(model: nn.Module, params: Params, batch: Batch, keep: torch.Tensor, max_norm: float,
                      objective: AbstractObjective, method: str, chunk_size: int | None, cohort_layers: bool | None,
                      return_loss: bool) -> tuple:
    if method == "ghost":
        layers = ghost_plan(model, params, batch, objective)
        if layers is not None:
            cohort = COHORT_LAYERS if cohort_layers is None else bool(cohort_layers)
            sums, norms, losses = ghost.in_client_groups(lambda p, bt, kp: _ghost_clipped_sum(  # ghost.PASS_BUDGET
                model, layers, p, bt, kp, max_norm, objective, cohort), layers, params, batch, keep)
            return (sums, norms, losses) if return_loss else (sums, norms)
        ghost.note_fallback(model, params)
    sums, norms = _vmap_clipped_sum(model, params, batch, keep, max_norm, chunk_size, objective)
    if not return_loss:
        return sums, norms
    with torch.no_grad():
        return sums, norms, batched_mean_losses(model, objective, params, batch, keep)


def supports_ghost(model: nn.Module, params: Mapping[str, torch.Tensor], batch: Batch,
                   objective: AbstractObjective = CROSS_ENTROPY) -> bool:
    """Whether ``clipped_grad_sum(method="ghost")`` runs the ghost path on stacked ``(m, ...)`` ``params`` and a batch
    with leading ``(m, B)`` (else it falls back to ``"vmap"``, saying so once per model class)."""
    return ghost_plan(model, params, batch, objective) is not None


def _ghost_clipped_sum(model: nn.Module, plan: Plan, params: Params, batch: Batch, keep: torch.Tensor,
                       max_norm: float, objective: AbstractObjective,
                       cohort_layers: bool = False) -> tuple[Params, torch.Tensor, torch.Tensor]:
    """``(sums, norms, losses)``: the clipped sums, the per-example norms and each client's mean loss over its real
    examples, from one forward and one backward pass."""
    m, b = keep.shape
    stack = None if cohort_layers and m > 1 else linear_stack(model)
    if applies(stack, objective, params, batch):  # an MLP: the hooked pass's bits in closed form
        acts, backprops, per_example = stack_ghost_inputs(stack, objective, params, batch, keep)  # type: ignore
        columns: list[torch.Tensor | None] = [None] * len(plan)
    else:  # columns: the patches of the convolutions that computed by patches (one client on the CPU)
        acts, backprops, per_example, columns = activations_and_backprops(model, plan, params, batch, keep,
                                                                           objective, cohort_layers)
    sq = torch.zeros(m * b, dtype=acts[0].dtype, device=acts[0].device)
    terms = []
    for (layer, _), a, g, cols in zip(plan, acts, backprops, columns):
        layer_sq, layer_terms = ghost.squared_norms(layer, a, g, cols)
        sq = sq + layer_sq
        terms.append(layer_terms)
    del acts, backprops, columns
    norms = sq.clamp(min=0).sqrt().view(m, b) * keep
    coef = clip_factors(norms, max_norm) * keep
    sums: Params = {}
    for (layer, _), layer_terms in zip(plan, terms):
        sums.update(ghost.weighted_grads(layer, layer_terms, coef))
    return {k: sums[k] for k in params}, norms, masked_mean(per_example.view(m, b), keep)


def _vmap_clipped_sum(model: nn.Module, params: Params, batch: Batch, keep: torch.Tensor, max_norm: float,
                      chunk_size: int | None, objective: AbstractObjective) -> tuple[Params, torch.Tensor]:
    m, b = keep.shape
    x = batch[objective.input_key]
    per_example = vmap(vmap(grad(_one_example_loss(model, objective)), in_dims=(None, 0)))
    d = sum(v[0].numel() for v in params.values())
    step = chunk_size or max(1, VMAP_BUDGET // max(1, m * d))
    sums = {k: torch.zeros_like(v) for k, v in params.items()}
    norms = torch.zeros(m, b, dtype=next(iter(params.values())).dtype, device=x.device)
    for s in range(0, b, step):  # chunks of examples (all clients together) bound the memory to m·step·d
        g = per_example(params, {k: v[:, s:s + step] for k, v in batch.items()})
        chunk_keep = keep[:, s:s + step]
        sq = sum(v.reshape(m, v.shape[1], -1).square().sum(-1) for v in g.values())  # 0-d parameters too
        chunk_norms = sq.sqrt() * chunk_keep
        coef = clip_factors(chunk_norms, max_norm) * chunk_keep
        norms[:, s:s + step] = chunk_norms
        for k, v in g.items():
            sums[k] += torch.einsum("mb...,mb->m...", v, coef)
    return sums, norms


def noisy_clipped_mean(grad_sum_stacked: Mapping[str, torch.Tensor], noise_multiplier: float, max_norm: float,
                       expected_batch_size: float | torch.Tensor,
                       generators: Sequence[torch.Generator]) -> Params:
    """DP-SGD's noisy mean ``(s_i + N(0, σ²C² I)) / E|S_i|`` for every client ``i``.

    Draw order (reproducibility depends on it): client ``i``'s generator alone makes client ``i``'s draws, one
    ``torch.randn(param_shape, generator=generators[i], dtype=grad.dtype)`` per parameter, in the dict's order
    (the same order as ``model.named_parameters()`` when the dict comes from it). The result for parameter ``k`` is
    ``z·(σC/E|S_i|) + s·(1/E|S_i|)`` with that draw ``z``. Nothing is drawn when ``σ = 0``.

    Args:
      grad_sum_stacked: ``{name: (m, *shape)}``, e.g. from :func:`clipped_grad_sum`.
      noise_multiplier: ``σ >= 0``.
      max_norm: ``C > 0`` (the sensitivity of the clipped sum under add/remove adjacency).
      expected_batch_size: ``E|S_i| > 0``, a number or an ``(m,)`` tensor (one per client).
      generators: ``m`` CPU generators, client ``i``'s at index ``i``.

    Returns:
      ``{name: (m, *shape)}``.

    Raises:
      PrivacyError: ``σ < 0``, ``C <= 0``, or ``σC/E|S|`` or ``1/E|S|`` beyond the sums' dtype.
      ConfigError: wrong number of generators or a bad batch size.

    Example:
      >>> g = noisy_clipped_mean({"w": torch.ones(2, 3)}, 0.0, 1.0, torch.tensor([1.0, 2.0]),
      ...                        [torch.Generator(), torch.Generator()])
      >>> g["w"].tolist()
      [[1.0, 1.0, 1.0], [0.5, 0.5, 0.5]]
    """
    check_number("noise_multiplier", noise_multiplier, low=0, finite=True, error=PrivacyError)
    check_norm(max_norm)
    m = check_stacked(grad_sum_stacked)
    if len(generators) != m or not all(isinstance(g, torch.Generator) for g in generators):
        raise ConfigError(f"`generators` must hold one torch.Generator per client ({m}), found "
                          f"{[type(g).__name__ for g in generators]}.")
    first = next(iter(grad_sum_stacked.values()))
    bad_sum = next((k for k, v in grad_sum_stacked.items() if not v.is_floating_point()), None)
    if bad_sum is not None:
        raise ConfigError(f"`grad_sum_stacked[{bad_sum!r}]` must have a floating dtype, found "
                          f"{grad_sum_stacked[bad_sum].dtype}.")
    check_expected_batch_size(expected_batch_size, m)
    ebs = torch.as_tensor(expected_batch_size, dtype=first.dtype, device=first.device)
    if ebs.dim() == 0:
        ebs = ebs.expand(m)
    noise_scale, mean_scale = noise_multiplier * max_norm / ebs, 1.0 / ebs  # (m,), once for every parameter
    if not bool((torch.isfinite(noise_scale) & torch.isfinite(mean_scale)).all()):
        raise PrivacyError(f"σ·C/E|S| = {noise_multiplier!r}·{max_norm!r}/{expected_batch_size!r} or 1/E|S| is beyond "
                           f"{first.dtype}'s range: the noisy mean would be ±inf or NaN.")
    if noise_multiplier == 0:
        return {k: v / ebs.view(m, *([1] * (v.dim() - 1))) for k, v in grad_sum_stacked.items()}
    noise = {k: torch.empty(v.shape, dtype=v.dtype, device=v.device) for k, v in grad_sum_stacked.items()}
    normal_rows(list(noise.values()), generators)  # client i's stream, parameters in dict order
    out: Params = {}
    for k, v in grad_sum_stacked.items():  # (s + σC·z) / E|S|, computed as z·(σC/E|S|) + s·(1/E|S|) in place
        shape = (m, *([1] * (v.dim() - 1)))
        out[k] = noise[k].mul_(noise_scale.view(shape)).addcmul_(v, mean_scale.view(shape))
    return out


def clipped_batch_mean(model: nn.Module, params_stacked: Mapping[str, torch.Tensor], batch: Batch,
                       mask: torch.Tensor, max_norm: float, return_loss: bool = False, *,
                       objective: AbstractObjective = CROSS_ENTROPY) -> tuple[Params, torch.Tensor] | tuple[
                           Params, torch.Tensor, torch.Tensor]:
    """Mini-batch clipping (CafCor Algorithm 1, eq. 1): ``Clip((1/n_i) Σ_{b real} g_{ib}; C)`` per client.

    ``n_i`` is the number of real examples of client ``i`` (a client with none gets a zero gradient), and
    ``Clip(g; C) = g · min(1, C/(‖g‖ + 1e-6))``. This bounds the *batch* gradient (user-level sensitivity ``2C``
    under replace-one), not each example's.

    Args:
      model, params_stacked, batch, mask, max_norm, objective: as in :func:`clipped_grad_sum`.
      return_loss: also return each client's mean loss ``(m,)`` (from the same forward pass).

    Returns:
      ``(clipped, norms)``: ``clipped[k]`` of shape ``(m, *param_shape)`` and the norms ``(m,)`` of the mean
      gradients before clipping; ``(clipped, norms, losses)`` with ``return_loss``.
    """
    params, batch, keep = prepare(model, params_stacked, batch, mask, max_norm, objective)
    # the per-client mean gradients by plain autograd on the stacked leaves (no torch.func.grad, whose first call
    # imports torch._dynamo: about a second of the first round)
    with labels_in_range(objective):
        g, losses = batched_mean_grad(model, objective, params, batch, keep)
    norms = sum(v.reshape(v.shape[0], -1).square().sum(-1) for v in g.values()).sqrt()
    factor = clip_factors(norms, max_norm)
    clipped = {k: v * factor.view(-1, *([1] * (v.dim() - 1))) for k, v in g.items()}
    return (clipped, norms, losses.detach()) if return_loss else (clipped, norms)


def _nothing(params: Params, keep: torch.Tensor, return_loss: bool) -> tuple:
    """The clipped sums, norms (and losses) of an empty cohort or batch: zeros."""
    m = keep.shape[0]
    like = next(iter(params.values()))
    out = ({k: torch.zeros_like(v) for k, v in params.items()}, like.new_zeros(keep.shape))
    return (*out, like.new_zeros(m)) if return_loss else out


def batched_mean_losses(model: nn.Module, objective: AbstractObjective, params_stacked: Mapping[str, torch.Tensor],
                        batch: Batch, mask: torch.Tensor) -> torch.Tensor:
    """Each client's masked mean loss ``(1/n_i) Σ_{b real} ℓ(θ_i; batch_{ib})``, shape ``(m,)`` (0 with no example).

    The forward pass runs under ``vmap`` over clients (plain autograd for one client); the losses are computed on
    the flattened ``(m·B)`` outputs.
    """
    m, b = mask.shape
    if objective.batch_coupled:
        return coupled_losses(model, objective, params_stacked, batch, mask, {})
    if m == 1:  # one client (the sequential executor): no vmap machinery
        outputs = objective.forward(model, {k: v[0] for k, v in params_stacked.items()},
                                    {k: v[0] for k, v in batch.items()}).unsqueeze(0)
    else:
        outputs = vmap(lambda p, bi: objective.forward(model, p, bi))(params_stacked, batch)
    return masked_mean(objective.losses(outputs.flatten(0, 1), flat_batch(batch, 2)).view(m, b), mask)


def coupled_losses(model: nn.Module, objective: AbstractObjective, params_stacked: Mapping[str, torch.Tensor],
                   batch: Batch, mask: torch.Tensor, personal: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``(m,)`` losses of a batch-coupled objective: ``client_loss`` of each client's own padded batch, mask and
    personal downlink, under ``vmap`` over clients (one client's rows never meet another's)."""
    def one(p: Params, bi: Batch, wi: torch.Tensor, pi: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return objective.client_loss(objective.client_outputs(model, p, bi, pi), bi, wi, pi)
    return vmap(one)(dict(params_stacked), dict(batch), mask, dict(personal))


def batched_mean_grad(model: nn.Module, objective: AbstractObjective, params_stacked: Mapping[str, torch.Tensor],
                      batch: Batch, mask: torch.Tensor, full: bool = False,
                      personal: Mapping[str, torch.Tensor] | None = None) -> tuple[Params, torch.Tensor]:
    """Per-client gradients of the per-client mean losses, ``({name: (m, ...)}, losses (m,))``.

    One autograd pass of ``Σ_i L_i(θ_i)`` w.r.t. the stacked parameters (the forward under ``vmap``): client ``i``'s
    rows depend on ``θ_i`` only, so row ``i`` of the result is ``∇L_i(θ_i)``. ``full``: every row of ``mask`` is
    real (known on the host). A batch-coupled objective's ``L_i``: :func:`coupled_losses` with ``personal``. A stack
    of linear layers and ReLUs (several clients): in closed form, the same bits (:mod:`trustfl.client.linear_stack`).
    """
    if objective.batch_coupled:
        with torch.enable_grad():
            leaves = {k: v.detach().requires_grad_(True) for k, v in params_stacked.items()}
            per_client = coupled_losses(model, objective, leaves, batch, mask, personal or {})
            grads = torch.autograd.grad(per_client.sum(), list(leaves.values()), allow_unused=True)
        out = {k: torch.zeros_like(v) if g is None else g for (k, v), g in zip(leaves.items(), grads)}
        return out, per_client.detach()
    if full and mask.shape[0] == 1:  # one client, no padding: the plain mean, no mask arithmetic
        return _one_client_mean_grad(model, objective, params_stacked, batch, None)
    x = batch[objective.input_key]
    w = mask.to(x.dtype if x.is_floating_point() else next(iter(params_stacked.values())).dtype)
    if w.shape[0] == 1:  # one client (the sequential executor): plain autograd, no torch.func transforms
        return _one_client_mean_grad(model, objective, params_stacked, batch, w[0])
    stack = linear_stack(model)  # an MLP: the bits of the vmap path below, in closed form (no vmap, no autograd graph)
    if applies(stack, objective, params_stacked, batch):
        return stack_mean_grad(stack, objective, params_stacked, batch, w)  # type: ignore[arg-type]
    # The forward runs under vmap; the gradient is plain autograd on the stacked leaves, bitwise equal to
    # torch.func.grad of the same sum (tests/client/test_per_example.py) without its first-call cost: torch.func.grad
    # imports torch._dynamo (seconds) on its first call.
    with torch.enable_grad():
        leaves = {k: v.detach().requires_grad_(True) for k, v in params_stacked.items()}
        per_client = batched_mean_losses(model, objective, leaves, batch, w)
        grads = torch.autograd.grad(per_client.sum(), list(leaves.values()), allow_unused=True)
    out = {k: torch.zeros_like(v) if g is None else g for (k, v), g in zip(leaves.items(), grads)}
    return out, per_client.detach()


def fused_sgd(model: nn.Module, objective: AbstractObjective, params_stacked: Mapping[str, torch.Tensor],
              batch: Batch, lr: float) -> FusedSGD | None:
    """Plain SGD steps fused into their gradient computation (:class:`trustfl.client.linear_stack.FusedSGD`) for
    a stack of linear layers and ReLUs and several clients; ``None`` for any other model, objective or a single
    client."""
    m = next(iter(params_stacked.values())).shape[0] if params_stacked else 0
    if m < 2 or objective.batch_coupled:
        return None
    stack = linear_stack(model)
    if not applies(stack, objective, params_stacked, batch):
        return None
    return FusedSGD(stack, objective, lr)  # type: ignore[arg-type]


def _one_client_mean_grad(model: nn.Module, objective: AbstractObjective, params_stacked: Mapping[str, torch.Tensor],
                          batch: Batch, w: torch.Tensor | None) -> tuple[Params, torch.Tensor]:
    one = {k: v[0] for k, v in batch.items()}
    with torch.enable_grad():
        leaves = {k: v[0].requires_grad_(True) for k, v in params_stacked.items()}  # views of no-grad tensors
        outputs = objective.forward(model, leaves, one)
        if w is None:  # a full batch: the objective's (possibly fused) sum, divided by the batch size
            loss = objective.loss_sum(outputs, one) / outputs.shape[0]
        else:  # equal to the mean on a full batch; no host sync
            losses = objective.losses(outputs, one)
            loss = (losses * w.to(losses.dtype)).sum() / w.sum().clamp(min=1)
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    out = {k: (torch.zeros_like(v) if g is None else g).unsqueeze(0) for (k, v), g in zip(leaves.items(), grads)}
    return out, loss.detach().view(1)
