"""Objectives (trustfl.objectives): per-example losses against hand-written formulas, data checks, output sizes,
user-registered objectives and the functional forward."""
from __future__ import annotations

import uuid

import pytest
import torch
from torch import nn

import trustfl
from trustfl.errors import ConfigError, RegistryError
from trustfl.objectives import LossObjective, register_objective

DT = torch.float64


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _unique(prefix: str) -> str:
    # registrations are process-global: a fresh name per call keeps reruns independent
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


# ---------------------------------------------------------------------------------------------------------------
# reference formulas, written out with elementary ops
# ---------------------------------------------------------------------------------------------------------------

def _ref_cross_entropy(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # -log softmax(z)[y] = log Σ_k exp(z_k) − z_y   (shifted by the row max for stability)
    zmax = z.max(1, keepdim=True).values
    lse = torch.log(torch.exp(z - zmax).sum(1)) + zmax.squeeze(1)
    return lse - z[torch.arange(z.shape[0]), y]


def _ref_bce(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    p = torch.sigmoid(z)
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p))


# ---------------------------------------------------------------------------------------------------------------
# losses
# ---------------------------------------------------------------------------------------------------------------

def test_cross_entropy_losses_match_negative_log_softmax():
    obj = trustfl.build("objective", "cross_entropy")
    g = _gen(1)
    z = torch.randn(9, 5, generator=g, dtype=DT) * 3
    y = torch.randint(0, 5, (9,), generator=g)
    losses = obj.losses(z, {"x": torch.zeros(9, 2), "y": y})
    assert losses.shape == (9,)
    torch.testing.assert_close(losses, _ref_cross_entropy(z, y), rtol=1e-12, atol=1e-12)
    assert bool((losses > 0).all())


def test_cross_entropy_of_a_confident_right_answer_is_near_zero():
    obj = trustfl.build("objective", "cross_entropy")
    z = torch.tensor([[20.0, 0.0, 0.0], [0.0, 0.0, 20.0]], dtype=DT)
    losses = obj.losses(z, {"y": torch.tensor([0, 2])})
    assert float(losses.max()) < 1e-8
    wrong = obj.losses(z, {"y": torch.tensor([1, 0])})
    torch.testing.assert_close(wrong, torch.full((2,), 20.0, dtype=DT), rtol=0, atol=1e-7)


def test_mse_losses_with_column_output_and_vector_targets():
    obj = trustfl.build("objective", "mse")
    g = _gen(2)
    out = torch.randn(7, 1, generator=g, dtype=DT)
    y = torch.randn(7, generator=g, dtype=DT)
    losses = obj.losses(out, {"y": y})
    assert losses.shape == (7,)
    torch.testing.assert_close(losses, (out[:, 0] - y) ** 2, rtol=1e-12, atol=0)


def test_mse_losses_multi_target_average_over_coordinates():
    obj = trustfl.build("objective", "mse")
    g = _gen(3)
    out = torch.randn(6, 4, generator=g, dtype=DT)
    y = torch.randn(6, 4, generator=g, dtype=DT)
    losses = obj.losses(out, {"y": y})
    assert losses.shape == (6,)
    ref = torch.stack([sum((out[n, k] - y[n, k]) ** 2 for k in range(4)) / 4 for n in range(6)])
    torch.testing.assert_close(losses, ref, rtol=1e-12, atol=0)


def test_bce_losses_single_label_with_column_logits():
    obj = trustfl.build("objective", "bce")
    g = _gen(4)
    z = torch.randn(8, 1, generator=g, dtype=DT) * 2
    y = torch.randint(0, 2, (8,), generator=g).to(DT)
    losses = obj.losses(z, {"y": y})
    assert losses.shape == (8,)
    torch.testing.assert_close(losses, _ref_bce(z[:, 0], y), rtol=1e-10, atol=1e-12)


