"""The SC loss and FedSC's client objective (trustfl.objectives.spectral) against direct computations: the original
pairwise form, the Sec. 5.2 matrices written out view by view, the authors' code, finite differences, and the
gradient alignment of Eq. 6."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import trustfl
from trustfl.errors import ConfigError
from trustfl.objectives.spectral import (SpectralContrastive, alpha_schedule, correlation_estimates,
                                         fedsc_example_losses, fedsc_loss, norm_clip, spectral_contrastive_loss)

DT = torch.float64


def _z(*shape, seed=0, requires_grad=False):
    z = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)
    return z.requires_grad_(requires_grad)


def _sym(h, seed):
    a = _z(h, h, seed=seed)
    return a @ a.T / h


def _direct_sc(z1, z2):
    """Original form: ½·E[(z(x)ᵀz(x⁻))²] over all pairs of the 2BV views − E[z(x)ᵀz(x⁺)] over positive pairs."""
    allz = torch.cat([z1.reshape(-1, z1.shape[-1]), z2.reshape(-1, z2.shape[-1])])
    gram = allz @ allz.T
    return 0.5 * gram.square().mean() - (z1 * z2).sum(-1).mean()


def _matrices_view_by_view(z1, z2):
    """R̂⁺ and R̂ of Sec. 5.2 with Z_v ∈ ℝ^{H×B} (columns z), written out as in the paper."""
    b, v, _ = z1.shape
    zs = [z1[:, i].T for i in range(v)] + [z2[:, i].T for i in range(v)]  # X_1..X_2V
    r_plus = sum(zs[i] @ zs[i + v].T + zs[i + v] @ zs[i].T for i in range(v)) / (2 * b * v)
    r = sum(zv @ zv.T for zv in zs) / (2 * b * v)
    return r_plus, r


@pytest.mark.parametrize("views", [1, 3])
def test_matrices_and_sc_loss_match_the_papers_definitions(views):
    z1, z2 = _z(7, views, 5, seed=1), _z(7, views, 5, seed=2)
    r_plus, r = correlation_estimates(z1, z2)
    ref_plus, ref = _matrices_view_by_view(z1, z2)
    torch.testing.assert_close(r_plus, ref_plus, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(r, ref, rtol=1e-12, atol=1e-12)
    loss = spectral_contrastive_loss(z1, z2)
    torch.testing.assert_close(loss, -torch.trace(ref_plus) + 0.5 * ref.square().sum(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss, _direct_sc(z1, z2), rtol=1e-12, atol=1e-12)


def test_two_dimensional_inputs_are_one_view_per_group():
    z1, z2 = _z(6, 4, seed=3), _z(6, 4, seed=4)
    torch.testing.assert_close(fedsc_loss(z1, z2, _sym(4, 5), 0.3),
                               fedsc_loss(z1.unsqueeze(1), z2.unsqueeze(1), _sym(4, 5), 0.3))


def test_fedsc_loss_value_and_gradient_match_a_direct_computation():
    z1, z2 = _z(8, 2, 4, seed=1, requires_grad=True), _z(8, 2, 4, seed=2, requires_grad=True)
    rbar, alpha = _sym(4, 9), 0.35
    loss = fedsc_loss(z1, z2, rbar, alpha)
    ref_plus, ref = _matrices_view_by_view(z1, z2)
    direct = -torch.trace(ref_plus) + 0.5 * alpha * ref.square().sum() + (1 - alpha) * torch.trace(ref @ rbar)
    torch.testing.assert_close(loss, direct, rtol=1e-12, atol=1e-12)
    g = torch.autograd.grad(loss, (z1, z2))
    g_ref = torch.autograd.grad(direct, (z1, z2))
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_fedsc_loss_passes_a_finite_difference_check_in_float64():
    rbar = _z(3, 3, seed=7)  # not symmetric: the iid-noised estimate
    fn = lambda a, b: fedsc_loss(a, b, rbar, 0.6, 2.0)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (_z(5, 2, 3, seed=1, requires_grad=True),
                                         _z(5, 2, 3, seed=2, requires_grad=True)))
    ex = lambda a, b: fedsc_example_losses(a, b, rbar, 0.6)  # noqa: E731
    assert torch.autograd.gradcheck(ex, (_z(4, 3, seed=3, requires_grad=True), _z(4, 3, seed=4, requires_grad=True)))


@pytest.mark.parametrize("reference", [None, "sym", "asym"])
def test_example_losses_average_to_the_batch_loss_in_value_and_gradient(reference):
    rbar = {None: None, "sym": _sym(5, 3), "asym": _z(5, 5, seed=3)}[reference]
    z1, z2 = _z(9, 2, 5, seed=1, requires_grad=True), _z(9, 2, 5, seed=2, requires_grad=True)
    ex = fedsc_example_losses(z1, z2, rbar, 0.4, 2.0)
    batch = fedsc_loss(z1, z2, rbar, 0.4, 2.0)
    assert ex.shape == (9,)
    torch.testing.assert_close(ex.mean(), batch, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(ex.mean(), (z1, z2)), torch.autograd.grad(batch, (z1, z2))):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_scale_two_is_the_authors_code():
    z0, z1 = _z(6, 4, seed=1), _z(6, 4, seed=2)
    cov, alpha, b = _sym(4, 3), 0.45, 6
    pos = -2 * torch.trace(z1 @ z0.T) / b
    zz = torch.cat([z1, z0])
    r = zz.T @ zz / (2 * b)
    code = pos + alpha * torch.trace(r @ r) + 2 * (1 - alpha) * torch.trace(r @ cov)
    torch.testing.assert_close(fedsc_loss(z0, z1, cov, alpha, scale=2.0), code, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fedsc_loss(z0, z1, cov, alpha, scale=2.0), 2 * fedsc_loss(z0, z1, cov, alpha))
    code_plain = pos + torch.trace(r @ r)  # the code without a shared matrix
    torch.testing.assert_close(spectral_contrastive_loss(z0, z1, scale=2.0), code_plain, rtol=1e-12, atol=1e-12)


def test_no_gradient_flows_into_the_reference():
    rbar = _sym(4, 2).requires_grad_(True)
    z1, z2 = _z(5, 4, seed=1, requires_grad=True), _z(5, 4, seed=2, requires_grad=True)
    fedsc_loss(z1, z2, rbar, 0.3).backward()
    fedsc_example_losses(z1, z2, rbar, 0.3).sum().backward()
    assert rbar.grad is None
    loss = fedsc_loss(z1, z2, rbar, 0.3)
    assert torch.autograd.grad(loss, rbar, allow_unused=True) == (None,)


def test_without_a_reference_alpha_is_one():
    z1, z2 = _z(5, 4, seed=1), _z(5, 4, seed=2)
    torch.testing.assert_close(fedsc_loss(z1, z2, None, 0.2), spectral_contrastive_loss(z1, z2))
    torch.testing.assert_close(fedsc_loss(z1, z2, _sym(4, 1), 1.0), spectral_contrastive_loss(z1, z2))


def test_gradient_alignment_eq6_with_alpha_q_and_exact_reference():
    """Σ_j q_j ∇L_j(θ; R_{−j}(θ)) = ∇L^SC(θ; ∪D_j): here ∇ w.r.t. each client's representations."""
    sizes = [4, 7, 5]
    zs = [(_z(n, 3, seed=10 + j, requires_grad=True), _z(n, 3, seed=20 + j, requires_grad=True))
          for j, n in enumerate(sizes)]
    q = [n / sum(sizes) for n in sizes]
    pooled = spectral_contrastive_loss(torch.cat([a for a, _ in zs]), torch.cat([b for _, b in zs]))
    mats = [correlation_estimates(a, b)[1].detach() for a, b in zs]
    for j, (a, b) in enumerate(zs):
        r_minus = sum(q[k] * mats[k] for k in range(3) if k != j) / (1 - q[j])
        local = fedsc_loss(a, b, r_minus, alpha=q[j])
        for g_pooled, g_local in zip(torch.autograd.grad(pooled, (a, b), retain_graph=True),
                                     torch.autograd.grad(local, (a, b))):
            torch.testing.assert_close(g_pooled, q[j] * g_local, rtol=1e-10, atol=1e-12)


