"""Local training as a chain: gradient method → gradient transforms → local optimizer (optax style).

A gradient transform maps the cohort's stacked gradients ``{name: (m, ...)}`` to new ones, with explicit
per-round state (``init → apply* → finish``). A transform may keep per-client state between participations (in
the client state store, :meth:`AbstractGradientTransform.client_state_defaults`), send values beside the
message (``finish`` → extras) and own a server half (``server_init`` / ``downlink`` / ``server_update``), so an
algorithm such as SCAFFOLD is one part. Transforms see only rows of their own clients, their own state entries
and what the server sent.

The default chain reproduces ``torch.optim.SGD`` semantics: ``g ← g + λθ`` (weight decay),
``b ← μb + g`` (momentum), ``θ ← θ − η_l b``; rows whose client takes no step (``active = False``) are unchanged.
"""
from __future__ import annotations

import abc
import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch

from trustfl.client.gradients import AbstractGradientMethod
from trustfl.core.checks import FLOAT32_MAX, check_number, describe_value
from trustfl.core.rng import normal_rows
from trustfl.core.registry import component_name, of_trustfl, register
from trustfl.errors import ConfigError
from trustfl.types import CohortContext, ParamLayout, Params, RoundContext


def _rows(active: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return active.view(-1, *([1] * (like.dim() - 1)))


class AbstractGradientTransform(abc.ABC):
    """One step of local training between "compute a gradient" and "apply it".

    Attributes:
      privacy_noise: ``True`` for transforms whose only job is to add privacy noise.
    """

    privacy_noise: ClassVar[bool] = False
    personalizes: ClassVar[bool] = False
    """``True`` when :meth:`personalize` chooses where a client starts (FedU, FedEMA)."""

    def personalize(self, start: torch.Tensor, cohort: CohortContext) -> torch.Tensor:
        """Each client's flat starting model ``(m, d)`` from ``start`` (the received model, or what an earlier
        transform chose) and its own state; the message stays ``θ_local − θ_received``. Default: ``start``."""
        return start

    def client_state_defaults(self, params: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per-client entries this transform keeps between rounds, with the value of a client never seen;
        ``params`` is the flat global model (its size, dtype and device)."""
        return {}

    def extras_widths(self, layout: ParamLayout) -> dict[str, int]:
        """Flat width of every extra :meth:`finish` sends beside the message (the server screens them)."""
        return {}

    def init(self, params: Params, cohort: CohortContext) -> Any:
        """Round state for the cohort (generators, momentum buffers, corrections)."""
        return None

    @abc.abstractmethod
    def apply(self, grads: Params, state: Any, params: Params, active: torch.Tensor | None,
              cohort: CohortContext) -> tuple[Params, Any]:
        """Transform the stacked gradients; ``active`` (``None``: all) marks the rows that take this step."""

    def finish(self, state: Any, cohort: CohortContext, start: torch.Tensor, end: torch.Tensor,
               num_steps: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``(new client-state entries, extras sent beside the message)``, stacked, from the flat start and end
        parameters ``(m, d)`` and the steps taken ``(m,)``."""
        return {}, {}

    def server_init(self, params: torch.Tensor) -> Any:
        """State of the server half (``None``: this transform has none); ``params`` is the flat global model."""
        return None

    def downlink(self, server_state: Any) -> dict[str, torch.Tensor]:
        """What the server half sends every client beside the model, flat."""
        return {}

    def server_update(self, server_state: Any, extras: Mapping[str, torch.Tensor], ctx: RoundContext) -> Any:
        """Fold the accepted rows' extras into the server state."""
        return server_state


@register("gradient_transform", "dp_noise")
@dataclass(frozen=True)
class DPNoise(AbstractGradientTransform):
    """DP-SGD's noisy mean: ``g̃_i = (g_i + N(0, z_i² C² I)) / d_i`` (Abadi et al. 2016, Alg. 1).

    ``z_i`` is client ``i``'s noise multiplier; ``d_i = E|S_i|`` (its expected batch size) when
    ``divide_by_batch_size`` (after a clipped *sum*), else 1 (after CafCor's clipped mean). Client ``i``'s draws come
    from its own ``"dpsgd"`` generator, one tensor per parameter in order, every step.

    Args:
      clip: ``C``, the sensitivity of the incoming gradient.
      divide_by_batch_size: divide by ``E|S_i|``.
    """

    clip: float = 1.0
    divide_by_batch_size: bool = True
    privacy_noise: ClassVar[bool] = True

    def init(self, params, cohort):
        std = cohort.noise_multipliers.to(torch.float64) * self.clip
        divisor = cohort.batch_sizes if self.divide_by_batch_size else torch.ones(cohort.size,
                                                                                  device=cohort.batch_sizes.device)
        gens = [cohort.generator(i, "dpsgd") for i in range(cohort.size)]
        noisy = [i for i, s in enumerate(std.tolist()) if s > 0]  # the clients that draw
        return gens, noisy, std.to(divisor.device), divisor.to(torch.float32)

    def apply(self, grads, state, params, active, cohort):
        gens, noisy, std, divisor = state
        blank = torch.empty if len(noisy) == len(gens) else torch.zeros  # a noiseless client's rows stay 0
        noise = {name: blank(g.shape, dtype=g.dtype, device=g.device) for name, g in grads.items()} if noisy else {}
        normal_rows(list(noise.values()), gens, noisy)  # client i's stream, one tensor per parameter in order
        out: Params = {}
        for name, g in grads.items():
            shape = (-1, *([1] * (g.dim() - 1)))
            if noisy:
                g = g + noise[name].mul_(std.to(g.dtype).view(shape))
            out[name] = g / divisor.to(g.dtype).view(shape)
        return out, state


@register("gradient_transform", "proximal")
@dataclass(frozen=True)
class Proximal(AbstractGradientTransform):
    """FedProx's proximal term (Li et al. 2020, eq. 2): ``g ← g + μ (θ − θ^t)`` with ``θ^t`` the received model.

    Minimises ``h(θ) = F_k(θ) + (μ/2)‖θ − θ^t‖²`` locally; ``μ = 0`` is FedAvg.

    Args:
      mu: ``μ >= 0``.

    References:
      Li et al., *Federated optimization in heterogeneous networks*, MLSys 2020. https://arxiv.org/abs/1812.06127
    """

    mu: float = 0.01

    def __post_init__(self) -> None:
        check_number("mu", self.mu, low=0, high=FLOAT32_MAX, note="it scales float32 parameters")

    def init(self, params, cohort):
        return cohort.layout.unflatten(cohort.received["model"])

    def apply(self, grads, state, params, active, cohort):
        return {k: g.add(params[k] - state[k], alpha=self.mu) for k, g in grads.items()}, state


@register("gradient_transform", "weight_decay")
@dataclass(frozen=True)
class WeightDecay(AbstractGradientTransform):
    """L2 weight decay as in ``torch.optim.SGD``: ``g ← g + λθ``.

    Args:
      weight_decay: ``λ >= 0``.
    """

    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        check_number("weight_decay", self.weight_decay, low=0, high=FLOAT32_MAX, note="it scales float32 parameters")

    def apply(self, grads, state, params, active, cohort):
        return {k: g.add(params[k], alpha=self.weight_decay) for k, g in grads.items()}, state


@register("gradient_transform", "momentum")
@dataclass(frozen=True)
class Momentum(AbstractGradientTransform):
    """Heavy-ball momentum as in ``torch.optim.SGD``: ``b ← μb + g``, ``g ← b`` (buffers start at 0 each round).

    Args:
      momentum: ``μ`` in ``[0, 1)``.
    """

    momentum: float = 0.9

    def __post_init__(self) -> None:
        if not 0 <= self.momentum < 1:
            raise ConfigError(f"`momentum` must be in [0, 1), found {self.momentum!r}.")

    def init(self, params, cohort):
        return {k: torch.zeros_like(v) for k, v in params.items()}

    def apply(self, grads, state, params, active, cohort):
        new_state: Params = {}
        for k, g in grads.items():
            buf = state[k]
            new_buf = buf.mul(self.momentum).add_(g)
            if active is not None:
                new_buf = torch.where(_rows(active, g), new_buf, buf)
            new_state[k] = new_buf
        return dict(new_state), new_state


@dataclass(frozen=True)
class SGD:
    """The local optimizer: ``θ_i ← θ_i − η_l g_i`` in place, for active rows only."""

    lr: float

    def step(self, params: Params, grads: Params, active: torch.Tensor | None) -> None:
        gs = [grads[name] for name in params]
        if active is not None:  # where, not a product: an idle row's inf/NaN gradient cannot leak in
            gs = [torch.where(_rows(active, g), g, torch.zeros((), dtype=g.dtype)) for g in gs]
        torch._foreach_sub_(list(params.values()), gs, alpha=self.lr)  # torch.optim.SGD's multi-tensor update


@dataclass(frozen=True)
class LocalChain:
    """Gradient method, named gradient transforms and the local optimizer; what one local step runs.

    Client-state keys, extras and shared statistics of transform ``name`` are stored as ``"name/key"``; a
    transform sees its own keys without the prefix (and the received ``"model"``).
    """

    method: AbstractGradientMethod
    transforms: tuple[tuple[str, AbstractGradientTransform], ...]
    optimizer: SGD

    def __post_init__(self) -> None:
        names = [n for n, _ in self.transforms]
        if len(set(names)) != len(names) or any("/" in n for n in names):
            raise ConfigError(f"gradient transform names must be unique and contain no '/', found {names}.")

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.transforms]

    def client_state_defaults(self, params: torch.Tensor) -> dict[str, torch.Tensor]:
        return {f"{n}/{k}": v for n, t in self.transforms for k, v in t.client_state_defaults(params).items()}

    def _view(self, name: str, cohort: CohortContext) -> CohortContext:
        pre = f"{name}/"
        own = lambda d: {k[len(pre):]: v for k, v in d.items() if k.startswith(pre)}  # noqa: E731
        return dataclasses.replace(cohort, client_state=own(cohort.client_state),
                                   received={"model": cohort.received["model"], **own(cohort.received)})

    @property
    def personalizes(self) -> bool:
        return any(t.personalizes for _, t in self.transforms)

    def personalize(self, received: torch.Tensor, cohort: CohortContext) -> torch.Tensor:
        """The clients' flat starting models ``(m, d)``: the received model as each personalizing transform
        leaves it, in chain order."""
        start = received.unsqueeze(0).expand(cohort.size, -1)
        for name, t in self.transforms:
            if t.personalizes:
                out = t.personalize(start, self._view(name, cohort))
                if not of_trustfl(t) and not (isinstance(out, torch.Tensor) and out.shape == start.shape and
                                              out.is_floating_point() and out.device == start.device):
                    _refuse(t, "personalize", f"returned {describe_value(out)}", f"it must return the clients' flat "
                            f"starting models, a floating-point tensor of shape {tuple(start.shape)} on {start.device}")
                start = out
        return start

    def init(self, params: Params, cohort: CohortContext) -> dict[str, Any]:
        views = {n: self._view(n, cohort) for n, _ in self.transforms}
        return {"views": views, **{n: t.init(params, views[n]) for n, t in self.transforms}}

    def fused_sgd(self, model: torch.nn.Module, objective: Any, params: Params,
                  batch: Mapping[str, torch.Tensor]) -> Any:
        """The gradient method's fused SGD steps (:meth:`AbstractGradientMethod.fused_sgd`) when the chain is that
        method and plain SGD (no transforms), else ``None``: then every step runs the method's ``compute`` and
        :meth:`step`."""
        if self.transforms:
            return None
        return self.method.fused_sgd(model, objective, params, batch, self.optimizer.lr)

    def step(self, grads: Params, states: dict[str, Any], params: Params, active: torch.Tensor | None) -> None:
        """Run the transforms on ``grads`` and apply the optimizer to ``params`` in place."""
        for name, t in self.transforms:
            out = t.apply(grads, states[name], params, active, states["views"][name])
            if not of_trustfl(t):
                _check_apply(out, t, params)
            grads, states[name] = out
        self.optimizer.step(params, grads, active)

    def finish(self, states: dict[str, Any], start: torch.Tensor, end: torch.Tensor,
               num_steps: torch.Tensor) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        client_state: dict[str, torch.Tensor] = {}
        extras: dict[str, torch.Tensor] = {}
        for name, t in self.transforms:
            out = t.finish(states[name], states["views"][name], start, end, num_steps)
            if not of_trustfl(t):
                _check_finish(out, t, start)
            new, sent = out
            client_state.update({f"{name}/{k}": v for k, v in new.items()})
            extras.update({f"{name}/{k}": v for k, v in sent.items()})
        return client_state, extras

    # server halves
    def server_init(self, params: torch.Tensor) -> dict[str, Any]:
        return {n: s for n, t in self.transforms if (s := t.server_init(params)) is not None}

    def downlink(self, server_states: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        return {f"{n}/{k}": v for n, t in self.transforms if n in server_states
                for k, v in t.downlink(server_states[n]).items()}

    def server_update(self, server_states: Mapping[str, Any], extras: Mapping[str, torch.Tensor],
                      ctx: RoundContext) -> dict[str, Any]:
        out = dict(server_states)
        for n, t in self.transforms:
            if n in out:
                pre = f"{n}/"
                out[n] = t.server_update(out[n], {k[len(pre):]: v for k, v in extras.items() if k.startswith(pre)},
                                         ctx)
        return out

    def extras_widths(self, layout: ParamLayout) -> dict[str, int]:
        """Flat width of every extra the clients send (what the server screens them against)."""
        return {f"{n}/{k}": w for n, t in self.transforms for k, w in t.extras_widths(layout).items()}


def _refuse(t: AbstractGradientTransform, method: str, problem: str, must: str) -> None:
    raise ConfigError(f"{component_name('gradient_transform', t)} {problem} from {method}(); {must}.")


def _check_apply(out: Any, t: AbstractGradientTransform, params: Params) -> None:
    """Refuse what a gradient transform of your own returned from ``apply`` unless it is ``(grads, state)`` with one
    floating-point gradient per parameter, of the parameter's stacked shape and device (else a traceback in the
    optimizer, or a parameter left out)."""
    must = "it must return (gradients, state), the gradients a dict with one floating-point tensor per parameter, " \
           "of the parameter's shape (clients, ...) and device"
    if not isinstance(out, tuple) or len(out) != 2 or not isinstance(out[0], Mapping):
        _refuse(t, "apply", f"returned a {type(out).__name__}", must)
    grads = out[0]
    if set(grads) != set(params):
        missing, extra = sorted(set(params) - set(grads)), sorted(set(grads) - set(params), key=str)
        found = " and ".join(([f"no gradient for {missing}"] if missing else []) +
                             ([f"gradients for unknown {extra}"] if extra else []))
        _refuse(t, "apply", f"returned {found}", must)
    for k, p in params.items():
        g = grads[k]
        if not isinstance(g, torch.Tensor) or g.shape != p.shape or g.device != p.device or not g.is_floating_point():
            _refuse(t, "apply", f"returned gradient {k!r} = {describe_value(g)} for a parameter of {tuple(p.shape)} on "
                    f"{p.device}", must)


def _check_finish(out: Any, t: AbstractGradientTransform, start: torch.Tensor) -> None:
    """Refuse what a gradient transform of your own returned from ``finish`` unless it is two dicts of tensors with
    a row per client on the model's device: its client-state entries (each of the shape of its
    ``client_state_defaults`` entry) and its extras (``extras_widths`` wide)."""
    must = "it must return (client_state, extras), dicts of tensors with one row per client on the model's device: " \
           "the state entries shaped as in client_state_defaults(), the extras as wide as extras_widths() says"
    if not isinstance(out, tuple) or len(out) != 2 or not all(isinstance(d, Mapping) for d in out):
        _refuse(t, "finish", f"returned a {type(out).__name__}", must)
    m = start.shape[0]
    defaults = t.client_state_defaults(start[0]) if out[0] else {}
    for k, v in out[0].items():
        want = (m, *defaults[k].shape) if k in defaults else None
        if want is None or not isinstance(v, torch.Tensor) or v.shape != want or v.device != start.device:
            what = f"an undeclared client-state entry {k!r}" if want is None else \
                f"client-state entry {k!r} = {describe_value(v)} (expected {want})"
            _refuse(t, "finish", f"returned {what}", must)
    for k, v in out[1].items():
        if not isinstance(v, torch.Tensor) or v.ndim != 2 or v.shape[0] != m or v.device != start.device:
            _refuse(t, "finish", f"returned extra {k!r} = {describe_value(v)} for {m} clients", must)
