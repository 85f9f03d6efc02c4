"""The vectorized RDP of the subsampled Gaussian is dp_accounting's, bit for bit, and used only where it is."""
from __future__ import annotations

import logging

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant as rdp
from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

from trustfl.privacy.analysis import rhdp, sampled_rdp
from trustfl.privacy.analysis.cached_rdp import CachedRdpAccountant, clear_caches
from trustfl.privacy.analysis.gaussian import DEFAULT_RDP_ORDERS, calibrate_noise_multiplier
from trustfl.privacy.analysis.rhdp import RHDP_ORDERS, rdp_poisson_gaussian
from trustfl.privacy.analysis.sampled_rdp import (CHECKED_SIGMAS, leaf_rdp, log_forward_differences,
                                                  poisson_gaussian_rdp, wor_gaussian_rdp)

ORDERS = sorted(set(DEFAULT_RDP_ORDERS) | set(RHDP_ORDERS) | {255.5, 256.5, 300.7})
"""trustfl's orders, Robust-HDP's fractional ones, and both sides of the Stirling form's threshold."""


bitwise_here = pytest.mark.skipif(
    not sampled_rdp.fast_path_agrees(),
    reason="numpy rounds the vectorized bounds differently from dp_accounting's scalar calls on this platform, so "
           "the accountant uses dp_accounting's own (the fall-back test below checks those bits)")
"""The bit-for-bit comparisons: they hold where the start-up probe found the two equal (every platform so far)."""


def bits(x) -> bytes:
    return np.asarray(x, dtype=np.float64).tobytes()


@bitwise_here
@pytest.mark.parametrize("seed", range(4))
def test_forward_differences_are_dp_accounting_s_table_whatever_the_signs(seed):
    logs = np.random.default_rng(seed).normal(0.0, 3.0, 60)  # rough: differences of both signs
    theirs, signs = rdp._get_forward_diffs(lambda x: logs[int(x)], 57)
    assert 0 < signs.sum() < signs.size  # both branches ran
    assert bits(log_forward_differences(np.concatenate(([0.0], logs[:59])))) == bits(theirs)


@bitwise_here
@pytest.mark.parametrize("sigma", [0.05, 0.7, 3.0, 60.0])
def test_forward_differences_of_the_gaussian_cgf_are_dp_accounting_s(sigma):
    x = np.arange(258, dtype=np.float64)
    theirs, _ = rdp._get_forward_diffs(lambda v: v * 1.0 * (v + 1) / (2.0 * sigma ** 2), 256)
    assert bits(log_forward_differences(np.concatenate(([0.0], x * 1.0 * (x + 1) / (2.0 * sigma ** 2))))) == \
        bits(theirs)


GRID = [(1e-5, 0.6), (0.004, 1.1), (0.03, 0.35), (0.2, 2.5), (0.6, 9.0), (0.97, 40.0)]


@bitwise_here
@pytest.mark.parametrize("q,sigma", GRID)
def test_poisson_rdp_is_dp_accounting_s_bit_for_bit(q, sigma):
    assert bits(poisson_gaussian_rdp(q, sigma, ORDERS)) == \
        bits(rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, ORDERS))


@bitwise_here
@pytest.mark.parametrize("q,sigma", GRID)
def test_without_replacement_rdp_is_dp_accounting_s_bit_for_bit(q, sigma):
    assert bits(wor_gaussian_rdp(q, sigma, ORDERS)) == bits(rdp._compute_rdp_sample_wor_gaussian(q, sigma, ORDERS))


@bitwise_here
@pytest.mark.parametrize("sigma", [CHECKED_SIGMAS[0], 0.03, 300.0, CHECKED_SIGMAS[1]])
def test_both_are_dp_accounting_s_across_the_checked_noise_range(sigma):
    orders = [1.25, 2, 3, 5, 17.5, 64, 128, 256, 300.5, 1024]
    for q in (1e-6, 0.5, 0.999):
        assert bits(poisson_gaussian_rdp(q, sigma, orders)) == \
            bits(rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, orders))
        assert bits(wor_gaussian_rdp(q, sigma, orders)) == bits(rdp._compute_rdp_sample_wor_gaussian(q, sigma, orders))


@bitwise_here
def test_edge_rates_and_orders_are_dp_accounting_s():
    orders = [1.5, 2, 7.5, float("inf")]
    for q in (0.0, 1.0, 0.5):
        for sigma in (0.0, 1.3):
            ours = poisson_gaussian_rdp(q, sigma, orders)
            theirs = rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, orders)
            assert ours.dtype == theirs.dtype and bits(ours) == bits(theirs)
    for q in (0.0, 1.0):
        assert bits(wor_gaussian_rdp(q, 1.3, orders)) == bits(rdp._compute_rdp_sample_wor_gaussian(q, 1.3, orders))
    with pytest.raises(ValueError, match="Sampling rate"):
        poisson_gaussian_rdp(1.5, 1.0, orders)
    for q, sigma, bad_orders in [(1.5, 1.0, orders), (float("nan"), 1.0, orders), (0.1, -1.0, orders),
                                 (0.1, 0.0, orders), (0.1, 1.0, [0.5, 2])]:
        with pytest.raises(ValueError, match="Need q in"):
            wor_gaussian_rdp(q, sigma, bad_orders)


