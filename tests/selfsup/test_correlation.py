"""FedSC's correlation matrices (trustfl.selfsup.correlation): DP-CalR (Algorithm 2) against a loop over samples and
views, clipping bounds, noise moments, the server store's incremental replace (Algorithm 1) against recomputation,
and R̃_{−j}."""
from __future__ import annotations

import math

import pytest
import torch

from trustfl.errors import ConfigError, PrivacyError
from trustfl.objectives.spectral import norm_clip
from trustfl.selfsup import (CorrelationStore, add_matrix_noise, client_weights, correlation, dp_calr,
                             view_generator)

DT = torch.float64


def _z(*shape, seed=0, scale=1.0):
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


def _sym(h, seed):
    a = _z(h, h, seed=seed)
    return a @ a.T / h


def test_clipped_terms_have_frobenius_norm_at_most_mu():
    mu = 2.5
    z = _z(50, 5, 8, seed=1, scale=3.0)
    clipped = norm_clip(z, math.sqrt(mu))
    terms = torch.einsum("nvh,nvk->nvhk", clipped, clipped)
    assert float(torch.linalg.matrix_norm(terms).max()) <= mu * (1 + 1e-12)
    assert float(torch.linalg.matrix_norm(terms).max()) > 0.99 * mu          # the clip is active
    r = dp_calr(z, mu, 0.0, torch.Generator())
    assert float(torch.linalg.matrix_norm(r)) <= mu * (1 + 1e-12)


