"""The closed-form cohort gradients of linear/ReLU stacks (trustfl.client.linear_stack): against a per-client
autograd loop written here (float64, 1e-12), bitwise against the vmap path they replace (float32, both memory
layouts), and every model or objective they do not describe takes the generic path."""
import pytest
import torch
from torch import nn
from torch.func import functional_call

from trustfl.client.linear_stack import applies, linear_stack, mean_grad, sgd_step
from trustfl.client.per_example import batched_mean_grad, clipped_grad_sum
from trustfl.models.zoo import MLP, LogisticRegression
from trustfl.objectives.builtin import BinaryCrossEntropy, CrossEntropy, SquaredError

M, B = 4, 6


def _stacked(model: nn.Module, m: int, device, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {k: torch.randn((m, *v.shape), generator=gen, dtype=torch.float64).to(device) * 0.5
            for k, v in model.named_parameters()}


def _reference(model, objective, params, batch, mask):
    """Each client's masked mean loss and its gradient, one client at a time by plain autograd."""
    grads, losses = {k: torch.zeros_like(v) for k, v in params.items()}, []
    for i in range(mask.shape[0]):
        leaves = {k: v[i].clone().requires_grad_(True) for k, v in params.items()}
        one = {k: v[i] for k, v in batch.items()}
        per_example = objective.losses(functional_call(model, leaves, (one["x"],)), one)
        w = mask[i].to(per_example.dtype)
        loss = (per_example * w).sum() / w.sum().clamp(min=1)
        for (k, g) in zip(leaves, torch.autograd.grad(loss, list(leaves.values()))):
            grads[k][i] = g
        losses.append(loss.detach())
    return grads, torch.stack(losses)


def _mask(device) -> torch.Tensor:
    mask = torch.ones(M, B, dtype=torch.bool)
    mask[1, 4:] = False  # a padded client
    mask[2] = False  # a client without examples: zero gradient, zero loss
    return mask.to(device)


CASES = {
    "mlp, cross-entropy": (lambda: MLP((2, 3, 3), 5, hidden=(7, 4)), CrossEntropy(), (2, 3, 3), "class"),
    "logreg, cross-entropy": (lambda: LogisticRegression((9,), 3), CrossEntropy(), (9,), "class"),
    "sequential with Flatten, no biases, mse": (
        lambda: nn.Sequential(nn.Flatten(), nn.Linear(6, 5, bias=False), nn.ReLU(), nn.Linear(5, 2, bias=False)),
        SquaredError(), (2, 3), "real2"),
    "sequential without Flatten, bce": (
        lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3, bias=False), nn.ReLU(), nn.Linear(3, 1)),
        BinaryCrossEntropy(), (4,), "binary"),
}


@pytest.mark.parametrize("case", CASES)
def test_gradients_and_losses_equal_a_per_client_autograd_loop(case, device):
    build, objective, shape, targets = CASES[case]
    gen = torch.Generator().manual_seed(7)
    model = build().double().to(device)
    params = _stacked(model, M, device, gen)
    x = torch.randn(M, B, *shape, generator=gen, dtype=torch.float64).to(device)
    y = {"class": lambda: torch.randint(0, 3, (M, B), generator=gen),
         "real2": lambda: torch.randn(M, B, 2, generator=gen, dtype=torch.float64),
         "binary": lambda: torch.randint(0, 2, (M, B), generator=gen).double()}[targets]().to(device)
    batch, mask = {"x": x, "y": y}, _mask(device)
    stack = linear_stack(model)
    assert stack is not None and applies(stack, objective, params, batch)
    want_grads, want_losses = _reference(model, objective, params, batch, mask)
    got_grads, got_losses = batched_mean_grad(model, objective, params, batch, mask)
    direct, _ = mean_grad(stack, objective, params, batch, mask.double())
    assert list(got_grads) == list(params)
    torch.testing.assert_close(got_losses, want_losses, rtol=1e-12, atol=1e-15)
    for k in params:
        torch.testing.assert_close(got_grads[k], want_grads[k], rtol=1e-12, atol=1e-15)
        assert torch.equal(direct[k], got_grads[k])
        assert got_grads[k].shape == params[k].shape
    assert bool((got_grads[next(iter(params))][2] == 0).all()) and float(got_losses[2]) == 0.0
    # the weight gradients keep the generic path's (m, in, out) storage, which the executor lays parameters out in
    assert got_grads[stack.layers[0][0]].transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("layout", ["row-major", "gradient layout"])
