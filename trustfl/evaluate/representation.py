"""Evaluators of learned representations: a linear probe and a weighted kNN classifier on frozen features.

Both need labelled *training* features besides the test set, which the evaluator interface never sees
(:mod:`trustfl.evaluate.base`). They are therefore split into pure functions and evaluators that hold the training
features explicitly:

- :func:`fit_linear_probe` / :func:`predict_linear_probe`: multinomial logistic regression on standardised
  features, ``min_{W,b} (1/N) Σ_n CE(W f_n + b, y_n) + λ‖W‖_F²``, fitted by full-batch torch L-BFGS (strong-Wolfe
  line search) on the features' device, from zero weights (deterministic).
- :func:`knn_predict`: the weighted kNN monitor of self-supervised learning (Wu et al. 2018): on L2-normalised
  features, the k most cosine-similar training points vote for their labels with weight exp(s/τ), s their
  similarity; k = 20, τ = 0.1 by default.
- :class:`LinearProbe` (``"linear_probe"``) and :class:`KNN` (``"knn"``): evaluators whose test features are the
  model's outputs (:meth:`AbstractObjective.forward`, ``(N, d)``) and whose training features come from
  :meth:`with_train` (e.g. the frozen backbone f(x) on the non-augmented training split, or the projector output for
  kNN, as in the FedSC paper's evaluation). The probe is fitted once per evaluation, in :meth:`init`.

References:
  Wu, Xiong, Yu & Lin, *Unsupervised Feature Learning via Non-Parametric Instance Discrimination*, CVPR 2018.
  https://arxiv.org/abs/1805.01978

Example:
  >>> f = torch.tensor([[0.0, 1.0], [0.1, 1.0], [1.0, 0.0], [1.0, 0.1]])
  >>> y = torch.tensor([0, 0, 1, 1])
  >>> knn_predict(f, y, torch.tensor([[0.2, 1.0]]), k=2).tolist()
  [0]
  >>> predict_linear_probe(fit_linear_probe(f, y), torch.tensor([[1.0, 0.2]])).tolist()
  [1]
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from trustfl.core.checks import check_number
from trustfl.core.functional import functional_call
from trustfl.core.memory import refuse_beyond_free
from trustfl.core.registry import register
from trustfl.errors import ConfigError
from trustfl.evaluate.base import AbstractEvaluator, declare
from trustfl.objectives.builtin import CrossEntropy

_CE = CrossEntropy()  # the probe's loss goes through the objective (the only place a loss is named)

__all__ = ["KNN", "L2_MAX", "LinearProbe", "LinearProbeFit", "evaluate_representations", "fit_linear_probe",
           "knn_predict", "predict_linear_probe", "representations"]


def _check_features(features: torch.Tensor, labels: Optional[torch.Tensor], name: str) -> None:
    if not isinstance(features, torch.Tensor) or features.dim() != 2 or not features.is_floating_point():
        found = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features).__name__
        raise ConfigError(f"`{name}` must be a floating-point (N, d) matrix of features, found {found}.")
    if labels is not None and (labels.dim() != 1 or labels.shape[0] != features.shape[0]
                               or labels.is_floating_point() or labels.numel() == 0):
        raise ConfigError(f"the labels of `{name}` must be {features.shape[0]} integer class ids (> 0 examples), "
                          f"found shape {tuple(labels.shape)} and dtype {labels.dtype}.")


@dataclass(frozen=True, eq=False)
class LinearProbeFit:
    """A fitted probe: ``logits = ((f − mean)/std) @ weight + bias``."""

    mean: torch.Tensor
    std: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor


L2_MAX = 1e12
"""The largest probe penalty λ: L-BFGS's float32 curvature products overflow into NaN weights from about 1e21."""


def _check_l2(l2: Any) -> Any:
    """``l2`` if it is a number in [0, :data:`L2_MAX`], else a ConfigError naming it."""
    return check_number("l2", l2, low=0, high=L2_MAX, note="L-BFGS's float32 products overflow beyond it")