def test_dp_calr_without_noise_is_algorithm_2_written_as_a_loop():
    mu, (n, v, h) = 1.5, (6, 3, 4)
    z = _z(n, v, h, seed=2, scale=1.2)
    ref = torch.zeros(h, h, dtype=DT)
    for i in range(n):
        for j in range(v):
            zz = z[i, j]
            norm = float(zz.norm())
            zc = zz if norm < math.sqrt(mu) else math.sqrt(mu) * zz / norm
            ref += torch.outer(zc, zc) / (n * v)
    torch.testing.assert_close(dp_calr(z, mu, 0.0, torch.Generator()), ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(correlation(z[:, 0]), z[:, 0].T @ z[:, 0] / n)


def test_chunked_accumulation_then_noise_equals_dp_calr():
    z, mu = _z(23, 2, 4, seed=6, scale=2.0), 3.0
    chunks = sum(correlation(norm_clip(c, math.sqrt(mu))) * c.shape[0] / 23 for c in z.split(7))
    noisy = add_matrix_noise(chunks, 0.2, torch.Generator().manual_seed(4))
    torch.testing.assert_close(noisy, dp_calr(z, mu, 0.2, torch.Generator().manual_seed(4)), rtol=1e-12, atol=1e-13)


def test_padding_rows_count_nothing_and_the_cohort_form_equals_per_client_calls(draw_threads):
    sizes, h = [5, 3, 4], 3
    zs = [_z(n, 2, h, seed=10 + j) for j, n in enumerate(sizes)]
    padded = torch.zeros(3, 5, 2, h, dtype=DT)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    for j, z in enumerate(zs):
        padded[j, :sizes[j]], mask[j, :sizes[j]] = z, True
    padded[~mask] = 99.0                                                      # garbage in padding rows
    gens = lambda: [view_generator(0, 1, j, "cpu", stage="calr") for j in range(3)]  # noqa: E731
    out = dp_calr(padded, 2.0, 0.1, gens(), mask=mask)
    for j, z in enumerate(zs):
        torch.testing.assert_close(out[j], dp_calr(z, 2.0, 0.1, gens()[j]), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(correlation(padded, mask)[1], correlation(zs[1]))


def test_noise_is_iid_with_the_calibrated_std_and_not_symmetric():
    h, sigma = 96, 0.37
    z = _z(4, 2, h, seed=3)
    clean = dp_calr(z, 4.0, 0.0, torch.Generator())
    noise = dp_calr(z, 4.0, sigma, view_generator(7, 0, 2, "cpu", stage="calr")) - clean
    n = h * h
    assert abs(float(noise.mean())) < 4 * sigma / math.sqrt(n)
    assert abs(float(noise.std()) / sigma - 1) < 5 / math.sqrt(2 * n)           # 5 standard errors
    kurt = float(((noise - noise.mean()) ** 4).mean() / noise.var(unbiased=False) ** 2)
    assert abs(kurt - 3) < 5 * math.sqrt(24 / n)
    assert not torch.allclose(noise, noise.T)                                  # iid on all H² entries
    assert abs(float(torch.corrcoef(torch.stack([noise.triu(1)[noise.triu(1) != 0],
                                                noise.T.triu(1)[noise.T.triu(1) != 0]]))[0, 1])) < 0.05
    again = dp_calr(z, 4.0, sigma, view_generator(7, 0, 2, "cpu", stage="calr")) - clean
    other = dp_calr(z, 4.0, sigma, view_generator(7, 0, 3, "cpu", stage="calr")) - clean
    assert torch.equal(noise, again) and not torch.equal(noise, other)


def test_symmetrized_noise_is_symmetric_with_halved_off_diagonal_variance_and_same_cross_term():
    h, sigma = 96, 0.5
    z = _z(4, 2, h, seed=4)
    clean = dp_calr(z, 4.0, 0.0, torch.Generator())
    raw = dp_calr(z, 4.0, sigma, torch.Generator().manual_seed(1))
    sym = dp_calr(z, 4.0, sigma, torch.Generator().manual_seed(1), symmetrize=True)
    noise = sym - clean
    assert torch.equal(sym, sym.T)
    off = noise[torch.triu(torch.ones(h, h, dtype=torch.bool), 1)]
    assert abs(float(off.std()) / (sigma / math.sqrt(2)) - 1) < 5 / math.sqrt(2 * off.numel())
    assert abs(float(noise.diagonal().std()) / sigma - 1) < 5 / math.sqrt(2 * h)
    r = _sym(h, 5)                                                            # Tr(R R̃) for symmetric R
    torch.testing.assert_close(torch.trace(r @ sym), torch.trace(r @ raw), rtol=1e-10, atol=1e-10)


def _scratch_total(matrices, weights):
    return sum(weights[j] * matrices[j] for j in range(len(weights)))


def test_incremental_store_equals_recomputing_from_scratch():
    j_count, h = 6, 4
    weights = client_weights([10, 20, 5, 7, 30, 8])
    g = torch.Generator().manual_seed(0)
    first = torch.stack([_sym(h, 100 + j) for j in range(j_count)])
    store = CorrelationStore.init(first, weights)
    latest = first.clone()
    for t in range(12):                                  # partial participation, 2-3 clients a round
        clients = torch.randperm(j_count, generator=g)[:2 + t % 2]
        uploads = torch.stack([_sym(h, 1000 * t + int(c)) for c in clients])
        store = store.update(clients, uploads)
        latest[clients] = uploads
        torch.testing.assert_close(store.matrices, latest)
        torch.testing.assert_close(store.total, _scratch_total(latest, weights), rtol=1e-12, atol=1e-12)
    assert store.matrices.dtype == DT


def test_others_is_the_weighted_mean_over_the_other_clients_only():
    h = 3
    weights = client_weights([1, 2, 3, 4])
    mats = torch.stack([_sym(h, j) for j in range(4)])
    store = CorrelationStore.init(mats, weights)
    out = store.others(torch.tensor([2, 0]))
    for row, j in enumerate([2, 0]):
        ref = sum(weights[k] * mats[k] for k in range(4) if k != j) / (1 - weights[j])
        torch.testing.assert_close(out[row], ref, rtol=1e-12, atol=1e-12)
    changed = store.update(torch.tensor([2]), 100 * _sym(h, 9).unsqueeze(0))   # client 2's own matrix changes
    torch.testing.assert_close(changed.others(torch.tensor([2]))[0], out[0], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(changed.others(torch.tensor([0]))[0], out[1])
    equal = CorrelationStore.init(mats, client_weights([5, 5, 5, 5]))         # the authors' (ΣR − R_j)/(J − 1)
    torch.testing.assert_close(equal.others(torch.tensor([1]))[0], (mats.sum(0) - mats[1]) / 3)


def test_store_and_dp_calr_errors():
    mats = torch.stack([torch.eye(2)] * 3)
    with pytest.raises(ConfigError, match="weights"):
        CorrelationStore.init(mats, torch.tensor([0.5, 0.5, 0.5]))
    with pytest.raises(ConfigError, match="uploads"):
        CorrelationStore.init(torch.eye(2).unsqueeze(0), torch.tensor([1.0]))
    store = CorrelationStore.init(mats, client_weights([1, 1, 1]))
    with pytest.raises(ConfigError, match="distinct"):
        store.update(torch.tensor([1, 1]), mats[:2])
    with pytest.raises(ConfigError, match="clients"):
        store.others(torch.tensor([3]))
    with pytest.raises(ConfigError, match="sizes"):
        client_weights([3])
    with pytest.raises(PrivacyError, match="mu"):
        dp_calr(_z(3, 2), 0.0, 1.0, torch.Generator())
    with pytest.raises(PrivacyError, match="sigma"):
        dp_calr(_z(3, 2), 1.0, -1.0, torch.Generator())
    with pytest.raises(ConfigError, match="generator"):
        dp_calr(_z(2, 3, 2), 1.0, 1.0, torch.Generator(), mask=torch.ones(2, 3))
