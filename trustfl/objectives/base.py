"""The objective interface: (model, parameters, batch) → per-example losses and the model's outputs.

A *batch* is a mapping of named tensors as the data set yields them (``"x"`` inputs, ``"y"`` targets of any dtype
and shape, extra views for self-supervised objectives), each with the example dimension first. Executors,
per-example gradient methods and evaluation all reach the loss through an objective, so a new learning problem
is a new objective, not a new engine.
"""
from __future__ import annotations

import abc
import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping

import torch
from torch import nn

from trustfl.core.functional import functional_call
from trustfl.core.registry import register, register_adapter
from trustfl.errors import ConfigError

Batch = Mapping[str, torch.Tensor]
LossFn = Callable[[torch.Tensor, Batch], torch.Tensor]


class AbstractObjective(abc.ABC):
    """Maps a model, its parameters and a batch to per-example losses.

    Attributes:
      task: what the targets are (``"classification"``, ``"regression"``, ``"multilabel"`` or ``"custom"``); it
        chooses the default evaluators and is checked against the data set by :meth:`check_data`.
      input_key: the batch entry fed to the model.
      batch_coupled: ``True`` when a client's batch loss is not a mean of per-example terms (e.g. the spectral
        contrastive loss, whose ‖R̂‖² couples the batch): executors then compute :meth:`client_loss` once per
        client (never on several clients' rows together), and per-example DP-SGD does not apply.
    """

    task: ClassVar[str] = "custom"
    input_key: ClassVar[str] = "x"
    batch_coupled: ClassVar[bool] = False
    reads_labels: ClassVar[bool] = True
    """Whether the loss reads the batch's labels (the self-supervised objectives do not: an attack poisoning labels
    is refused beside them)."""

    def forward(self, model: nn.Module, params: Mapping[str, torch.Tensor], batch: Batch) -> torch.Tensor:
        """The model's outputs for ``batch`` (a functional call, so it runs under ``vmap`` and ``grad``)."""
        return functional_call(model, params, (batch[self.input_key],))

    @abc.abstractmethod
    def losses(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Per-example losses ``(N,)`` from outputs ``(N, ...)`` and the batch (leading dimension ``N``)."""

    def loss_sum(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``Σ_n losses[n]`` (an objective may compute it in one fused call)."""
        return self.losses(outputs, batch).sum()

    def weighted_loss_grad(self, outputs: torch.Tensor, batch: Batch,
                           weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(losses (N,), ∂(Σ_n c_n ℓ_n)/∂outputs)`` for per-example weights ``c`` ``(N,)``: autograd on the
        outputs alone by default; an objective with a closed form overrides it (cross-entropy)."""
        with torch.enable_grad():
            leaf = outputs.detach().requires_grad_(True)
            losses = self.losses(leaf, batch)
            if not losses.requires_grad:  # detached, or an integer loss: torch's "does not require grad" in round 1
                raise ConfigError(f"objective {getattr(self, 'name', type(self).__name__)!r}: its losses "
                                  f"({losses.dtype}) do not depend differentiably on the model's outputs (detached, "
                                  f"or computed by argmax or integer ops); nothing could be trained.")
            (grad,) = torch.autograd.grad((losses * weights.to(losses.dtype)).sum(), [leaf])
        return losses.detach(), grad

    def autograd_loss_grad(self, outputs: torch.Tensor, batch: Batch,
                           weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What :meth:`weighted_loss_grad` returns, with the bits autograd gives for ``(ℓ · c).sum()`` (ghost
        clipping's closed-form pass matches its hooked pass, which runs autograd, bit for bit): the autograd form by
        default; cross-entropy calls autograd's own kernels without building a graph."""
        return AbstractObjective.weighted_loss_grad(self, outputs, batch, weights)

    def per_example(self, model: nn.Module, params: Mapping[str, torch.Tensor],
                    batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """``(losses (N,), outputs)`` of one client's batch."""
        outputs = self.forward(model, params, batch)
        return self.losses(outputs, batch), outputs

    def client_outputs(self, model: nn.Module, params: Mapping[str, torch.Tensor], batch: Batch,
                       personal: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """One client's outputs for :meth:`client_loss` (batch-coupled objectives): :meth:`forward` by default; an
        objective that also reads what the client holds beside its parameters (``personal``: the server's personal
        downlink and the objective's own local state, e.g. BYOL's target network) overrides it. Runs under
        ``vmap`` over clients."""
        return self.forward(model, params, batch)

    def local_state_init(self, params: Mapping[str, torch.Tensor], cohort: Any) -> dict[str, torch.Tensor]:
        """State the objective keeps during one round's local steps, stacked ``(m, ...)`` from the cohort's
        starting parameters ``params``; the executor passes it to :meth:`client_outputs` inside ``personal`` (so
        its keys must not collide with the downlink's). Default: none."""
        return {}

    def local_state_update(self, state: dict[str, torch.Tensor], params: Mapping[str, torch.Tensor],
                           active: torch.Tensor | None, batch: Batch | None = None,
                           mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The state after a local step that left the parameters at ``params``, on the step's cohort ``batch``
        (``(m, B, ...)`` per entry, ``mask`` ``(m, B)``: real rows); rows with ``active`` False (no step) must keep
        theirs. Default: unchanged."""
        return state

    def client_loss(self, outputs: torch.Tensor, batch: Batch, mask: torch.Tensor,
                    personal: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """One client's batch loss (a scalar) from its outputs ``(B, ...)``, its batch and ``mask`` ``(B,)``
        (nonzero: a real row; padding rows must not count). ``personal`` holds what the server sent this client
        alone (e.g. FedSC's R̃_{−j}), unstacked. Default: the masked mean of :meth:`losses`; runs under ``vmap``
        over clients, so no data-dependent control flow."""
        return masked_mean(self.losses(outputs, batch), mask)

    def check_data(self, targets: torch.Tensor, num_classes: int) -> None:
        """Raise ConfigError when the training targets cannot be what this objective expects."""
        return None

    def check_batch(self, batch: Batch, lead: tuple[int, ...]) -> None:
        """Raise ConfigError when a batch given to a direct call (leading dims ``lead``) lacks what the loss reads;
        no host read on a device. Default: the model's input."""
        if self.input_key not in batch:
            raise ConfigError(f"`batch` has no {self.input_key!r} entry (the model's input); found {sorted(batch)}.")

    def num_outputs(self, targets: torch.Tensor, num_classes: int) -> int:
        """How many outputs the model needs: the classes, or the size of one target."""
        return num_classes if num_classes >= 2 else max(1, math.prod(targets.shape[1:]))


@dataclass(frozen=True)
class LossObjective(AbstractObjective):
    """An objective from a plain function ``fn(outputs, batch) -> (N,) losses`` (a user's own objective)."""

    fn: LossFn
    name: str = "custom"

    def losses(self, outputs: torch.Tensor, batch: Batch) -> torch.Tensor:
        out = self.fn(outputs, batch)
        n = outputs.shape[0]
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (n,):
            found = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ConfigError(f"objective {self.name!r} must return one loss per example (shape ({n},)), found "
                              f"{found}.")
        return out


def register_objective(name: str) -> Callable[[LossFn], LossFn]:
    """Register ``fn(outputs, batch) -> per-example losses`` as the objective ``name``.

    Example:
      >>> import torch.nn.functional as F
      >>> @register_objective("huber_example")
      ... def huber(outputs, batch):
      ...     return F.huber_loss(outputs.squeeze(-1), batch["y"], reduction="none")
      >>> import trustfl
      >>> obj = trustfl.build("objective", "huber_example")
      >>> obj.losses(torch.zeros(2, 1), {"y": torch.tensor([0.5, 3.0])}).tolist()
      [0.125, 2.5]
    """

    def deco(fn: LossFn) -> LossFn:
        register("objective", name)(lambda: LossObjective(fn, name))
        return fn

    return deco


def _imported_objective(obj: Any, name: str) -> Callable[..., AbstractObjective]:
    """``objective = "pkg.mod:fn"``: an :class:`AbstractObjective` subclass is used as is; a plain function
    ``fn(outputs, batch, **params) -> (N,) losses`` becomes a :class:`LossObjective` (the table's parameters are
    passed to it on every call)."""
    if isinstance(obj, type) and issubclass(obj, AbstractObjective):
        return obj
    if not callable(obj):
        raise ConfigError(f"objective {name!r} is a {type(obj).__name__}, not a loss function or an objective class.")

    def factory(**params: Any) -> AbstractObjective:
        if params:  # a misspelt parameter: refused here, by name, not as a TypeError in round 1
            try:
                inspect.signature(obj).bind(None, None, **params)
            except TypeError as err:
                raise ConfigError(f"objective {name!r} takes (outputs, batch, ...) and cannot take the parameters "
                                  f"{sorted(params)}: {err}.") from None
            except ValueError:  # no signature to read (a builtin): the call will say
                pass
        fn = functools.partial(obj, **params) if params else obj
        return LossObjective(fn, name)
    return factory


register_adapter("objective", _imported_objective)


def match_targets(outputs: torch.Tensor, targets: torch.Tensor, who: str) -> torch.Tensor:
    """``outputs`` reshaped to the targets' shape (``(N, 1)`` outputs for ``(N,)`` targets); a model whose outputs
    do not hold one value per target coordinate is an error, never a silent broadcast."""
    if outputs.numel() != targets.numel():
        raise ConfigError(f"{who}: the model gives outputs of shape {tuple(outputs.shape)} for targets of shape "
                          f"{tuple(targets.shape)}; it needs one output per target coordinate.")
    return outputs.reshape(targets.shape)


def masked_mean(losses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The mean of ``losses`` over their last dimension's real rows (``mask`` nonzero, same shape), 0 where there are
    none: a client's batch loss, ``(..., B) -> (...)``."""
    w = mask.to(losses.dtype)
    return (losses * w).sum(-1) / w.sum(-1).clamp(min=1)


def flat_batch(batch: Batch, leading: int) -> dict[str, Any]:
    """Merge the first ``leading`` dimensions of every batch tensor (``(m, B, ...)`` → ``(m·B, ...)``)."""
    return {k: v.flatten(0, leading - 1) for k, v in batch.items()}


def view_pair(objective: str, batch: Batch, key: str = "views") -> torch.Tensor:
    """The batch's two views of every image, ``(B, 2, ...)`` under ``key`` (a ConfigError names ``objective``)."""
    views = batch[key]
    if views.dim() < 3 or views.shape[1] != 2:
        raise ConfigError(f"objective {objective!r} needs two views per image, (B, 2, ...) under {key!r}, found "
                          f"shape {tuple(views.shape)} (set `recipe.views` = 1).")
    return views


def view_pair_outputs(objective: str, model: nn.Module, params: Mapping[str, torch.Tensor], batch: Batch,
                      key: str = "views", **kwargs: Any) -> torch.Tensor:
    """The model's outputs ``(B, 2, ...)`` on both views of every image (:func:`view_pair`), in one call on the
    2B images; ``kwargs`` go to the model (e.g. ``output="predictor"``)."""
    views = view_pair(objective, batch, key)
    b = views.shape[0]
    return functional_call(model, params, (views.reshape(2 * b, *views.shape[2:]),), kwargs).reshape(b, 2, -1)
