"""Ghost clipping math: per-example gradient norms and clipped gradient sums from activations and output gradients.

Plain tensor code (no torch.func): the activations ``a`` and output gradients ``g`` of every ``nn.Linear`` /
``nn.Conv1d`` / ``nn.Conv2d`` layer are captured by :mod:`trustfl.client.per_example`; this module turns them into

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

whichever is cheaper (the "mixed" strategy of Bu et al.); and the clipped sum of client ``i`` is
``Σ_b c_{ib} G_{ib}ᵀ A_{ib}``, one batched matmul. On the CPU a convolution's materialised form comes from one
convolution backward with the examples as groups (:func:`_conv_per_example_grads`), which is faster than the
products of the unfolded matrices when each output channel has many weights, except where a one-client pass's
forward has already made the patches ``A`` (:mod:`trustfl.client.patch_conv`; columns in ``(k_h, k_w, C)`` order,
``columns`` of :func:`squared_norms`): their products form it then.

A ``Conv1d`` is a ``Conv2d`` of height 1. A convolution with ``groups = g`` splits ``A_b`` and ``G_b`` column-wise into
``g`` blocks ``A_{b,j} ∈ R^{T×D/g}``, ``G_{b,j} ∈ R^{T×P/g}``; group ``j``'s weight gradient is ``G_{b,j}ᵀ A_{b,j}``
(output channels ``j·P/g …``), so ``‖∇W_b‖² = Σ_j ‖G_{b,j}ᵀ A_{b,j}‖²`` with the cheaper form chosen for the group
shapes; the bias gradient is ``Σ_t G_b[t]`` whatever ``g``.

References:
  Goodfellow, *Efficient per-example gradient computations*, 2015. https://arxiv.org/abs/1510.01799
  Li, Tramèr, Liang, Hashimoto, *Large language models can be strong differentially private learners*, ICLR 2022.
  https://arxiv.org/abs/2110.05679
  Bu, Wang, Zha, Karypis, *Differentially private optimization on large model at small cost*, ICML 2023.
  https://arxiv.org/abs/2210.00038
  Rochette, Manoel, Tramel, *Efficient per-example gradient computations in convolutional neural networks*, 2019.
  https://arxiv.org/abs/1912.06015
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from trustfl.client import ghost_direct
from trustfl.errors import ConfigError, TrustFLError

MATERIALISE_BUDGET = 2**25
"""Largest number of per-example gradient elements held at once (128 MiB in float32); larger work is chunked."""


KINDS = ("linear", "conv1d", "conv2d") + ghost_direct.DIRECT_KINDS


PASS_BUDGET = 32 << 20
"""Most bytes of the layer tensors one ghost pass holds for its clients (:func:`clients_per_pass`); a larger cohort
runs in groups of clients. CafCor's CNN (17 MB per client of 64 examples by this estimate) then runs one client at a
time and a 10-client step peaks at about 90 MB instead of 430 MB (Opacus ghost: 108 MB), as fast on one thread and 9 %
slower on two; the MLP 784-256-10 (1.3 MB per client of 256) keeps a cohort of 10 in one pass."""


class GhostUnsupportedError(TrustFLError):
    """A model has a parameterised layer that ghost clipping cannot handle; use ``method="vmap"``."""


@dataclass(frozen=True)
class GhostLayer:
    """One ``nn.Linear``, ``nn.Conv1d``, ``nn.Conv2d``, ``nn.LayerNorm``, ``nn.GroupNorm`` or ``nn.Embedding`` layer
    whose parameters are trained (the last three: :mod:`trustfl.client.ghost_direct`).

    Attributes:
      name: module path in ``model.named_modules()``.
      kind: ``"linear"``, ``"conv1d"``, ``"conv2d"``, ``"layer_norm"``, ``"group_norm"`` or ``"embedding"``.
      weight: key of the weight in the params dict, ``None`` if the weight is not trained.
      bias: key of the bias in the params dict, ``None`` if there is no trained bias.
      weight_shape: shape of the weight (without the client dimension).
      kernel_size, stride, padding, dilation: convolution geometry as ``(height, width)`` pairs (unused for linear
        layers; a ``Conv1d`` is stored as a ``Conv2d`` of height 1: ``(1, k)``, ``(1, s)``, ``(0, p)``, ``(1, d)``).
      groups: number of convolution groups (1 for linear layers), or GroupNorm's number of groups.
      eps: a normalisation's ε. norm_shape: LayerNorm's ``normalized_shape``. padding_idx: an Embedding's.
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
    groups: int = 1
    eps: float = 0.0
    norm_shape: tuple[int, ...] = ()
    padding_idx: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"`kind` must be one of {KINDS}, found {self.kind!r}.")
        if not isinstance(self.groups, int) or self.groups < 1 or (self.kind == "linear" and self.groups != 1):
            raise ConfigError(f"`groups` must be a positive integer (1 for linear layers), found {self.groups!r}.")


