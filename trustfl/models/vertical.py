"""The model of vertical (feature-partitioned) FL: one party model per feature block and a server head.

Party ``m`` maps its own columns ``ξ_m`` of an example to an embedding ``h_m = h(w_m; ξ_m)``; the server's head
maps the concatenated embeddings ``[h_1, …, h_M]`` to the outputs (DPZV eq. 1: ``F(w) = (1/D)·Σ_i L(w_0, h_{1,i},
…, h_{M,i}; y_i)``). :class:`VerticalModel` is the whole composition as one ``nn.Module``: evaluation, the flat
parameter vector a run checkpoints, and ``model.pt`` treat it like any other model. During training the vertical
engine never runs it whole: each party runs only ``parties[m]`` on its own columns, and the server only ``head``.

Parameters are ordered ``parties.0.*, …, parties.{M−1}.*, head.*``, so every party's parameters are one contiguous
slice of the flat vector (:meth:`VerticalModel.slices`).
"""
from __future__ import annotations

import math
import numbers
from typing import Sequence

import torch
from torch import nn

from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.models.pooling import max_pool2d
from trustfl.models.zoo import check_input_shape, check_outputs, check_sizes

PARTY_MODELS = ("mlp", "cnn")


def _mlp(sizes: Sequence[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class StripCNN(nn.Module):
    """A party's small CNN on its strip of image rows: conv 3×3 (``channels``) → ReLU → max-pool 2 → linear to
    the embedding → ReLU (the DPZV paper's "two-layer CNN" in small)."""

    def __init__(self, rows: int, width: int, embedding_dim: int, channels: int = 8) -> None:
        super().__init__()
        self.rows, self.width = rows, width
        self.pool = rows >= 2 and width >= 2
        self.conv = nn.Conv2d(1, channels, 3, padding=1)
        out_rows, out_width = (rows // 2, width // 2) if self.pool else (rows, width)
        self.fc = nn.Linear(channels * out_rows * out_width, embedding_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.relu(self.conv(x.reshape(x.shape[0], 1, self.rows, self.width)))
        z = max_pool2d(z, 2) if self.pool else z
        return torch.relu(self.fc(z.flatten(1)))


@register("model", "vertical")
class VerticalModel(nn.Module):
    """M party models over disjoint feature blocks and a head over their concatenated embeddings.

    Args:
      input_shape: the shape of one example (flattened to ``d`` features).
      num_classes: the head's outputs.
      blocks: M disjoint lists of column indices into the flattened example (the feature split).
      party: ``"mlp"`` (``d_m → party_hidden… → embedding_dim``, ReLU) or ``"cnn"`` (:class:`StripCNN`; needs
        blocks that are whole image rows, with ``width`` columns each).
      party_hidden: hidden widths of the party MLP.
      embedding_dim: d_h, the width of every party's embedding.
      head_hidden: hidden widths of the head (the DPZV paper's two-layer head: one hidden layer).
      width: the row length of the images for ``party = "cnn"`` (0: the last dimension of ``input_shape``).
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int, blocks: Sequence[Sequence[int]],
                 party: str = "mlp", party_hidden: Sequence[int] = (64,), embedding_dim: int = 16,
                 head_hidden: Sequence[int] = (64,), width: int = 0) -> None:
        super().__init__()
        if party not in PARTY_MODELS:
            raise ConfigError(f"`model.party` must be one of {', '.join(map(repr, PARTY_MODELS))}, found {party!r}.")
        if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) or embedding_dim < 1:
            raise ConfigError(f"`model.embedding_dim` must be an integer >= 1, found {embedding_dim!r}.")
        party_hidden = check_sizes("party_hidden", party_hidden, allow_empty=True)
        head_hidden = check_sizes("head_hidden", head_hidden, allow_empty=True)
        input_shape = check_input_shape(input_shape)
        num_features = int(math.prod(input_shape))
        if not isinstance(blocks, Sequence) or isinstance(blocks, str) or not blocks or any(
                not isinstance(cols, Sequence) or isinstance(cols, str) or not cols
                or any(isinstance(c, bool) or not isinstance(c, numbers.Integral) or not 0 <= c < num_features
                       for c in cols) for cols in blocks):
            raise ConfigError(f"`blocks` must be a non-empty list of non-empty lists of column indices in "
                              f"[0, {num_features}), found {blocks!r}.")
        if isinstance(width, bool) or not isinstance(width, int) or width < 0:
            raise ConfigError(f"`model.width` must be an integer >= 0 (0: the input's last dimension), found "
                              f"{width!r}.")
        width = width or int(input_shape[-1])
        parties: list[nn.Module] = []
        for m, cols in enumerate(blocks):
            if party == "cnn":
                if len(cols) % width:
                    raise ConfigError(f"`model.party` = \"cnn\" needs whole image rows of {width} columns, but party "
                                      f"{m} holds {len(cols)} columns.")
                parties.append(StripCNN(len(cols) // width, width, embedding_dim))
            else:
                parties.append(_mlp([len(cols), *party_hidden, embedding_dim], last_relu=True))
        self.parties = nn.ModuleList(parties)
        self.head = _mlp([len(blocks) * embedding_dim, *head_hidden, check_outputs(num_classes)], last_relu=False)
        self.embedding_dim = embedding_dim
        self.num_features = num_features
        for m, cols in enumerate(blocks):
            self.register_buffer(f"block_{m}", torch.as_tensor(list(cols), dtype=torch.long), persistent=False)

    @property
    def num_parties(self) -> int:
        return len(self.parties)

    def block(self, m: int) -> torch.Tensor:
        """Party ``m``'s column indices."""
        return getattr(self, f"block_{m}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(1)
        embeddings = [party(flat[:, self.block(m)]) for m, party in enumerate(self.parties)]
        return self.head(torch.cat(embeddings, dim=1))

    def slices(self) -> list[slice]:
        """Each party's slice of the flat parameter vector, then the head's (``M + 1`` slices)."""
        out, start = [], 0
        for module in [*self.parties, self.head]:
            size = sum(p.numel() for p in module.parameters())
            out.append(slice(start, start + size))
            start += size
        return out