@pytest.mark.parametrize("objective", [CrossEntropy(), SquaredError()], ids=["cross_entropy", "mse"])
def test_bitwise_the_vmap_path_it_replaces(layout, objective, device):
    """Against the generic path itself (forward under vmap, autograd on the stacked leaves; a hooked model takes it),
    in float32 as the engine runs, padded: the same bits, for a row-major start (a client's stored model) and for
    the executor's gradient layout."""
    gen = torch.Generator().manual_seed(3)
    model = MLP((20,), 4, hidden=(16, 8)).to(device)
    params = {k: v.float() for k, v in _stacked(model, M, device, gen).items()}
    if layout == "gradient layout":
        params = {k: v.transpose(1, 2).contiguous().transpose(1, 2) if v.dim() == 3 else v for k, v in params.items()}
    y = torch.randint(0, 4, (M, B), generator=gen) if isinstance(objective, CrossEntropy) else \
        torch.randn(M, B, 4, generator=gen)
    batch, mask = {"x": torch.randn(M, B, 20, generator=gen).to(device), "y": y.to(device)}, _mask(device)
    got, got_losses = batched_mean_grad(model, objective, params, batch, mask)
    model.register_forward_hook(lambda *_: None)
    assert linear_stack(model) is None
    want, want_losses = batched_mean_grad(model, objective, params, batch, mask)
    assert torch.equal(got_losses, want_losses)
    for k in params:
        assert torch.equal(got[k], want[k]), k
        assert got[k].stride() == want[k].stride(), k


class _Subclass(MLP):
    def forward(self, x):
        return super().forward(x) * 2


class _OwnForward(CrossEntropy):
    def forward(self, model, params, batch):
        return super().forward(model, params, batch) + 1


def _hooked() -> nn.Module:
    model = MLP((4,), 2, hidden=(3,))
    model.net[0].register_forward_pre_hook(lambda *_: None)
    return model


@pytest.mark.parametrize("build", [
    lambda: nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)),
    lambda: nn.Sequential(nn.Linear(4, 3), nn.ReLU()),
    lambda: nn.Sequential(nn.Flatten(0), nn.Linear(4, 2)),
    lambda: nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3, 2)),
    lambda: _Subclass((4,), 2, hidden=(3,)),
    _hooked,
], ids=["tanh", "ends-in-relu", "flatten-dim0", "flatten-inside", "subclass", "hooked"])
def test_other_models_are_not_described(build):
    assert linear_stack(build()) is None


def test_objectives_and_params_it_cannot_compute_take_the_generic_path():
    model = MLP((4,), 3, hidden=(5,))
    gen = torch.Generator().manual_seed(0)
    params = _stacked(model, 2, "cpu", gen)
    batch = {"x": torch.randn(2, 3, 4, dtype=torch.float64), "y": torch.zeros(2, 3, dtype=torch.long)}
    stack = linear_stack(model)
    assert applies(stack, CrossEntropy(), params, batch)
    assert not applies(stack, _OwnForward(), params, batch)
    assert not applies(stack, CrossEntropy(), {k: v for k, v in params.items() if k != "net.0.bias"}, batch)
    assert not applies(stack, CrossEntropy(), params, {**batch, "x": batch["x"].float()})
    assert not applies(None, CrossEntropy(), params, batch)
    plain = nn.Sequential(nn.Linear(4, 3))
    assert not applies(linear_stack(plain), CrossEntropy(), {"0.weight": torch.zeros(2, 3, 4, dtype=torch.float64),
                                                            "0.bias": torch.zeros(2, 3, dtype=torch.float64)},
                       {**batch, "x": batch["x"].unsqueeze(2)})  # no Flatten: the input must be (m, B, features)