def test_bce_losses_multilabel_mean_over_labels_and_integer_targets():
    obj = trustfl.build("objective", "bce")
    g = _gen(5)
    z = torch.randn(5, 3, generator=g, dtype=DT) * 2
    y_int = torch.randint(0, 2, (5, 3), generator=g)
    losses = obj.losses(z, {"y": y_int})  # integer labels are converted to the output dtype
    assert losses.shape == (5,) and losses.dtype == DT
    torch.testing.assert_close(losses, _ref_bce(z, y_int.to(DT)).mean(1), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name,make", [
    ("cross_entropy", lambda g: (torch.randn(11, 4, generator=g), torch.randint(0, 4, (11,), generator=g))),
    ("mse", lambda g: (torch.randn(11, 3, generator=g), torch.randn(11, 3, generator=g))),
    ("mse", lambda g: (torch.randn(11, 1, generator=g), torch.randn(11, generator=g))),
    ("bce", lambda g: (torch.randn(11, 2, generator=g), torch.randint(0, 2, (11, 2), generator=g).float())),
])
def test_loss_sum_equals_sum_of_losses(name, make):
    obj = trustfl.build("objective", name)
    out, y = make(_gen(6))
    batch = {"y": y}
    total = obj.loss_sum(out, batch)
    assert total.dim() == 0
    ref = float(obj.losses(out, batch).double().sum())
    assert abs(float(total) - ref) <= 1e-6 * abs(ref)


@pytest.mark.parametrize("name,make", [
    ("cross_entropy", lambda g: (torch.randn(9, 4, generator=g, dtype=DT) * 3, torch.randint(0, 4, (9,), generator=g))),
    ("mse", lambda g: (torch.randn(9, 1, generator=g, dtype=DT), torch.randn(9, generator=g, dtype=DT))),
    ("bce", lambda g: (torch.randn(9, 2, generator=g, dtype=DT), torch.randint(0, 2, (9, 2), generator=g).to(DT))),
])
def test_weighted_loss_grad_is_the_gradient_of_the_weighted_loss_sum(name, make):
    """Per-example losses and ∂(Σ_n c_n ℓ_n)/∂z against hand-written derivatives (cross-entropy computes it in
    closed form, the others by the default autograd), with a zero weight (a padded row: zero gradient)."""
    obj = trustfl.build("objective", name)
    out, y = make(_gen(8))
    c = torch.rand(9, generator=_gen(9), dtype=DT)
    c[3] = 0.0
    losses, grad = obj.weighted_loss_grad(out, {"y": y}, c)
    torch.testing.assert_close(losses, obj.losses(out, {"y": y}), rtol=1e-12, atol=1e-15)
    if name == "cross_entropy":  # c_n (softmax(z_n) − e_{y_n})
        want = (torch.softmax(out, 1) - torch.nn.functional.one_hot(y, 4).to(DT)) * c.unsqueeze(1)
    elif name == "mse":  # ℓ_n = (z_n − y_n)²: 2 c_n (z_n − y_n)
        want = 2 * (out - y.unsqueeze(1)) * c.unsqueeze(1)
    else:  # ℓ_n = mean_k BCE: c_n (σ(z_nk) − y_nk) / K
        want = (torch.sigmoid(out) - y) * c.unsqueeze(1) / out.shape[1]
    assert grad.shape == out.shape
    torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-15)
    assert bool((grad[3] == 0).all())


