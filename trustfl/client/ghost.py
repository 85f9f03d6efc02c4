"""Ghost clipping math: per-example gradient norms and clipped gradient sums from activations and output gradients.

Plain tensor code (no torch.func): the activations ``a`` and output gradients ``g`` of every ``nn.Linear`` /
``nn.Conv2d`` layer are captured by :mod:`trustfl.client.per_example`; this module turns them into

* per-example squared gradient norms, without materialising the per-example gradients of fully connected layers
  (Goodfellow 2015; "ghost clipping", Li et al. 2022), and
* the clipped sum ``Σ_b c_b ∇_θ ℓ_b`` directly from ``(a, c·g)``, so no second backward pass is needed
  ("book-keeping", Bu et al. 2023).

Every layer is written as a per-example product of two matrices: ``A_b ∈ R^{T×D}`` (inputs; for a convolution the
unfolded patches, ``D = C_in·k_h·k_w`` and ``T`` output positions) and ``G_b ∈ R^{T×P}`` (output gradients, ``P``
output channels). Example ``b``'s weight gradient is ``G_bᵀ A_b`` and its bias gradient ``Σ_t G_b[t]``, so

    ‖∇W_b‖² = ‖A_b‖²·‖G_b‖²                              if T = 1,
            = Σ_{t,s} (A_b A_bᵀ)_{ts} (G_b G_bᵀ)_{ts}    (ghost Gram form, cost T²(D+P)), or
            = ‖G_bᵀ A_b‖²_F                              (materialised, cost T·D·P),

whichever is cheaper; and the clipped sum of client ``i`` is ``Σ_b c_{ib} G_{ib}ᵀ A_{ib}``, one batched matmul.

References:
  Goodfellow, *Efficient per-example gradient computations*, 2015. https://arxiv.org/abs/1510.01799
  Li, Tramèr, Liang, Hashimoto, *Large language models can be strong differentially private learners*, ICLR 2022.
  https://arxiv.org/abs/2110.05679
  Bu, Wang, Zha, Karypis, *Differentially private optimization on large model at small cost*, ICML 2023.
  https://arxiv.org/abs/2210.00038
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from trustfl.errors import ConfigError, TrustFLError

MATERIALISE_BUDGET = 2**25
"""Largest number of per-example gradient elements held at once (128 MiB in float32); larger work is chunked."""


class GhostUnsupportedError(TrustFLError):
    """A model has a parameterised layer that ghost clipping cannot handle; use ``method="vmap"``."""


@dataclass(frozen=True)
class GhostLayer:
    """One ``nn.Linear`` or ``nn.Conv2d`` layer whose parameters are trained.

    Attributes:
      name: module path in ``model.named_modules()``.
      kind: ``"linear"`` or ``"conv2d"``.
      weight: key of the weight in the params dict, ``None`` if the weight is not trained.
      bias: key of the bias in the params dict, ``None`` if there is no trained bias.
      weight_shape: shape of the weight (without the client dimension).
      kernel_size, stride, padding, dilation: convolution geometry (unused for linear layers).
    """

    name: str
    kind: str
    weight: str | None
    bias: str | None
    weight_shape: tuple[int, ...]
    kernel_size: tuple[int, int] = (1, 1)
    stride: tuple[int, int] = (1, 1)
    padding: tuple[int, int] = (0, 0)
    dilation: tuple[int, int] = (1, 1)

    def __post_init__(self) -> None:
        if self.kind not in ("linear", "conv2d"):
            raise ConfigError(f"`kind` must be 'linear' or 'conv2d', found {self.kind!r}.")


def ghost_layers(model: nn.Module, param_names: Iterable[str]) -> tuple[GhostLayer, ...]:
    """The layers of ``model`` that own the parameters ``param_names``, in module order.

    Args:
      model: the model; its parameters named in ``param_names`` are the trained ones.
      param_names: keys of the params dict (``model.named_parameters()`` names).

    Returns:
      One :class:`GhostLayer` per module owning at least one trained parameter.

    Raises:
      GhostUnsupportedError: a trained parameter belongs to a module other than exactly ``nn.Linear`` /
        ``nn.Conv2d`` (with ``groups=1``, zero padding given as numbers), or parameters are tied.
      ConfigError: a name is not a parameter of ``model``.
    """
    wanted = set(param_names)
    seen: dict[int, str] = {}
    layers: list[GhostLayer] = []
    found: set[str] = set()
    for mod_name, module in model.named_modules():
        own = {p_name: p for p_name, p in module.named_parameters(recurse=False, remove_duplicate=False)}
        keys = {p_name: f"{mod_name}.{p_name}" if mod_name else p_name for p_name in own}
        for p_name, p in own.items():
            if id(p) in seen:
                raise GhostUnsupportedError(f"parameters {seen[id(p)]!r} and {keys[p_name]!r} are tied; ghost "
                                            f"clipping needs each parameter in one layer call (use method='vmap').")
            seen[id(p)] = keys[p_name]
        trained = {p_name: key for p_name, key in keys.items() if key in wanted}
        if not trained:
            continue
        found.update(trained.values())
        layers.append(_describe(mod_name, module, trained))
    missing = sorted(wanted - found)
    if missing:
        raise ConfigError(f"`params` keys {missing} are not parameters of {type(model).__name__}; pass keys from "
                          f"`model.named_parameters()`.")
    return tuple(layers)


def _describe(name: str, module: nn.Module, trained: dict[str, str]) -> GhostLayer:
    kind = {nn.Linear: "linear", nn.Conv2d: "conv2d"}.get(type(module))
    extra = sorted(set(trained) - {"weight", "bias"})
    if kind is None or extra:
        raise GhostUnsupportedError(
            f"parameter {next(iter(trained.values()))!r} belongs to a {type(module).__name__}; ghost clipping "
            f"supports exactly nn.Linear and nn.Conv2d (use method='vmap').")
    shape = tuple(module.weight.shape)
    if kind == "linear":
        return GhostLayer(name, kind, trained.get("weight"), trained.get("bias"), shape)
    conv: nn.Conv2d = module  # type: ignore[assignment]
    padding = conv.padding
    if padding == "valid":
        padding = (0, 0)
    if conv.groups != 1 or conv.padding_mode != "zeros" or isinstance(padding, str):
        raise GhostUnsupportedError(
            f"Conv2d {name!r} has groups={conv.groups}, padding={conv.padding!r}, padding_mode="
            f"{conv.padding_mode!r}; ghost clipping supports groups=1 with numeric zero padding (use method='vmap').")
    return GhostLayer(name, kind, trained.get("weight"), trained.get("bias"), shape,
                      tuple(conv.kernel_size), tuple(conv.stride), tuple(padding), tuple(conv.dilation))


def layer_matrices(layer: GhostLayer, a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example ``A (N, T, D)`` and ``G (N, T, P)`` of one layer (``N`` examples, leading dims flattened).

    Args:
      layer: the layer.
      a: its input, ``(N, ..., D)`` for linear layers, ``(N, C_in, H, W)`` for convolutions.
      g: the gradient of the loss w.r.t. its output, ``(N, ..., P)`` or ``(N, P, H_out, W_out)``.
    """
    n = a.shape[0]
    if layer.kind == "linear":
        return a.reshape(n, -1, a.shape[-1]), g.reshape(n, -1, g.shape[-1])
    return _patches(layer, a).transpose(1, 2), g.flatten(2).transpose(1, 2)