@pytest.mark.parametrize("layout", ["row-major", "gradient layout"])
@pytest.mark.parametrize("case", ["mlp, cross-entropy", "sequential with Flatten, no biases, mse",
                                  "sequential without Flatten, bce"])
def test_fused_sgd_step_equals_gradient_then_update(case, layout, device):
    """sgd_step's in-place update is θ − η·mean_grad(θ), against the unfused path in float64 (1e-12), padded and
    with an empty client (which must not move), on both memory layouts the executor keeps parameters in."""
    build, objective, shape, targets = CASES[case]
    gen = torch.Generator().manual_seed(11)
    model = build().double().to(device)
    params = _stacked(model, M, device, gen)
    if layout == "gradient layout":
        params = {k: v.transpose(1, 2).contiguous().transpose(1, 2) if v.dim() == 3 else v for k, v in params.items()}
    x = torch.randn(M, B, *shape, generator=gen, dtype=torch.float64).to(device)
    y = {"class": lambda: torch.randint(0, 3, (M, B), generator=gen),
         "real2": lambda: torch.randn(M, B, 2, generator=gen, dtype=torch.float64),
         "binary": lambda: torch.randint(0, 2, (M, B), generator=gen).double()}[targets]().to(device)
    batch, mask, lr = {"x": x, "y": y}, _mask(device), 0.3
    stack = linear_stack(model)
    grads, want_losses = mean_grad(stack, objective, params, batch, mask.double())
    want = {k: v - lr * grads[k] for k, v in params.items()}
    stepped = {k: v.clone(memory_format=torch.preserve_format) for k, v in params.items()}
    losses = sgd_step(stack, objective, stepped, batch, mask.double(), lr)
    torch.testing.assert_close(losses, want_losses, rtol=1e-12, atol=1e-15)
    for k in params:
        torch.testing.assert_close(stepped[k], want[k], rtol=1e-12, atol=1e-15)
        assert stepped[k].stride() == params[k].stride(), k  # updated in its own storage
        assert torch.equal(stepped[k][2], params[k][2]), k  # the client without examples did not move
        assert not torch.equal(stepped[k][0], params[k][0]), k


def test_fused_sgd_step_in_float32_agrees_to_rounding():
    """In float32 the fused product rounds W − η·GᵀH once where the unfused path rounds GᵀH first: not bitwise,
    within a few units in the last place of the weights."""
    gen = torch.Generator().manual_seed(5)
    model = MLP((20,), 4, hidden=(16, 8))
    params = {k: v.float() for k, v in _stacked(model, M, "cpu", gen).items()}
    batch = {"x": torch.randn(M, B, 20, generator=gen), "y": torch.randint(0, 4, (M, B), generator=gen)}
    mask = _mask("cpu")
    stack = linear_stack(model)
    grads, _ = mean_grad(stack, CrossEntropy(), params, batch, mask.float())
    stepped = {k: v.clone() for k, v in params.items()}
    sgd_step(stack, CrossEntropy(), stepped, batch, mask.float(), 0.5)
    for k in params:
        torch.testing.assert_close(stepped[k], params[k] - 0.5 * grads[k], rtol=1e-6, atol=1e-6)


def test_a_client_that_does_not_step_keeps_its_parameters_bitwise_even_non_finite():
    """``idle``: rows that sit the step out keep their parameters bit for bit, even a row whose weights hold inf
    and NaN (whose products would give NaN times zero); the others take the step of the unfused path."""
    gen = torch.Generator().manual_seed(13)
    model = MLP((6,), 3, hidden=(5, 4)).double()
    params = _stacked(model, M, "cpu", gen)
    params["net.2.weight"][1, 0, 0] = float("inf")  # client 1 sits out, with non-finite weights
    params["net.0.weight"][1, 2, 3] = float("nan")
    batch = {"x": torch.randn(M, B, 6, generator=gen, dtype=torch.float64) * 1e200,  # huge inputs: inf activations
             "y": torch.randint(0, 3, (M, B), generator=gen)}
    batch["x"][0] /= 1e200  # client 0 steps on ordinary inputs
    idle = torch.tensor([1, 3])
    mask = _mask("cpu")
    stack = linear_stack(model)
    grads, _ = mean_grad(stack, CrossEntropy(), params, batch, mask.double())
    stepped = {k: v.clone() for k, v in params.items()}
    sgd_step(stack, CrossEntropy(), stepped, batch, mask.double(), 0.1, idle)
    for k in params:
        for i in (1, 3):
            assert torch.equal(stepped[k][i].nan_to_num(7.0), params[k][i].nan_to_num(7.0)), (k, i)
        torch.testing.assert_close(stepped[k][0], params[k][0] - 0.1 * grads[k][0], rtol=1e-12, atol=1e-15)