def ghost_layers(model: nn.Module, param_names: Iterable[str]) -> tuple[GhostLayer, ...]:
    """The layers of ``model`` that own the parameters ``param_names``, in module order.

    Args:
      model: the model; its parameters named in ``param_names`` are the trained ones.
      param_names: keys of the params dict (``model.named_parameters()`` names).

    Returns:
      One :class:`GhostLayer` per module owning at least one trained parameter.

    Raises:
      GhostUnsupportedError: a trained parameter belongs to a module other than exactly ``nn.Linear`` /
        ``nn.Conv1d`` / ``nn.Conv2d`` (with zero padding given as numbers, ``"valid"``, or ``"same"`` when it is
        symmetric), or parameters are tied.
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
        layers.append(describe(mod_name, module, trained))
    missing = sorted(wanted - found)
    if missing:
        raise ConfigError(f"`params` keys {missing} are not parameters of {type(model).__name__}; pass keys from "
                          f"`model.named_parameters()`.")
    return tuple(layers)


_MODULE_KINDS = {nn.Linear: "linear", nn.Conv1d: "conv1d", nn.Conv2d: "conv2d", nn.LayerNorm: "layer_norm",
                 nn.GroupNorm: "group_norm", nn.Embedding: "embedding"}


_FALLBACKS: set[str] = set()


def note_fallback(model: nn.Module, param_names: Iterable[str]) -> None:
    """Warn, once per model class, that ghost clipping falls back to materialised per-example gradients, and why."""
    name = type(model).__name__
    if name in _FALLBACKS:
        return
    _FALLBACKS.add(name)
    try:
        ghost_layers(model, param_names)
        reason = "a layer with trained parameters runs more than once (or never) in a forward pass"
    except GhostUnsupportedError as err:
        reason = str(err)
    warnings.warn(f"DP-SGD on {name}: ghost clipping falls back to per-example gradients (method='vmap'): {reason}",
                  stacklevel=3)


def describe(name: str, module: nn.Module, trained: dict[str, str]) -> GhostLayer:
    """The :class:`GhostLayer` of ``module`` (at path ``name``) whose trained parameters are ``trained``
    (``{"weight" | "bias": params-dict key}``); :class:`GhostUnsupportedError` for a module ghost clipping cannot
    handle."""
    kind = _MODULE_KINDS.get(type(module))
    extra = sorted(set(trained) - {"weight", "bias"})
    if kind is None or extra:
        raise GhostUnsupportedError(
            f"parameter {next(iter(trained.values()))!r} belongs to a {type(module).__name__}; ghost clipping "
            f"supports exactly nn.Linear, nn.Conv1d, nn.Conv2d, nn.LayerNorm, nn.GroupNorm and nn.Embedding (use "
            f"method='vmap').")
    shape = tuple(module.weight.shape)
    weight, bias = trained.get("weight"), trained.get("bias")
    if kind == "linear":
        return GhostLayer(name, kind, weight, bias, shape)
    if kind == "layer_norm":
        return GhostLayer(name, kind, weight, bias, shape, eps=module.eps, norm_shape=tuple(module.normalized_shape))
    if kind == "group_norm":
        return GhostLayer(name, kind, weight, bias, shape, groups=module.num_groups, eps=module.eps)
    if kind == "embedding":
        if module.max_norm is not None or module.scale_grad_by_freq or module.sparse:
            raise GhostUnsupportedError(
                f"nn.Embedding {name!r} has max_norm={module.max_norm!r}, scale_grad_by_freq="
                f"{module.scale_grad_by_freq!r}, sparse={module.sparse!r}; ghost clipping supports plain lookups "
                f"(use method='vmap').")
        return GhostLayer(name, kind, weight, None, shape, padding_idx=module.padding_idx)
    conv: nn.Conv1d | nn.Conv2d = module  # type: ignore[assignment]
    kernel, stride, dilation = tuple(conv.kernel_size), tuple(conv.stride), tuple(conv.dilation)
    padding = conv.padding
    if padding == "valid":
        padding = (0,) * len(kernel)
    elif padding == "same":  # stride 1 (PyTorch's rule); total d·(k-1), left half rounded down
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        padding = tuple(t // 2 for t in totals) if all(t % 2 == 0 for t in totals) else padding
    if conv.padding_mode != "zeros" or isinstance(padding, str):
        raise GhostUnsupportedError(
            f"{type(conv).__name__} {name!r} has padding={conv.padding!r}, padding_mode={conv.padding_mode!r}; ghost "
            f"clipping supports symmetric zero padding (use method='vmap').")
    if kind == "conv1d":  # a Conv2d of height 1
        kernel, stride, padding, dilation = (1, *kernel), (1, *stride), (0, *padding), (1, *dilation)
    return GhostLayer(name, kind, trained.get("weight"), trained.get("bias"), shape,
                      kernel, stride, tuple(padding), dilation, conv.groups)


def example_numel(layer: GhostLayer, out_shape: tuple[int, ...]) -> int:
    """Numbers one example holds in a ghost pass for ``layer``: its output gradient, its input as ``A`` (unfolded
    patches for a convolution) and the cheaper of its Gram or per-example weight gradient."""
    out = math.prod(out_shape)
    if layer.kind in ghost_direct.DIRECT_KINDS:
        return 3 * out
    p, d = layer.weight_shape[0], layer.groups * math.prod(layer.weight_shape[1:])
    t = max(1, out // p)
    return out + t * d + min(t * t, p * d // layer.groups)


def clients_per_pass(plan: Iterable[tuple[GhostLayer, tuple[int, ...]]], batch_size: int, element_size: int) -> int:
    """How many clients of ``batch_size`` examples one pass may hold within :data:`PASS_BUDGET` (at least 1)."""
    per_client = element_size * batch_size * sum(example_numel(layer, shape) for layer, shape in plan)
    return max(1, PASS_BUDGET // max(per_client, 1))


def in_client_groups(run: Callable, plan: list, params: dict[str, torch.Tensor], batch: dict[str, torch.Tensor],
                     keep: torch.Tensor) -> tuple:
    """``run(params, batch, keep) -> (sums, *per_client)`` on groups of the cohort's clients that fit
    :data:`PASS_BUDGET`, concatenated in client order (each client's result is its own: grouping changes no value
    beyond float rounding); ``per_client`` are tensors with the clients along their first dimension (the norms, …).
    """
    m = keep.shape[0]
    step = clients_per_pass(plan, keep.shape[1], next(iter(params.values())).element_size())
    if step >= m:
        return run(params, batch, keep)
    sums: dict[str, torch.Tensor] = {}
    per_client: list[torch.Tensor] = []
    for i in range(0, m, step):  # each group's results written into the cohort's tensors (no second copy)
        part_sums, *part_rest = run({k: v[i:i + step] for k, v in params.items()},
                                    {k: v[i:i + step] for k, v in batch.items()}, keep[i:i + step])
        if i == 0:
            sums = {k: v.new_empty((m, *v.shape[1:])) for k, v in part_sums.items()}
            per_client = [t.new_empty((m, *t.shape[1:])) for t in part_rest]
        for k, v in part_sums.items():
            sums[k][i:i + step] = v
        for whole, part in zip(per_client, part_rest):
            whole[i:i + step] = part
    return (sums, *per_client)


def layer_matrices(layer: GhostLayer, a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example ``A (N, T, D)`` and ``G (N, T, P)`` of one layer (``N`` examples, leading dims flattened).

    Args:
      layer: the layer.
      a: its input, ``(N, ..., D)`` for linear layers, ``(N, C_in, H, W)`` / ``(N, C_in, L)`` for convolutions.
      g: the gradient of the loss w.r.t. its output, ``(N, ..., P)``, ``(N, P, H_out, W_out)`` or ``(N, P, L_out)``.

    For a grouped convolution the columns of ``A`` and ``G`` are group-major (group ``j`` owns input columns
    ``j·D/g …`` and output columns ``j·P/g …``); see :func:`group_matrices`.
    """
    n = a.shape[0]
    if layer.kind == "linear":
        return a.reshape(n, -1, a.shape[-1]), g.reshape(n, -1, g.shape[-1])
    if layer.kind == "conv1d":
        a = a.unsqueeze(2)
    return _patches(layer, a).transpose(1, 2), g.flatten(2).transpose(1, 2)