def _patches(layer: GhostLayer, a: torch.Tensor) -> torch.Tensor:
    """``F.unfold`` of ``a`` as ``(N, C·k_h·k_w, T)``, built from strided views (one copy; faster than im2col)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = layer.kernel_size, layer.stride, layer.padding, layer.dilation
    if ph or pw:
        a = F.pad(a, (pw, pw, ph, ph))
    windows = a.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)[..., ::dh, ::dw]
    n, c, ho, wo = windows.shape[:4]  # windows: (N, C, H_out, W_out, k_h, k_w)
    return windows.permute(0, 1, 4, 5, 2, 3).reshape(n, c * kh * kw, ho * wo)


def _use_gram(t: int, d: int, p: int) -> bool:
    return t > 1 and t * (d + p) < d * p  # T²(D+P) < T·D·P


def _sq(t: torch.Tensor) -> torch.Tensor:
    """Per-row squared L2 norm of ``(N, ...)`` without an ``N × ...`` temporary."""
    return torch.linalg.vector_norm(t.flatten(1), dim=1).square()


@dataclass(frozen=True)
class LayerTerms:
    """What :func:`weighted_grads` needs from :func:`squared_norms`, so nothing is computed twice.

    Attributes:
      a: ``A (N, T, D)``, ``None`` once ``per_example`` holds the weight gradients.
      g: ``G (N, T, P)``.
      bias: per-example bias gradients ``(N, P)`` (``None`` if the bias is not trained).
      per_example: materialised per-example weight gradients ``(N, P, D)``, or ``None``.
    """

    a: torch.Tensor | None
    g: torch.Tensor
    bias: torch.Tensor | None
    per_example: torch.Tensor | None


def squared_norms(layer: GhostLayer, a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, LayerTerms]:
    """Per-example squared gradient norm of one layer, summed over its trained parameters.

    Args:
      layer, a, g: as in :func:`layer_matrices`, with ``N`` examples.

    Returns:
      ``(sq, terms)``: ``sq[b] = ‖∇W_b‖² + ‖∇bias_b‖²`` of shape ``(N,)``, and the terms reused by
      :func:`weighted_grads` (including the materialised per-example weight gradients when that form was the cheaper
      one and fits :data:`MATERIALISE_BUDGET`).
    """
    mat_a, mat_g = layer_matrices(layer, a, g)
    n, t, d = mat_a.shape
    p = mat_g.shape[-1]
    bias = mat_g.sum(1) if layer.bias is not None else None
    sq = _sq(bias) if bias is not None else mat_a.new_zeros(n)
    if layer.weight is None:
        return sq, LayerTerms(None, mat_g, bias, None)
    if t == 1:
        return sq + _sq(mat_a) * _sq(mat_g), LayerTerms(mat_a, mat_g, bias, None)
    if _use_gram(t, d, p):
        step = max(1, MATERIALISE_BUDGET // (t * t))
        parts = [(mat_a[s:s + step] @ mat_a[s:s + step].transpose(1, 2)).mul_(
            mat_g[s:s + step] @ mat_g[s:s + step].transpose(1, 2)).sum((1, 2)) for s in range(0, n, step)]
        return sq + torch.cat(parts), LayerTerms(mat_a, mat_g, bias, None)
    if n * p * d <= MATERIALISE_BUDGET:
        per_example = mat_g.transpose(1, 2) @ mat_a  # (N, P, D)
        return sq + _sq(per_example), LayerTerms(None, mat_g, bias, per_example)
    step = max(1, MATERIALISE_BUDGET // (p * d))
    parts = [_sq(mat_g[s:s + step].transpose(1, 2) @ mat_a[s:s + step]) for s in range(0, n, step)]
    return sq + torch.cat(parts), LayerTerms(mat_a, mat_g, bias, None)


def weighted_grads(layer: GhostLayer, terms: LayerTerms, coef: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-client sums ``Σ_b coef[i, b] · ∇_θ ℓ_{ib}`` of one layer's trained parameters.

    Args:
      layer: the layer.
      terms: from :func:`squared_norms`, with ``N = m·B`` examples ordered client-major.
      coef: ``(m, B)`` weights (the clip factors; 0 for padding).

    Returns:
      ``{key: (m, *param_shape)}`` for the layer's weight and/or bias keys.
    """
    m, b = coef.shape
    n, t, p = terms.g.shape
    out: dict[str, torch.Tensor] = {}
    if layer.weight is not None:
        if terms.per_example is not None:
            d = terms.per_example.shape[-1]
            w = torch.bmm(coef.unsqueeze(1), terms.per_example.view(m, b, p * d)).view(m, p, d)
        else:
            d = terms.a.shape[-1]  # type: ignore[union-attr]
            scaled = terms.g * coef.reshape(n, 1, 1)
            w = scaled.reshape(m, b * t, p).transpose(1, 2) @ terms.a.reshape(m, b * t, d)  # type: ignore[union-attr]
        out[layer.weight] = w.reshape(m, *layer.weight_shape)
    if terms.bias is not None:
        out[layer.bias] = torch.bmm(coef.unsqueeze(1), terms.bias.view(m, b, p)).squeeze(1)  # type: ignore[index]
    return out
