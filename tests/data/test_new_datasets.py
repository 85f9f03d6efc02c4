"""The diabetes regression set, FedProx's Synthetic(α, β) and the natural partitioner."""
import numpy as np
import pytest
import torch

from trustfl.core.registry import build
from trustfl.data import load_dataset
from trustfl.errors import ConfigError, DataError


def test_diabetes_is_a_standardised_regression_set():
    ds = load_dataset("diabetes", seed=0)
    assert ds.task == "regression" and ds.num_classes == 0
    assert ds.train_x.shape == (354, 10) and ds.test_x.shape == (88, 10) and ds.train_y.dtype == torch.float32
    assert torch.allclose(ds.train_x.mean(0), torch.zeros(10), atol=1e-5)
    assert torch.allclose(ds.train_x.std(0, unbiased=False), torch.ones(10), atol=1e-4)
    assert abs(float(ds.train_y.mean())) < 1e-5 and abs(float(ds.train_y.std(unbiased=False)) - 1) < 1e-4
    again, other = load_dataset("diabetes", seed=0), load_dataset("diabetes", seed=1)
    assert torch.equal(ds.test_y, again.test_y) and not torch.equal(ds.test_y, other.test_y)
    with pytest.raises(ConfigError, match="max_train"):
        load_dataset("diabetes", max_train=10_000)


def test_a_regression_dataset_rejects_integer_targets():
    from trustfl.data import Dataset
    with pytest.raises(DataError, match="float32"):
        Dataset("bad", torch.zeros(3, 2), torch.zeros(3, dtype=torch.long), torch.zeros(1, 2),
                torch.zeros(1, dtype=torch.long), (2,), 0, "test", task="regression")


def test_synthetic_follows_its_generative_model():
    ds = load_dataset("fedprox_synthetic", seed=0, alpha=0.0, beta=0.0, num_devices=6, max_samples=400)
    assert ds.input_shape == (60,) and ds.num_classes == 10
    groups = ds.train_groups
    assert groups.shape == ds.train_y.shape and int(groups.max()) == 5 and int(groups.min()) == 0
    # Σ = diag(j^-1.2): the per-device variance of feature j falls as j^-1.2 (first vs last feature)
    x0 = ds.train_x[groups == int(torch.bincount(groups).argmax())]
    ratio = float(x0[:, 0].var() / x0[:, -1].var())
    assert 60 ** 1.2 / 2 < ratio < 60 ** 1.2 * 2
    same = load_dataset("fedprox_synthetic", seed=0, alpha=0.0, beta=0.0, num_devices=6, max_samples=400)
    assert torch.equal(ds.train_x, same.train_x)
    with pytest.raises(ConfigError, match="alpha"):
        load_dataset("fedprox_synthetic", alpha=-1.0)


def test_heterogeneity_grows_with_alpha_and_beta():
    def spread(a):
        ds = load_dataset("fedprox_synthetic", seed=1, alpha=a, beta=a, num_devices=20, max_samples=300)
        means = torch.stack([ds.train_x[ds.train_groups == g].mean(0) for g in range(20)])
        return float(means.mean(1).std())

    assert spread(0.0) < spread(1.0) < spread(10.0)


def test_natural_partition_gives_each_group_to_its_client():
    ds = load_dataset("fedprox_synthetic", seed=0, num_devices=5)
    part = build("partitioner", "natural")(ds.train_y.numpy(), 5, np.random.default_rng(0),
                                           groups=ds.train_groups.numpy())
    for g, idx in enumerate(part.indices):
        assert np.array_equal(idx, np.flatnonzero(ds.train_groups.numpy() == g))
    with pytest.raises(ConfigError, match="num_clients"):
        build("partitioner", "natural")(ds.train_y.numpy(), 4, np.random.default_rng(0),
                                        groups=ds.train_groups.numpy())
    with pytest.raises(ConfigError, match="groups"):
        build("partitioner", "natural")(ds.train_y.numpy(), 5, np.random.default_rng(0))