def test_a_cross_entropy_subclass_with_its_own_losses_gets_their_gradient_not_the_closed_form():
    """Both weighted_loss_grad (to float rounding) and autograd_loss_grad (autograd's bits)."""
    from trustfl.objectives.builtin import CrossEntropy

    class Smoothed(CrossEntropy):
        def losses(self, outputs, batch):
            return torch.nn.functional.cross_entropy(outputs, batch["y"], reduction="none", label_smoothing=0.2)

    out = torch.randn(6, 3, generator=_gen(2), dtype=DT)
    y = torch.randint(0, 3, (6,), generator=_gen(3))
    c = torch.full((6,), 0.5, dtype=DT)
    losses, grad = Smoothed().weighted_loss_grad(out, {"y": y}, c)
    target = 0.8 * torch.nn.functional.one_hot(y, 3).to(DT) + 0.2 / 3  # the smoothed target distribution
    torch.testing.assert_close(grad, (torch.softmax(out, 1) - target) * 0.5, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(losses, -(target * torch.log_softmax(out, 1)).sum(1), rtol=1e-12, atol=1e-15)
    leaf = out.clone().requires_grad_(True)
    (want,) = torch.autograd.grad((Smoothed().losses(leaf, {"y": y}) * c).sum(), [leaf])
    assert torch.equal(Smoothed().autograd_loss_grad(out, {"y": y}, c)[1], want)
    assert not torch.equal(CrossEntropy().autograd_loss_grad(out, {"y": y}, c)[1], want)  # the smoothing counts


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name,make", [
    ("cross_entropy", lambda g, dt: (torch.randn(37, 10, generator=g, dtype=dt) * 4,
                                     torch.randint(0, 10, (37,), generator=g))),
    ("cross_entropy", lambda g, dt: (torch.randn(1, 2, generator=g, dtype=dt), torch.randint(0, 2, (1,), generator=g))),
    ("mse", lambda g, dt: (torch.randn(37, 3, generator=g, dtype=dt), torch.randn(37, 3, generator=g, dtype=dt))),
])
def test_autograd_loss_grad_has_the_bits_of_autograd_on_the_weighted_loss_sum(name, make, dtype):
    """Ghost clipping's closed-form pass relies on these bits matching its hooked pass (autograd): compared with
    torch.equal against autograd of (ℓ · keep).sum(), for a 0/1 mask (padding rows) and for real-valued weights."""
    obj = trustfl.build("objective", name)
    out, y = make(_gen(12), dtype)
    n = out.shape[0]
    for weights in ((torch.rand(n, generator=_gen(13)) > 0.3), torch.rand(n, generator=_gen(14), dtype=dtype)):
        leaf = out.clone().requires_grad_(True)
        ref_losses = obj.losses(leaf, {"y": y})
        (ref_grad,) = torch.autograd.grad((ref_losses * weights).sum(), [leaf])
        losses, grad = obj.autograd_loss_grad(out, {"y": y}, weights)
        assert not losses.requires_grad and not grad.requires_grad
        assert torch.equal(losses, ref_losses.detach()) and torch.equal(grad, ref_grad)


# ---------------------------------------------------------------------------------------------------------------
# check_data and num_outputs
# ---------------------------------------------------------------------------------------------------------------

def test_cross_entropy_check_data():
    obj = trustfl.build("objective", "cross_entropy")
    obj.check_data(torch.tensor([0, 1, 2, 1]), 3)
    with pytest.raises(ConfigError):
        obj.check_data(torch.tensor([0.0, 1.0, 2.0]), 3)
    with pytest.raises(ConfigError):
        obj.check_data(torch.tensor([0, 1, 2]), 0)
    with pytest.raises(ConfigError):
        obj.check_data(torch.zeros(4, 2, dtype=torch.long), 3)
    # one class is classification with too few classes, not a regression data set
    with pytest.raises(ConfigError, match=r"holds only one class") as err:
        obj.check_data(torch.zeros(4, dtype=torch.long), 1)
    assert "regression" not in str(err.value) and "mse" not in str(err.value)
    with pytest.raises(ConfigError, match=r"regression data set"):
        obj.check_data(torch.zeros(4), 0)


def test_mse_check_data():
    obj = trustfl.build("objective", "mse")
    obj.check_data(torch.randn(5), 0)
    obj.check_data(torch.randn(5, 2), 0)
    with pytest.raises(ConfigError):
        obj.check_data(torch.tensor([0, 1, 1]), 2)