@bitwise_here
def test_a_series_that_does_not_stop_excludes_its_order_as_dp_accounting_does_without_the_warnings(caplog):
    # Robust-HDP's calibration meets these at its small fractional orders: hundreds of absl warnings per build
    q, sigma, orders = 1 / 9, 1.128, [1.1, 1.2, 1.5, 3.5]
    with caplog.at_level(logging.WARNING):
        ours = poisson_gaussian_rdp(q, sigma, orders)
    assert not caplog.records
    theirs = rdp._compute_rdp_poisson_subsampled_gaussian(q, sigma, orders)
    assert np.isinf(ours[0]) and np.isfinite(ours[-1]) and bits(ours) == bits(theirs)


@bitwise_here
def test_only_gaussian_leaves_under_their_own_relation_take_the_fast_path():
    orders = np.array(DEFAULT_RDP_ORDERS)
    gauss = dp_event.GaussianDpEvent(1.2)
    add_remove, replace_one = NeighboringRelation.ADD_OR_REMOVE_ONE, NeighboringRelation.REPLACE_ONE
    wor = dp_event.SampledWithoutReplacementDpEvent(1000, 20, gauss)
    poisson = dp_event.PoissonSampledDpEvent(0.02, gauss)
    oversampled = dp_event.SampledWithoutReplacementDpEvent(10, 20, gauss)  # dp_accounting fails an assertion
    for event, relation in [(wor, add_remove), (poisson, replace_one), (dp_event.LaplaceDpEvent(1.0), add_remove),
                            (oversampled, replace_one),
                            (dp_event.PoissonSampledDpEvent(0.02, dp_event.ComposedDpEvent([gauss])), add_remove)]:
        assert leaf_rdp(event, 3, orders, relation) is None
    for event, relation in [(wor, replace_one), (poisson, add_remove), (gauss, add_remove)]:
        ours = leaf_rdp(event, 3, orders, relation)
        assert bits(ours) == bits(RdpAccountant(list(orders), relation).compose(event, 3).rdp)


@pytest.mark.parametrize("sigma", [1e-200, 1e-5, 1e7, 1e200])
def test_noise_outside_the_checked_range_is_left_to_dp_accounting(sigma):
    event = dp_event.SampledWithoutReplacementDpEvent(1000, 20, dp_event.GaussianDpEvent(sigma))
    assert leaf_rdp(event, 1, np.array(DEFAULT_RDP_ORDERS), NeighboringRelation.REPLACE_ONE) is None


EVENT = dp_event.SelfComposedDpEvent(dp_event.SampledWithoutReplacementDpEvent(
    600, 16, dp_event.GaussianDpEvent(1.7)), 40)
RHDP_EVENT = dp_event.PoissonSampledDpEvent(0.05, dp_event.GaussianDpEvent(1.37))


def _refuse(*args, **kwargs):
    raise AssertionError("the slow path ran")


def _fresh() -> None:
    clear_caches()
    rhdp._rdp_one_step.cache_clear()


@bitwise_here
def test_accountants_and_calibration_use_it_with_dp_accounting_s_bits(monkeypatch):
    relation = NeighboringRelation.REPLACE_ONE
    reference = RdpAccountant(list(DEFAULT_RDP_ORDERS), relation).compose(EVENT).rdp
    rhdp_reference = RdpAccountant(list(RHDP_ORDERS)).compose(RHDP_EVENT).rdp
    _fresh()
    with monkeypatch.context() as patch:  # dp_accounting's per-order loops are not needed
        patch.setattr(rdp, "_compute_rdp_sample_wor_gaussian", _refuse)
        patch.setattr(rdp, "_compute_rdp_poisson_subsampled_gaussian", _refuse)
        assert bits(CachedRdpAccountant(list(DEFAULT_RDP_ORDERS), relation).compose(EVENT).rdp) == bits(reference)
        assert bits(rdp_poisson_gaussian(0.05, 1.37)) == bits(rhdp_reference)
    _fresh()


def test_where_the_probe_disagrees_dp_accounting_computes_everything_with_the_same_bits(monkeypatch):
    relation = NeighboringRelation.REPLACE_ONE
    reference = RdpAccountant(list(DEFAULT_RDP_ORDERS), relation).compose(EVENT).rdp
    rhdp_reference = RdpAccountant(list(RHDP_ORDERS)).compose(RHDP_EVENT).rdp
    _fresh()
    z_as_run = calibrate_noise_multiplier(2.0, 1e-5, 16 / 600, 400, sampling="without_replacement")
    _fresh()
    with monkeypatch.context() as patch:
        patch.setattr(sampled_rdp, "fast_path_agrees", lambda: False)
        patch.setattr(sampled_rdp, "poisson_gaussian_rdp", _refuse)
        patch.setattr(sampled_rdp, "wor_gaussian_rdp", _refuse)
        assert bits(CachedRdpAccountant(list(DEFAULT_RDP_ORDERS), relation).compose(EVENT).rdp) == bits(reference)
        assert bits(rdp_poisson_gaussian(0.05, 1.37)) == bits(rhdp_reference)
        z_fallback = calibrate_noise_multiplier(2.0, 1e-5, 16 / 600, 400, sampling="without_replacement")
    _fresh()
    assert z_fallback == z_as_run  # the same noise as the run's, whichever path the run took
