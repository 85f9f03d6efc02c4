"""trustfl.core.functional: the tied-weights search is skipped only where a model has no aliases."""
import torch
from torch import nn
from torch.func import functional_call as torch_functional_call

from trustfl.core.functional import functional_call, has_tied_tensors


def _tied_mlp() -> nn.Sequential:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    model[2].weight = model[0].weight  # one parameter under two names
    return model


def test_tied_tensors_are_found():
    torch.manual_seed(0)
    assert not has_tied_tensors(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    assert has_tied_tensors(_tied_mlp())
    model = nn.Sequential(nn.BatchNorm1d(4), nn.BatchNorm1d(4))
    model[1].register_buffer("running_mean", model[0].running_mean)  # a buffer under two names
    assert has_tied_tensors(model)


def test_untied_model_gives_torchs_result():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    params = {k: torch.randn_like(v) for k, v in model.named_parameters()}
    x = torch.randn(5, 4)
    assert torch.equal(functional_call(model, params, (x,)), torch_functional_call(model, params, (x,)))
    assert not torch.equal(functional_call(model, params, (x,)), model(x))  # the given values were used


def test_tied_model_keeps_the_aliases():
    torch.manual_seed(0)
    model = _tied_mlp()
    params = {k: torch.randn_like(v) for k, v in model.named_parameters()}  # one entry for the tied weight
    assert "2.weight" not in params
    x = torch.randn(5, 4)
    out = functional_call(model, params, (x,))
    w, b0, b2 = params["0.weight"], params["0.bias"], params["2.bias"]
    expected = torch.relu(x @ w.T + b0) @ w.T + b2  # the new weight in both layers
    torch.testing.assert_close(out, expected)
    assert torch.equal(out, torch_functional_call(model, params, (x,)))
