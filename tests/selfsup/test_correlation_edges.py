"""FedSC's server store and client weights on edge input: non-finite uploads are refused without touching the
store, a huge matrix replaced by an ordinary one leaves the right total (no cancellation), weights never overflow."""
from __future__ import annotations

import pytest
import torch

from trustfl.errors import ConfigError, MessageError
from trustfl.selfsup import CorrelationStore, client_weights


def _store():
    return CorrelationStore.init(torch.zeros(2, 2, 2), client_weights([1, 1]))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_upload_is_refused_and_the_store_unchanged(bad):
    store = _store()
    upload = torch.ones(2, 2, 2)
    upload[1, 0, 1] = bad
    with pytest.raises(MessageError, match=r"clients \[1\]"):
        store.update(torch.tensor([0, 1]), upload)
    assert torch.equal(store.total, torch.zeros(2, 2)) and torch.equal(store.matrices, torch.zeros(2, 2, 2))
    after = store.update(torch.tensor([0]), torch.ones(1, 2, 2))          # a later finite upload is exact
    assert torch.equal(after.total, torch.full((2, 2), 0.5))
    first = torch.zeros(2, 2, 2)
    first[0, 1, 1] = bad
    with pytest.raises(MessageError, match=r"clients \[0\]"):
        CorrelationStore.init(first, client_weights([1, 1]))


def test_a_float64_upload_that_overflows_the_float32_store_is_refused():
    with pytest.raises(MessageError):
        _store().update(torch.tensor([1]), torch.full((1, 2, 2), 1e300, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_huge_matrix_replaced_by_an_ordinary_one_gives_the_exact_total(dtype):
    store = CorrelationStore.init(torch.zeros(2, 2, 2, dtype=dtype), client_weights([1, 1]))
    big = store.update(torch.tensor([0]), torch.full((1, 2, 2), 1e30, dtype=dtype))
    back = big.update(torch.tensor([0]), torch.ones(1, 2, 2, dtype=dtype))
    assert torch.equal(back.total, torch.full((2, 2), 0.5, dtype=dtype))
    # R̃_{−1} of the client beside the huge one is client 0's matrix: exact too (the difference would cancel)
    both = big.update(torch.tensor([1]), torch.ones(1, 2, 2, dtype=dtype))
    assert torch.equal(both.others(torch.tensor([0, 1])),
                       torch.stack([torch.ones(2, 2, dtype=dtype), torch.full((2, 2), 1e30, dtype=dtype)]))
    mixed = CorrelationStore.init(torch.stack([torch.full((2, 2), 1e30, dtype=dtype), torch.ones(2, 2, dtype=dtype)]),
                                  client_weights([1, 1]))
    assert torch.equal(mixed.others(torch.tensor([0]))[0], torch.ones(2, 2, dtype=dtype))
    # an update whose difference overflows float64 (−max → +max) is summed afresh, finite
    lim = torch.finfo(torch.float64).max
    st = CorrelationStore.init(torch.stack([torch.full((2, 2), -lim, dtype=torch.float64),
                                            torch.zeros(2, 2, dtype=torch.float64)]), client_weights([1, 1]))
    out = st.update(torch.tensor([0]), torch.full((1, 2, 2), lim, dtype=torch.float64))
    assert torch.equal(out.total, torch.full((2, 2), lim / 2, dtype=torch.float64))


def test_client_weights_normalise_without_overflow():
    assert client_weights([1e308, 1e308]).tolist() == [0.5, 0.5]
    assert client_weights([1.5e308, 1.5e308, 1.5e308]).sum().item() == pytest.approx(1.0)
    assert client_weights([5e-324, 5e-324]).tolist() == [0.5, 0.5]
    assert torch.equal(client_weights([10, 20, 5]), torch.tensor([10, 20, 5], dtype=torch.float64) / 35)
    with pytest.raises(ConfigError, match="sizes"):                        # the small weight would be 0
        client_weights([1e308, 5e-324])
