"""The local-training chain (trustfl.client.transforms), SCAFFOLD (trustfl.client.scaffold) and the gradient
methods' argument checks (trustfl.client.gradients).

Oracles: torch.optim.SGD run per client for weight decay + momentum, the documented formulas of FedProx, DP-SGD's
noise and SCAFFOLD (Karimireddy et al. 2020, Alg. 1 option II), and moments of the noise draws.
"""
from __future__ import annotations

import math

import pytest
import torch

from trustfl.client.gradients import BatchClipped, PerExampleClipped, PlainGradient
from trustfl.client.scaffold import Scaffold
from trustfl.client.transforms import SGD, DPNoise, LocalChain, Momentum, Proximal, WeightDecay
from trustfl.core.rng import make_generator
from trustfl.errors import ConfigError, PrivacyError
from trustfl.types import CohortContext, ParamLayout, RoundContext

SHAPES = {"w": (3, 2), "b": (3,)}
D = 9


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _global(seed: int = 0, dtype=torch.float32) -> dict[str, torch.Tensor]:
    g = _gen(seed)
    return {k: torch.randn(s, generator=g, dtype=dtype) for k, s in SHAPES.items()}


def _stacked(m: int, seed: int = 1, dtype=torch.float32) -> dict[str, torch.Tensor]:
    g = _gen(seed)
    return {k: torch.randn(m, *s, generator=g, dtype=dtype) for k, s in SHAPES.items()}


def _cohort(m: int, *, ids=None, lr=0.1, batch_sizes=None, z=None, received=None, client_state=None,
            seed: int = 0, round_: int = 0, dtype=torch.float32) -> CohortContext:
    glob = _global(dtype=dtype)
    layout = ParamLayout.of(glob)
    return CohortContext(
        client_ids=tuple(range(m)) if ids is None else tuple(ids), round=round_, seed=seed, lr=lr,
        batch_sizes=torch.full((m,), 4.0, dtype=torch.float64) if batch_sizes is None
        else torch.as_tensor(batch_sizes, dtype=torch.float64),
        noise_multipliers=torch.zeros(m, dtype=torch.float64) if z is None
        else torch.as_tensor(z, dtype=torch.float64),
        received={"model": layout.flatten(glob), **(received or {})},
        client_state=client_state or {}, layout=layout)


def _grad_sequence(steps: int, m: int, seed: int = 5, dtype=torch.float32) -> list[dict[str, torch.Tensor]]:
    g = _gen(seed)
    return [{k: torch.randn(m, *s, generator=g, dtype=dtype) for k, s in SHAPES.items()} for _ in range(steps)]


# ---------------------------------------------------------------------------------------------------------------
# weight decay + momentum + SGD against torch.optim.SGD
# ---------------------------------------------------------------------------------------------------------------

class _TorchClients:
    """One torch.optim.SGD per client: the oracle."""

    def __init__(self, params: dict[str, torch.Tensor], lr: float, momentum: float, wd: float) -> None:
        m = next(iter(params.values())).shape[0]
        self.params = [{k: torch.nn.Parameter(v[i].clone()) for k, v in params.items()} for i in range(m)]
        self.opts = [torch.optim.SGD(list(p.values()), lr=lr, momentum=momentum, weight_decay=wd)
                     for p in self.params]

    def step(self, grads: dict[str, torch.Tensor], active=None) -> None:
        for i, (p, opt) in enumerate(zip(self.params, self.opts)):
            if active is not None and not bool(active[i]):
                continue
            for k, v in p.items():
                v.grad = grads[k][i].clone()
            opt.step()

    def param(self, i: int, k: str) -> torch.Tensor:
        return self.params[i][k].detach()

    def buffer(self, i: int, k: str) -> torch.Tensor | None:
        state = self.opts[i].state.get(self.params[i][k], {})
        return state.get("momentum_buffer")


def _sgd_chain(lr: float) -> LocalChain:
    return LocalChain(method=PlainGradient(),
                      transforms=(("weight_decay", WeightDecay(1e-2)), ("momentum", Momentum(0.9))),
                      optimizer=SGD(lr))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_chain_reproduces_torch_sgd_with_momentum_and_weight_decay(dtype, tol):
    m, lr = 3, 0.05
    params = _stacked(m, dtype=dtype)
    oracle = _TorchClients(params, lr, 0.9, 1e-2)
    chain = _sgd_chain(lr)
    states = chain.init(params, _cohort(m, lr=lr, dtype=dtype))
    for grads in _grad_sequence(6, m, dtype=dtype):
        chain.step(grads, states, params, active=None)
        oracle.step(grads)
        for i in range(m):
            for k in SHAPES:
                torch.testing.assert_close(params[k][i], oracle.param(i, k), rtol=tol, atol=tol)
                torch.testing.assert_close(states["momentum"][k][i], oracle.buffer(i, k), rtol=tol, atol=tol)


