"""A party of vertical FL: its own columns of the training set, its own model slice, nothing else.

A :class:`Party` holds the features ``ξ_m`` of every training sample (the columns of its feature block; sample
IDs are aligned across parties), a view of its parameters ``w_m`` in the run's flat parameter vector and its own
optimizer state. It never sees the labels, the head, or another party's features or embeddings: what it gets from
the server is a scalar (DPZV, ZOO-VFL, VFL-CZOFO) or the gradient of the loss with respect to its own embedding
(VAFL). The operations here are the party halves of :mod:`trustfl.vertical.methods`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from trustfl.vertical.directions import add_direction, direction_scale
from trustfl.vertical.functional import FlatForward


@dataclass
class EmbeddingPrivacy:
    """Clip each sample's embedding to L2 norm ``clip`` and add N(0, ``noise_std``²) to every coordinate (the
    baselines' DP, following VAFL); ``clip = inf`` and ``noise_std = 0``: the embedding is sent as it is."""

    clip: float = float("inf")
    noise_std: float = 0.0

    @property
    def active(self) -> bool:
        return self.clip != float("inf") or self.noise_std > 0

    def clip_rows(self, h: torch.Tensor) -> torch.Tensor:
        """Differentiable row clipping ``h·min(1, C/‖h‖)``."""
        if self.clip >= torch.finfo(h.dtype).max:  # clips no finite row (and would overflow clamp_min)
            return h
        norms = h.norm(dim=1, keepdim=True)
        return h * (self.clip / norms.clamp_min(self.clip))

    def noise(self, h: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if self.noise_std == 0:
            return h
        return h + self.noise_std * torch.randn(h.shape, generator=generator, device=h.device, dtype=h.dtype)


@dataclass
class Party:
    """Party ``index``: its flat parameters (a view into the run's vector), its features, and the forward pass of
    its model on them."""

    index: int
    params: torch.Tensor
    features: torch.Tensor
    forward: FlatForward
    momentum: float = 0.0
    velocity: torch.Tensor | None = field(default=None, repr=False)
    direction_cache: dict = field(default_factory=dict, repr=False)
    """The current direction's single chunk, for a model within one chunk (:mod:`trustfl.vertical.directions`)."""

    @classmethod
    def of(cls, index: int, module: nn.Module, params: torch.Tensor, features: torch.Tensor,
           momentum: float = 0.0) -> "Party":
        return cls(index, params, features, FlatForward(module), momentum)

    @property
    def num_params(self) -> int:
        return self.params.numel()

    # -- forward passes ---------------------------------------------------------------------------------------
    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """``ξ_{m,I}``: the party's own features of the samples ``ids``."""
        return self.features[ids]

    def embed(self, rows: torch.Tensor) -> torch.Tensor:
        """``h(w_m; ξ)`` without a graph, for features ``rows`` (``self.rows(ids)``)."""
        with torch.no_grad():
            return self.forward(self.params, rows)

    def embed_with_graph(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(h, w)``: the embedding as a function of a leaf copy ``w`` of the parameters, for a backward pass."""
        w = self.params.detach().clone().requires_grad_(True)  # own version counter: the server's in-place
        # update of its slice of the same vector must not invalidate this graph
        h = self.forward(w, self.features[ids])
        return h, w

    # -- zeroth-order (DPZV eq. 6 and 9; ZOO-VFL) -----------------------------------------------------------------
    def perturb(self, seed: int, coefficient: torch.Tensor) -> None:
        """``w_m += coefficient·g(seed)`` in place (``g`` regenerated, never stored)."""
        add_direction(self.params, seed, coefficient, self.direction_cache)

    def scale(self, seed: int, kind: str) -> torch.Tensor:
        return direction_scale(self.params, seed, kind, self.direction_cache)

    # -- first order (VAFL, VFL-CZOFO) --------------------------------------------------------------------------
    def backward_step(self, h: torch.Tensor, w: torch.Tensor, grad_h: torch.Tensor, lr: float) -> None:
        """Back-propagate ``grad_h`` through the party's own forward (``h`` of leaf ``w``) and take an SGD step
        (heavy-ball momentum when ``momentum`` > 0)."""
        (grad,) = torch.autograd.grad(h, w, grad_h)
        with torch.no_grad():
            if self.momentum:
                if self.velocity is None:
                    self.velocity = torch.zeros_like(self.params)
                self.velocity.mul_(self.momentum).add_(grad)
                grad = self.velocity
            self.params.sub_(lr * grad)
