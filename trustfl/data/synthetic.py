"""FedProx's synthetic federated data set, Synthetic(α, β) (Li et al. 2020, §5.1; Shamir et al. 2014).

Device ``k`` draws its own model and its own input distribution:

    u_k ~ N(0, α),  W_k ~ N(u_k, 1)^{10×60},  b_k ~ N(u_k, 1)^{10}       (how different the local models are)
    B_k ~ N(0, β),  v_k ~ N(B_k, 1)^{60},     x ~ N(v_k, Σ), Σ = diag(j^{−1.2})  (how different the local data are)
    y = argmax softmax(W_k x + b_k)

and holds ``n_k = min(⌊LogNormal(4, 2)⌋ + 50, max_samples)`` examples (the authors' power law, capped here to bound
memory). Each device's examples are split 80/20 into its training part and a share of the global test set;
``train_groups`` records the owner of every training example, and ``data.partition = "natural"`` gives each device
to one client (``data.num_clients = num_devices``). Features are not standardised (the paper's setting).

Reference: Li et al., *Federated optimization in heterogeneous networks*, MLSys 2020, https://arxiv.org/abs/1812.06127
"""
from __future__ import annotations

import numpy as np
import torch

from trustfl.core.registry import register
from trustfl.core.rng import numpy_rng
from trustfl.data.datasets import TEST_FRACTION, Dataset
from trustfl.errors import ConfigError

DIM, CLASSES = 60, 10


@register("dataset", "fedprox_synthetic")
def fedprox_synthetic(data_dir: str | None = None, seed: int = 0, *, alpha: float = 1.0, beta: float = 1.0,
                      num_devices: int = 30, max_samples: int = 1000) -> Dataset:
    """Synthetic(α, β) with ``num_devices`` devices (α = β = 0 is the least heterogeneous non-IID setting).

    Example:
      >>> ds = fedprox_synthetic(seed=0, num_devices=5)
      >>> ds.input_shape, ds.num_classes, int(ds.train_groups.max()) + 1
      ((60,), 10, 5)
    """
    for name, value in (("alpha", alpha), ("beta", beta)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ConfigError(f"`{name}` of data set 'fedprox_synthetic' must be a number >= 0, found {value!r}.")
    for name, value, low in (("num_devices", num_devices, 1), ("max_samples", max_samples, 50)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"`{name}` of data set 'fedprox_synthetic' must be an integer >= {low}, found "
                              f"{value!r}.")
    rng = numpy_rng(seed, "dataset", "fedprox_synthetic")
    sizes = np.minimum(rng.lognormal(4, 2, num_devices).astype(np.int64) + 50, max_samples)
    cov = np.arange(1, DIM + 1, dtype=np.float64) ** -1.2
    parts = {"train_x": [], "train_y": [], "test_x": [], "test_y": [], "groups": []}
    for k in range(num_devices):
        u, big_b = rng.normal(0, np.sqrt(alpha)), rng.normal(0, np.sqrt(beta))
        w, b = rng.normal(u, 1, (CLASSES, DIM)), rng.normal(u, 1, CLASSES)
        v = rng.normal(big_b, 1, DIM)
        x = rng.normal(v, np.sqrt(cov), (int(sizes[k]), DIM))
        y = np.argmax(x @ w.T + b, axis=1)
        n_test = int(round(TEST_FRACTION * sizes[k]))
        parts["test_x"].append(x[:n_test])
        parts["test_y"].append(y[:n_test])
        parts["train_x"].append(x[n_test:])
        parts["train_y"].append(y[n_test:])
        parts["groups"].append(np.full(int(sizes[k]) - n_test, k))
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    return Dataset(
        name="fedprox_synthetic",
        train_x=torch.from_numpy(cat["train_x"].astype(np.float32)),
        train_y=torch.from_numpy(cat["train_y"].astype(np.int64)),
        test_x=torch.from_numpy(cat["test_x"].astype(np.float32)),
        test_y=torch.from_numpy(cat["test_y"].astype(np.int64)),
        input_shape=(DIM,), num_classes=CLASSES, task="classification",
        source=f"Synthetic(alpha={alpha}, beta={beta}) of FedProx, {num_devices} devices, generated from the seed",
        train_groups=torch.from_numpy(cat["groups"].astype(np.int64)))