def test_masked_rows_keep_params_and_momentum():
    m, lr = 3, 0.1
    params = _stacked(m, dtype=torch.float64)
    oracle = _TorchClients(params, lr, 0.9, 1e-2)
    chain = _sgd_chain(lr)
    states = chain.init(params, _cohort(m, lr=lr, dtype=torch.float64))
    masks = [None, torch.tensor([True, False, True]), torch.tensor([False, True, False]), None,
             torch.tensor([True, False, False])]
    for grads, active in zip(_grad_sequence(len(masks), m, dtype=torch.float64), masks):
        before = {k: v.clone() for k, v in params.items()}
        bufs = {k: v.clone() for k, v in states["momentum"].items()}
        chain.step(grads, states, params, active=active)
        oracle.step(grads, active)
        for i in range(m):
            if active is not None and not bool(active[i]):
                for k in SHAPES:  # bitwise unchanged
                    assert torch.equal(params[k][i], before[k][i])
                    assert torch.equal(states["momentum"][k][i], bufs[k][i])
            for k in SHAPES:  # and afterwards continues as if the masked step never happened for that row
                torch.testing.assert_close(params[k][i], oracle.param(i, k), rtol=1e-12, atol=1e-12)
                torch.testing.assert_close(states["momentum"][k][i], oracle.buffer(i, k), rtol=1e-12, atol=1e-12)


def test_plain_sgd_chain_is_theta_minus_lr_g():
    m, lr = 2, 0.3
    params = _stacked(m, dtype=torch.float64)
    start = {k: v.clone() for k, v in params.items()}
    chain = LocalChain(PlainGradient(), (), SGD(lr))
    states = chain.init(params, _cohort(m, lr=lr, dtype=torch.float64))
    grads = _grad_sequence(1, m, dtype=torch.float64)[0]
    chain.step(grads, states, params, None)
    for k in SHAPES:
        torch.testing.assert_close(params[k], start[k] - lr * grads[k], rtol=1e-14, atol=1e-14)


def test_momentum_out_of_range_raises():
    with pytest.raises(ConfigError):
        Momentum(1.0)
    with pytest.raises(ConfigError):
        Momentum(-0.1)


# ---------------------------------------------------------------------------------------------------------------
# Proximal (FedProx)
# ---------------------------------------------------------------------------------------------------------------

def test_proximal_with_mu_zero_is_the_identity():
    m = 3
    params, cohort = _stacked(m), _cohort(m)
    prox = Proximal(0.0)
    grads = _grad_sequence(1, m)[0]
    out, _ = prox.apply(grads, prox.init(params, cohort), params, None, cohort)
    for k in SHAPES:
        assert torch.equal(out[k], grads[k])


@pytest.mark.parametrize("mu", [0.01, 0.5, 3])
def test_proximal_adds_mu_times_distance_to_received_model(mu):
    m = 3
    params, cohort = _stacked(m, dtype=torch.float64), _cohort(m, dtype=torch.float64)
    glob = _global(dtype=torch.float64)  # what _cohort sends as "model"
    prox = Proximal(mu)
    grads = _grad_sequence(1, m, dtype=torch.float64)[0]
    out, _ = prox.apply(grads, prox.init(params, cohort), params, None, cohort)
    for k in SHAPES:
        for i in range(m):
            torch.testing.assert_close(out[k][i], grads[k][i] + mu * (params[k][i] - glob[k]),
                                       rtol=1e-13, atol=1e-13)


