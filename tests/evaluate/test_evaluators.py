"""Evaluators and the chunked evaluation loop (trustfl.evaluate) against sklearn.metrics and hand counts."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score
from torch import nn

import trustfl
from trustfl.evaluate import default_evaluators, evaluate_model, higher_is_better

DT = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _evs(*names: str):
    return [trustfl.build("evaluator", n) for n in names]


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in model.named_parameters()}


class _Shifted(nn.Module):
    """``x @ W.T + b`` with explicit float64 parameters (a regression model with a chosen fit)."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor) -> None:
        super().__init__()
        self.w = nn.Parameter(w)
        self.b = nn.Parameter(b)

    def forward(self, x):
        return x @ self.w.T + self.b


def _regression(n: int, k: int, seed: int, offset: float = 0.0):
    g = _gen(seed)
    x = torch.randn(n, 5, generator=g, dtype=DT)
    w_true = torch.randn(k, 5, generator=g, dtype=DT)
    y = x @ w_true.T + offset + 0.7 * torch.randn(n, k, generator=g, dtype=DT)
    # a model near, but not at, the truth
    model = _Shifted(w_true + 0.3 * torch.randn(k, 5, generator=g, dtype=DT),
                     torch.full((k,), offset + 0.2, dtype=DT))
    return model, x, (y[:, 0] if k == 1 else y)


# ---------------------------------------------------------------------------------------------------------------
# regression metrics against sklearn
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [7, 16, 53, 1000])
def test_regression_metrics_match_sklearn_single_target(batch_size):
    model, x, y = _regression(53, 1, seed=0)
    obj = trustfl.build("objective", "mse")
    res = evaluate_model(model, obj, _evs("mse", "mae", "r2", "loss"), _params(model), {"x": x, "y": y},
                         batch_size)
    with torch.no_grad():
        pred = model(x)[:, 0].numpy()
    yn = y.numpy()
    assert res["mse"] == pytest.approx(mean_squared_error(yn, pred), rel=1e-12)
    assert res["mae"] == pytest.approx(mean_absolute_error(yn, pred), rel=1e-12)
    assert res["r2"] == pytest.approx(r2_score(yn, pred), rel=1e-10)
    assert res["loss"] == pytest.approx(float(np.mean((pred - yn) ** 2)), rel=1e-12)
    assert 0.0 < res["r2"] < 1.0


def test_regression_metrics_multi_target():
    model, x, y = _regression(40, 3, seed=1)
    obj = trustfl.build("objective", "mse")
    res = evaluate_model(model, obj, _evs("mse", "mae", "r2"), _params(model), {"x": x, "y": y}, 9)
    with torch.no_grad():
        pred = model(x).numpy()
    yn = y.numpy()
    # equal counts per column: the mean over all coordinates is sklearn's uniform average
    assert res["mse"] == pytest.approx(mean_squared_error(yn, pred), rel=1e-12)
    assert res["mae"] == pytest.approx(mean_absolute_error(yn, pred), rel=1e-12)
    # R² over all target coordinates pooled (as documented): sklearn on the flattened arrays
    assert res["r2"] == pytest.approx(r2_score(yn.ravel(), pred.ravel()), rel=1e-10)


def test_result_does_not_depend_on_batch_size():
    model, x, y = _regression(61, 1, seed=2)
    obj = trustfl.build("objective", "mse")
    data = {"x": x, "y": y}
    results = [evaluate_model(model, obj, _evs("mse", "mae", "r2", "loss"), _params(model), data, bs)
               for bs in (1, 4, 10, 61, 500)]
    for res in results[1:]:
        assert res.keys() == results[0].keys()
        for key in res:
            assert abs(res[key] - results[0][key]) <= 1e-9 * max(1.0, abs(results[0][key])), key


def test_r2_of_a_perfect_fit_is_one_and_of_the_mean_is_zero():
    g = _gen(3)
    x = torch.randn(30, 2, generator=g, dtype=DT)
    y = x @ torch.tensor([1.5, -2.0], dtype=DT) + 0.5
    perfect = _Shifted(torch.tensor([[1.5, -2.0]], dtype=DT), torch.tensor([0.5], dtype=DT))
    obj = trustfl.build("objective", "mse")
    res = evaluate_model(perfect, obj, _evs("r2", "mse"), _params(perfect), {"x": x, "y": y}, 7)
    assert res["r2"] == pytest.approx(1.0, abs=1e-12)
    assert res["mse"] == pytest.approx(0.0, abs=1e-24)
    mean_model = _Shifted(torch.zeros(1, 2, dtype=DT), y.mean().reshape(1))
    res = evaluate_model(mean_model, obj, _evs("r2"), _params(mean_model), {"x": x, "y": y}, 7)
    assert res["r2"] == pytest.approx(0.0, abs=1e-12)