def fit_linear_probe(features: torch.Tensor, labels: torch.Tensor, num_classes: Optional[int] = None, *,
                     l2: float = 1e-4, max_iter: int = 100) -> LinearProbeFit:
    """Fit multinomial logistic regression on frozen ``features`` ``(N, d)`` with integer ``labels`` ``(N,)``.

    Args:
      num_classes: K (default: ``max(labels) + 1``).
      l2: λ in [0, :data:`L2_MAX`], the weight penalty (on standardised features).
      max_iter: L-BFGS iterations (one full-batch L-BFGS step of at most this many iterations).
    """
    _check_features(features, labels, "features")
    _check_l2(l2)
    check_number("max_iter", max_iter, integer=True, low=1)
    k = int(labels.max()) + 1 if num_classes is None else check_number("num_classes", num_classes, integer=True,
                                                                       low=int(labels.max()) + 1)
    x = features.detach().to(torch.promote_types(features.dtype, torch.float32))
    mean, std = x.mean(0), x.std(0, unbiased=False).clamp(min=1e-6)
    x = (x - mean) / std
    y = labels.to(x.device)
    weight = torch.zeros(x.shape[1], k, dtype=x.dtype, device=x.device, requires_grad=True)
    bias = torch.zeros(k, dtype=x.dtype, device=x.device, requires_grad=True)
    opt = torch.optim.LBFGS([weight, bias], max_iter=max_iter, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-9, tolerance_change=1e-12, history_size=20)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = _CE.loss_sum(x @ weight + bias, {"y": y}) / y.shape[0] + l2 * weight.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():  # evaluation runs under no_grad
        opt.step(closure)
    return LinearProbeFit(mean, std, weight.detach(), bias.detach())


def predict_linear_probe(fit: LinearProbeFit, features: torch.Tensor) -> torch.Tensor:
    """The probe's predicted classes ``(N,)`` for ``features`` ``(N, d)``."""
    _check_features(features, None, "features")
    x = features.to(device=fit.weight.device, dtype=fit.weight.dtype)
    return (((x - fit.mean) / fit.std) @ fit.weight + fit.bias).argmax(1)


def knn_predict(train_features: torch.Tensor, train_labels: torch.Tensor, features: torch.Tensor, k: int = 20,
                temperature: float = 0.1, num_classes: Optional[int] = None) -> torch.Tensor:
    """Weighted kNN classes ``(N,)``: argmax_c Σ_{i ∈ top-k(s_n)} exp(s_ni/τ)·1[y_i = c], s_ni = f̂_nᵀ f̂_i (cosine).

    Args:
      train_features, train_labels: the memory bank ``(M, d)`` and its integer labels ``(M,)``.
      features: queries ``(N, d)``.
      k: neighbours (at most M are used). temperature: τ > 0.
    """
    _check_features(train_features, train_labels, "train_features")
    _check_features(features, None, "features")
    check_number("k", k, integer=True, low=1)
    check_number("temperature", temperature, low=0, low_open=True, finite=True)
    if features.shape[1] != train_features.shape[1]:
        raise ConfigError(f"`features` have {features.shape[1]} dimensions, the training features "
                          f"{train_features.shape[1]}.")
    classes = int(train_labels.max()) + 1 if num_classes is None else int(num_classes)
    bank = F.normalize(train_features, dim=1)
    query = F.normalize(features.to(device=bank.device, dtype=bank.dtype), dim=1)
    sim, idx = (query @ bank.T).topk(min(int(k), bank.shape[0]), dim=1)   # sorted: column 0 is each row's max
    # exp(s/τ) overflows float32 beyond s/τ ≈ 88 (τ < 0.0114 at s = 1), and two infinite votes tie: the weights
    # exp((s − max s)/τ) in float64 have the same ratios and are at most 1, for every τ > 0
    weights = (sim - sim[:, :1]).double().div(temperature).exp()
    votes = torch.zeros(query.shape[0], classes, dtype=weights.dtype, device=bank.device)
    votes.scatter_add_(1, train_labels.to(bank.device)[idx], weights)
    return votes.argmax(1)


