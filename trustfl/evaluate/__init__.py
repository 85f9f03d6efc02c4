"""Evaluators: metrics of a model on held-out data, registered as ``("evaluator", name)``.

Built in: ``accuracy`` and ``loss`` (classification), ``mse``, ``mae`` and ``r2`` (regression), ``loss`` for any
objective. :func:`evaluate_model` runs a list of them over a test set in chunks.
"""
from trustfl.evaluate.base import (AbstractEvaluator, default_evaluators, evaluate_model,
                                   higher_is_better)
from trustfl.evaluate import builtin  # noqa: F401  (registers the built-in evaluators)

__all__ = ["AbstractEvaluator", "default_evaluators", "evaluate_model", "higher_is_better"]