def test_r2_of_a_constant_target_is_nan():
    g = _gen(4)
    model = _Shifted(torch.randn(1, 3, generator=g, dtype=DT), torch.zeros(1, dtype=DT))
    x = torch.randn(12, 3, generator=g, dtype=DT)
    for c in (0.0, 2.0, -5.0):
        res = evaluate_model(model, trustfl.build("objective", "mse"), _evs("r2"), _params(model),
                             {"x": x, "y": torch.full((12,), c, dtype=DT)}, 5)
        assert math.isnan(res["r2"]), c


def test_r2_of_a_constant_inexact_target_is_nan():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    x = torch.randn(100, 3, generator=_gen(5))
    y = torch.full((100,), 0.1)
    res = evaluate_model(model, trustfl.build("objective", "mse"), _evs("r2"), _params(model),
                         {"x": x, "y": y}, 7)
    assert math.isnan(res["r2"]), res


def test_r2_with_large_target_offset_matches_sklearn():
    model, x, y = _regression(1000, 1, seed=6, offset=1e6)
    obj = trustfl.build("objective", "mse")
    res = evaluate_model(model, obj, _evs("r2"), _params(model), {"x": x, "y": y}, 128)
    with torch.no_grad():
        pred = model(x)[:, 0].numpy()
    ref = r2_score(y.numpy(), pred)
    assert 0.0 < ref < 1.0
    assert res["r2"] == pytest.approx(ref, abs=1e-8)


# ---------------------------------------------------------------------------------------------------------------
# classification
# ---------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [1, 6, 25, 100])
def test_accuracy_and_loss_for_classification(batch_size):
    torch.manual_seed(7)
    model = nn.Linear(6, 4).double()
    g = _gen(7)
    x = torch.randn(25, 6, generator=g, dtype=DT)
    y = torch.randint(0, 4, (25,), generator=g)
    obj = trustfl.build("objective", "cross_entropy")
    res = evaluate_model(model, obj, _evs("accuracy", "loss"), _params(model), {"x": x, "y": y}, batch_size)
    with torch.no_grad():
        z = model(x)
    correct = sum(int(int(torch.argmax(z[n])) == int(y[n])) for n in range(25))
    assert res["accuracy"] == correct / 25
    assert 0 < correct < 25  # a non-trivial case
    ref_loss = float((torch.logsumexp(z, 1) - z[torch.arange(25), y]).mean())
    assert res["loss"] == pytest.approx(ref_loss, rel=1e-12)
    # the loss evaluator is the objective's mean per-example loss
    assert res["loss"] == pytest.approx(float(obj.losses(z, {"y": y}).mean()), rel=1e-12)


def test_binary_accuracy_single_and_multilabel():
    g = _gen(8)
    obj = trustfl.build("objective", "bce")
    # single label: one logit per example
    model = _Shifted(torch.randn(1, 4, generator=g, dtype=DT), torch.zeros(1, dtype=DT))
    x = torch.randn(33, 4, generator=g, dtype=DT)
    y = torch.randint(0, 2, (33,), generator=g).to(DT)
    res = evaluate_model(model, obj, _evs("binary_accuracy", "loss"), _params(model), {"x": x, "y": y}, 10)
    with torch.no_grad():
        z = model(x)[:, 0]
    assert res["binary_accuracy"] == pytest.approx(sum(int((float(z[n]) > 0) == (float(y[n]) == 1.0))
                                                       for n in range(33)) / 33, abs=1e-15)
    p = torch.sigmoid(z)
    ref = float(-(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean())
    assert res["loss"] == pytest.approx(ref, rel=1e-10)
    # multi-label: K logits, accuracy over all N·K labels
    model = _Shifted(torch.randn(3, 4, generator=g, dtype=DT), torch.zeros(3, dtype=DT))
    y = torch.randint(0, 2, (33, 3), generator=g).to(DT)
    res = evaluate_model(model, obj, _evs("binary_accuracy"), _params(model), {"x": x, "y": y}, 8)
    with torch.no_grad():
        z = model(x)
    assert res["binary_accuracy"] == pytest.approx(float(((z > 0).to(DT) == y).to(DT).mean()), abs=1e-15)


# ---------------------------------------------------------------------------------------------------------------
# metadata
# ---------------------------------------------------------------------------------------------------------------

def test_higher_is_better():
    assert higher_is_better("accuracy") is True
    assert higher_is_better("r2") is True
    assert higher_is_better("binary_accuracy") is True
    assert higher_is_better("mse") is False
    assert higher_is_better("mae") is False
    assert higher_is_better("loss") is False
    assert higher_is_better("no_such_metric") is False


def test_default_evaluators():
    assert default_evaluators("classification") == ("accuracy", "loss")
    reg = default_evaluators("regression")
    assert reg[0] == "mse" and "r2" in reg
    # every default is a registered evaluator reporting a metric of that name
    for task in ("classification", "regression", "multilabel", "custom"):
        for name in default_evaluators(task):
            assert name in trustfl.build("evaluator", name).metrics
