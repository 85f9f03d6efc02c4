"""Per-example gradients, clipped sums, DP noise and mini-batch clipping (trustfl.client.per_example).

All gradient oracles run in float64 so that agreement is checked at 1e-6 (or tighter).
"""
from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trustfl.client.per_example import (clip_factors, clipped_batch_mean, clipped_grad_sum, noisy_clipped_mean,
                                        per_example_grads)
from trustfl.client.per_example_checks import blank_padding
from trustfl.errors import ConfigError, PrivacyError, TrustFLError
from trustfl.models import build_model

MODELS = [("logreg", (64,), {}), ("mlp", (64,), {"hidden": (32, 16)}),
          ("cnn_cafcor", (1, 28, 28), {}), ("cnn_rhdp", (1, 28, 28), {})]


def _model(name: str, shape: tuple[int, ...], kw: dict, seed: int = 0) -> nn.Module:
    return build_model(name, shape, 10, seed=seed, **kw).double()


def _cohort(name: str, shape: tuple[int, ...], kw: dict, m: int, b: int, seed: int = 0):
    nets = [_model(name, shape, kw, seed=seed + i) for i in range(m)]
    params = {k: torch.stack([dict(n.named_parameters())[k].detach() for n in nets])
              for k, _ in nets[0].named_parameters()}
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, b, *shape, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (m, b), generator=gen)
    return nets, params, x, y


def _loop_grads(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """One example at a time with plain autograd: the oracle."""
    out = []
    for xb, yb in zip(x, y):
        loss = F.cross_entropy(net(xb.unsqueeze(0)), yb.unsqueeze(0))
        names, ps = zip(*net.named_parameters())
        out.append(dict(zip(names, torch.autograd.grad(loss, ps))))
    return out


def _reference_clipped_sum(nets, x, y, mask, c):
    sums, norms = {}, torch.zeros(mask.shape, dtype=torch.float64)
    for i, net in enumerate(nets):
        for b, g in enumerate(_loop_grads(net, x[i], y[i])):
            if not mask[i, b]:
                continue
            n = math.sqrt(sum(v.square().sum().item() for v in g.values()))
            norms[i, b] = n
            for k, v in g.items():
                total = sums.setdefault(k, torch.zeros(len(nets), *v.shape, dtype=torch.float64))
                total[i] += min(1, c / (n + 1e-6)) * v
    return sums, norms


@pytest.mark.parametrize("name,shape,kw", MODELS, ids=[m[0] for m in MODELS])
def test_per_example_grads_match_one_at_a_time(name, shape, kw):
    net = _model(name, shape, kw)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, *shape, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (5,), generator=gen)
    params = {k: v.detach() for k, v in net.named_parameters()}
    got = per_example_grads(net, params, {"x": x, "y": y})
    chunked = per_example_grads(net, params, {"x": x, "y": y}, chunk_size=2)
    for b, ref in enumerate(_loop_grads(net, x, y)):
        for k, v in ref.items():
            assert got[k].shape == (5, *v.shape)
            assert torch.allclose(got[k][b], v, atol=1e-6, rtol=0)
            assert torch.allclose(chunked[k][b], v, atol=1e-6, rtol=0)


@pytest.mark.parametrize("method", ["ghost", "vmap"])
def test_clipped_sum_matches_reference_with_masks(method):
    nets, params, x, y = _cohort("mlp", (64,), {"hidden": (32, 16)}, m=3, b=7)
    mask = torch.ones(3, 7)
    mask[0, 5:] = 0
    mask[2, 0] = 0
    sums, norms = clipped_grad_sum(nets[0], params, {"x": x, "y": y}, mask, 0.3, method=method, chunk_size=3)
    ref, ref_norms = _reference_clipped_sum(nets, x, y, mask, 0.3)
    assert torch.allclose(norms, ref_norms, atol=1e-9, rtol=1e-9)
    assert (norms[mask == 0] == 0).all()
    for k in ref:
        assert torch.allclose(sums[k], ref[k], atol=1e-9, rtol=0)