def test_bce_check_data():
    obj = trustfl.build("objective", "bce")
    obj.check_data(torch.tensor([0.0, 1.0, 1.0]), 2)
    obj.check_data(torch.tensor([[0, 1], [1, 1]]), 0)
    with pytest.raises(ConfigError):
        obj.check_data(torch.tensor([0.0, 0.5, 1.0]), 2)
    with pytest.raises(ConfigError):
        obj.check_data(torch.tensor([0, 1, 2]), 2)
    with pytest.raises(ConfigError):
        obj.check_data(torch.tensor([0, 1, 1]), 5)


def test_num_outputs():
    ce = trustfl.build("objective", "cross_entropy")
    mse = trustfl.build("objective", "mse")
    bce = trustfl.build("objective", "bce")
    assert ce.num_outputs(torch.tensor([0, 3, 1]), 10) == 10
    assert mse.num_outputs(torch.randn(6), 0) == 1
    assert mse.num_outputs(torch.randn(6, 4), 0) == 4
    assert bce.num_outputs(torch.tensor([0.0, 1.0]), 2) == 1  # one logit for two classes
    assert bce.num_outputs(torch.zeros(6, 5), 2) == 5
    assert bce.num_outputs(torch.zeros(6, 5), 0) == 5


def test_tasks_of_builtin_objectives():
    assert trustfl.build("objective", "cross_entropy").task == "classification"
    assert trustfl.build("objective", "mse").task == "regression"
    assert trustfl.build("objective", "bce").task == "multilabel"


# ---------------------------------------------------------------------------------------------------------------
# user objectives
# ---------------------------------------------------------------------------------------------------------------

def test_register_objective_builds_a_loss_objective():
    name = _unique("test_user_objective_abs")

    @register_objective(name)
    def abs_error(outputs, batch):
        return (outputs.squeeze(-1) - batch["y"]).abs()

    assert name in trustfl.names("objective")
    obj = trustfl.build("objective", name)
    assert isinstance(obj, LossObjective)
    out = torch.tensor([[1.0], [-2.0], [0.5]])
    y = torch.tensor([3.0, -2.0, 0.0])
    torch.testing.assert_close(obj.losses(out, {"y": y}), torch.tensor([2.0, 0.0, 0.5]), rtol=0, atol=0)
    assert float(obj.loss_sum(out, {"y": y})) == pytest.approx(2.5, rel=1e-6)
    # the decorator returns the function itself
    assert abs_error(out, {"y": y}).shape == (3,)


@pytest.mark.parametrize("bad", [lambda o, b: (o - b["y"].unsqueeze(1)) ** 2,   # (N, 1)
                                 lambda o, b: ((o.squeeze(-1) - b["y"]) ** 2).sum()])  # scalar
def test_user_objective_of_wrong_rank_raises(bad):
    name = _unique("test_user_objective_bad")
    register_objective(name)(bad)
    obj = trustfl.build("objective", name)
    with pytest.raises(ConfigError):
        obj.losses(torch.zeros(4, 1), {"y": torch.ones(4)})


def test_user_objective_with_wrong_length_raises():
    name = _unique("test_user_objective_len")
    # a typical mistake: averaging over the batch instead of the output coordinates gives shape (1,)
    register_objective(name)(lambda o, b: ((o - b["y"].unsqueeze(1)) ** 2).mean(0))
    obj = trustfl.build("objective", name)
    with pytest.raises(ConfigError):
        obj.losses(torch.zeros(5, 1), {"y": torch.arange(5.0)})


def test_register_objective_twice_with_another_function_raises():
    name = _unique("test_user_objective_dup")
    register_objective(name)(lambda o, b: o.squeeze(-1))
    with pytest.raises(RegistryError):
        register_objective(name)(lambda o, b: 2 * o.squeeze(-1))
    # the first registration is kept
    obj = trustfl.build("objective", name)
    torch.testing.assert_close(obj.losses(torch.tensor([[1.5], [2.0]]), {}), torch.tensor([1.5, 2.0]))


