"""Partitioners (IID, Dirichlet, shards, quantity skew) and vertical feature splits."""
from __future__ import annotations

import json

import numpy as np
import pytest

import trustfl
from trustfl.data import IID, Dirichlet, Partition, QuantitySkew, Shards, split_features
from trustfl.data.vertical import check_columns, unused_columns_notice
from trustfl.errors import ConfigError

# Unequal classes, as in MNIST: class c has 150 + 17c examples (10 classes, 2,265 in all), in shuffled order.
LABELS = np.random.default_rng(123).permutation(np.repeat(np.arange(10), 150 + 17 * np.arange(10)))
N = LABELS.size

PARTITIONERS = [IID(), Dirichlet(alpha=0.5), Dirichlet(alpha=0.1, min_size=5), Shards(labels_per_client=2),
                Shards(labels_per_client=3, class_aligned=False), QuantitySkew(alpha=0.5)]


def _num_labels(part: Partition) -> np.ndarray:
    return np.array([sum(1 for c in h if c) for h in part.summary["label_histograms"]])


@pytest.mark.parametrize("partitioner", PARTITIONERS, ids=repr)
@pytest.mark.parametrize("num_clients", [1, 7, 40])
def test_disjoint_cover_and_summary(partitioner, num_clients: int) -> None:
    if isinstance(partitioner, Shards) and partitioner.class_aligned and num_clients * 2 < 10:
        partitioner = Shards(labels_per_client=10)  # 2 shards cannot hold 10 classes apart (tested below)
    part = partitioner(LABELS, num_clients, np.random.default_rng(0))
    assert len(part.indices) == num_clients
    joined = np.concatenate(part.indices)
    assert joined.dtype == np.int64 and np.array_equal(np.sort(joined), np.arange(N))  # disjoint and covering
    summary = json.loads(json.dumps(part.summary))
    assert summary["sizes"] == [len(i) for i in part.indices] and sum(summary["sizes"]) == N
    assert summary["num_clients"] == num_clients and summary["partitioner"] == partitioner.name
    hist = np.array(summary["label_histograms"])
    assert hist.shape == (num_clients, 10)
    assert np.array_equal(hist.sum(0), np.bincount(LABELS))
    for i, idx in enumerate(part.indices):
        assert np.array_equal(hist[i], np.bincount(LABELS[idx], minlength=10))


@pytest.mark.parametrize("partitioner", PARTITIONERS, ids=repr)
def test_deterministic_for_rng(partitioner) -> None:
    a = partitioner(LABELS, 12, np.random.default_rng(5))
    b = partitioner(LABELS, 12, np.random.default_rng(5))
    c = partitioner(LABELS, 12, np.random.default_rng(6))
    assert all(np.array_equal(x, y) for x, y in zip(a.indices, b.indices))
    assert a.summary == b.summary
    assert not all(np.array_equal(x, y) for x, y in zip(a.indices, c.indices))


def test_iid_sizes_and_labels_balanced() -> None:
    part = IID()(LABELS, 9, np.random.default_rng(0))
    sizes = np.array(part.summary["sizes"])
    assert sizes.max() - sizes.min() <= 1
    hist = np.array(part.summary["label_histograms"]) / sizes[:, None]
    assert np.abs(hist - np.bincount(LABELS) / N).max() < 0.05


def _skew(part: Partition) -> float:
    """Mean over clients of the total-variation distance between the client's label mix and the global one."""
    hist = np.array(part.summary["label_histograms"], dtype=float)
    mix = hist / hist.sum(1, keepdims=True)
    return float(0.5 * np.abs(mix - np.bincount(LABELS) / N).sum(1).mean())


def test_dirichlet_small_alpha_more_skewed() -> None:
    skews = {a: np.mean([_skew(Dirichlet(alpha=a)(LABELS, 20, np.random.default_rng(s))) for s in range(3)])
             for a in (0.1, 1.0, 100.0)}
    assert skews[0.1] > skews[1.0] > skews[100.0]
    assert skews[0.1] > 0.5 and skews[100.0] < 0.15


