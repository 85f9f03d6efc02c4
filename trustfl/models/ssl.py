"""Encoder + projector networks for self-supervised learning (the FedSC paper's f and g).

``forward(x)`` returns the projector output z = g(f(x)) ∈ ℝ^H, on which the spectral contrastive loss and the shared
correlation matrices are computed; ``forward(x, output="backbone")`` returns the backbone features f(x), which the
linear probe reads (the FedSC paper's evaluation). With ``predictor`` (a list of hidden widths) the model also has
a predictor q (Linear–ReLU–Linear, H → H; BYOL's and FedX's) and ``forward(x, output="predictor")`` returns
q(g(f(x))), ``output="projector_predictor"`` both z and q(z) concatenated ``(…, 2H)`` in one pass. Both models
ignore ``num_classes`` (there is no classifier head).

- ``sc_mlp``: flatten → MLP backbone (ReLU after every layer) → projector Linear–ReLU–Linear.
- ``sc_cnn``: a small CNN for grey-scale images of any side >= 4 (10×10 canvases, 28×28 MNIST): three 3×3
  convolutions (the last two with stride 2), global average pooling, one linear layer to the feature size; then the
  projector.

Example:
  >>> net = SCMLP((1, 10, 10), 10, hidden=(32,), projector=(16,), dim=8)
  >>> tuple(net(torch.zeros(2, 1, 10, 10)).shape), tuple(net(torch.zeros(2, 1, 10, 10), output="backbone").shape)
  ((2, 8), (2, 32))
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.models.zoo import check_input_shape, check_sizes

OUTPUTS = ("projector", "backbone", "predictor", "projector_predictor")
PREDICTOR = "predictor."
"""Prefix of the predictor's parameter names; every other parameter belongs to the encoder (backbone, projector)."""
INITS = ("default", "he")
"""``model.init``: PyTorch's default initialisation, or He-normal weights (fan-in, ReLU gain) with zero biases."""


def _projector(width: int, hidden: Sequence[int], dim: int) -> nn.Sequential:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
        raise ConfigError(f"`model.dim` (H, the representation size) must be a positive integer, found {dim!r}.")
    layers: list[nn.Module] = []
    for a, b in zip([width, *hidden], hidden):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(([width, *hidden])[-1], dim))
    return nn.Sequential(*layers)


def in_encoder(name: str) -> bool:
    """Whether parameter ``name`` of an encoder + projector (+ predictor) model belongs to the encoder."""
    return not name.startswith(PREDICTOR)


def _check_init(init: str) -> str:
    if init not in INITS:
        raise ConfigError(f"`model.init` must be one of {INITS}, found {init!r}.")
    return init


class _EncoderProjector(nn.Module):
    backbone: nn.Module
    projector: nn.Module
    predictor: nn.Module | None
    init: str = "default"

    def _add_predictor(self, predictor: Sequence[int] | None, dim: int) -> None:
        """BYOL's predictor H → hidden… → H after the projector (registered last: its parameters come last)."""
        self.predictor = None if predictor is None else _projector(dim, check_sizes("predictor", predictor, True),
                                                                   dim)

    def init_weights(self, generator: torch.Generator) -> None:
        """With ``init = "he"``: every Linear/Conv weight ~ N(0, 2/fan_in), every bias 0 (drawn from ``generator``
        in registration order; called by :func:`trustfl.models.zoo.build_model`). Without a centred input, the
        default initialisation's biases make z(x) almost the same vector for every input, the SC loss's trivial
        stationary point (docs/papers/fedsc.md, "Results")."""
        if self.init != "he":
            return
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu", generator=generator)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor, output: str = "projector") -> torch.Tensor:
        h = self.backbone(x)
        if output == "backbone":
            return h
        if output == "projector":
            return self.projector(h)
        if output == "predictor" and self.predictor is not None:
            return self.predictor(self.projector(h))
        if output == "projector_predictor" and self.predictor is not None:  # (…, 2H): z and q(z) in one pass
            z = self.projector(h)
            return torch.cat([z, self.predictor(z)], dim=-1)
        raise ConfigError(f"`output` must be one of {OUTPUTS if self.predictor is not None else OUTPUTS[:2]}, "
                          f"found {output!r}.")


@register("model", "sc_mlp")
class SCMLP(_EncoderProjector):
    """MLP encoder + projector: flatten → [Linear–ReLU] × len(hidden) → projector (Linear–ReLU)* → Linear(H).

    Args:
      hidden: the backbone's layer widths (the last is the feature size; default 256, 128).
      projector: the projector's hidden widths (default 128). dim: H (default 64).
      init: ``"default"`` (PyTorch's) or ``"he"`` (He-normal weights, zero biases; :data:`INITS`).
      predictor: BYOL's predictor hidden widths (e.g. ``[128]``); ``None``: no predictor.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int = 0, hidden: Sequence[int] = (256, 128),
                 projector: Sequence[int] = (128,), dim: int = 64, init: str = "default",
                 predictor: Sequence[int] | None = None) -> None:
        super().__init__()
        self.init = _check_init(init)
        sizes = [int(math.prod(check_input_shape(input_shape))), *check_sizes("hidden", hidden)]
        layers: list[nn.Module] = [nn.Flatten()]
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.backbone = nn.Sequential(*layers)
        self.projector = _projector(sizes[-1], check_sizes("projector", projector, True), dim)
        self._add_predictor(predictor, dim)


class _MeanPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


@register("model", "sc_cnn")
class SCCNN(_EncoderProjector):
    """Small CNN encoder + projector for grey-scale (or C-channel) images ``(C, S, S)``, S >= 4.

    Conv(C→c₁, 3, pad 1)–ReLU–Conv(c₁→c₂, 3, stride 2, pad 1)–ReLU–Conv(c₂→c₂, 3, stride 2, pad 1)–ReLU–mean pool
    –Linear(c₂→features)–ReLU, then the projector.

    Args:
      channels: (c₁, c₂) (default 32, 64). features: the backbone's output size (default 128).
      projector: the projector's hidden widths (default 128). dim: H (default 64).
      init: ``"default"`` or ``"he"`` (:data:`INITS`). predictor: as for ``sc_mlp``.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int = 0, channels: Sequence[int] = (32, 64),
                 features: int = 128, projector: Sequence[int] = (128,), dim: int = 64,
                 init: str = "default", predictor: Sequence[int] | None = None) -> None:
        super().__init__()
        self.init = _check_init(init)
        shape = check_input_shape(input_shape)
        if len(shape) != 3 or shape[1] < 4 or shape[2] < 4:
            raise ConfigError(f"model 'sc_cnn' needs images (C, H, W) with H, W >= 4, found input shape {shape}.")
        sizes = check_sizes("channels", channels)
        if len(sizes) != 2:  # a third width would be ignored
            raise ConfigError(f"`model.channels` must hold two positive integers, found {channels!r}.")
        c1, c2 = sizes
        if isinstance(features, bool) or not isinstance(features, int) or features < 1:
            raise ConfigError(f"`model.features` must be a positive integer, found {features!r}.")
        self.backbone = nn.Sequential(
            nn.Conv2d(shape[0], c1, 3, padding=1), nn.ReLU(),
            nn.Conv2d(c1, c2, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(c2, c2, 3, stride=2, padding=1), nn.ReLU(),
            _MeanPool(), nn.Linear(c2, features), nn.ReLU())
        self.projector = _projector(features, check_sizes("projector", projector, True), dim)
        self._add_predictor(predictor, dim)