def group_matrices(groups: int, mat_a: torch.Tensor, mat_g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split ``A (N, T, D)``, ``G (N, T, P)`` into ``(N·g, T, D/g)``, ``(N·g, T, P/g)``; row ``n·g+j``: group ``j``.

    A grouped convolution's input columns are group-major (``F.unfold`` orders them channel-first) and so are its
    output channels.
    """
    if groups == 1:
        return mat_a, mat_g
    n, t, d = mat_a.shape
    p = mat_g.shape[-1]

    def split(mat: torch.Tensor, c: int) -> torch.Tensor:
        return mat.reshape(n, t, groups, c // groups).transpose(1, 2).reshape(n * groups, t, c // groups)
    return split(mat_a, d), split(mat_g, p)


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
      channels_last: the weight terms' ``D`` columns are in ``(k_h, k_w, C)`` order (patches made by
        :mod:`trustfl.client.patch_conv`), not the weight's ``(C, k_h, k_w)``.
    """

    a: torch.Tensor | None
    g: torch.Tensor
    bias: torch.Tensor | None
    per_example: torch.Tensor | None
    channels_last: bool = False


def squared_norms(layer: GhostLayer, a: torch.Tensor, g: torch.Tensor,
                  columns: torch.Tensor | None = None) -> tuple[torch.Tensor, LayerTerms]:
    """Per-example squared gradient norm of one layer, summed over its trained parameters.

    Args:
      layer, a, g: as in :func:`layer_matrices`, with ``N`` examples.
      columns: a ``Conv2d``'s (``groups = 1``) patches ``A (N, T, k_h·k_w·C)`` already made by its forward
        (:func:`trustfl.client.patch_conv.patches`), used instead of unfolding ``a`` again.

    Returns:
      ``(sq, terms)``: ``sq[b] = ‖∇W_b‖² + ‖∇bias_b‖²`` of shape ``(N,)``, and the terms reused by
      :func:`weighted_grads` (including the materialised per-example weight gradients when that form was the cheaper
      one and fits :data:`MATERIALISE_BUDGET`).
    """
    if layer.kind in ghost_direct.DIRECT_KINDS:
        return _direct_norms(layer, a, g)
    if columns is not None:
        return _patch_norms(layer, columns, g)
    if layer.kind != "linear":  # one layout whatever the gradient's (a sum over a strided view rounds otherwise)
        g = g.contiguous()
    grouped = _by_grouped_convolution(layer, g)  # then the unfolded A is not needed
    mat_a, mat_g = (None, g.flatten(2).transpose(1, 2)) if grouped else layer_matrices(layer, a, g)
    bias = None if layer.bias is None else mat_g[:, 0] if mat_g.shape[1] == 1 else mat_g.sum(1)  # a view at T = 1
    sq = _sq(bias) if bias is not None else g.new_zeros(g.shape[0])
    if layer.weight is None:
        return sq, LayerTerms(None, mat_g, bias, None)
    if grouped:
        per_example = _conv_per_example_grads(layer, a, g)
        return sq + _sq(per_example.view(g.shape[0], -1)), LayerTerms(None, mat_g, bias, per_example)
    if layer.groups == 1:
        return _weight_norms(mat_a, mat_g, sq, bias)
    n, groups = mat_a.shape[0], layer.groups
    mat_a, mat_g = group_matrices(groups, mat_a, mat_g)
    weight_sq, terms = _weight_norms(mat_a, mat_g, mat_a.new_zeros(n * groups), None)
    return sq + weight_sq.view(n, groups).sum(1), LayerTerms(terms.a, terms.g, bias, terms.per_example)


def _patch_norms(layer: GhostLayer, columns: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, LayerTerms]:
    """:func:`squared_norms` of a ``Conv2d`` from its patches ``A (N, T, k_h·k_w·C)``; ``G (N, T, P)`` is ``g`` laid out
    channels-last (a view of the channels-last gradient a patched forward gets; one layout whatever ``g``'s, so the
    same bits)."""
    n, p = g.shape[:2]
    mat_g = g.permute(0, 2, 3, 1).contiguous().view(n, -1, p)
    bias = mat_g.sum(1) if layer.bias is not None else None
    sq = _sq(bias) if bias is not None else g.new_zeros(n)
    sq, terms = _weight_norms(columns, mat_g, sq, bias)
    return sq, LayerTerms(terms.a, terms.g, terms.bias, terms.per_example, channels_last=True)


GROUPED_MIN_KERNEL = 64
"""Fewest weights per output channel (``C_in/g · k_h · k_w``) for which the CPU computes a convolution's per-example
weight gradients by one grouped convolution backward (:func:`_by_grouped_convolution`)."""


def _by_grouped_convolution(layer: GhostLayer, g: torch.Tensor) -> bool:
    """Whether a convolution's per-example weight gradients come from one grouped convolution backward
    (:func:`_conv_per_example_grads`) instead of batched products of the unfolded matrices: on the CPU, when the
    materialised form is the cheaper one, fits :data:`MATERIALISE_BUDGET`, and each output channel has at least
    :data:`GROUPED_MIN_KERNEL` weights. ``benchmarks/conv_grads.md`` (one thread): 1.4–2.5× faster from 72 weights
    per channel (cnn_cafcor's and cnn_rhdp's second convolutions, 3×3 convolutions of 8–64 channels), 0.5–1.0× below
    (one-channel first convolutions, 3×3 over 3–4 channels). Not measured on CUDA, which keeps the products."""
    return grouped_form(layer, g.shape[0], math.prod(g.shape[2:]), g.device)


def grouped_form(layer: GhostLayer, n: int, t: int, device: torch.device) -> bool:
    """:func:`_by_grouped_convolution` for ``n`` examples of ``t`` output positions on ``device``."""
    if layer.kind == "linear" or layer.weight is None or device.type != "cpu":
        return False
    per_channel = math.prod(layer.weight_shape[1:])  # C_in/g · k_h · k_w
    return (per_channel >= GROUPED_MIN_KERNEL and t > 1
            and not _use_gram(t, per_channel, layer.weight_shape[0] // layer.groups)
            and n * per_channel * layer.weight_shape[0] <= MATERIALISE_BUDGET)


def _conv_per_example_grads(layer: GhostLayer, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Per-example weight gradients ``(N·g, P/g, D/g)`` (example-major, as :func:`group_matrices` orders them) of a
    convolution: the ``N`` examples become ``N·g`` groups of one convolution, whose weight gradient holds each
    example's (Rochette et al. 2019, arXiv:1912.06015)."""
    if layer.kind == "conv1d":
        a, g = a.unsqueeze(2), g.unsqueeze(2)
    n, c, h, w = a.shape
    p = g.shape[1]
    groups = layer.groups
    kh, kw = layer.kernel_size
    grads = torch.nn.grad.conv2d_weight(a.reshape(1, n * c, h, w), (n * p, c // groups, kh, kw),
                                        g.reshape(1, n * p, *g.shape[2:]), layer.stride, layer.padding,
                                        layer.dilation, n * groups)
    return grads.view(n * groups, p // groups, c // groups * kh * kw)


def _direct_norms(layer: GhostLayer, a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, LayerTerms]:
    """Normalisations: materialised per-example gradients; embeddings: the index-equality Gram form."""
    if layer.kind == "embedding":
        idx, grads = ghost_direct.embedding_terms(a, g, layer.padding_idx)
        return ghost_direct.embedding_squared_norms(idx, grads, MATERIALISE_BUDGET), LayerTerms(idx, grads, None, None)
    weight, bias = ghost_direct.norm_grads(layer.kind, layer.norm_shape or layer.weight_shape, layer.groups,
                                           layer.eps, a, g, layer.weight is not None, layer.bias is not None)
    sq = sum(_sq(t) for t in (weight, bias) if t is not None)
    return sq, LayerTerms(None, g, bias, weight)


def _weight_norms(mat_a: torch.Tensor, mat_g: torch.Tensor, sq: torch.Tensor,
                  bias: torch.Tensor | None) -> tuple[torch.Tensor, LayerTerms]:
    """``sq + ‖G_bᵀ A_b‖²`` for each row ``b`` by the cheapest form, and the terms for :func:`weighted_grads`; ``sq`` is
    the bias gradients' squared norms when ``bias`` is given (``‖G_b‖²`` itself when ``T = 1``, reused then)."""
    n, t, d = mat_a.shape
    p = mat_g.shape[-1]
    if t == 1:
        return sq + _sq(mat_a) * (sq if bias is not None else _sq(mat_g)), LayerTerms(mat_a, mat_g, bias, None)
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
      terms: from :func:`squared_norms`, with ``N = m·B`` examples ordered client-major (for a grouped convolution
        the weight terms hold ``N·g`` rows, example-major, as made by :func:`group_matrices`).
      coef: ``(m, B)`` weights (the clip factors; 0 for padding).

    Returns:
      ``{key: (m, *param_shape)}`` for the layer's weight and/or bias keys.
    """
    m, b = coef.shape
    groups = layer.groups
    out: dict[str, torch.Tensor] = {}
    if layer.kind in ghost_direct.NORM_KINDS:  # per-example (N, k) gradients: one weighted sum per client
        for key, grads in ((layer.weight, terms.per_example), (layer.bias, terms.bias)):
            if key is not None:
                out[key] = torch.bmm(coef.unsqueeze(1).to(grads.dtype), grads.view(m, b, -1)).reshape(
                    m, *layer.weight_shape)
        return out
    if layer.kind == "embedding":
        out[layer.weight] = ghost_direct.embedding_weighted(terms.a, terms.g, coef, layer.weight_shape[0])
        return out
    if layer.weight is not None:
        if terms.per_example is not None:  # (N·g, P/g, D/g), example-major: the weight layout per example
            w = torch.bmm(coef.unsqueeze(1), terms.per_example.reshape(m, b, -1))
        else:
            _, t, p = terms.g.shape  # per group: P/g output channels
            mat_a: torch.Tensor = terms.a  # type: ignore[assignment]
            d = mat_a.shape[-1]
            if groups == 1:
                scaled = terms.g * coef.reshape(-1, 1, 1)
                w = scaled.reshape(m, b * t, p).transpose(1, 2) @ mat_a.reshape(m, b * t, d)
            else:  # (m·g, B·T, ·): client-major, then group, then examples and positions
                scaled = terms.g * coef.reshape(-1).repeat_interleave(groups).view(-1, 1, 1)
                per_group = lambda x: x.reshape(m, b, groups, t, x.shape[-1]).transpose(1, 2).reshape(  # noqa: E731
                    m * groups, b * t, x.shape[-1])
                w = per_group(scaled).transpose(1, 2) @ per_group(mat_a)  # (m·g, P/g, D/g)
        if terms.channels_last:  # (m, P, k_h, k_w, C) → the weight's (m, P, C, k_h, k_w)
            p_out, c_in, kh, kw = layer.weight_shape
            w = w.reshape(m, p_out, kh, kw, c_in).permute(0, 1, 4, 2, 3)
        out[layer.weight] = w.reshape(m, *layer.weight_shape)
    if terms.bias is not None:
        p_all = terms.bias.shape[-1]
        out[layer.bias] = torch.bmm(coef.unsqueeze(1), terms.bias.view(m, b, p_all)).squeeze(1)  # type: ignore[index]
    return out
