"""Representation evaluators (trustfl.evaluate.representation): linear probe and weighted kNN on synthetic features
(separable → ~100%, random labels → chance), kNN against a per-query loop, and the chunked evaluation loop."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import trustfl
from trustfl.errors import ConfigError
from trustfl.evaluate import evaluate_model
from trustfl.evaluate.representation import (KNN, L2_MAX, LinearProbe, fit_linear_probe, knn_predict,
                                             predict_linear_probe)
from trustfl.objectives.spectral import SpectralContrastive


def _clusters(n, k=4, d=16, spread=0.7, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, k, (n,), generator=g)
    centers = 4.0 * torch.eye(k, d)
    return centers[y] + spread * torch.randn(n, d, generator=g), y


def _random(n, k=4, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, k, (n,), generator=g)


def test_separable_features_are_classified_almost_perfectly():
    xtr, ytr = _clusters(400, seed=1)
    xte, yte = _clusters(400, seed=2)
    probe = fit_linear_probe(xtr, ytr)
    assert float((predict_linear_probe(probe, xte) == yte).float().mean()) >= 0.99
    assert float((knn_predict(xtr, ytr, xte) == yte).float().mean()) >= 0.99


def test_random_labels_give_chance_accuracy():
    xtr, ytr = _random(1000, seed=3)
    xte, yte = _random(2000, seed=4)
    probe = fit_linear_probe(xtr, ytr)
    assert abs(float((predict_linear_probe(probe, xte) == yte).float().mean()) - 0.25) < 0.05
    assert abs(float((knn_predict(xtr, ytr, xte) == yte).float().mean()) - 0.25) < 0.05


def test_linear_probe_is_deterministic_and_fits_the_training_set():
    xtr, ytr = _clusters(200, seed=5)
    a, b = fit_linear_probe(xtr, ytr), fit_linear_probe(xtr, ytr)
    assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)
    assert float((predict_linear_probe(a, xtr) == ytr).float().mean()) == 1.0
    assert a.weight.shape == (16, 4) and a.weight.dtype == torch.float32


def test_knn_matches_a_per_query_loop():
    xtr, ytr = _random(60, k=3, d=5, seed=6)
    xte, _ = _random(15, k=3, d=5, seed=7)
    k, tau = 7, 0.1
    pred = knn_predict(xtr, ytr, xte, k=k, temperature=tau)
    bank = xtr / xtr.norm(dim=1, keepdim=True)
    for n in range(15):
        q = xte[n] / xte[n].norm()
        sims = [(float(bank[i] @ q), int(ytr[i])) for i in range(60)]
        top = sorted(sims, reverse=True)[:k]
        votes = [sum(torch.exp(torch.tensor(s / tau)).item() for s, y in top if y == c) for c in range(3)]
        assert int(pred[n]) == max(range(3), key=lambda c: votes[c])


def test_knn_weights_do_not_overflow_at_small_temperatures():
    """The nearest point (s = 1, class 1) against two at s = 0.99 (class 0): 2e^{9.9} > e^{10} at τ = 0.1, and the
    nearest point wins as τ shrinks. exp(s/τ) overflowed float32 below τ ≈ 0.0114: both classes' votes were inf
    and the tie went to class 0."""
    a = math.acos(0.99)
    bank = torch.tensor([[1.0, 0.0], [math.cos(a), math.sin(a)], [math.cos(a), -math.sin(a)]])
    labels, query = torch.tensor([1, 0, 0]), torch.tensor([[1.0, 0.0]])
    assert knn_predict(bank, labels, query, k=3, temperature=0.1).tolist() == [0]
    for tau in (1e-3, 1e-300):
        assert knn_predict(bank, labels, query, k=3, temperature=tau).tolist() == [1]


def test_probe_penalty_is_bounded_where_its_float32_fit_stays_finite():
    """λ = 1e25 gave NaN weights, λ = 1e300 a RuntimeError inside L-BFGS; λ up to L2_MAX fits finite weights."""
    x, y = _clusters(200, d=16)
    assert bool(torch.isfinite(fit_linear_probe(x * 100, y, l2=L2_MAX).weight).all())
    for l2 in (L2_MAX * 10, 1e300):
        with pytest.raises(ConfigError, match=r"`l2` must be a number in \[0, 1e\+12\]"):
            LinearProbe(l2=l2)
        with pytest.raises(ConfigError, match="`l2`"):
            fit_linear_probe(x, y, l2=l2)


@pytest.mark.parametrize("name", ["linear_probe", "knn"])
@pytest.mark.parametrize("key", ["train_features", "train_labels"])
def test_training_features_are_no_config_keys(name, key):
    """The run computes them (a config's ``train_labels = "x"`` was accepted and left the result as it was)."""
    from trustfl.config.build import build_component
    from trustfl.config.schema import Component

    with pytest.raises(ConfigError, match=rf"Unknown key `evaluators\[0\]\.{key}` for evaluator '{name}'; "
                                          r"allowed: [a-z_, 0-9]*output\."):
        build_component("evaluator", Component(name, {key: "x"}), "evaluators[0]")
    with pytest.raises(ConfigError, match=key):
        trustfl.build("evaluator", name, **{key: torch.zeros(2, 2)})
    plain = trustfl.build("evaluator", name)
    bound = plain.with_train(*_clusters(8))
    assert plain.train_features is None and bound.train_features.shape == (8, 16)


class _Identity(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d, bias=False)
        with torch.no_grad():
            self.lin.weight.copy_(torch.eye(d))

    def forward(self, x):
        return self.lin(x)


def test_evaluators_run_in_the_chunked_evaluation_loop():
    xtr, ytr = _clusters(300, seed=8)
    xte, yte = _clusters(250, seed=9)
    model = _Identity(16)
    params = {k: v.detach() for k, v in model.named_parameters()}
    evs = [trustfl.build("evaluator", "linear_probe").with_train(xtr, ytr),
           trustfl.build("evaluator", "knn", k=20, temperature=0.1).with_train(xtr, ytr)]
    out = evaluate_model(model, SpectralContrastive(), evs, params, {"x": xte, "y": yte}, batch_size=37)
    assert set(out) == {"linear_probe_accuracy", "knn_accuracy"}
    assert out["linear_probe_accuracy"] >= 0.99 and out["knn_accuracy"] >= 0.99
    whole = float((knn_predict(xtr, ytr, xte) == yte).float().mean())
    assert out["knn_accuracy"] == pytest.approx(whole, abs=1e-12)
    assert trustfl.evaluate.higher_is_better("knn_accuracy") and trustfl.evaluate.higher_is_better(
        "linear_probe_accuracy")


def test_missing_training_features_and_bad_arguments_are_config_errors():
    for ev in (LinearProbe(), KNN()):
        with pytest.raises(ConfigError, match="with_train"):
            ev.init()
    with pytest.raises(ConfigError, match="`k`"):
        KNN(k=0)
    with pytest.raises(ConfigError, match="temperature"):
        KNN(temperature=0.0)
    with pytest.raises(ConfigError, match="l2"):
        LinearProbe(l2=-1.0)
    with pytest.raises(ConfigError, match="train_features"):
        KNN().with_train(torch.zeros(3, 2), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ConfigError, match="features"):
        fit_linear_probe(torch.zeros(3, 2, 2), torch.zeros(3, dtype=torch.long))
