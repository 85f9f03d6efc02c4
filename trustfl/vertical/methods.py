"""One server iteration of each vertical FL method: the activated party's half, the server's half, the messages.

Every method gets the activated :class:`~trustfl.vertical.parties.Party`, the
:class:`~trustfl.vertical.server.Server` and the minibatch IDs ``I`` (``|I| = B``), and returns ``(ok, loss)``:
``ok`` is false when the party's message held a non-finite value (the message is rejected: the head, the cache and
the party do not move; a 0-dim tensor, so nothing waits for the device) and ``loss`` the mean training loss the
server saw. What crosses between the two halves is recorded in ``log`` when one is given (``(iteration, sender,
receiver, what, shape)``, tests read it).

- :class:`DPZV` (Alg. 1): two-point ZO perturbation ``w_m ± λu`` of the party's own parameters (eq. 6), per-sample
  loss differences ``δ_i = (f⁺_i − f⁻_i)/λ`` (eq. 7; ``/2λ`` as an option), clipped to ``[−C, C]``, averaged, one
  scalar Gaussian draw (eq. 8), the party's step ``w_m ← w_m − η_m·Δ·u`` (eq. 9).
- :class:`VAFL` (Chen et al. 2020): first order; the server returns ``∂L/∂h_m`` and the party back-propagates.
- :class:`ZOOVFL` (Zhang et al. 2021): ZO on the party's parameters with a one-sided difference and ``u`` on the
  unit sphere: ``w_m ← w_m − η_m·(d_m/λ)·[L(w + λu) − L(w)]·u``.
- :class:`CZOFO` (Wang et al. 2023, VFL-CZOFO): the server perturbs the embedding, ``δ = L(h + μv) − L(h)``, and
  the party back-propagates ``(d_h/μ)·δ·v`` (``v`` regenerated from the shared seed).

The baselines protect the party's embeddings (clip each row, add Gaussian noise:
:class:`~trustfl.vertical.parties.EmbeddingPrivacy`); DPZV protects the scalar the party receives.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from trustfl.core.rng import derive_seed
from trustfl.vertical.directions import direction, row_directions
from trustfl.vertical.parties import EmbeddingPrivacy, Party
from trustfl.vertical.server import Server

SERVER = "server"


@dataclass(frozen=True)
class Iteration:
    """Server iteration ``t`` of the run seeded ``seed``: every random draw is keyed by ``(seed, t, …)``."""

    seed: int
    t: int

    def seed_for(self, *keys: object) -> int:
        return derive_seed(self.seed, self.t, *keys)

    def generator(self, device: torch.device, *keys: object) -> torch.Generator:
        gen = torch.Generator(device=device)
        gen.manual_seed(self.seed_for(*keys))
        return gen


@dataclass
class VerticalMethod:
    """What one iteration does. ``channel`` says what the method's DP protects: ``"scalar"`` (the server's
    reply, DPZV) or ``"embedding"`` (each party's embeddings, the baselines); ``releases`` is how many protected
    messages one iteration makes."""

    party_lr: float
    log: list | None = field(default=None, repr=False)
    channel: ClassVar[str] = "embedding"
    releases: ClassVar[int] = 1
    embeddings_up: ClassVar[int] = 1
    down_floats_per_embedding: ClassVar[bool] = False

    def bytes_per_iteration(self, batch: int, embedding_dim: int) -> tuple[int, int]:
        """``(up, down)``: the party's embeddings (float32) and sample IDs (int64); the server's reply."""
        up = 4 * self.embeddings_up * batch * embedding_dim + 8 * batch
        down = 4 * batch * embedding_dim if self.down_floats_per_embedding else 4
        return up, down

    def _record(self, it: Iteration, sender: object, receiver: object, what: str, shape: tuple[int, ...]) -> None:
        if self.log is not None:
            self.log.append((it.t, sender, receiver, what, tuple(shape)))

    def iterate(self, it: Iteration, party: Party, server: Server,
                ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


def _finite(x: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(x).all()


def keep(ok: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x`` where the message was accepted, zeros where it was rejected. On a GPU a ``torch.where`` (nothing waits
    for the device); on the CPU, where reading ``ok`` costs nothing, a plain branch (the same values)."""
    if x.device.type == "cpu":
        return x if bool(ok) else torch.zeros_like(x)
    return torch.where(ok, x, torch.zeros_like(x))


@dataclass
class DPZV(VerticalMethod):
    """DPZV (Alg. 1). ``clip = inf`` disables clipping; ``noise_std`` is σ_dp of eq. 8 (0: no noise)."""

    smoothing: float = 1e-3
    clip: float = 10.0
    noise_std: float = 0.0
    difference: str = "lambda"
    direction_kind: str = "sphere"
    server_update: str = "sgd"
    channel: ClassVar[str] = "scalar"
    embeddings_up: ClassVar[int] = 2

    def iterate(self, it, party, server, ids):
        m, lam = party.index, self.smoothing
        seed = it.seed_for(m, "direction")
        scale = party.scale(seed, self.direction_kind)
        rows = party.rows(ids)
        party.perturb(seed, lam * scale)  # MeZO in place: +λu, −2λu, +λu (§2.4)
        h_plus = party.embed(rows)
        party.perturb(seed, -2 * lam * scale)
        h_minus = party.embed(rows)
        party.perturb(seed, lam * scale)
        if self.log is not None:
            self._record(it, m, SERVER, "embeddings", (2, *h_plus.shape))
            self._record(it, m, SERVER, "sample_ids", tuple(ids.shape))
        # -- server --
        fresh = torch.stack([h_plus, h_minus])
        ok = _finite(fresh)
        fresh = keep(ok, fresh)
        sgd = self.server_update == "sgd"
        w = server.leaf() if sgd else server.params
        with torch.set_grad_enabled(sgd):
            losses = server.losses(w, server.inputs(ids, m, fresh), ids)
        f_plus, f_minus = losses.detach().view(2, -1)
        deltas = (f_plus - f_minus) / (lam if self.difference == "lambda" else 2 * lam)  # eq. 7
        ok = ok & _finite(deltas)
        if self.clip < torch.finfo(deltas.dtype).max:  # a larger C clips no finite value (and overflows clamp)
            deltas = deltas.clamp(-self.clip, self.clip)  # symmetric clipping (the sensitivity 2C/B needs it)
        reply = deltas.mean()
        if self.noise_std > 0:
            gen = it.generator(reply.device, "dp_noise")
            reply = reply + self.noise_std * torch.randn((), generator=gen, device=reply.device, dtype=reply.dtype)
        reply = keep(ok, reply)
        self._record(it, SERVER, m, "scalar", ())
        middle = fresh.mean(dim=0)
        if sgd:
            (grad,) = torch.autograd.grad(losses.mean(), w)
        else:
            grad = self._zeroth_order_head(it, server, ids, m, middle)
        server.step(keep(ok, grad), ok)
        server.remember(m, ids, middle, ok)
        # -- party (eq. 9) --
        party.perturb(seed, -self.party_lr * reply * scale)
        return ok, losses.detach().mean()

    def _zeroth_order_head(self, it, server, ids, m, middle):
        """The server's option (i): eq. 3 on the head, ``g = [f(w_0 + λu) − f(w_0 − λu)]/(2λ)·u``."""
        lam, seed = self.smoothing, it.seed_for("server_direction")
        u = direction(server.params.numel(), seed, "sphere", server.params.device, server.params.dtype)
        x = server.inputs(ids, m, middle[None])
        with torch.no_grad():
            f_plus = server.losses(server.params + lam * u, x, ids).mean()
            f_minus = server.losses(server.params - lam * u, x, ids).mean()
        return (f_plus - f_minus) / (2 * lam) * u


def _first_order_message(method: VerticalMethod, it: Iteration, party: Party, ids: torch.Tensor,
                         privacy: EmbeddingPrivacy) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The party half of VAFL and VFL-CZOFO: ``(w, clipped, message, ok)``, its embedding as a function of the leaf
    ``w``, clipped (differentiable), the message sent (clipped and noised), and whether it is finite."""
    m = party.index
    h, w = party.embed_with_graph(ids)
    clipped = privacy.clip_rows(h)
    message = privacy.noise(clipped.detach(), it.generator(h.device, m, "embedding_noise"))
    method._record(it, m, SERVER, "embeddings", (1, *message.shape))
    method._record(it, m, SERVER, "sample_ids", tuple(ids.shape))
    return w, clipped, message, _finite(message)


def _difference_reply(method: VerticalMethod, it: Iteration, server: Server, ids: torch.Tensor, m: int,
                      pair: torch.Tensor, ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The server half of ZOO-VFL and VFL-CZOFO: the batch losses at the two embeddings ``pair[0]`` (the party's
    own) and ``pair[1]`` (perturbed), the reply ``L(pair[1]) − L(pair[0])``, the head's SGD step at ``pair[0]``,
    which the cache keeps. Returns ``(reply, ok, loss at pair[0])``."""
    wh = server.leaf()
    losses = server.losses(wh, server.inputs(ids, m, pair), ids).view(2, -1)
    reply = (losses[1] - losses[0]).detach().mean()
    ok = ok & _finite(reply)
    reply = keep(ok, reply)
    method._record(it, SERVER, m, "scalar", ())
    (grad,) = torch.autograd.grad(losses[0].mean(), wh)
    server.step(keep(ok, grad), ok)
    server.remember(m, ids, pair[0], ok)
    return reply, ok, losses[0].detach().mean()


def _send_embedding(privacy: EmbeddingPrivacy, h: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    return privacy.noise(privacy.clip_rows(h).detach(), gen)


@dataclass
class VAFL(VerticalMethod):
    """VAFL: the server returns the gradient of the batch loss with respect to the party's embedding."""

    privacy: EmbeddingPrivacy = field(default_factory=EmbeddingPrivacy)
    down_floats_per_embedding: ClassVar[bool] = True

    def iterate(self, it, party, server, ids):
        m = party.index
        w, clipped, message, ok = _first_order_message(self, it, party, ids, self.privacy)
        received = keep(ok, message).requires_grad_(True)
        wh = server.leaf()
        losses = server.losses(wh, server.inputs(ids, m, received[None]), ids)
        grad_head, grad_h = torch.autograd.grad(losses.mean(), [wh, received])
        ok = ok & _finite(grad_h)
        server.step(keep(ok, grad_head), ok)
        server.remember(m, ids, received.detach(), ok)
        grad_h = keep(ok, grad_h)
        self._record(it, SERVER, m, "embedding_gradient", tuple(grad_h.shape))
        party.backward_step(clipped, w, grad_h, self.party_lr)
        return ok, losses.detach().mean()


@dataclass
class ZOOVFL(VerticalMethod):
    """ZOO-VFL: ``u`` on the unit sphere of the party's parameters, the one-sided difference of the batch
    loss, ``w_m ← w_m − η_m·(d_m/λ)·δ·u``; both embedding batches are released (two DP releases)."""

    smoothing: float = 1e-3
    privacy: EmbeddingPrivacy = field(default_factory=EmbeddingPrivacy)
    releases: ClassVar[int] = 2
    embeddings_up: ClassVar[int] = 2

    def iterate(self, it, party, server, ids):
        m, lam = party.index, self.smoothing
        seed = it.seed_for(m, "direction")
        scale = party.scale(seed, "unit_sphere")
        rows = party.rows(ids)
        h0 = party.embed(rows)
        party.perturb(seed, lam * scale)
        h1 = party.embed(rows)
        party.perturb(seed, -lam * scale)
        sent = torch.stack([_send_embedding(self.privacy, h0, it.generator(h0.device, m, "embedding_noise")),
                            _send_embedding(self.privacy, h1, it.generator(h0.device, m, "embedding_noise_2"))])
        self._record(it, m, SERVER, "embeddings", tuple(sent.shape))
        self._record(it, m, SERVER, "sample_ids", tuple(ids.shape))
        ok = _finite(sent)
        sent = keep(ok, sent)
        reply, ok, loss = _difference_reply(self, it, server, ids, m, sent, ok)
        party.perturb(seed, -self.party_lr * (party.num_params / lam) * reply * scale)
        return ok, loss


@dataclass
class CZOFO(VerticalMethod):
    """VFL-CZOFO: the server's zeroth-order estimate of ``∂L/∂h_m`` along ``v`` (rows on the unit sphere of
    R^{d_h}), sent as one scalar; the party back-propagates ``(d_h/μ)·δ·v`` through its own model."""

    embedding_smoothing: float = 1e-3
    privacy: EmbeddingPrivacy = field(default_factory=EmbeddingPrivacy)

    def iterate(self, it, party, server, ids):
        m, mu = party.index, self.embedding_smoothing
        w, clipped, message, ok = _first_order_message(self, it, party, ids, self.privacy)
        message = keep(ok, message)
        rows, dh = message.shape
        device, dtype = message.device, message.dtype
        v = row_directions(rows, dh, it.generator(device, m, "embedding_direction"), device, dtype)
        reply, ok, loss = _difference_reply(self, it, server, ids, m, torch.stack([message, message + mu * v]), ok)
        v_party = row_directions(rows, dh, it.generator(device, m, "embedding_direction"), device, dtype)
        party.backward_step(clipped, w, (dh / mu) * reply * v_party, self.party_lr)
        return ok, loss


__all__ = ["CZOFO", "DPZV", "Iteration", "VAFL", "VerticalMethod", "ZOOVFL"]