def test_proximal_in_a_chain_sees_the_received_model():
    m, lr, mu = 2, 0.1, 0.7
    params = _stacked(m, dtype=torch.float64)
    start = {k: v.clone() for k, v in params.items()}
    glob = _global(dtype=torch.float64)
    chain = LocalChain(PlainGradient(), (("fedprox", Proximal(mu)),), SGD(lr))
    states = chain.init(params, _cohort(m, lr=lr, dtype=torch.float64))
    grads = _grad_sequence(1, m, dtype=torch.float64)[0]
    chain.step(grads, states, params, None)
    for k in SHAPES:
        torch.testing.assert_close(params[k], start[k] - lr * (grads[k] + mu * (start[k] - glob[k])),
                                   rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("mu", [-0.1, float("inf"), float("nan"), "0.1"])
def test_proximal_invalid_mu_raises(mu):
    with pytest.raises(ConfigError):
        Proximal(mu)


# ---------------------------------------------------------------------------------------------------------------
# DP noise
# ---------------------------------------------------------------------------------------------------------------

def test_dp_noise_without_noise_divides_by_batch_size():
    m = 3
    params = _stacked(m)
    cohort = _cohort(m, batch_sizes=[2.0, 5.0, 8.0], z=[0.0, 0.0, 0.0])
    grads = _grad_sequence(1, m)[0]
    t = DPNoise(clip=1.0, divide_by_batch_size=True)
    out, _ = t.apply(grads, t.init(params, cohort), params, None, cohort)
    for k in SHAPES:
        for i, d in enumerate((2.0, 5.0, 8.0)):
            torch.testing.assert_close(out[k][i], grads[k][i] / d, rtol=1e-7, atol=0)
    t = DPNoise(clip=1.0, divide_by_batch_size=False)
    out, _ = t.apply(grads, t.init(params, cohort), params, None, cohort)
    for k in SHAPES:
        assert torch.equal(out[k], grads[k])


def test_dp_noise_follows_each_clients_own_generator(draw_threads):
    m, clip, seed, rnd = 3, 0.8, 11, 4
    z = [1.5, 0.0, 0.7]
    ids = (13, 2, 700)
    bs = [3.0, 6.0, 9.0]
    params = _stacked(m, dtype=torch.float64)
    cohort = _cohort(m, ids=ids, z=z, batch_sizes=bs, seed=seed, round_=rnd, dtype=torch.float64)
    t = DPNoise(clip=clip)
    state = t.init(params, cohort)
    seq = _grad_sequence(2, m, dtype=torch.float64)
    gens = {i: make_generator(seed, rnd, ids[i], "dpsgd") for i in range(m)}
    for grads in seq:  # two steps: the generator advances, one tensor per parameter in order
        out, state = t.apply(grads, state, params, None, cohort)
        for i in range(m):
            for k in SHAPES:  # documented order: parameter by parameter
                noise = (torch.randn(SHAPES[k], generator=gens[i], dtype=torch.float64) * (z[i] * clip)
                         if z[i] > 0 else torch.zeros(SHAPES[k], dtype=torch.float64))
                torch.testing.assert_close(out[k][i], (grads[k][i] + noise) / bs[i], rtol=1e-12, atol=1e-12)


def test_dp_noise_row_depends_only_on_its_client():
    m = 2
    params = _stacked(m)
    grads = _grad_sequence(1, m)[0]
    t = DPNoise(clip=1.0)

    def run(ids):
        cohort = _cohort(m, ids=ids, z=[1.0, 1.0], seed=3, round_=2)
        return t.apply(grads, t.init(params, cohort), params, None, cohort)[0]

    a, b, a2 = run((10, 20)), run((10, 21)), run((10, 20))
    for k in SHAPES:
        assert torch.equal(a[k], a2[k])  # deterministic
        assert torch.equal(a[k][0], b[k][0])  # row 0 untouched by client 1's id
        assert not torch.allclose(a[k][1], b[k][1])  # row 1 follows its client
    # a different round gives different noise
    cohort = _cohort(m, ids=(10, 20), z=[1.0, 1.0], seed=3, round_=3)
    c = t.apply(grads, t.init(params, cohort), params, None, cohort)[0]
    assert not torch.allclose(a["w"][0], c["w"][0])


def test_dp_noise_moments():
    n, z, clip = 20000, 2.0, 1.5
    glob = {"p": torch.zeros(n)}
    layout = ParamLayout.of(glob)
    cohort = CohortContext(client_ids=(77,), round=0, seed=1, lr=0.1,
                           batch_sizes=torch.ones(1, dtype=torch.float64),
                           noise_multipliers=torch.full((1,), z, dtype=torch.float64),
                           received={"model": layout.flatten(glob)}, client_state={}, layout=layout)
    params = {"p": torch.zeros(1, n)}
    t = DPNoise(clip=clip)
    out, _ = t.apply({"p": torch.zeros(1, n)}, t.init(params, cohort), params, None, cohort)
    x = out["p"][0].double()
    assert abs(float(x.mean())) < 5 * z * clip / math.sqrt(n)
    assert float(x.std()) == pytest.approx(z * clip, rel=0.02)
    # Gaussian: about 68.3% of the draws within one standard deviation
    assert float((x.abs() < z * clip).double().mean()) == pytest.approx(0.6827, abs=0.02)


# ---------------------------------------------------------------------------------------------------------------
# SCAFFOLD
# ---------------------------------------------------------------------------------------------------------------

def _scaffold_cohort(m: int, c_i: torch.Tensor, c: torch.Tensor, lr: float) -> CohortContext:
    return _cohort(m, lr=lr, received={"c": c}, client_state={"c": c_i}, dtype=torch.float64)


def test_scaffold_finish_option_ii():
    m, lr = 3, 0.05
    g = _gen(9)
    c_i = torch.randn(m, D, generator=g, dtype=torch.float64)
    c = torch.randn(D, generator=g, dtype=torch.float64)
    start = torch.randn(m, D, generator=g, dtype=torch.float64)
    end = torch.randn(m, D, generator=g, dtype=torch.float64)
    steps = torch.tensor([4, 0, 7])
    sc = Scaffold()
    cohort = _scaffold_cohort(m, c_i, c, lr)
    state = sc.init(_stacked(m, dtype=torch.float64), cohort)
    new, extras = sc.finish(state, cohort, start, end, steps)
    for i, k in enumerate((4, 0, 7)):
        expected = c_i[i] if k == 0 else c_i[i] - c + (start[i] - end[i]) / (k * lr)
        torch.testing.assert_close(new["c"][i], expected, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(extras["c"], new["c"] - c_i, rtol=1e-13, atol=1e-13)
    assert torch.equal(new["c"][1], c_i[1])
    assert torch.equal(extras["c"][1], torch.zeros(D, dtype=torch.float64))


def test_scaffold_corrects_each_gradient_by_c_minus_c_i():
    m, lr = 2, 0.1
    g = _gen(10)
    c_i = torch.randn(m, D, generator=g, dtype=torch.float64)
    c = torch.randn(D, generator=g, dtype=torch.float64)
    sc = Scaffold()
    cohort = _scaffold_cohort(m, c_i, c, lr)
    params = _stacked(m, dtype=torch.float64)
    grads = _grad_sequence(1, m, dtype=torch.float64)[0]
    out, _ = sc.apply(grads, sc.init(params, cohort), params, None, cohort)
    flat = cohort.layout.flatten(out, batch_dims=1) - cohort.layout.flatten(grads, batch_dims=1)
    torch.testing.assert_close(flat, c.unsqueeze(0) - c_i, rtol=1e-13, atol=1e-13)


def test_scaffold_server_update_divides_by_population():
    g = _gen(11)
    sc = Scaffold()
    layout = ParamLayout.of(_global())
    server = sc.server_init(layout.flatten(_global()))
    assert torch.equal(server["c"], torch.zeros(D))
    assert torch.equal(sc.downlink(server)["c"], server["c"])
    deltas = torch.randn(3, D, generator=g)
    ctx = RoundContext(round=0, seed=0, client_ids=(4, 8, 15), num_clients=10)
    new = sc.server_update(server, {"c": deltas}, ctx)
    torch.testing.assert_close(new["c"], deltas.sum(0) / 10, rtol=1e-6, atol=1e-7)
    again = sc.server_update(new, {"c": deltas[:1]}, RoundContext(round=1, seed=0, client_ids=(4,),
                                                                  num_clients=10))
    torch.testing.assert_close(again["c"], new["c"] + deltas[0] / 10, rtol=1e-6, atol=1e-7)
    # no accepted rows: unchanged
    empty = sc.server_update(new, {"c": torch.zeros(0, D)}, RoundContext(round=2, seed=0, client_ids=(),
                                                                         num_clients=10))
    assert torch.equal(empty["c"], new["c"])


def test_scaffold_server_variate_is_the_mean_of_client_variates_under_full_participation():
    n, lr = 4, 0.2
    g = _gen(12)
    sc = Scaffold()
    layout = ParamLayout.of(_global())
    server = sc.server_init(layout.flatten(_global()))
    c_i = sc.client_state_defaults(layout.flatten(_global()))["c"].double().expand(n, D).clone()
    server = {"c": server["c"].double()}
    for rnd in range(3):
        cohort = _scaffold_cohort(n, c_i, server["c"], lr)
        state = sc.init(_stacked(n, dtype=torch.float64), cohort)
        start = torch.randn(n, D, generator=g, dtype=torch.float64)
        end = start + torch.randn(n, D, generator=g, dtype=torch.float64)
        steps = torch.randint(1, 6, (n,), generator=g)
        new, extras = sc.finish(state, cohort, start, end, steps)
        server = sc.server_update(server, extras, RoundContext(round=rnd, seed=0, client_ids=tuple(range(n)),
                                                               num_clients=n))
        c_i = new["c"]
        torch.testing.assert_close(server["c"], c_i.mean(0), rtol=1e-12, atol=1e-12)


def test_scaffold_keys_are_prefixed_in_a_chain():
    lr = 0.1
    chain = LocalChain(PlainGradient(), (("scaffold", Scaffold()), ("momentum", Momentum(0.5))), SGD(lr))
    layout = ParamLayout.of(_global())
    defaults = chain.client_state_defaults(layout.flatten(_global()))
    assert set(defaults) == {"scaffold/c"} and defaults["scaffold/c"].shape == (D,)
    server = chain.server_init(layout.flatten(_global()))
    assert set(server) == {"scaffold"}  # momentum has no server half
    down = chain.downlink(server)
    assert set(down) == {"scaffold/c"} and down["scaffold/c"].shape == (D,)
    assert chain.extras_widths(layout) == {"scaffold/c": D}


def test_scaffold_through_a_chain_round():
    m, lr = 3, 0.1
    g = _gen(13)
    chain = LocalChain(PlainGradient(), (("scaffold", Scaffold()),), SGD(lr))
    c_i = torch.randn(m, D, generator=g, dtype=torch.float64)
    c = torch.randn(D, generator=g, dtype=torch.float64)
    cohort = _cohort(m, lr=lr, received={"scaffold/c": c}, client_state={"scaffold/c": c_i},
                     dtype=torch.float64)
    layout = cohort.layout
    params = _stacked(m, dtype=torch.float64)
    start = layout.flatten(params, batch_dims=1).clone()
    states = chain.init(params, cohort)
    seq = _grad_sequence(3, m, dtype=torch.float64)
    for grads in seq:
        chain.step(grads, states, params, None)
    end = layout.flatten(params, batch_dims=1)
    gsum = sum(layout.flatten(gr, batch_dims=1) for gr in seq)
    # θ_K = θ_0 − η Σ_k (g_k + c − c_i)
    torch.testing.assert_close(end, start - lr * (gsum + 3 * (c - c_i)), rtol=1e-12, atol=1e-12)
    new, extras = chain.finish(states, start, end, torch.full((m,), 3))
    assert set(new) == {"scaffold/c"} and set(extras) == {"scaffold/c"}
    # option II with plain SGD: c_i⁺ = c_i − c + mean_k (g_k + c − c_i) = mean_k g_k
    torch.testing.assert_close(new["scaffold/c"], gsum / 3, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(extras["scaffold/c"], gsum / 3 - c_i, rtol=1e-10, atol=1e-10)
    server = chain.server_update({"scaffold": {"c": c}}, extras,
                                 RoundContext(round=0, seed=0, client_ids=(0, 1, 2), num_clients=5))
    torch.testing.assert_close(server["scaffold"]["c"], c + (gsum / 3 - c_i).sum(0) / 5, rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------------------------------------------------------
# chain and gradient-method argument checks
# ---------------------------------------------------------------------------------------------------------------

def test_chain_with_duplicate_names_raises():
    with pytest.raises(ConfigError):
        LocalChain(PlainGradient(), (("m", Momentum(0.9)), ("m", WeightDecay(0.1))), SGD(0.1))


def test_chain_with_slash_in_name_raises():
    with pytest.raises(ConfigError):
        LocalChain(PlainGradient(), (("a/b", Momentum(0.9)),), SGD(0.1))


def test_chain_names_keep_order():
    chain = LocalChain(PlainGradient(), (("wd", WeightDecay(0.1)), ("mom", Momentum(0.9))), SGD(0.1))
    assert chain.names == ["wd", "mom"]
    assert chain.client_state_defaults(ParamLayout.of(_global()).flatten(_global())) == {}
    assert chain.server_init(ParamLayout.of(_global()).flatten(_global())) == {}


@pytest.mark.parametrize("clip", [0, -1.0, float("inf"), float("nan")])
def test_gradient_methods_reject_bad_clip(clip):
    with pytest.raises(PrivacyError):
        PerExampleClipped(clip=clip)
    with pytest.raises(PrivacyError):
        BatchClipped(clip=clip)


def test_per_example_unknown_method_raises():
    with pytest.raises(ConfigError):
        PerExampleClipped(method="foo")
    PerExampleClipped(clip=0.5, method="vmap")
    PerExampleClipped(clip=0.5, method="ghost")


def test_gradient_method_flags():
    assert PlainGradient().skips_empty_batches is True
    assert PerExampleClipped().skips_empty_batches is False
    assert BatchClipped(2.0).clip == 2.0