def test_alpha_schedule_is_linear_from_one_to_point_two():
    assert alpha_schedule(0, 200) == 1.0
    assert alpha_schedule(199, 200) == pytest.approx(0.204, abs=1e-12)
    assert alpha_schedule(100, 200) == pytest.approx(0.6, abs=1e-12)
    steps = [alpha_schedule(r, 10) for r in range(10)]
    assert all(abs((a - b) - 0.08) < 1e-12 for a, b in zip(steps, steps[1:]))
    assert alpha_schedule(9, 10, endpoint=True) == pytest.approx(0.2, abs=1e-12)
    assert alpha_schedule(0, 1) == 1.0 and alpha_schedule(0, 1, endpoint=True) == 1.0
    with pytest.raises(ConfigError, match="round"):
        alpha_schedule(200, 200)
    with pytest.raises(ConfigError, match="num_rounds"):
        alpha_schedule(0, 0)


def test_norm_clip_bounds_rows_and_keeps_short_ones():
    z = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]], dtype=DT)
    out = norm_clip(z, 1.0)
    torch.testing.assert_close(out, torch.tensor([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]], dtype=DT))
    with pytest.raises(ConfigError, match="max_norm"):
        norm_clip(z, 0.0)


class _Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 4, dtype=DT)

    def forward(self, x):
        return self.lin(x.flatten(1))


