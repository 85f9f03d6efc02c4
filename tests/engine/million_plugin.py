"""A test plugin (loaded through a config's ``plugins``): a data set of 1,000,000 two-feature points, two classes."""
import torch

from trustfl.core.registry import register
from trustfl.data.datasets import Dataset

N = 1_000_000


@register("dataset", "million_points")
def million_points(data_dir=None, seed=0) -> Dataset:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 2, generator=gen)
    y = (x[:, 0] > 0).long()
    return Dataset("million_points", x, y, x[:1000].clone(), y[:1000].clone(), (2,), 2, "synthetic (test plugin)")
