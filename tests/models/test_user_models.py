"""A model of your own is built as written under the run's seed (its own initialisation, tied parameters and
tensor arithmetic in its constructor kept), evaluated in eval mode, and refused when the run is built if trustfl
cannot train it as written: frozen or mixed-dtype parameters, a forward that writes a buffer or draws random
numbers (these passed `validate` and crashed round 1, trained frozen weights, or leaked state between clients)."""
import math

import pytest
import torch
from torch import nn

from trustfl.config.build import build_federation
from trustfl.config.load import config_from_dict
from trustfl.core import registry
from trustfl.errors import ConfigError
from trustfl.evaluate.base import evaluate_model
from trustfl.models.zoo import build_model
from trustfl.objectives.builtin import CrossEntropy

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cfg(name, **over):
    return config_from_dict({"name": "user_models", "seed": 0, "rounds": 1,
                             "data": {"dataset": "digits", "num_clients": 4}, "model": {"name": name},
                             "client": {"steps": 1, "batch_size": 16}, "engine": {"checkpoint_every": 0}, **over})


def _register(monkeypatch, name, factory):
    monkeypatch.setitem(registry._REGISTRY.setdefault("model", {}), name, factory)


class Tied(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(math.prod(input_shape), 16), nn.Linear(16, 16), nn.Linear(16, num_classes)
        self.l2b = nn.Linear(16, 16)
        self.l2b.weight = self.l2.weight

    def forward(self, x):
        h = torch.relu(self.l2(torch.relu(self.l1(x.flatten(1)))))
        return self.l3(torch.relu(self.l2b(h)))


class TiedOwn(Tied):
    """The same model as if it were trustfl's own (built on the meta device, then materialised)."""


TiedOwn.__module__ = "trustfl.models._tied_test"


@pytest.mark.parametrize("cls", [Tied, TiedOwn])
def test_tied_parameters_stay_tied(monkeypatch, cls):
    _register(monkeypatch, "_test_tied", cls)
    model = build_model("_test_tied", (64,), 10, 3)
    assert model.l2b.weight is model.l2.weight
    assert len(list(model.parameters())) == 7


ZERO_INIT = '''
import math, torch
from torch import nn

class ZeroInit(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.l1 = nn.Linear(int(torch.tensor(input_shape).prod()), num_classes)  # reads tensor values
        self.l2 = nn.Linear(num_classes, num_classes)
        with torch.no_grad():
            self.l1.weight.zero_()
            self.l1.bias.fill_(0.5)

    def forward(self, x):
        return self.l2(self.l1(x.flatten(1)))
'''


def test_a_constructors_own_initialisation_is_kept_and_drawn_from_the_seed(tmp_path):
    path = tmp_path / "zero_init.py"
    path.write_text(ZERO_INIT)
    torch.manual_seed(1234)
    state = torch.get_rng_state()
    model = build_model(f"{path}:ZeroInit", (1, 8, 8), 10, 42)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.count_nonzero(model.l1.weight) == 0 and torch.equal(model.l1.bias, torch.full((10,), 0.5))
    cls = registry.import_object(f"{path}:ZeroInit")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(42)
        expected = cls((1, 8, 8), 10)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), expected.state_dict().values()))


class Frozen(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.l1, self.l2 = nn.Linear(math.prod(input_shape), 16), nn.Linear(16, num_classes)
        self.l1.weight.requires_grad_(False)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x.flatten(1))))


class Mixed(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.l1, self.l2 = nn.Linear(math.prod(input_shape), 16), nn.Linear(16, num_classes).double()

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x.flatten(1))).double()).float()


class Normed(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.l1, self.bn = nn.Linear(math.prod(input_shape), 16), nn.BatchNorm1d(16)
        self.l2 = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.l2(self.bn(self.l1(x.flatten(1))))


class Dropped(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.l1, self.drop = nn.Linear(math.prod(input_shape), num_classes), nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.l1(x.flatten(1)))


class Counting(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.l1 = nn.Linear(math.prod(input_shape), num_classes)
        self.register_buffer("count", torch.tensor(0))

    def forward(self, x):
        if self.training:
            self.count += 1
        return self.l1(x.flatten(1))


@pytest.mark.parametrize("cls, fragment", [
    (Frozen, r"has parameters with requires_grad=False \('l1.weight'\)"),
    (Mixed, r"mixes parameter dtypes \(float32: 'l1.weight', 'l1.bias'; float64: 'l2.weight', 'l2.bias'\)"),
    (Normed, r": its forward in training writes the buffer\(s\) 'bn.running_mean', 'bn.running_var', "
             r"'bn.num_batches_tracked' \(BatchNorm's running statistics: use GroupNorm or LayerNorm"),
    (Counting, r": its forward in training writes the buffer\(s\) 'count'; the clients share one model object"),
    (Dropped, r": its forward in training draws random numbers \(e.g. dropout in training mode\)"),
])
def test_a_model_trustfl_cannot_train_as_written_is_refused_when_the_run_is_built(monkeypatch, cls, fragment):
    _register(monkeypatch, "_test_user_model", cls)
    torch.manual_seed(5)
    state = torch.get_rng_state()
    with pytest.raises(ConfigError, match=f"^`model` \\('_test_user_model'\\) ?{fragment}") as err:
        build_federation(_cfg("_test_user_model"))
    assert "\n" not in str(err.value)
    assert torch.equal(torch.get_rng_state(), state)


def test_a_model_writing_a_buffer_is_refused_beside_a_loss_of_your_own(monkeypatch, tmp_path):
    (tmp_path / "my_loss.py").write_text("import torch.nn.functional as F\n\n"
                                         "def xent(outputs, batch):\n"
                                         "    return F.cross_entropy(outputs, batch['y'], reduction='none')\n")
    _register(monkeypatch, "_test_user_model", Normed)
    with pytest.raises(ConfigError, match=r"^`model` \('_test_user_model'\): its forward in training writes"):
        build_federation(_cfg("_test_user_model", objective={"name": f"{tmp_path / 'my_loss.py'}:xent"}))


class Float64(nn.Module):
    def __init__(self, input_shape, num_classes, dtype="float64"):
        super().__init__()
        self.l1 = nn.Linear(math.prod(input_shape), num_classes).to(getattr(torch, dtype))

    def forward(self, x):
        return self.l1(x.flatten(1).to(self.l1.weight.dtype)).float()


@pytest.mark.parametrize("cls", [Float64, Tied])
def test_a_model_of_one_dtype_or_with_tied_parameters_builds(monkeypatch, cls):
    _register(monkeypatch, "_test_user_model", cls)
    fed = build_federation(_cfg("_test_user_model"))
    assert fed.model.training


class ModeSpy(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.bn = nn.Linear(4, 3), nn.BatchNorm1d(3)
        self.bn.eval()  # a submodule kept in eval mode by its owner
        self.seen = []

    def forward(self, x):
        self.seen.append(self.training)
        return self.bn(self.l1(x))


def test_evaluation_runs_the_model_in_eval_mode_and_restores_each_modules_mode():
    model = ModeSpy()
    params = {k: v.detach() for k, v in model.named_parameters()}
    data = {"x": torch.randn(10, 4), "y": torch.randint(0, 3, (10,))}
    evaluate_model(model, CrossEntropy(), [], params, data, batch_size=4)
    assert model.seen == [False, False, False]
    assert model.training and not model.bn.training and model.l1.training
