"""Per-example gradients of normalisation affine parameters and of embeddings, from a layer's input and output gradient.

The companions of :mod:`trustfl.client.ghost` for layers whose parameters are small (a ``LayerNorm`` / ``GroupNorm``
scale and shift) or whose gradient is a row selection (an ``Embedding``). With ``a`` the layer's input and ``g`` the
gradient of the loss w.r.t. its output, for example ``b``:

* LayerNorm over the trailing ``normalized_shape`` (Ba et al. 2016), ``y = x̂ ⊙ γ + β`` with
  ``x̂ = (x − μ)/√(σ² + ε)`` per position:  ``∇γ_b = Σ_t g_{b,t} ⊙ x̂_{b,t}``, ``∇β_b = Σ_t g_{b,t}``, summed over the
  leading positions ``t``;
* GroupNorm with ``G`` groups over ``(C, *)`` (Wu & He 2018): the same per channel, summed over the spatial positions;
* Embedding ``W ∈ R^{V×D}`` looked up at the indices ``i_{b,1..T}``: ``∇W_b = Σ_t e_{i_{b,t}} g_{b,t}ᵀ`` (the row of
  ``padding_idx`` gets no gradient), so ``‖∇W_b‖² = Σ_{t,s} 1[i_{b,t} = i_{b,s}] g_{b,t}·g_{b,s}`` without forming
  ``∇W_b``, and a client's clipped sum is one ``index_add`` of ``c_b g_{b,t}`` into rows ``i_{b,t}``.

The normalisation gradients are materialised per example (``N × numel(γ)`` numbers, as small as the layer's
activations); ``x̂`` is recomputed from the input by ``F.layer_norm`` / ``F.group_norm`` without affine parameters,
with the module's ε.

References:
  Ba, Kiros, Hinton, *Layer normalization*, 2016. https://arxiv.org/abs/1607.06450
  Wu, He, *Group normalization*, ECCV 2018. https://arxiv.org/abs/1803.08494
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

NORM_KINDS = ("layer_norm", "group_norm")
DIRECT_KINDS = NORM_KINDS + ("embedding",)


def norm_grads(kind: str, shape: tuple[int, ...], groups: int, eps: float, a: torch.Tensor, g: torch.Tensor,
               weight: bool, bias: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per-example ``(∇γ, ∇β)``, each ``(N, numel(γ))`` (``None`` for a parameter that is not asked for).

    Args:
      kind: ``"layer_norm"`` (``shape`` = its ``normalized_shape``) or ``"group_norm"`` (``shape`` = ``(C,)``,
        ``groups`` = G).
      eps: the module's ε. a, g: the layer's input and output gradient, ``(N, ...)``.
    """
    n, k = a.shape[0], math.prod(shape)
    if kind == "layer_norm":
        per_example = lambda t: t.reshape(n, -1, k).sum(1)  # noqa: E731  (N, positions, *shape) -> (N, k)
        normalised = F.layer_norm(a, shape, None, None, eps) if weight else None
    else:
        per_example = lambda t: t.reshape(n, k, -1).sum(2)  # noqa: E731  (N, C, *spatial) -> (N, C)
        normalised = F.group_norm(a, groups, None, None, eps) if weight else None
    return (per_example(g * normalised) if weight else None), (per_example(g) if bias else None)


def embedding_terms(a: torch.Tensor, g: torch.Tensor, padding_idx: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices ``(N, T)`` and output gradients ``(N, T, D)``, with the rows of ``padding_idx`` zeroed."""
    n = a.shape[0]
    idx = a.reshape(n, -1)
    grads = g.reshape(n, idx.shape[1], -1)
    if padding_idx is not None:
        grads = grads * (idx != padding_idx).unsqueeze(-1).to(grads.dtype)
    return idx, grads


def embedding_squared_norms(idx: torch.Tensor, grads: torch.Tensor, budget: int) -> torch.Tensor:
    """``Σ_{t,s} 1[i_t = i_s] g_t·g_s`` per example, ``(N,)``, at most ``budget`` Gram entries at once."""
    n, t = idx.shape
    step = max(1, budget // max(t * t, 1))
    parts = [((grads[s:s + step] @ grads[s:s + step].transpose(1, 2))
              * (idx[s:s + step].unsqueeze(2) == idx[s:s + step].unsqueeze(1))).sum((1, 2))
             for s in range(0, n, step)]
    return torch.cat(parts) if parts else grads.new_zeros(0)


def embedding_weighted(idx: torch.Tensor, grads: torch.Tensor, coef: torch.Tensor, vocab: int) -> torch.Tensor:
    """Per-client ``Σ_b coef[i, b] ∇W_{ib}``, ``(m, V, D)``: one ``index_add`` (not deterministic on CUDA unless
    ``torch.use_deterministic_algorithms`` is on)."""
    m, b = coef.shape
    t, d = idx.shape[1], grads.shape[-1]
    client = torch.arange(m, device=idx.device).repeat_interleave(b * t)
    scaled = (grads * coef.reshape(-1, 1, 1).to(grads.dtype)).reshape(-1, d)
    out = grads.new_zeros((m * vocab, d)).index_add_(0, client * vocab + idx.reshape(-1), scaled)
    return out.view(m, vocab, d)