def test_idle_rows_are_left_as_they_were_and_the_others_step_as_when_all_step():
    """``idle`` rows keep their parameters though their own products are NaN; the other rows take the bits of a
    step in which every row steps (rows of a batched product do not mix)."""
    gen = torch.Generator().manual_seed(17)
    model = MLP((6,), 3, hidden=(5, 4)).double()
    params = _stacked(model, M, "cpu", gen)
    params["net.4.weight"][2, 0, 0] = float("inf")  # client 2 sits out: its products with its zero G are NaN
    batch = {"x": torch.randn(M, B, 6, generator=gen, dtype=torch.float64),
             "y": torch.randint(0, 3, (M, B), generator=gen)}
    mask = _mask("cpu")
    stack = linear_stack(model)
    stepped = {}
    for how, idle in (("idle", torch.tensor([2])), ("all", None)):
        out = {k: v.clone() for k, v in params.items()}
        sgd_step(stack, CrossEntropy(), out, {k: v.clone() for k, v in batch.items()}, mask.double(), 0.1, idle)
        stepped[how] = out
    for k in params:
        assert torch.equal(stepped["idle"][k][2], params[k][2]), k
        for i in (0, 1, 3):
            assert torch.equal(stepped["idle"][k][i], stepped["all"][k][i]), (k, i)
            assert not torch.equal(stepped["idle"][k][i], params[k][i]), (k, i)


@pytest.mark.parametrize("m", [1, M], ids=["one client", "cohort"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", CASES)
def test_ghost_clipping_inputs_bitwise_the_hooked_pass(case, dtype, m, device):
    """Ghost clipping of a stack takes its layer inputs and output gradients in closed form (ghost_inputs): the
    clipped sums, norms and losses are the bits of the hooked pass it replaces (forward hooks, zero probes, autograd
    through the model: what a hooked model takes), padded rows included, with a clip norm between the norms."""
    build, objective, shape, targets = CASES[case]
    gen = torch.Generator().manual_seed(11)
    model = build().to(device=device, dtype=dtype)
    params = {k: v[:m].to(dtype) for k, v in _stacked(model, M, device, gen).items()}
    x = torch.randn(m, B, *shape, generator=gen, dtype=dtype).to(device)
    y = {"class": lambda: torch.randint(0, 3, (m, B), generator=gen),
         "real2": lambda: torch.randn(m, B, 2, generator=gen, dtype=dtype),
         "binary": lambda: torch.randint(0, 2, (m, B), generator=gen).to(dtype)}[targets]().to(device)
    batch, mask = {"x": x, "y": y}, _mask(device)[-m:]  # one client: the padded last; a cohort: all four
    mask[0, 0] = False
    assert applies(linear_stack(model), objective, params, batch)
    norms = clipped_grad_sum(model, params, batch, mask, 1.0, objective=objective)[1][mask]
    clip = float(norms.median())  # clipped and unclipped examples
    got = clipped_grad_sum(model, params, batch, mask, clip, objective=objective, return_loss=True)
    model.register_forward_hook(lambda *_: None)
    assert linear_stack(model) is None
    want = clipped_grad_sum(model, params, batch, mask, clip, objective=objective, return_loss=True)
    assert bool((norms > clip).any()) and bool((norms < clip).any())
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
    for k in params:
        assert torch.equal(got[0][k], want[0][k]), k