def test_dirichlet_min_size_and_errors() -> None:
    part = Dirichlet(alpha=0.05, min_size=10)(LABELS, 20, np.random.default_rng(1))
    assert min(part.summary["sizes"]) >= 10 and sum(part.summary["sizes"]) == N  # a bound (min_size), every row placed
    assert part.summary["params"] == {"alpha": 0.05, "min_size": 10, "max_tries": 1000}
    with pytest.raises(ConfigError, match="max_tries"):
        Dirichlet(alpha=0.01, min_size=100, max_tries=3)(LABELS, 20, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="min_size"):
        Dirichlet(alpha=1.0, min_size=200)(LABELS, 20, np.random.default_rng(0))
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="alpha"):
            Dirichlet(alpha=bad)
    with pytest.raises(ConfigError, match="min_size"):
        Dirichlet(alpha=1.0, min_size=-1)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_shards_labels_per_client(k: int) -> None:
    part = Shards(labels_per_client=k)(LABELS, 30, np.random.default_rng(0))
    assert _num_labels(part).max() <= k  # class-aligned shards: at most k labels (<= k + 1 asked for)
    sizes = np.array(part.summary["sizes"])
    assert sizes.sum() == N and sizes.min() > 0.6 * N / 30
    mcmahan = Shards(labels_per_client=k, class_aligned=False)(LABELS, 30, np.random.default_rng(0))
    assert _num_labels(mcmahan).max() <= 2 * k
    assert np.mean(_num_labels(mcmahan) <= k + 1) > 0.8
    sizes = np.array(mcmahan.summary["sizes"])
    assert sizes.max() - sizes.min() <= k  # shards differ by at most one example


def test_shards_one_label_per_client_is_pure_label_split() -> None:
    part = Shards(labels_per_client=1)(LABELS, 10, np.random.default_rng(0))
    assert np.all(_num_labels(part) == 1)
    assert sorted(part.summary["sizes"]) == sorted(np.bincount(LABELS).tolist())


def test_shards_errors() -> None:
    with pytest.raises(ConfigError, match="class_aligned"):
        Shards(labels_per_client=2)(LABELS, 4, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="labels_per_client"):
        Shards(labels_per_client=0)
    with pytest.raises(ConfigError, match="num_clients"):
        IID()(LABELS, N + 1, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="labels"):
        IID()(LABELS.astype(float), 3, np.random.default_rng(0))


def test_quantity_skew_sizes_vary() -> None:
    skewed = QuantitySkew(alpha=0.3)(LABELS, 20, np.random.default_rng(0))
    sizes = np.array(skewed.summary["sizes"])
    assert sizes.min() >= 1 and sizes.sum() == N
    assert sizes.std() / sizes.mean() > 0.8  # Dir(0.3) over 20: coefficient of variation ≈ sqrt((M-1)/(Mα+1)) ≈ 1.6
    flat = np.array(QuantitySkew(alpha=1000.0)(LABELS, 20, np.random.default_rng(0)).summary["sizes"])
    assert flat.std() / flat.mean() < 0.1
    tiny = QuantitySkew(alpha=1e-4)(LABELS, 20, np.random.default_rng(0))
    assert min(tiny.summary["sizes"]) >= 1 and sum(tiny.summary["sizes"]) == N


def test_registry_builds_partitioners() -> None:
    assert set(trustfl.names("partitioner")) >= {"iid", "dirichlet", "shards", "quantity_skew"}
    part = trustfl.build("partitioner", "dirichlet", alpha=0.3)
    assert part == Dirichlet(alpha=0.3)