def test_objective_is_registered_and_consumes_views():
    obj = trustfl.build("objective", "spectral_contrastive", mu=2.0, scale=2.0)
    assert isinstance(obj, SpectralContrastive) and obj.input_key == "views"
    model = _Linear()
    params = dict(model.named_parameters())
    views = _z(5, 4, 2, 3, seed=1)        # B = 5, 2V = 4 views of (2, 3) inputs
    rbar = _sym(4, 2)
    obj = obj.with_reference(rbar, 0.3)
    out = obj.forward(model, params, {"views": views})
    assert out.shape == (5, 4, 4)
    torch.testing.assert_close(out[:, 1], model(views[:, 1]))
    z = norm_clip(out, 2.0 ** 0.5)
    ref = fedsc_loss(z[:, :2], z[:, 2:], rbar, 0.3, 2.0)
    losses = obj.losses(out, {"views": views})
    torch.testing.assert_close(losses.mean(), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(obj.loss_sum(out, {"views": views}), 5 * ref, rtol=1e-12, atol=1e-12)
    feats = obj.forward(model, params, {"x": views[:, 0]})  # evaluation batches: features of x
    assert feats.shape == (5, 4)


def test_objective_gradient_reaches_the_model_but_not_the_reference():
    model = _Linear()
    rbar = _sym(4, 2).requires_grad_(True)
    obj = SpectralContrastive(mu=1.0).with_reference(rbar, 0.5)
    out = obj.forward(model, dict(model.named_parameters()), {"views": _z(5, 2, 6, seed=3)})
    obj.loss_sum(out, {}).backward()
    assert model.lin.weight.grad is not None and float(model.lin.weight.grad.abs().sum()) > 0
    assert rbar.grad is None


@pytest.mark.parametrize("kwargs, key", [({"alpha": 1.5}, "alpha"), ({"mu": 0.0}, "mu"), ({"scale": -1.0}, "scale"),
                                         ({"reference": torch.zeros(3, 4)}, "reference"),
                                         ({"mu": 1e78}, "mu"), ({"scale": 1e-300}, "scale")])  # beyond float32
def test_objective_parameters_are_validated(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        SpectralContrastive(**kwargs)


def test_bad_shapes_are_config_errors():
    obj = SpectralContrastive()
    with pytest.raises(ConfigError, match="views"):
        obj.losses(_z(5, 3, 4), {})
    with pytest.raises(ConfigError, match="z1"):
        fedsc_loss(_z(5, 4), _z(4, 4))
    with pytest.raises(ConfigError, match="reference"):
        fedsc_loss(_z(5, 4), _z(5, 4), _z(3, 3), 0.5)