@pytest.mark.parametrize("method", ["ghost", "vmap"])
def test_clipped_norm_at_most_c(method):
    # one example per client: the clipped sum is that example's clipped gradient
    nets, params, x, y = _cohort("cnn_rhdp", (1, 28, 28), {}, m=4, b=1, seed=3)
    for c in (1e-3, 0.1, 1e3):
        sums, norms = clipped_grad_sum(nets[0], params, {"x": x, "y": y}, torch.ones(4, 1), c, method=method)
        total = torch.sqrt(sum(v.flatten(1).square().sum(1) for v in sums.values()))
        assert (total <= c * (1 + 1e-9)).all()
        assert torch.allclose(total, torch.minimum(norms[:, 0], torch.full((4,), c)), rtol=1e-5)


def test_padding_is_blanked_without_reading_the_device():
    """Off the CPU the blanking never reads ``keep`` on the host (a CUDA sync every step): on the meta device, where
    any host read raises, the padded rows still come back zeroed, and a CPU batch without padding is not copied."""
    x = torch.full((2, 3, 4), float("nan"), device="meta")
    out = blank_padding({"x": x}, torch.ones(2, 3, dtype=torch.bool, device="meta"))
    assert out["x"].device.type == "meta" and out["x"].shape == x.shape
    keep = torch.tensor([[True, False, True], [True, True, True]])
    cpu = torch.full((2, 3, 4), float("nan"))
    blanked = blank_padding({"x": cpu}, keep)["x"]
    assert torch.equal(blanked[0, 1], torch.zeros(4)) and blanked[keep].isnan().all()
    assert blank_padding({"x": cpu}, torch.ones(2, 3, dtype=torch.bool))["x"] is cpu


@pytest.mark.parametrize("method", ["ghost", "vmap"])
def test_mask_zeros_contribute_nothing(method):
    nets, params, x, y = _cohort("logreg", (64,), {}, m=2, b=6, seed=5)
    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    base, base_norms = clipped_grad_sum(nets[0], params, {"x": x, "y": y}, mask, 0.5, method=method)
    x2, y2 = x.clone(), y.clone()
    x2[~mask] = float("nan")  # garbage in padding rows, including an invalid label
    y2[~mask] = -7
    got, got_norms = clipped_grad_sum(nets[0], params, {"x": x2, "y": y2}, mask.double(), 0.5, method=method)
    assert torch.equal(got_norms, base_norms)
    for k in base:
        assert torch.allclose(got[k], base[k], atol=1e-12)
    # dropping the padded rows of client 0 (its real examples are 0, 1, 3) gives the same client-0 sum
    keep = torch.tensor([0, 1, 3])
    alone, _ = clipped_grad_sum(nets[0], {k: v[:1] for k, v in params.items()}, {"x": x[:1, keep], "y": y[:1, keep]},
                                torch.ones(1, 3), 0.5, method=method)
    for k in base:
        assert torch.allclose(alone[k][0], base[k][0], atol=1e-12)