def _correct(pred: torch.Tensor, batch: Mapping[str, torch.Tensor], acc: list) -> list:
    y = batch["y"]
    acc[-2] += int((pred.to(y.device) == y).sum())
    acc[-1] += int(y.shape[0])
    return acc


def _check_output(output: str) -> None:
    if output not in ("backbone", "projector", "model"):
        raise ConfigError(f"`output` must be one of ('backbone', 'projector', 'model'), found {output!r}.")


def _need_train(name: str, features: Optional[torch.Tensor]) -> None:
    if features is None:
        raise ConfigError(f"evaluator {name!r} needs the training features: build it with .with_train(features, "
                          f"labels) (features of the training split from the same model) before evaluating.")


def _with_train(evaluator: Any, features: torch.Tensor, labels: torch.Tensor) -> Any:
    """A copy of ``evaluator`` holding the training split's ``features`` and ``labels`` (checked), in the fields that
    are no constructor arguments: the run computes them, so a config cannot set them."""
    _check_features(features, labels, "train_features")
    bound = replace(evaluator)
    object.__setattr__(bound, "train_features", features.detach())
    object.__setattr__(bound, "train_labels", labels)
    return bound


@register("evaluator", "linear_probe")
@declare
@dataclass(frozen=True, eq=False)
class LinearProbe(AbstractEvaluator):
    """Test accuracy of a logistic-regression probe fitted on the training features (:func:`fit_linear_probe`).

    Args:
      l2: λ, the weight penalty. max_iter: L-BFGS iterations.
      output: the model output probed: ``"backbone"`` (default, f(x), as in the FedSC paper), ``"projector"``, or
        ``"model"`` (the plain forward, for models without named outputs).
      train_features, train_labels: set by :meth:`with_train` only (no constructor argument, so no config key).
    """

    metrics: ClassVar[Mapping[str, bool]] = {"linear_probe_accuracy": True}
    needs_train_features: ClassVar[bool] = True
    l2: float = 1e-4
    max_iter: int = 100
    output: str = "backbone"
    train_features: Optional[torch.Tensor] = field(default=None, init=False, repr=False)
    train_labels: Optional[torch.Tensor] = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        _check_l2(self.l2)
        check_number("max_iter", self.max_iter, integer=True, low=1)
        _check_output(self.output)

    def with_train(self, features: torch.Tensor, labels: torch.Tensor) -> "LinearProbe":
        """This evaluator with the training split's features ``(M, d)`` and labels ``(M,)``."""
        return _with_train(self, features, labels)

    def init(self) -> Any:
        _need_train("linear_probe", self.train_features)
        return [fit_linear_probe(self.train_features, self.train_labels, l2=self.l2, max_iter=self.max_iter), 0, 0]

    def update(self, acc, outputs, batch, objective):
        return _correct(predict_linear_probe(acc[0], outputs), batch, acc)

    def result(self, acc) -> dict[str, float]:
        return {"linear_probe_accuracy": acc[1] / max(acc[2], 1)}


