"""The server of vertical FL: the labels, the head model and the cache of every party's last embeddings.

The server combines the fresh embeddings of the activated party ``m`` with its cached, possibly stale
embeddings ``H̃[k][I]`` of the other parties (DPZV eq. 5: the model it evaluates is ``{w_0^t, w_k^{t_k − τ_k}}``),
computes per-sample losses with its head and the labels, and updates the head by SGD with momentum (the DPZV
paper's option (ii)) or by its own two-point zeroth-order step (option (i), eq. 3). It sees only messages: the
activated party's embeddings and the sample IDs they belong to.
"""
from __future__ import annotations

from dataclasses import InitVar, dataclass, field

import torch
from torch import nn
from trustfl.objectives.base import AbstractObjective
from trustfl.vertical.functional import FlatForward


@dataclass
class Server:
    """The head's parameters ``params`` (its own copy; the engine writes them back into the run's vector), its
    momentum, the labels and the embedding cache, given party-major ``(M, D, d_h)`` and kept sample-major
    (``rows[i, k]``: sample ``i``, party ``k``) so that a minibatch's head inputs are one gather."""

    head: nn.Module
    params: torch.Tensor
    labels: torch.Tensor
    initial_cache: InitVar[torch.Tensor]
    objective: AbstractObjective
    lr: float
    momentum: float = 0.0
    forward: FlatForward = field(init=False, repr=False)
    velocity: torch.Tensor = field(init=False, repr=False)
    rows: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self, initial_cache: torch.Tensor) -> None:
        self.forward = FlatForward(self.head)
        self.velocity = torch.zeros_like(self.params)
        self.rows = initial_cache.permute(1, 0, 2).contiguous()

    @property
    def cache(self) -> torch.Tensor:
        """The cache party-major, ``(M, D, d_h)`` (a view)."""
        return self.rows.permute(1, 0, 2)

    @property
    def num_parties(self) -> int:
        return int(self.rows.shape[1])

    def inputs(self, ids: torch.Tensor, party: int, fresh: torch.Tensor) -> torch.Tensor:
        """Head inputs ``(K·B, M·d_h)``: the cached embeddings of samples ``ids`` with party ``party``'s slot
        replaced by each of the ``K`` fresh alternatives ``fresh`` ``(K, B, d_h)`` (differentiable in ``fresh``)."""
        k, b, dh = fresh.shape
        x = self.rows[ids].unsqueeze(0).expand(k, -1, -1, -1).clone()  # (K, B, M, d_h)
        x[:, :, party] = fresh
        return x.view(k * b, self.num_parties * dh)

    def losses(self, w: torch.Tensor, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Per-sample losses ``(K·B,)`` of head parameters ``w`` on inputs ``x`` built for ``ids`` by
        :meth:`inputs` (labels repeated ``K`` times)."""
        outputs = self.forward(w, x)
        y = self.labels[ids]
        return self.objective.losses(outputs, {"y": y.repeat(x.shape[0] // ids.numel(), *([1] * (y.dim() - 1)))})

    def leaf(self) -> torch.Tensor:
        """The head parameters as a leaf that gradients are taken with respect to (the server's own storage, so
        no party's in-place step can touch it)."""
        return self.params.detach().requires_grad_(True)

    def step(self, grad: torch.Tensor, ok: torch.Tensor) -> None:
        """SGD with heavy-ball momentum on the head; nothing changes where ``ok`` (a 0-dim bool) is false."""
        with torch.no_grad():
            cpu = self.params.device.type == "cpu"  # reading ``ok`` is free there: a branch, the same values
            if cpu and not bool(ok):
                return
            velocity = self.velocity * self.momentum + grad if self.momentum else grad
            if self.momentum:
                self.velocity.copy_(velocity if cpu else torch.where(ok, velocity, self.velocity))
            self.params.sub_(self.lr * velocity if cpu else torch.where(ok, self.lr * velocity,
                                                                         torch.zeros_like(velocity)))

    def remember(self, party: int, ids: torch.Tensor, embeddings: torch.Tensor, ok: torch.Tensor) -> None:
        """``H̃[party][ids] ← embeddings`` unless the message was rejected."""
        with torch.no_grad():
            if self.rows.device.type == "cpu":
                if bool(ok):
                    self.rows[ids, party] = embeddings
                return
            self.rows[ids, party] = torch.where(ok, embeddings, self.rows[ids, party])