def test_noise_std_and_mean():
    m, d, sigma, c = 2, 200_000, 0.7, 2.5
    zeros = {"w": torch.zeros(m, d // 4, 4), "b": torch.zeros(m, 3)}
    gens = [torch.Generator().manual_seed(11), torch.Generator().manual_seed(12)]
    ebs = torch.tensor([1.0, 4.0])
    out = noisy_clipped_mean(zeros, sigma, c, ebs, gens)
    for i in range(m):
        z = out["w"][i].flatten() * ebs[i]
        n = z.numel()
        se_std = sigma * c / math.sqrt(2 * n)  # standard error of the sample std of a Gaussian
        assert abs(z.std().item() - sigma * c) < 3 * se_std
        assert abs(z.mean().item()) < 3 * sigma * c / math.sqrt(n)


def test_noise_draw_order_and_determinism(draw_threads):
    sums = {"w": torch.randn(3, 4, 5), "b": torch.randn(3, 2)}
    out1 = noisy_clipped_mean(sums, 1.3, 0.5, 8.0, [torch.Generator().manual_seed(s) for s in (1, 2, 3)])
    out2 = noisy_clipped_mean(sums, 1.3, 0.5, 8.0, [torch.Generator().manual_seed(s) for s in (1, 2, 3)])
    for k in sums:
        assert torch.equal(out1[k], out2[k])
    # documented order: client i's generator draws one randn per parameter, in dict order
    gen = torch.Generator().manual_seed(2)
    zw, zb = torch.randn(4, 5, generator=gen), torch.randn(2, generator=gen)
    assert torch.allclose(out1["w"][1], (sums["w"][1] + 1.3 * 0.5 * zw) / 8.0, atol=1e-6)
    assert torch.allclose(out1["b"][1], (sums["b"][1] + 1.3 * 0.5 * zb) / 8.0, atol=1e-6)
    # client 1's result depends only on client 1's generator
    other = noisy_clipped_mean(sums, 1.3, 0.5, 8.0, [torch.Generator().manual_seed(s) for s in (9, 2, 7)])
    assert torch.equal(other["w"][1], out1["w"][1]) and not torch.equal(other["w"][0], out1["w"][0])


def test_noise_free_mean_and_generators_untouched():
    gen = torch.Generator().manual_seed(4)
    state = gen.get_state()
    out = noisy_clipped_mean({"w": torch.full((1, 3), 6.0)}, 0.0, 1.0, 3.0, [gen])
    assert out["w"].tolist() == [[2.0, 2.0, 2.0]]
    assert torch.equal(gen.get_state(), state)


def test_clipped_batch_mean():
    nets, params, x, y = _cohort("mlp", (64,), {"hidden": (16,)}, m=3, b=5, seed=7)
    mask = torch.ones(3, 5)
    mask[1, 2:] = 0
    mask[2] = 0  # a client with no real example gets a zero gradient
    for c in (1e-2, 1e3):
        clipped, norms = clipped_batch_mean(nets[0], params, {"x": x, "y": y}, mask, c)
        total = torch.sqrt(sum(v.flatten(1).square().sum(1) for v in clipped.values()))
        assert (total <= c * (1 + 1e-9)).all()
        for i in range(2):
            n_real = int(mask[i].sum())
            grads = _loop_grads(nets[i], x[i, :n_real], y[i, :n_real])
            mean = {k: sum(g[k] for g in grads) / n_real for k in grads[0]}
            ref_norm = math.sqrt(sum(v.square().sum().item() for v in mean.values()))
            assert norms[i].item() == pytest.approx(ref_norm, rel=1e-9)
            for k, v in mean.items():
                assert torch.allclose(clipped[k][i], v * min(1.0, c / (ref_norm + 1e-6)), atol=1e-12)
        assert norms[2] == 0 and total[2] == 0
    # The loss from the same forward pass: each client's mean loss over its real examples.
    _, _, losses = clipped_batch_mean(nets[0], params, {"x": x, "y": y}, mask, 1.0, return_loss=True)
    for i in range(2):
        n_real = int(mask[i].sum())
        with torch.no_grad():
            ref = torch.nn.functional.cross_entropy(nets[i](x[i, :n_real]), y[i, :n_real])
        assert losses[i].item() == pytest.approx(ref.item(), rel=1e-9)
    assert losses[2] == 0


def test_clip_factor_is_opacus():
    norms = torch.tensor([0.0, 1.0, 3.0])
    assert torch.allclose(clip_factors(norms, 2.0), torch.tensor([1.0, 1.0, 2.0 / (3.0 + 1e-6)]))


def test_errors_name_the_argument():
    nets, params, x, y = _cohort("logreg", (64,), {}, m=2, b=3)
    mask = torch.ones(2, 3)
    with pytest.raises(ConfigError, match="method"):
        clipped_grad_sum(nets[0], params, {"x": x, "y": y}, mask, 1.0, method="hooks")
    with pytest.raises(PrivacyError, match="max_norm"):
        clipped_grad_sum(nets[0], params, {"x": x, "y": y}, mask, 0.0)
    with pytest.raises(ConfigError, match="mask"):
        clipped_grad_sum(nets[0], params, {"x": x, "y": y}, torch.ones(2, 4), 1.0)
    with pytest.raises(ConfigError, match="clients"):
        clipped_grad_sum(nets[0], {k: v[:1] for k, v in params.items()}, {"x": x, "y": y}, mask, 1.0)
    with pytest.raises(ConfigError, match="chunk_size"):
        clipped_grad_sum(nets[0], params, {"x": x, "y": y}, mask, 1.0, method="vmap", chunk_size=0)
    with pytest.raises(PrivacyError, match="noise_multiplier"):
        noisy_clipped_mean({"w": torch.zeros(1, 2)}, -1.0, 1.0, 1.0, [torch.Generator()])
    with pytest.raises(ConfigError, match="generators"):
        noisy_clipped_mean({"w": torch.zeros(2, 2)}, 1.0, 1.0, 1.0, [torch.Generator()])
    with pytest.raises(ConfigError, match="expected_batch_size"):
        noisy_clipped_mean({"w": torch.zeros(2, 2)}, 1.0, 1.0, torch.tensor([1.0, 0.0]),
                           [torch.Generator(), torch.Generator()])
    # a string batch size or a generator that is not one raised TypeError from torch; integer sums torch's
    # NotImplementedError; 1e-300, positive but 0 in float32, was called not positive
    two = [torch.Generator(), torch.Generator()]
    with pytest.raises(ConfigError, match=r"^`expected_batch_size` must be a positive number .*found '5'\.$"):
        noisy_clipped_mean({"w": torch.zeros(2, 2)}, 1.0, 1.0, "5", two)
    with pytest.raises(ConfigError, match=r"found True\.$"):
        noisy_clipped_mean({"w": torch.zeros(2, 2)}, 1.0, 1.0, True, two)
    with pytest.raises(ConfigError, match=r"^`generators` must hold one torch.Generator per client \(2\), found "
                                          r"\['int', 'Generator'\]\.$"):
        noisy_clipped_mean({"w": torch.zeros(2, 2)}, 1.0, 1.0, 1.0, [1, torch.Generator()])
    with pytest.raises(ConfigError, match=r"^`grad_sum_stacked\['w'\]` must have a floating dtype"):
        noisy_clipped_mean({"w": torch.zeros(2, 2, dtype=torch.long)}, 1.0, 1.0, 1.0, two)
    with pytest.raises(PrivacyError, match="beyond torch.float32's range"):
        noisy_clipped_mean({"w": torch.zeros(2, 2)}, 1.0, 1.0, 1e-300, two)
    assert torch.equal(noisy_clipped_mean({"w": torch.ones(2, 2)}, 0.0, 1.0, torch.tensor([2, 4]), two)["w"],
                       torch.tensor([[0.5, 0.5], [0.25, 0.25]]))  # an integer tensor of sizes is still one
    assert issubclass(ConfigError, TrustFLError) and issubclass(PrivacyError, TrustFLError)


@pytest.mark.parametrize("name,shape,kw", MODELS)
@pytest.mark.parametrize("objective", ["cross_entropy", "mse"])
def test_plain_mean_grad_is_bitwise_torch_func_grad(name, shape, kw, objective):
    """The plain path takes autograd of the vmapped sum (no torch.func.grad, whose first call imports torch._dynamo):
    bitwise what ``torch.func.grad`` of the same sum gives, in float32 as the engine runs, masked or not."""
    from torch.func import grad

    import trustfl
    from trustfl.client.per_example import batched_mean_grad, batched_mean_losses

    obj = trustfl.build("objective", objective)
    net = build_model(name, shape, 10, seed=0, **kw)
    m, b = 4, 6
    gen = torch.Generator().manual_seed(3)
    params = {k: v.detach() + 0.01 * torch.randn(m, *v.shape, generator=gen) for k, v in net.named_parameters()}
    x = torch.randn(m, b, *shape, generator=gen)
    y = torch.randint(0, 10, (m, b), generator=gen) if objective == "cross_entropy" else torch.randn(m, b, 10,
                                                                                                      generator=gen)
    for padded in (False, True):
        mask = torch.ones(m, b, dtype=torch.bool)
        if padded:
            mask[0, b // 2:] = False
            mask[-1] = False
        w = mask.float()

        def total(p):
            per_client = batched_mean_losses(net, obj, p, {"x": x, "y": y}, w)
            return per_client.sum(), per_client.detach()

        ref, ref_losses = grad(total, has_aux=True)(params)
        grads, losses = batched_mean_grad(net, obj, params, {"x": x, "y": y}, mask, full=not padded)
        assert torch.equal(losses, ref_losses)
        for k in ref:
            assert torch.equal(grads[k], ref[k]), k


@pytest.mark.parametrize("method,groups", [("ghost", False), ("ghost", True), ("vmap", False)])
@pytest.mark.parametrize("name,shape,kw", [MODELS[1], MODELS[2]])
def test_the_clipped_sums_losses_are_bitwise_batched_mean_losses(monkeypatch, name, shape, kw, method, groups):
    """DP-SGD's reported loss: the ghost pass takes it from its own forward (no second forward). In float32 it is
    bitwise what batched_mean_losses gives on the unblanked batch (padding rows hold other data there) when the cohort
    runs in one pass; one client per pass (plain autograd, no vmap) rounds a convolution differently, so there it
    agrees to float32 rounding. Sums and norms are those without ``return_loss``."""
    from trustfl.client import ghost
    from trustfl.client.per_example import batched_mean_losses
    from trustfl.objectives.builtin import CrossEntropy

    nets, params, x, y = _cohort(name, shape, kw, 3, 5, seed=2)
    nets[0].float()
    params = {k: v.float() for k, v in params.items()}
    x = x.float() * 3
    mask = torch.tensor([[True, True, False, True, False], [True] * 5, [False] * 5])
    if groups:
        monkeypatch.setattr(ghost, "PASS_BUDGET", 1)
    want = batched_mean_losses(nets[0], CrossEntropy(), params, {"x": x, "y": y}, mask)
    sums, norms, losses = clipped_grad_sum(nets[0], params, {"x": x, "y": y}, mask, 0.5, method=method,
                                           return_loss=True)
    assert losses.shape == (3,) and float(losses[2]) == 0.0 and float(losses[0]) > 0
    if groups:
        torch.testing.assert_close(losses, want, rtol=1e-6, atol=0)
    else:
        assert torch.equal(losses, want)
    plain_sums, plain_norms = clipped_grad_sum(nets[0], params, {"x": x, "y": y}, mask, 0.5, method=method)
    assert torch.equal(norms, plain_norms) and all(torch.equal(sums[k], plain_sums[k]) for k in sums)


class _Scaled(nn.Module):
    """A learnable 0-d parameter (a temperature): its stacked per-client form is ``(m,)``."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x):
        return self.fc(x) * self.scale


@pytest.mark.parametrize("method", ["ghost", "vmap"])
def test_a_zero_dimensional_parameter_is_clipped_like_any_other(method):
    """``flatten(2)`` of its ``(m, B)`` per-example gradients raised IndexError, in both methods and in
    clipped_batch_mean; the norms now match an autograd loop, the scale's gradient included."""
    torch.manual_seed(0)
    model = _Scaled().double().eval()
    params = {k: v.detach().unsqueeze(0).repeat(2, *[1] * v.dim()) for k, v in model.named_parameters()}
    x, y = torch.randn(2, 3, 4, dtype=torch.float64), torch.tensor([[0, 1, 2], [2, 2, 0]])
    with pytest.warns(UserWarning, match="falls back") if method == "ghost" else contextlib.nullcontext():
        sums, norms = clipped_grad_sum(model, params, {"x": x, "y": y}, torch.ones(2, 3), 0.5, method=method)
    for b in range(3):
        grads = torch.autograd.grad(F.cross_entropy(model(x[0, b:b + 1]), y[0, b:b + 1]), list(model.parameters()))
        assert math.isclose(float(norms[0, b]), math.sqrt(sum(float(g.square().sum()) for g in grads)), rel_tol=1e-12)
    assert sums["scale"].shape == (2,)
    clipped, batch_norms = clipped_batch_mean(model, params, {"x": x, "y": y}, torch.ones(2, 3), 0.5)
    assert clipped["scale"].shape == (2,) and torch.isfinite(batch_norms).all()


def test_parameters_the_model_lacks_or_another_dtype_are_refused_by_name():
    """A wrong shape or a float64 batch raised RuntimeError deep in the forward; an unknown name was silently ignored
    by method="vmap" (and refused by ghost)."""
    model = nn.Linear(4, 3)
    params = {k: v.detach().unsqueeze(0).repeat(2, *[1] * v.dim()) for k, v in model.named_parameters()}
    batch = {"x": torch.randn(2, 5, 4), "y": torch.randint(0, 3, (2, 5))}
    for method in ("ghost", "vmap"):
        with pytest.raises(ConfigError, match=r"holds 'extra', which is not a parameter of the Linear"):
            clipped_grad_sum(model, {**params, "extra": torch.zeros(2, 1)}, batch, torch.ones(2, 5), 1.0,
                             method=method)
        with pytest.raises(ConfigError, match=r"`params_stacked\['weight'\]` has shape \(2, 3, 5\)"):
            clipped_grad_sum(model, {**params, "weight": torch.zeros(2, 3, 5)}, batch, torch.ones(2, 5), 1.0,
                             method=method)
        with pytest.raises(ConfigError, match=r"`batch\['x'\]` is torch.float64 but the parameters are torch.float32"):
            clipped_grad_sum(model, params, {**batch, "x": batch["x"].double()}, torch.ones(2, 5), 1.0, method=method)


@pytest.mark.parametrize("method", ["ghost", "vmap"])
@pytest.mark.parametrize("m, b", [(2, 0), (0, 5)])
def test_no_client_or_no_example_clips_to_zeros(method, m, b):
    """An empty batch raised RuntimeError on the ghost path, no client IndexError on the vmap path."""
    model = nn.Linear(4, 3)
    params = {k: v.detach().unsqueeze(0).repeat(m, *[1] * v.dim()) for k, v in model.named_parameters()}
    batch = {"x": torch.randn(m, b, 4), "y": torch.zeros(m, b, dtype=torch.long)}
    sums, norms, losses = clipped_grad_sum(model, params, batch, torch.ones(m, b), 1.0, method=method,
                                           return_loss=True)
    assert norms.shape == (m, b) and losses.shape == (m,) and all(v.shape == params[k].shape and not v.any()
                                                                    for k, v in sums.items())


@pytest.mark.parametrize("sigma, clip, ebs", [(1.0, 1.0, 1e-45), (1e38, 10.0, 1.0), (0.0, 1.0, 1e-45)])
def test_a_noise_scale_beyond_the_dtype_is_refused_not_returned_as_inf(sigma, clip, ebs):
    """E|S| = 1e-45 (a float32 denormal) or σC = 1e39 gave ±inf and NaN."""
    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    with pytest.raises(PrivacyError, match=r"beyond torch.float32's range"):
        noisy_clipped_mean({"w": torch.ones(2, 3)}, sigma, clip, ebs, gens)


@pytest.mark.parametrize("method", ["ghost", "vmap"])
@pytest.mark.parametrize("labels, message", [
    (torch.full((2, 5), 7), r"^`batch\['y'\]` holds a label outside the model's outputs"),
    (torch.full((2, 5), -100), r"^`batch\['y'\]` holds the negative label -100;"),  # torch's loss ignored it: 0
    (torch.zeros(2, 5), r"^`batch\['y'\]`: cross_entropy needs integer class labels, found dtype torch.float32"),
    (None, r"^`batch\['y'\]`: cross_entropy needs integer class labels, found no 'y' entry"),
    (torch.zeros(2, 5, 2, dtype=torch.long), r"^`batch\['y'\]` must have the shape \(2, 5\)"),
])
def test_labels_the_loss_cannot_read_are_refused_by_name(method, labels, message):
    """Direct calls with such labels raised torch's IndexError, RuntimeError, KeyError or AssertionError; -100
    (cross-entropy's ignore index) gave a zero gradient for every example."""
    model = nn.Linear(4, 3)
    params = {k: v.detach().unsqueeze(0).repeat(2, *[1] * v.dim()) for k, v in model.named_parameters()}
    batch = {"x": torch.randn(2, 5, 4)} | ({} if labels is None else {"y": labels})
    with pytest.raises(ConfigError, match=message):
        clipped_grad_sum(model, params, batch, torch.ones(2, 5), 1.0, method=method)
    if labels is not None and labels.dim() == 2:
        with pytest.raises(ConfigError, match=message):
            clipped_batch_mean(model, params, batch, torch.ones(2, 5), 1.0)


def test_padding_rows_may_hold_any_label():
    """Only real rows' labels are checked: padding is blanked first."""
    model = nn.Linear(4, 3)
    params = {k: v.detach().unsqueeze(0).repeat(2, *[1] * v.dim()) for k, v in model.named_parameters()}
    y = torch.tensor([[0, 1, -100, 99], [2, 2, 1, -1]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    batch = {"x": torch.randn(2, 4, 4), "y": y}
    sums, norms = clipped_grad_sum(model, params, batch, mask, 1.0)
    clean = {"x": batch["x"], "y": torch.where(mask.bool(), y, 0)}
    ref_sums, ref_norms = clipped_grad_sum(model, params, clean, mask, 1.0)
    assert torch.equal(norms, ref_norms) and all(torch.equal(sums[k], ref_sums[k]) for k in sums)
