"""The client state store (trustfl.client.state.ClientStateStore): gather/scatter, immutability, checkpoints."""
from __future__ import annotations

import pytest
import torch

from trustfl.client.state import ClientStateStore
from trustfl.errors import MessageError


def _defaults() -> dict[str, torch.Tensor]:
    return {"c": torch.zeros(4), "count": torch.tensor(0, dtype=torch.int64),
            "model": torch.full((2, 3), -1.0, dtype=torch.float64)}


def _values(m: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"c": torch.randn(m, 4, generator=g), "count": torch.randint(1, 100, (m,), generator=g),
            "model": torch.randn(m, 2, 3, generator=g, dtype=torch.float64)}


def test_gather_of_unknown_clients_stacks_the_defaults():
    store = ClientStateStore()
    d = _defaults()
    out = store.gather([5, 9, 5], d)
    assert out.keys() == d.keys()
    for k, v in d.items():
        assert out[k].shape == (3, *v.shape) and out[k].dtype == v.dtype
        for row in out[k]:
            assert torch.equal(row, v)
    assert len(store) == 0


def test_gather_of_no_clients_is_empty():
    out = ClientStateStore().gather([], _defaults())
    assert out["c"].shape == (0, 4) and out["model"].shape == (0, 2, 3)


def test_scatter_then_gather_returns_what_was_scattered():
    vals = _values(3)
    store = ClientStateStore().scatter([11, 2, 7], vals)
    # any order, mixed with an unknown client
    out = store.gather([7, 100, 11, 2], _defaults())
    d = _defaults()
    for k in vals:
        assert torch.equal(out[k][0], vals[k][2])
        assert torch.equal(out[k][1], d[k])
        assert torch.equal(out[k][2], vals[k][0])
        assert torch.equal(out[k][3], vals[k][1])
    assert 7 in store and 100 not in store


def test_scatter_returns_a_new_store_and_leaves_the_old_one_unchanged():
    first = _values(2, seed=1)
    old = ClientStateStore().scatter([1, 2], first)
    new = old.scatter([2, 3], _values(2, seed=2))
    assert new is not old
    assert len(old) == 2 and len(new) == 3
    assert 3 not in old and 3 in new
    before = old.gather([1, 2, 3], _defaults())
    assert torch.equal(before["c"][1], first["c"][1])  # client 2's old entry is still in the old store
    assert torch.equal(before["c"][2], _defaults()["c"])
    after = new.gather([1, 2], _defaults())
    assert torch.equal(after["c"][0], first["c"][0])  # client 1 carried over
    assert not torch.equal(after["c"][1], first["c"][1])


def test_scatter_of_some_keys_keeps_the_other_keys():
    vals = _values(2)
    store = ClientStateStore().scatter([4, 5], vals)
    store = store.scatter([5], {"c": torch.full((1, 4), 9.0)})
    out = store.gather([4, 5], _defaults())
    assert torch.equal(out["c"][1], torch.full((4,), 9.0))
    assert torch.equal(out["model"][1], vals["model"][1])
    assert torch.equal(out["count"][1], vals["count"][1])
    assert torch.equal(out["c"][0], vals["c"][0])


def test_only_scattered_clients_are_allocated():
    store = ClientStateStore()
    assert len(store) == 0 and store.nbytes() == 0
    store = store.scatter([1_000_000 - 1, 0, 123_456], {"c": torch.ones(3, 4)})
    assert len(store) == 3
    assert store.nbytes() == 3 * 4 * 4
    # a population of one million ids, gathered in part, allocates nothing more
    store.gather([5, 999_999], {"c": torch.zeros(4)})
    assert len(store) == 3


def test_nbytes_counts_every_entry():
    store = ClientStateStore().scatter([1, 2, 3], _values(3))
    per_entry = 4 * 4 + 8 + 6 * 8  # float32 (4,), int64 (), float64 (2, 3)
    assert store.nbytes() == 3 * per_entry


def test_entries_are_cloned():
    vals = _values(2)
    keep = {k: v.clone() for k, v in vals.items()}
    store = ClientStateStore().scatter([0, 1], vals)
    for v in vals.values():
        v.add_(1)
    out = store.gather([0, 1], _defaults())
    for k in vals:
        assert torch.equal(out[k], keep[k])
    # gathered tensors are not views of the store either
    out["c"].mul_(0)
    assert torch.equal(store.gather([0, 1], _defaults())["c"], keep["c"])


def test_scattered_entries_are_detached():
    w = torch.randn(2, 4, requires_grad=True)
    store = ClientStateStore().scatter([0, 1], {"c": w * 2})
    assert not store.gather([0], {"c": torch.zeros(4)})["c"].requires_grad


def test_state_dict_round_trip_through_torch_save(tmp_path):
    vals = _values(4, seed=3)
    ids = [3, 1_000_000, 42, 0]
    store = ClientStateStore().scatter(ids, vals)
    path = tmp_path / "state.pt"
    torch.save(store.state_dict(), path)
    restored = ClientStateStore.from_state_dict(torch.load(path))
    assert len(restored) == len(store)
    query = ids + [7]
    a, b = store.gather(query, _defaults()), restored.gather(query, _defaults())
    for k in a:
        assert a[k].dtype == b[k].dtype
        assert torch.equal(a[k], b[k])
    assert restored.nbytes() == store.nbytes()


def test_from_state_dict_of_nothing_is_empty():
    assert len(ClientStateStore.from_state_dict(None)) == 0
    assert len(ClientStateStore.from_state_dict({})) == 0


def test_gather_raises_on_a_shape_mismatch():
    store = ClientStateStore().scatter([1, 2], {"c": torch.zeros(2, 3)})
    with pytest.raises(MessageError, match=r"client 1's state 'c' has shape \(3,\), expected \(4,\)"):
        store.gather([1], {"c": torch.zeros(4)})
    # clients without an entry are fine with any default
    assert store.gather([9], {"c": torch.zeros(4)})["c"].shape == (1, 4)