def test_split_features_contiguous_and_shuffled() -> None:
    blocks = split_features(10, 3)
    assert [b.tolist() for b in blocks] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    rows = split_features(784, 7, unit=28)
    assert all(b.size == 112 for b in rows) and rows[1][0] == 112 and np.all(np.diff(rows[1]) == 1)
    shuffled = split_features(64, 4, np.random.default_rng(0), shuffle=True, unit=8)
    assert np.array_equal(np.sort(np.concatenate(shuffled)), np.arange(64))
    assert [b.size for b in shuffled] == [16] * 4
    assert not all(np.array_equal(a, b) for a, b in zip(shuffled, split_features(64, 4, unit=8)))
    again = split_features(64, 4, np.random.default_rng(0), shuffle=True, unit=8)
    assert all(np.array_equal(a, b) for a, b in zip(shuffled, again))


def test_split_features_errors() -> None:
    with pytest.raises(ConfigError, match="num_parties"):
        split_features(4, 5)
    with pytest.raises(ConfigError, match="unit"):
        split_features(10, 2, unit=3)
    with pytest.raises(ConfigError, match="rng"):
        split_features(10, 2, shuffle=True)


def test_class_groups_give_the_first_clients_only_their_classes() -> None:
    labels = np.repeat(np.arange(10), 60)
    part = trustfl.build("partitioner", "class_groups", classes=[7, 8, 9], share=0.25)(
        labels, 8, np.random.default_rng(3))
    owned = [set(labels[i].tolist()) for i in part.indices]
    assert all(o == {7, 8, 9} for o in owned[:2]) and all(o == set(range(7)) for o in owned[2:])
    assert sorted(np.concatenate(part.indices).tolist()) == list(range(600))
    sizes = [len(i) for i in part.indices]
    assert sizes[:2] == [90, 90] and max(sizes[2:]) - min(sizes[2:]) <= 1
    with pytest.raises(ConfigError, match="share"):
        trustfl.build("partitioner", "class_groups", share=1.0)
    with pytest.raises(ConfigError, match="classes"):
        trustfl.build("partitioner", "class_groups", classes=[11])(labels, 8, np.random.default_rng(0))


# 46 examples of class 0 and 4 of class 1 (the probe's skew.csv): too few of class 1 for the clients that hold it.
SKEWED = np.array([0] * 46 + [1] * 4)


def test_no_partitioner_gives_a_client_zero_examples() -> None:
    """Refused naming the empty clients and the class or group short of examples (they trained on nothing)."""
    cpc = trustfl.build("partitioner", "classes_per_client", classes_per_client=1)
    with pytest.raises(ConfigError, match=r"^classes_per_client: client 9 holds no training examples "
                                          r"\(class 1 has 4 for 5 clients\); use fewer clients\.$"):
        cpc(SKEWED, 10, np.random.default_rng(0))
    assert min(cpc(SKEWED, 8, np.random.default_rng(0)).summary["sizes"]) == 1  # 4 rows for 4 clients: allowed
    groups = trustfl.build("partitioner", "class_groups", classes=[1], share=0.5)
    with pytest.raises(ConfigError, match=r"^class_groups: client 4 holds no training examples: 5 clients share "
                                          r"the 4 examples of `classes` \[1\]"):
        groups(SKEWED, 10, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="no example has group 1 .*client 1 would hold none"):
        trustfl.build("partitioner", "natural")(np.array([0, 1, 0, 1]), 3, np.random.default_rng(0),
                                                groups=np.array([0, 2, 0, 2]))

    class Lopsided(IID):  # any partitioner: the check is in the common finishing step
        def _split(self, labels, num_clients, rng):
            return [np.arange(labels.size)] + [np.zeros(0, np.int64)] * (num_clients - 1)

    with pytest.raises(ConfigError, match=r"'iid': clients 1, 2 hold no training examples \(2 of the 3 clients\)"):
        Lopsided()(LABELS, 3, np.random.default_rng(0))