def test_registering_a_builtin_name_raises():
    with pytest.raises(RegistryError):
        register_objective("mse")(lambda o, b: o.squeeze(-1))


# ---------------------------------------------------------------------------------------------------------------
# per_example: the functional forward with given parameters
# ---------------------------------------------------------------------------------------------------------------

class _TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def test_per_example_uses_the_given_parameters():
    torch.manual_seed(0)
    model = _TwoLayer().double()
    g = _gen(7)
    # parameters different from the module's own, so that using the module's weights would be caught
    params = {k: torch.randn(v.shape, generator=g, dtype=DT) for k, v in model.named_parameters()}
    x = torch.randn(10, 4, generator=g, dtype=DT)
    y = torch.randint(0, 3, (10,), generator=g)
    obj = trustfl.build("objective", "cross_entropy")
    losses, outputs = obj.per_example(model, params, {"x": x, "y": y})
    h = torch.tanh(x @ params["fc1.weight"].T + params["fc1.bias"])
    ref_out = h @ params["fc2.weight"].T + params["fc2.bias"]
    torch.testing.assert_close(outputs, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(losses, _ref_cross_entropy(ref_out, y), rtol=1e-12, atol=1e-12)
    # the module's own parameters are untouched and give different outputs
    own = model(x)
    assert not torch.allclose(own, outputs)


def test_per_example_mse_on_linear_regression():
    model = nn.Linear(3, 1).double()
    g = _gen(8)
    params = {"weight": torch.randn(1, 3, generator=g, dtype=DT), "bias": torch.randn(1, generator=g, dtype=DT)}
    x = torch.randn(12, 3, generator=g, dtype=DT)
    y = torch.randn(12, generator=g, dtype=DT)
    losses, outputs = trustfl.build("objective", "mse").per_example(model, params, {"x": x, "y": y})
    pred = x @ params["weight"][0] + params["bias"]
    assert outputs.shape == (12, 1)
    torch.testing.assert_close(losses, (pred - y) ** 2, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("bad", [lambda o, b: torch.nn.functional.cross_entropy(o.detach(), b["y"], reduction="none"),
                                 lambda o, b: (o.argmax(1) != b["y"]).long()])
def test_a_loss_that_does_not_depend_on_the_outputs_is_refused_by_name(bad):
    """torch's "element 0 of tensors does not require grad" came out of round 1 as a traceback."""
    name = _unique("test_user_objective_detached")
    register_objective(name)(bad)
    obj = trustfl.build("objective", name)
    with pytest.raises(ConfigError, match=f"^objective '{name}': its losses .* do not depend differentiably on the "
                                          "model's outputs"):
        obj.weighted_loss_grad(torch.randn(4, 3), {"y": torch.tensor([0, 1, 2, 0])}, torch.ones(4))


def test_an_imported_objective_refuses_a_parameter_its_function_does_not_take():
    """A misspelt parameter passed `trustfl validate` and raised TypeError in round 1."""
    from trustfl.objectives.base import _imported_objective

    def scaled(outputs, batch, scale=1.0):
        return scale * torch.nn.functional.cross_entropy(outputs, batch["y"], reduction="none")

    factory = _imported_objective(scaled, "mod:scaled")
    with pytest.raises(ConfigError, match=r"^objective 'mod:scaled' takes \(outputs, batch, \.\.\.\) and cannot take "
                                          r"the parameters \['scal'\]"):
        factory(scal=2.0)
    losses = factory(scale=2.0).losses(torch.zeros(2, 3), {"y": torch.tensor([0, 1])})
    assert torch.allclose(losses, torch.full((2,), 2 * float(torch.log(torch.tensor(3.0)))))
