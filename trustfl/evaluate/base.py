"""The evaluator interface and the chunked evaluation loop.

An evaluator accumulates over chunks of a test set (``init → update* → result``), so a metric of 10⁶ examples
needs no more memory than one chunk. It sees the model's outputs, the batch and the objective's per-example
losses; it never sees the training data or any client's state.
"""
from __future__ import annotations

import abc
import contextlib
from typing import Any, ClassVar, Iterator, Mapping, Sequence

import torch
from torch import nn

from trustfl.errors import ConfigError
from trustfl.objectives.base import AbstractObjective, Batch


class AbstractEvaluator(abc.ABC):
    """Accumulates one or more metrics over test chunks.

    Attributes:
      metrics: the names :meth:`result` returns, with ``True`` where a larger value is better.
      needs_train_features: ``True`` for evaluators of learned representations (linear probe, kNN): they are fed
        the model's features of the training split through :meth:`with_train` before every evaluation, and see
        the test features of the model output named by their ``output`` field
        (:func:`trustfl.evaluate.representation.evaluate_representations`).
      task: the objective task (``"classification"``, ``"regression"``) the metrics measure; ``None``: any.
    """

    metrics: ClassVar[Mapping[str, bool]] = {}
    needs_train_features: ClassVar[bool] = False
    task: ClassVar[str | None] = None

    def with_train(self, features: torch.Tensor, labels: torch.Tensor) -> "AbstractEvaluator":
        """This evaluator with the training split's features (only for ``needs_train_features``)."""
        raise NotImplementedError(f"{type(self).__name__} takes no training features.")

    @abc.abstractmethod
    def init(self) -> Any:
        """A fresh accumulator."""

    @abc.abstractmethod
    def update(self, acc: Any, outputs: torch.Tensor, batch: Batch, objective: AbstractObjective) -> Any:
        """Fold one chunk into the accumulator and return it."""

    @abc.abstractmethod
    def result(self, acc: Any) -> dict[str, float]:
        """The metrics of everything folded in."""


_DIRECTION: dict[str, bool] = {}


def higher_is_better(metric: str) -> bool:
    """Whether a larger value of ``metric`` is better (``loss``, ``mse``, ... are not); unknown names: False."""
    return _DIRECTION.get(metric, False)


def declare(evaluator_cls: type[AbstractEvaluator]) -> type[AbstractEvaluator]:
    """Class decorator: record the direction of the evaluator's metrics for summaries and ``best_*``."""
    _DIRECTION.update(evaluator_cls.metrics)
    return evaluator_cls


DEFAULTS: dict[str, tuple[str, ...]] = {
    "classification": ("accuracy", "loss"),
    "regression": ("mse", "mae", "r2", "loss"),
    "multilabel": ("binary_accuracy", "loss"),
    "custom": ("loss",),
}
"""The evaluators a task gets when the config names none."""


def default_evaluators(task: str) -> tuple[str, ...]:
    return DEFAULTS.get(task, ("loss",))


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode (dropout off, BatchNorm reading its running statistics); each submodule's own mode
    is restored afterwards."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for m, training in modes:
            m.training = training


@torch.no_grad()
def evaluate_model(model: nn.Module, objective: AbstractObjective, evaluators: Sequence[AbstractEvaluator],
                   params: Mapping[str, torch.Tensor], data: Batch, batch_size: int,
                   train: Batch | None = None) -> dict[str, float]:
    """Every evaluator's metrics of ``params`` on ``data`` (named tensors, examples first), in chunks, with the
    model in eval mode (:func:`eval_mode`).

    ``train``: the (non-augmented) training split: evaluators with ``needs_train_features`` are then fed the
    model's features of it (``None``: they must already hold theirs, and score the objective's outputs).
    """
    with eval_mode(model):
        return _evaluate(model, objective, evaluators, params, data, batch_size, train)


def _evaluate(model: nn.Module, objective: AbstractObjective, evaluators: Sequence[AbstractEvaluator],
              params: Mapping[str, torch.Tensor], data: Batch, batch_size: int,
              train: Batch | None) -> dict[str, float]:
    if train is not None and any(e.needs_train_features for e in evaluators):
        from trustfl.evaluate.representation import evaluate_representations

        out = _evaluate(model, objective, [e for e in evaluators if not e.needs_train_features], params, data,
                        batch_size, None)
        out.update(evaluate_representations(model, [e for e in evaluators if e.needs_train_features], params,
                                            data, train, batch_size))
        return out
    accs = [e.init() for e in evaluators]
    n = next(iter(data.values())).shape[0] if data else 0
    for i in range(0, n, batch_size):
        chunk = {k: v[i:i + batch_size] for k, v in data.items()}
        outputs = objective.forward(model, params, chunk)
        accs = [e.update(a, outputs, chunk, objective) for e, a in zip(evaluators, accs)]
    out: dict[str, float] = {}
    for e, a in zip(evaluators, accs):
        out.update(checked_result(e, e.result(a)))
    return out


def checked_result(evaluator: AbstractEvaluator, result: Any) -> dict[str, float]:
    """``result`` of ``evaluator``, refused (ConfigError naming it) unless it maps exactly the metric names the
    evaluator declares (``metrics``) to numbers (a one-number tensor becomes a float): an evaluator of your own
    that breaks this would otherwise fail when the row is written, or leave a metric out of every row."""
    name, declared = type(evaluator).__name__, sorted(evaluator.metrics)
    if not isinstance(result, Mapping) or sorted(result) != declared:
        found = sorted(result) if isinstance(result, Mapping) else type(result).__name__
        raise ConfigError(f"evaluator {name}: result() must return {{name: number}} for its declared metrics "
                          f"{declared} (the class attribute `metrics`), found {found}.")
    out: dict[str, float] = {}
    for key, value in result.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"evaluator {name}: result() gave {key!r} = {value!r}; a metric is one number.")
        out[key] = value
    return out