@pytest.mark.parametrize("seed", range(4))
def test_dirichlet_min_size_zero_allows_empty_clients_and_says_so(seed: int) -> None:
    part = Dirichlet(alpha=0.01, min_size=0)(SKEWED, 10, np.random.default_rng(seed))
    sizes = part.summary["sizes"]
    empty = [i for i, s in enumerate(sizes) if s == 0]
    assert empty and sum(sizes) == SKEWED.size  # Dir(0.01) over 10 clients with 2 classes: at most 2 hold data
    notice = part.summary["notice"]
    assert notice.startswith("NOTICE:") and f"({len(empty)} of the 10 clients, as `min_size` = 0 allows)" in notice
    shown = ", ".join(map(str, empty[:5])) + (f", … ({len(empty)} in all)" if len(empty) > 5 else "")
    assert f"'dirichlet': clients {shown} hold no training examples" in notice
    assert "notice" not in Dirichlet(alpha=100.0, min_size=0)(LABELS, 5, np.random.default_rng(seed)).summary


def test_direct_calls_refuse_bad_arguments_by_name() -> None:
    """The documented entry point ``trustfl.build("partitioner", name)(labels, num_clients, rng)``: every bad
    argument a ConfigError naming it, never a raw numpy error."""
    iid, rng = trustfl.build("partitioner", "iid"), np.random.default_rng
    huge = iid(np.array([0, 10 ** 12, 0, 10 ** 12]), 2, rng(0))  # a 10**12-bin histogram was a MemoryError
    assert huge.summary["sizes"] == [2, 2] and huge.summary["num_classes"] == 10 ** 12 + 1
    assert "label_histograms" not in huge.summary  # above SUMMARY_MAX_CELLS
    small = np.array([0, 1, 0, 1, 2, 2])
    as_uint = Dirichlet(alpha=1.0, min_size=1)(small.astype(np.uint64), 2, rng(0))  # was a TypeError in bincount
    as_int = Dirichlet(alpha=1.0, min_size=1)(small, 2, rng(0))
    assert all(np.array_equal(a, b) for a, b in zip(as_uint.indices, as_int.indices))
    assert as_uint.summary == as_int.summary
    with pytest.raises(ConfigError, match="`labels` must fit in int64"):
        iid(np.array([0, 2 ** 64 - 1], dtype=np.uint64), 2, rng(0))
    with pytest.raises(ConfigError, match="`rng` must be a numpy Generator"):
        iid(small, 2, None)
    natural = trustfl.build("partitioner", "natural")
    for bad in (np.array(list("abab")), np.array([0.0, 1.0, 0.0, 1.0]), np.array([[0, 1], [0, 1]])):
        with pytest.raises(ConfigError, match="`groups` must be a 1-D integer array"):
            natural(small[:4], 2, rng(0), groups=bad)
    with pytest.raises(ConfigError, match=r"`groups` must be client indices >= 0, found -1 \(example 2\)"):
        natural(small[:4], 2, rng(0), groups=np.array([0, 1, -1, 1]))
    with pytest.raises(ConfigError, match="3 group ids for 4 examples"):
        natural(small[:4], 2, rng(0), groups=np.array([0, 1, 1]))
    ok = natural(small[:4], 2, rng(0), groups=np.array([1, 0, 1, 0], dtype=np.uint64))
    assert [i.tolist() for i in ok.indices] == [[1, 3], [0, 2]]


def test_columns_left_to_no_party_are_named() -> None:
    blocks = check_columns([[0], [1]], 3, 2)
    assert unused_columns_notice(blocks, 3) == ("NOTICE: `data.features` leaves column 2 of the 3 features to no "
                                                "party (1 unused); no party trains on them.")
    assert "columns 0, 3, 4, 5, 6, … (7 in all)" in unused_columns_notice(check_columns([[1], [2]], 9, 2), 9)
    assert unused_columns_notice(check_columns([[0, 2], [1]], 3, 2), 3) is None
    assert unused_columns_notice(split_features(10, 3), 10) is None