@register("evaluator", "knn")
@declare
@dataclass(frozen=True, eq=False)
class KNN(AbstractEvaluator):
    """Test accuracy of the weighted kNN classifier on the training features (:func:`knn_predict`).

    Args:
      k: neighbours (20). temperature: τ (0.1).
      output: the model output used (default ``"projector"``, as the FedSC paper's kNN monitor).
      train_features, train_labels: the memory bank, set by :meth:`with_train` only (no config key).
    """

    metrics: ClassVar[Mapping[str, bool]] = {"knn_accuracy": True}
    needs_train_features: ClassVar[bool] = True
    k: int = 20
    temperature: float = 0.1
    output: str = "projector"
    train_features: Optional[torch.Tensor] = field(default=None, init=False, repr=False)
    train_labels: Optional[torch.Tensor] = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        check_number("k", self.k, integer=True, low=1)
        check_number("temperature", self.temperature, low=0, low_open=True, finite=True)
        _check_output(self.output)

    def with_train(self, features: torch.Tensor, labels: torch.Tensor) -> "KNN":
        """This evaluator with the memory bank: training features ``(M, d)`` and labels ``(M,)``."""
        return _with_train(self, features, labels)

    def init(self) -> Any:
        _need_train("knn", self.train_features)
        return [0, 0]

    def update(self, acc, outputs, batch, objective):
        pred = knn_predict(self.train_features, self.train_labels, outputs, self.k, self.temperature)
        return _correct(pred, batch, acc)

    def result(self, acc) -> dict[str, float]:
        return {"knn_accuracy": acc[0] / max(acc[1], 1)}


OUTPUT_NAMES = ("backbone", "projector", "model")


def check_model_outputs(evaluators: Sequence[Any], model: nn.Module, path: str = "evaluators") -> None:
    """Refuse (ConfigError naming ``evaluators[i].output``) an evaluator that reads a named output
    (``"backbone"``/``"projector"``) of a model whose forward takes no ``output`` argument."""
    params = inspect.signature(model.forward).parameters
    named = "output" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for i, e in enumerate(evaluators):
        output = getattr(e, "output", "model")
        if output != "model" and not named:
            raise ConfigError(f"`{path}[{i}].output` = {output!r}: the model ({type(model).__name__}) has no named "
                              f"outputs (its forward takes no `output`); set `output = \"model\"` to use its plain "
                              f"forward, or use a self-supervised model (sc_mlp, sc_cnn).")


def representations(model: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor, output: str,
                    batch_size: int) -> torch.Tensor:
    """The model's ``output`` features ``(N, d)`` of inputs ``x``, in chunks (``"model"``: the plain forward,
    otherwise ``model(x, output=output)``, e.g. :mod:`trustfl.models.ssl`'s encoder + projector)."""
    if output not in OUTPUT_NAMES:
        raise ConfigError(f"evaluator `output` must be one of {OUTPUT_NAMES}, found {output!r}.")
    kwargs = {} if output == "model" else {"output": output}
    if x.shape[0]:  # the features (chunks, then their concatenation) sized from one example's before they are made
        probe = functional_call(model, params, (x[:1],), kwargs)
        refuse_beyond_free(2 * x.shape[0] * probe.numel() * probe.element_size(), probe.device)
    parts = [functional_call(model, params, (x[i:i + batch_size],), kwargs)
             for i in range(0, x.shape[0], batch_size)]
    return torch.cat(parts).flatten(1) if parts else x.new_zeros((0, 0))


@torch.no_grad()
def evaluate_representations(model: nn.Module, evaluators: Sequence[Any], params: Mapping[str, torch.Tensor],
                             test: Mapping[str, torch.Tensor], train: Optional[Mapping[str, torch.Tensor]],
                             batch_size: int) -> dict[str, float]:
    """Metrics of representation evaluators: each gets the frozen model's features of the training split
    (``with_train``) and scores the test features of the same ``output`` (features computed once per output)."""
    if train is None or "x" not in train or "y" not in train:
        names = [m for e in evaluators for m in e.metrics]
        raise ConfigError(f"evaluators {names} need the labelled training split (`x`, `y`) to fit on.")
    cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    out: dict[str, float] = {}
    for e in evaluators:
        if e.output not in cache:
            cache[e.output] = (representations(model, params, train["x"], e.output, batch_size),
                               representations(model, params, test["x"], e.output, batch_size))
        f_train, f_test = cache[e.output]
        bound = e.with_train(f_train, train["y"])
        out.update(bound.result(bound.update(bound.init(), f_test, test, None)))
    return out
